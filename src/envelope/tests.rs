use super::*;
use crate::telemetry::outcome::DeadLetterReason;

fn pod() -> PodMetadata {
    PodMetadata { name: Some("web-1".into()), namespace: Some("shop".into()), container: None, node: Some("n1".into()) }
}

fn write(writer: &EnvelopeWriter, line: &str) -> Vec<u8> {
    let mut out = BytesMut::new();
    let peer = EnvelopeWriter::peer_fragment(&Peer { pid: Some(42), uid: 1000, gid: 1001 });
    writer.write(line, &peer, Utc::now(), &mut out);
    out.to_vec()
}

#[test]
fn envelopes_appended_to_one_buffer_each_parse_on_their_own() {
    let writer = EnvelopeWriter::with_instance(&pod(), "inst".into());
    let mut arena = BytesMut::new();
    writer.write("first", "", Utc::now(), &mut arena);
    let first = arena.split().freeze();
    writer.write(r#"{"second":2}"#, "", Utc::now(), &mut arena);
    let second = arena.split().freeze();
    assert_eq!(Envelope::parse(&first).expect("first").payload().expect("payload"), "first");
    assert_eq!(Envelope::parse(&second).expect("second").payload().expect("payload"), r#"{"second":2}"#);
}

proptest::proptest! {
    #![proptest_config(crate::test_support::prop_config(512))]

    #[test]
    fn ingest_time_is_written_as_chrono_writes_rfc3339_with_microseconds(
        seconds in -62_135_596_800i64..253_402_300_799,
        nanos in 0u32..2_000_000_000,
    ) {
        let Some(time) = DateTime::<Utc>::from_timestamp(seconds, nanos) else { return Ok(()) };
        let mut out = BytesMut::new();
        write_rfc3339_micros(time, &mut out);
        proptest::prop_assert_eq!(
            std::str::from_utf8(&out).expect("ascii"),
            time.to_rfc3339_opts(SecondsFormat::Micros, true)
        );
    }
}

#[test]
fn embeds_a_json_line_byte_for_byte() {
    let writer = EnvelopeWriter::with_instance(&pod(), "inst".into());
    let line = r#"{"b":1.50,"a":"x\u00e9","a":2}"#;
    let bytes = write(&writer, line);
    let envelope = Envelope::parse(&bytes).expect("valid envelope");
    assert_eq!(envelope.format, Format::Json);
    assert_eq!(envelope.payload().expect("payload"), line);
}

#[test]
fn wraps_a_text_line_as_a_message() {
    let writer = EnvelopeWriter::with_instance(&pod(), "inst".into());
    let line = "plain \"quoted\" \\ text\twith tab";
    let bytes = write(&writer, line);
    let envelope = Envelope::parse(&bytes).expect("valid envelope");
    assert_eq!(envelope.format, Format::Text);
    assert_eq!(envelope.payload().expect("payload"), line);
    let record: serde_json::Value = serde_json::from_str(envelope.record.get()).expect("json");
    assert_eq!(record, serde_json::json!({ "message": line }));
}

#[test]
fn treats_json_that_is_not_one_bare_object_as_text() {
    for line in [" {\"a\":1}", "{\"a\":1} ", "[1,2]", "42", "{not json}", "{\"a\":1}{\"b\":2}"] {
        let writer = EnvelopeWriter::with_instance(&pod(), "inst".into());
        let bytes = write(&writer, line);
        let envelope = Envelope::parse(&bytes).expect("valid envelope");
        assert_eq!(envelope.format, Format::Text, "{line}");
        assert_eq!(envelope.payload().expect("payload"), line);
    }
}

#[test]
fn numbers_records_with_the_instance_and_a_sequence() {
    let writer = EnvelopeWriter::with_instance(&pod(), "abc".into());
    let first = write(&writer, "one");
    let second = write(&writer, "two");
    assert_eq!(Envelope::parse(&first).expect("valid").id, "abc-0");
    assert_eq!(Envelope::parse(&second).expect("valid").id, "abc-1");
}

#[test]
fn new_writers_never_share_an_instance_id() {
    let a = EnvelopeWriter::new(&PodMetadata::default());
    let b = EnvelopeWriter::new(&PodMetadata::default());
    assert_ne!(a.instance(), b.instance());
}

#[test]
fn carries_pod_and_peer_metadata_and_omits_absent_fields() {
    let writer = EnvelopeWriter::with_instance(&pod(), "inst".into());
    let bytes = write(&writer, "x");
    let value: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(value["pod"], serde_json::json!({"name": "web-1", "namespace": "shop", "node": "n1"}));
    assert_eq!(value["peer"], serde_json::json!({"pid": 42, "uid": 1000, "gid": 1001}));
    let bare = EnvelopeWriter::with_instance(&PodMetadata::default(), "inst".into());
    let value: serde_json::Value = serde_json::from_slice(&write(&bare, "x")).expect("json");
    assert!(value.get("pod").is_none());
}

#[test]
fn rejects_envelopes_it_does_not_understand() {
    assert_eq!(Envelope::parse(b"not json").expect_err("malformed").reason(), DeadLetterReason::MalformedEnvelope);
    let future = br#"{"v":2,"id":"a","ingest_time":"2026-01-01T00:00:00Z","format":"text","record":{"message":"x"}}"#;
    assert_eq!(Envelope::parse(future).expect_err("version").reason(), DeadLetterReason::UnsupportedVersion);
    let no_message = br#"{"v":1,"id":"a","ingest_time":"2026-01-01T00:00:00Z","format":"text","record":{"msg":"x"}}"#;
    let envelope = Envelope::parse(no_message).expect("parses");
    assert_eq!(envelope.payload().expect_err("no message").reason(), DeadLetterReason::MissingMessage);
}
