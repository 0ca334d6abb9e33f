use super::*;
use crate::telemetry::outcome::DeadLetterReason;

const BOTH: [EnvelopeKind; 2] = [EnvelopeKind::Binary, EnvelopeKind::Json];

fn pod() -> PodMetadata {
    PodMetadata {
        name: Some("web-1".into()),
        namespace: Some("shop".into()),
        container: None,
        node: Some("n1".into()),
        info: Default::default(),
    }
}

fn instance() -> uuid::Uuid {
    uuid::Uuid::parse_str("0197a5c0f0e07d3a8f1e2b3c4d5e6f70").expect("a uuid")
}

fn writer(kind: EnvelopeKind) -> EnvelopeWriter {
    EnvelopeWriter::with_instance(&pod(), instance(), kind)
}

fn peer() -> PeerFragment {
    PeerFragment::new(Some(Peer { pid: Some(42), uid: 1000, gid: 1001 }))
}

fn write(writer: &EnvelopeWriter, line: &str) -> Vec<u8> {
    let mut out = BytesMut::new();
    writer.write(line, &peer(), Utc::now(), &mut out);
    out.to_vec()
}

fn text_id(envelope: &Envelope<'_>) -> String {
    envelope.id.text().into_owned()
}

#[test]
fn envelopes_appended_to_one_buffer_each_parse_on_their_own() {
    for kind in BOTH {
        let writer = writer(kind);
        let mut arena = BytesMut::new();
        writer.write("first", &PeerFragment::default(), Utc::now(), &mut arena);
        let first = arena.split().freeze();
        writer.write(r#"{"second":2}"#, &PeerFragment::default(), Utc::now(), &mut arena);
        let second = arena.split().freeze();
        assert_eq!(Envelope::parse(&first).expect("first").body, Body::Text("first".into()), "{kind:?}");
        assert_eq!(Envelope::parse(&second).expect("second").body, Body::Json(r#"{"second":2}"#), "{kind:?}");
    }
}

#[test]
fn embeds_a_json_line_byte_for_byte() {
    for kind in BOTH {
        let line = r#"{"b":1.50,"a":"x\u00e9","a":2}"#;
        let bytes = write(&writer(kind), line);
        let envelope = Envelope::parse(&bytes).expect("valid envelope");
        assert_eq!(envelope.body, Body::Json(line), "{kind:?}");
    }
}

#[test]
fn carries_a_text_line_as_it_was_written() {
    for kind in BOTH {
        let line = "plain \"quoted\" \\ text\twith tab";
        let bytes = write(&writer(kind), line);
        assert_eq!(Envelope::parse(&bytes).expect("valid envelope").body, Body::Text(line.into()), "{kind:?}");
    }
    // The JSON envelope wraps it as a message.
    let bytes = write(&writer(EnvelopeKind::Json), "a \"b\"");
    let value: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(value["record"], serde_json::json!({ "message": "a \"b\"" }));
}

#[test]
fn the_binary_envelope_is_its_header_then_the_line_byte_for_byte() {
    let line = "plain text";
    let bytes = write(&writer(EnvelopeKind::Binary), line);
    assert_eq!(bytes[0], BINARY_VERSION);
    let header = usize::from(u16::from_be_bytes([bytes[1], bytes[2]]));
    assert_eq!(&bytes[header..], line.as_bytes());
    assert_eq!(&bytes[3..19], instance().as_bytes());
    // Fixed part, pid + uid + gid, "web-1", "shop", "n1" with their lengths.
    assert_eq!(header, BINARY_FIXED + 12 + (2 + 5) + (2 + 4) + (2 + 2));
}

#[test]
fn treats_json_that_is_not_one_bare_object_as_text() {
    for kind in BOTH {
        for line in [" {\"a\":1}", "{\"a\":1} ", "[1,2]", "42", "{not json}", "{\"a\":1}{\"b\":2}"] {
            let bytes = write(&writer(kind), line);
            let envelope = Envelope::parse(&bytes).expect("valid envelope");
            assert_eq!(envelope.body, Body::Text(line.into()), "{kind:?} {line}");
        }
    }
}

#[test]
fn numbers_records_with_the_instance_and_a_sequence() {
    for kind in BOTH {
        let writer = writer(kind);
        let first = write(&writer, "one");
        let second = write(&writer, "two");
        assert_eq!(text_id(&Envelope::parse(&first).expect("valid")), format!("{}-0", writer.instance()));
        assert_eq!(text_id(&Envelope::parse(&second).expect("valid")), format!("{}-1", writer.instance()));
    }
}

#[test]
fn new_writers_never_share_an_instance_id() {
    let a = EnvelopeWriter::new(&PodMetadata::default(), EnvelopeKind::Binary);
    let b = EnvelopeWriter::new(&PodMetadata::default(), EnvelopeKind::Binary);
    assert_ne!(a.instance(), b.instance());
}

#[test]
fn carries_pod_peer_and_time_and_omits_absent_fields_in_either_encoding() {
    let now = DateTime::from_timestamp_micros(1_780_315_200_123_456).expect("a time");
    for kind in BOTH {
        let mut out = BytesMut::new();
        writer(kind).write("x", &peer(), now, &mut out);
        let envelope = Envelope::parse(&out).expect("valid");
        assert_eq!(envelope.ingest_time, now, "{kind:?}");
        let pod = &envelope.pod;
        assert_eq!(
            (pod.name.as_deref(), pod.namespace.as_deref(), pod.container.as_deref(), pod.node.as_deref()),
            (Some("web-1"), Some("shop"), None, Some("n1")),
            "{kind:?}"
        );
        let peer = envelope.peer.expect("a peer");
        assert_eq!((peer.pid, peer.uid, peer.gid), (Some(42), Some(1000), Some(1001)), "{kind:?}");

        let bare = EnvelopeWriter::with_instance(&PodMetadata::default(), instance(), kind);
        let mut out = BytesMut::new();
        bare.write("x", &PeerFragment::new(None), now, &mut out);
        let envelope = Envelope::parse(&out).expect("valid");
        assert!(envelope.peer.is_none(), "{kind:?}");
        assert!(envelope.pod.name.is_none() && envelope.pod.node.is_none(), "{kind:?}");
    }
}

#[test]
fn a_peer_without_a_pid_is_carried_without_one() {
    for kind in BOTH {
        let mut out = BytesMut::new();
        let peer = PeerFragment::new(Some(Peer { pid: None, uid: 7, gid: 8 }));
        writer(kind).write("x", &peer, Utc::now(), &mut out);
        let peer = Envelope::parse(&out).expect("valid").peer.expect("a peer");
        assert_eq!((peer.pid, peer.uid, peer.gid), (None, Some(7), Some(8)), "{kind:?}");
    }
}

#[test]
fn a_reload_switches_the_encoding_of_the_records_written_after_it() {
    let writer = writer(EnvelopeKind::Binary);
    assert_eq!(write(&writer, "a")[0], BINARY_VERSION);
    writer.set_kind(EnvelopeKind::Json);
    assert_eq!(write(&writer, "b")[0], b'{');
}

#[test]
fn a_pod_field_no_kubernetes_name_can_be_is_refused() {
    let long = PodMetadata { container: Some("c".repeat(MAX_POD_FIELD + 1)), ..PodMetadata::default() };
    let error = long.check().expect_err("too long");
    assert_eq!(error.variable, "CONTAINER_NAME");
    assert!(pod().check().is_ok());
}

#[test]
fn rejects_json_envelopes_it_does_not_understand() {
    assert_eq!(Envelope::parse(b"not json").expect_err("malformed").reason(), DeadLetterReason::MalformedEnvelope);
    let future = br#"{"v":2,"id":"a","ingest_time":"2026-01-01T00:00:00Z","format":"text","record":{"message":"x"}}"#;
    assert_eq!(Envelope::parse(future).expect_err("version").reason(), DeadLetterReason::UnsupportedVersion);
    let no_message = br#"{"v":1,"id":"a","ingest_time":"2026-01-01T00:00:00Z","format":"text","record":{"msg":"x"}}"#;
    assert_eq!(Envelope::parse(no_message).expect_err("no message").reason(), DeadLetterReason::MissingMessage);
}

#[test]
fn rejects_binary_envelopes_that_do_not_hold_what_their_header_says() {
    let good = write(&writer(EnvelopeKind::Binary), "line");
    let header = usize::from(u16::from_be_bytes([good[1], good[2]]));
    let malformed = |bytes: &[u8]| Envelope::parse(bytes).expect_err("refused").reason();
    // Cut inside the header, at every length.
    for len in 1..header {
        assert_eq!(malformed(&good[..len]), DeadLetterReason::MalformedEnvelope, "cut at {len}");
    }
    // A header length beyond the message, or shorter than its fields.
    for declared in [good.len() + 1, BINARY_FIXED - 1, header - 1] {
        let mut bytes = good.clone();
        bytes[1..3].copy_from_slice(&(declared as u16).to_be_bytes());
        assert_eq!(malformed(&bytes), DeadLetterReason::MalformedEnvelope, "declared {declared}");
    }
    // A header longer than its fields.
    let mut bytes = good[..header].to_vec();
    bytes.push(0);
    bytes[1..3].copy_from_slice(&((header + 1) as u16).to_be_bytes());
    bytes.extend_from_slice(b"line");
    assert_eq!(malformed(&bytes), DeadLetterReason::MalformedEnvelope);
    // A flag this build does not know; a pid without a peer.
    let flags = BINARY_FIXED - 1;
    for bad in [good[flags] | 0x80, flag::PID] {
        let mut bytes = good.clone();
        bytes[flags] = bad;
        assert_eq!(malformed(&bytes), DeadLetterReason::MalformedEnvelope, "flags {bad:#x}");
    }
    // A record that is not UTF-8.
    let mut bytes = good.clone();
    bytes.extend_from_slice(&[0xff, 0xfe]);
    assert_eq!(malformed(&bytes), DeadLetterReason::MalformedEnvelope);
    // Another version of the binary envelope, or Confluent's framing (magic byte 0).
    for version in [0, 1, 3, 0x1f] {
        let mut bytes = good.clone();
        bytes[0] = version;
        assert_eq!(malformed(&bytes), DeadLetterReason::UnsupportedVersion, "version {version}");
    }
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

    #[test]
    fn both_encodings_carry_the_same_record_and_metadata(
        line in "[ -~é\\t]{0,40}|\\{\"[a-z]{1,5}\":[0-9]{1,3}\\}",
        name in proptest::option::of("[a-z0-9-]{1,20}"),
        container in proptest::option::of("[a-zé]{1,8}"),
        pid in proptest::option::of(proptest::prelude::any::<i32>()),
        micros in 0i64..4_102_444_800_000_000,
    ) {
        let pod = PodMetadata { name, namespace: None, container, node: Some("n".into()), info: Default::default() };
        let peer = PeerFragment::new(Some(Peer { pid, uid: 5, gid: 6 }));
        let now = DateTime::from_timestamp_micros(micros).expect("a time");
        let read = |kind| {
            let mut out = BytesMut::new();
            EnvelopeWriter::with_instance(&pod, instance(), kind).write(&line, &peer, now, &mut out);
            let envelope = Envelope::parse(&out).expect("valid");
            let pod = &envelope.pod;
            (
                text_id(&envelope),
                envelope.ingest_time,
                envelope.body.clone().format(),
                match &envelope.body { Body::Json(text) => text.to_string(), Body::Text(text) => text.to_string() },
                (pod.name.as_deref().map(str::to_owned), pod.container.as_deref().map(str::to_owned), pod.node.as_deref().map(str::to_owned)),
                envelope.peer.map(|peer| (peer.pid, peer.uid, peer.gid)),
            )
        };
        let binary = read(EnvelopeKind::Binary);
        proptest::prop_assert_eq!(&binary.3, &line);
        proptest::prop_assert_eq!(binary, read(EnvelopeKind::Json));
    }
}

#[test]
fn carries_the_pods_labels_and_annotations_in_both_encodings_and_new_ones_after_a_change() {
    for kind in BOTH {
        let mut pod = pod();
        pod.info.labels.insert("app".into(), "web \"1\"".into());
        pod.info.annotations.insert("sluice.dev/team".into(), "payments".into());
        let writer = EnvelopeWriter::with_instance(&pod, instance(), kind);
        let bytes = write(&writer, r#"{"n":1}"#);
        let envelope = Envelope::parse(&bytes).expect("valid envelope");
        assert_eq!(envelope.pod.labels.map(RawValue::get), Some(r#"{"app":"web \"1\""}"#), "{kind:?}");
        assert_eq!(envelope.pod.annotations.map(RawValue::get), Some(r#"{"sluice.dev/team":"payments"}"#), "{kind:?}");
        assert_eq!(envelope.pod.name.as_deref(), Some("web-1"), "{kind:?}");
        assert_eq!(envelope.body, Body::Json(r#"{"n":1}"#), "{kind:?}");

        pod.info.annotations.clear();
        pod.info.labels.insert("app".into(), "api".into());
        writer.set_pod(&pod);
        let bytes = write(&writer, "text");
        let envelope = Envelope::parse(&bytes).expect("valid envelope");
        assert_eq!(envelope.pod.labels.map(RawValue::get), Some(r#"{"app":"api"}"#), "{kind:?}");
        assert!(envelope.pod.annotations.is_none(), "{kind:?}");
        assert_eq!(envelope.body, Body::Text("text".into()), "{kind:?}");
    }
}

#[test]
fn refuses_labels_that_are_not_a_json_object() {
    let bad = br#"{"v":1,"id":"a-1","ingest_time":"2026-12-06T00:00:00Z","pod":{"labels":["x"]},"format":"text","record":{"message":"m"}}"#;
    assert!(Envelope::parse(bad).is_err());
}
