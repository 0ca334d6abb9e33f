use chrono::TimeZone;
use serde_json::json;

use super::*;
use crate::telemetry::outcome::DeadLetterReason;

fn origin() -> Origin {
    Origin { topic: "t".into(), partition: 0, offset: 7 }
}

fn envelope(format: &str, record: &str) -> Vec<u8> {
    format!(
        r#"{{"v":1,"id":"i-1","ingest_time":"2026-11-30T01:02:03.000004Z","pod":{{"name":"web"}},"peer":{{"pid":9,"uid":1000,"gid":1000}},"format":"{format}","record":{record}}}"#
    )
    .into_bytes()
}

#[test]
fn a_json_record_becomes_a_row_with_derived_columns() {
    let record = r#"{"ts":1764464523.5,"lvl":"ERROR","msg":"boom","n":1.50}"#;
    let Parsed::Row(row) = parse(Some(&envelope("json", record)), origin()) else { panic!("a row") };
    assert_eq!(row.key, RecordKey::of("i-1"));
    assert_eq!(row.record, Some(JsonText(record.into())));
    assert_eq!(row.level.as_deref(), Some("error"));
    assert_eq!(row.message, None, "the message stays in the record: the view logs derives it");
    assert_eq!(row.event_time.map(|t| t.timestamp_millis()), Some(1_764_464_523_500));
    assert_eq!(row.pod_name.as_deref(), Some("web"));
    assert_eq!((row.peer_pid, row.peer_uid), (Some(9), Some(1000)));
    assert_eq!(row.origin, origin());
}

#[test]
fn a_text_record_is_stored_once_as_its_message() {
    let Parsed::Row(row) = parse(Some(&envelope("text", r#"{"message":"a \"b\""}"#)), origin()) else {
        panic!("a row")
    };
    assert_eq!(row.message.as_deref(), Some("a \"b\""));
    assert_eq!(row.record, None, "no JSON copy of the line");
    assert_eq!((&row.level, row.event_time), (&None, None));
    assert_eq!(row.into_written(), b"a \"b\"", "the record as written is the line");
}

#[test]
fn a_json_record_as_written_is_its_exact_text() {
    let record = r#"{ "a":1.50,  "a" : 2 }"#;
    let Parsed::Row(row) = parse(Some(&envelope("json", record)), origin()) else { panic!("a row") };
    assert_eq!(row.into_written(), record.as_bytes());
}

#[test]
fn an_agents_record_id_is_its_instance_uuid_and_sequence() {
    let key = RecordKey::of("0192f0a1b2c3d4e5a60718293a4b5c6d-7");
    assert_eq!(key.to_string(), "0192f0a1-b2c3-d4e5-a607-18293a4b5c6d/7");
    assert_eq!(RecordKey::of("0192f0a1b2c3d4e5a60718293a4b5c6d-0").seq, 0);
    let own = uuid::Uuid::now_v7().simple().to_string();
    assert_eq!(RecordKey::of(&format!("{own}-1")).agent.0, *uuid::Uuid::parse_str(&own).expect("uuid").as_bytes());
}

#[test]
fn any_other_record_id_gets_the_key_migration_v2_computes_in_sql() {
    // Each expected key was printed by PostgreSQL running migrations/V2__compact_rows.sql on a
    // V1 row holding that id: the persister and the migration must agree, or a record stored
    // before the upgrade and redelivered after it would be stored twice.
    for (id, key) in [
        ("r0-5", "dd191696-e15e-2ee2-f341-0d02454c5f94/5"),
        ("noseq", "ee8eb8b6-239b-8566-fced-dbdb52b4bc44/-1"),
        ("x-007", "847ccc5f-7477-6ebf-ef7f-4cd0271f1bc8/-1"),
        ("a-b-123456789012345678", "d44362d6-7d92-1091-e7b9-674d752e9e23/123456789012345678"),
        ("a-1234567890123456789", "3b1c4e94-d756-71a1-f34f-920ec51ec8b7/-1"),
        ("web-1-5", "c4719afa-76fa-448b-feca-99e673688584/5"),
        // 32 hex digits that are not an RFC 4122 uuid (17th digit 5, f) are hashed like any name.
        ("c4719afa76fa448b5eca99e673688584-5", "9d7eba96-77ac-5051-f0cf-b7f30e2e5544/5"),
        ("0192f0a1b2c3d4e5f60718293a4b5c6d-7", "3433009d-77a7-129f-fa1b-8daaafafa8c4/7"),
        ("0192f0a1b2c3d4e5a60718293a4b5c6d-7", "0192f0a1-b2c3-d4e5-a607-18293a4b5c6d/7"),
    ] {
        assert_eq!(RecordKey::of(id).to_string(), key, "{id}");
    }
}

#[test]
fn distinct_record_ids_get_distinct_keys() {
    let ids = [
        "a-1",
        "a-01",
        "a-1-",
        "a",
        "a-",
        "-1",
        "A-1",
        "0192f0a1b2c3d4e5f60718293a4b5c6d-1",
        "0192F0A1B2C3D4E5F60718293A4B5C6D-1",
        "0192f0a1b2c3d4e5f60718293a4b5c6d-01",
        "a-+1",
        "a- 1",
        "a-999999999999999999",
        "a-9999999999999999999",
        // Found by the cold review: the first 16 bytes of SHA-256("web-1") written as an
        // instance took the hashed instance's key.
        "web-1-5",
        "c4719afa76fa448b5eca99e673688584-5",
        "c4719afa76fa448b8eca99e673688584-5",
    ];
    let keys: std::collections::BTreeSet<_> = ids.iter().map(|id| RecordKey::of(id)).collect();
    assert_eq!(keys.len(), ids.len());
}

#[test]
fn event_times_are_read_from_rfc3339_and_epoch_numbers_of_any_unit() {
    let expected = Some(1_764_464_523_000);
    for value in [
        json!("2025-11-30T01:02:03Z"),
        json!(1_764_464_523),
        json!(1_764_464_523_000_i64),
        json!(1_764_464_523_000_000_i64),
    ] {
        assert_eq!(event_time(&value).map(|t| t.timestamp_millis()), expected, "{value}");
    }
    assert_eq!(event_time(&json!("yesterday")), None);
    assert_eq!(event_time(&json!(true)), None);
    assert_eq!(event_time(&json!("0001-01-01T00:00:00Z")), None, "implausible years are not believed");
}

#[test]
fn a_huge_number_is_no_event_time_rather_than_the_year_2262() {
    // Found by the `row` fuzz target: nanoseconds were cast to one i64, which saturates, so any
    // number beyond it (1e300, or milliseconds past 2262) became 2262-04-11, a believable year.
    assert_eq!(event_time(&json!(1e300)), None);
    assert_eq!(event_time(&json!(-1e300)), None);
    let year_3000 = Utc.with_ymd_and_hms(3000, 1, 1, 0, 0, 0).single().expect("a time");
    assert_eq!(event_time(&json!(year_3000.timestamp())), Some(year_3000), "seconds of a year past 2262");
    assert_eq!(event_time(&json!(year_3000.timestamp_millis())), Some(year_3000), "milliseconds too");
    // Found by the fuzz target in the first form of this fix, which split f64 nanoseconds in
    // f64: the quotient rounded up while the remainder did not, a second off.
    let seconds = 17_803_152_050;
    assert_eq!(event_time(&json!(seconds)), DateTime::from_timestamp(seconds, 0));
}

#[test]
fn levels_are_lower_cased_and_numeric_levels_named() {
    assert_eq!(level(&json!("WARN")).as_deref(), Some("warn"));
    assert_eq!(level(&json!(50)).as_deref(), Some("error"));
    assert_eq!(level(&json!(33)), None);
    assert_eq!(level(&json!("x".repeat(100))), None);
}

#[test]
fn a_message_that_is_not_an_envelope_becomes_a_dead_letter_with_its_bytes() {
    let Parsed::Dead(letter) = parse(Some(b"hello from someone else"), origin()) else { panic!("dead letter") };
    assert_eq!(letter.reason, DeadLetterReason::MalformedEnvelope);
    assert_eq!(letter.payload.as_deref(), Some(&b"hello from someone else"[..]));
    let Parsed::Dead(letter) = parse(None, origin()) else { panic!("dead letter") };
    assert_eq!(letter.reason, DeadLetterReason::EmptyMessage);
}

#[test]
fn a_record_with_u0000_becomes_a_dead_letter_because_postgres_text_cannot_hold_it() {
    let Parsed::Dead(letter) = parse(Some(&envelope("text", r#"{"message":"a\u0000b"}"#)), origin()) else {
        panic!("dead letter")
    };
    assert_eq!(letter.reason, DeadLetterReason::ContainsNul);
    let Parsed::Dead(letter) = parse(Some(&envelope("json", r#"{"k":"a\u0000"}"#)), origin()) else {
        panic!("dead letter")
    };
    assert_eq!(letter.reason, DeadLetterReason::ContainsNul);
    // An escaped backslash followed by "u0000" is not a NUL character.
    assert!(matches!(parse(Some(&envelope("json", r#"{"k":"a\\u0000"}"#)), origin()), Parsed::Row(_)));
}

#[test]
fn a_json_record_with_an_unpaired_surrogate_escape_becomes_a_dead_letter() {
    // Found by the cold review of the V2 table: `json` stores `"\ud800"` (a string cut in the
    // middle of an emoji), after which every `record->>'x'` or `::jsonb` query whose scan
    // reaches that row fails. V1's `jsonb` refused it; now it is refused before the database.
    for record in [
        r#"{"msg":"\ud800"}"#,
        r#"{"msg":"\uD83D"}"#,
        r#"{"msg":"\udc00x"}"#,
        r#"{"msg":"\ud83dx\ude00"}"#,
        r#"{"msg":"\ud83d\u0041"}"#,
        r#"["a","\ud83d"]"#,
    ] {
        let Parsed::Dead(letter) = parse(Some(&envelope("json", record)), origin()) else {
            panic!("a dead letter for {record}")
        };
        assert_eq!(letter.reason, DeadLetterReason::UnpairedSurrogate, "{record}");
        assert_eq!(letter.payload.as_deref(), Some(&envelope("json", record)[..]), "kept byte for byte");
    }
    // A text record stores its line only: what else its object holds is not stored.
    assert!(matches!(
        parse(Some(&envelope("text", r#"{"message":"ok","x":"\ud800"}"#)), origin()),
        Parsed::Row(row) if row.message.as_deref() == Some("ok")
    ));
    for record in
        [r#"{"msg":"\ud83d\ude00"}"#, r#"{"msg":"\uD83D\uDE00 ok"}"#, r#"{"msg":"\\ud800"}"#, r#"{"msg":"\u00e9"}"#]
    {
        assert!(matches!(parse(Some(&envelope("json", record)), origin()), Parsed::Row(_)), "{record} is a row");
    }
}

#[test]
fn a_nul_in_a_record_nested_deeper_than_serde_json_builds_is_a_dead_letter() {
    // Found by the `row` fuzz target: the NUL check built the record as a tree, which serde_json
    // refuses past 128 levels, so such a record became a row; its derived message (read all
    // the same) carried the NUL into a text column, and `jsonb` refuses the escape too.
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    for record in [format!(r#"{{"msg":"a\u0000b","x":{deep}}}"#), format!(r#"{{"x":{deep},"y":["\u0000"]}}"#)] {
        let Parsed::Dead(letter) = parse(Some(&envelope("json", &record)), origin()) else {
            panic!("a dead letter for {record}")
        };
        assert_eq!(letter.reason, DeadLetterReason::ContainsNul);
    }
    let record = format!(r#"{{"msg":"a\\u0000b","x":{deep}}}"#);
    assert!(matches!(parse(Some(&envelope("json", &record)), origin()), Parsed::Row(_)), "an escaped backslash");
}

#[test]
fn a_nul_in_the_envelope_id_or_pod_fields_is_a_dead_letter() {
    // Found by the `row` fuzz target: only the record was checked, so a NUL in the id or a pod
    // field reached a text column of the row.
    let good = String::from_utf8(envelope("json", r#"{"msg":"ok"}"#)).expect("utf-8");
    for bad in [good.replace(r#""id":"i-1""#, r#""id":"i-\u00001""#), good.replace(r#""web""#, r#""w\u0000eb""#)] {
        let Parsed::Dead(letter) = parse(Some(bad.as_bytes()), origin()) else { panic!("a dead letter for {bad}") };
        assert_eq!(letter.reason, DeadLetterReason::ContainsNul);
        assert!(!letter.error.contains('\0'));
    }
}

#[test]
fn a_json_record_is_stored_as_its_own_text_with_every_digit() {
    let record = r#"{"msg":"x","big":123456789012345678901234567890,"n":1.50}"#;
    let Parsed::Row(row) = parse(Some(&envelope("json", record)), origin()) else { panic!("a row") };
    assert_eq!(row.record, Some(JsonText(record.into())));
}

#[test]
fn derived_columns_take_the_last_of_a_repeated_field_and_read_escaped_names() {
    let record = r#"{"level":"info","level":"WARN","nested":{"lvl":"error"}}"#;
    let Parsed::Row(row) = parse(Some(&envelope("json", record)), origin()) else { panic!("a row") };
    assert_eq!(row.level.as_deref(), Some("warn"));
    let escaped = r#"{"l\u0065vel":"debug"}"#;
    let Parsed::Row(row) = parse(Some(&envelope("json", escaped)), origin()) else { panic!("a row") };
    assert_eq!(row.level.as_deref(), Some("debug"));
}

#[test]
fn a_json_record_that_is_not_an_object_has_no_derived_columns() {
    for record in [r#"["a",{"msg":"b"}]"#, r#""just a string""#, "42", "null", "true"] {
        let Parsed::Row(row) = parse(Some(&envelope("json", record)), origin()) else { panic!("a row for {record}") };
        assert_eq!((row.event_time, row.level, row.message), (None, None, None), "{record}");
        assert_eq!(row.record, Some(JsonText(record.into())));
    }
}

#[test]
fn a_dead_letters_error_text_escapes_nul_and_is_cut_at_its_limit() {
    let letter = DeadLetter::new(origin(), DeadLetterReason::MalformedEnvelope, "unknown variant `\u{0}`", None);
    assert_eq!(letter.error, "unknown variant `\\u0000`");
    let long = "é".repeat(MAX_ERROR_TEXT);
    let cut = DeadLetter::new(origin(), DeadLetterReason::MalformedEnvelope, &long, None).error;
    assert!(cut.len() <= MAX_ERROR_TEXT && cut.ends_with('…'), "{} bytes", cut.len());
    assert_eq!(storable_text("\u{0}\u{0}", 13), "\\u0000…", "an escape is never cut in half");
}

#[test]
fn the_ascii_form_of_a_dead_letter_keeps_only_printable_ascii() {
    let letter = DeadLetter::new(origin(), DeadLetterReason::RejectedByPostgres, "café ✓\nline", Some(b"x".to_vec()));
    assert_eq!(letter.ascii_only().error, "caf? ??line");
    assert_eq!(letter.ascii_only().payload, Some(b"x".to_vec()));
}

#[test]
fn a_poison_envelope_with_a_nul_format_is_a_dead_letter_with_storable_text() {
    let bytes = br#"{"v":1,"id":"a-2","ingest_time":"2026-12-01T00:00:00Z","format":"\u0000","record":{}}"#;
    let Parsed::Dead(letter) = parse(Some(bytes), origin()) else { panic!("a dead letter") };
    assert_eq!(letter.reason, DeadLetterReason::MalformedEnvelope);
    assert!(!letter.error.contains('\0') && letter.error.contains("\\u0000"), "{}", letter.error);
    assert_eq!(letter.payload.as_deref(), Some(&bytes[..]));
}

#[test]
fn the_window_refuses_rows_older_than_retention_and_further_ahead_than_the_skew() {
    let Parsed::Row(row) = parse(Some(&envelope("json", "{}")), origin()) else { panic!("a row") };
    // The row was ingested at 2026-11-30T01:02:03.000004Z.
    let day = |text: &str| NaiveDate::parse_from_str(text, "%Y-%m-%d").expect("date");
    let latest = |text: &str| DateTime::parse_from_rfc3339(text).expect("time").with_timezone(&Utc);
    let window = Window { oldest_day: Some(day("2026-11-30")), latest: latest("2026-11-30T01:02:03.000004Z") };
    assert_eq!(window.refuses(&row), None, "the oldest day kept and the latest instant are inside");
    let later = Window { oldest_day: Some(day("2026-12-01")), ..window };
    assert_eq!(later.refuses(&row).map(|(reason, _)| reason), Some(DeadLetterReason::Expired));
    let earlier = Window { latest: latest("2026-11-30T01:02:02Z"), ..window };
    assert_eq!(earlier.refuses(&row).map(|(reason, _)| reason), Some(DeadLetterReason::IngestTimeInFuture));
    assert_eq!(Window { oldest_day: None, ..window }.refuses(&row), None, "retention 0 keeps everything");
    // Issue 30, item 12: even then, not what no agent's clock reads (a negative year names a
    // partition PostgreSQL refuses).
    let mut ancient = row.clone();
    ancient.ingest_time = DateTime::from_timestamp_micros(-62_200_000_000_000_000).expect("year -1");
    let kept_forever = Window { oldest_day: None, ..window };
    assert_eq!(kept_forever.refuses(&ancient).map(|(reason, _)| reason), Some(DeadLetterReason::IngestTimeBeforeEpoch));
}

/// The same record written by an agent in each encoding.
fn written(kind: crate::envelope::EnvelopeKind, line: &str) -> Vec<u8> {
    use crate::envelope::{EnvelopeWriter, Peer, PeerFragment, PodMetadata};
    let pod = PodMetadata {
        name: Some("web".into()),
        namespace: Some("shop".into()),
        container: None,
        node: None,
        info: Default::default(),
    };
    let instance = uuid::Uuid::parse_str("0197a5c0f0e07d3a8f1e2b3c4d5e6f70").expect("a uuid");
    let writer = EnvelopeWriter::with_instance(&pod, instance, kind);
    let peer = PeerFragment::new(Some(Peer { pid: Some(9), uid: 1000, gid: 1001 }));
    let now = Utc.with_ymd_and_hms(2026, 11, 30, 1, 2, 3).single().expect("a time");
    let mut out = bytes::BytesMut::new();
    writer.write(line, &peer, now, &mut out);
    out.to_vec()
}

#[test]
fn a_record_in_the_binary_envelope_becomes_the_row_its_json_envelope_becomes() {
    use crate::envelope::EnvelopeKind::{Binary, Json};
    let lines = [
        r#"{"ts":1764464523.5,"lvl":"ERROR","msg":"boom","n":1.50}"#,
        r#"{ "a":1.50,  "a" : 2 }"#,
        "plain \"quoted\" text",
        "{not json}",
        "",
    ];
    for line in lines {
        let (Parsed::Row(binary), Parsed::Row(json)) =
            (parse(Some(&written(Binary, line)), origin()), parse(Some(&written(Json, line)), origin()))
        else {
            panic!("rows for {line:?}")
        };
        assert_eq!(binary, json, "{line:?}");
        assert_eq!(binary.into_written(), line.as_bytes());
    }
}

#[test]
fn a_binary_envelopes_nul_or_surrogate_escape_is_a_dead_letter_as_in_json() {
    use crate::envelope::EnvelopeKind::Binary;
    for (line, reason) in [
        ("a\0b", DeadLetterReason::ContainsNul),
        (r#"{"k":"a\u0000"}"#, DeadLetterReason::ContainsNul),
        (r#"{"k":"\ud800"}"#, DeadLetterReason::UnpairedSurrogate),
    ] {
        let message = written(Binary, line);
        let Parsed::Dead(letter) = parse(Some(&message), origin()) else { panic!("a dead letter for {line:?}") };
        assert_eq!(letter.reason, reason, "{line:?}");
        assert_eq!(letter.payload.as_deref(), Some(&message[..]), "kept byte for byte");
    }
}

proptest::proptest! {
    #![proptest_config(crate::test_support::prop_config(1024))]

    #[test]
    fn a_binary_ids_key_is_the_key_of_the_same_id_as_text(
        instance in proptest::prelude::any::<[u8; 16]>(),
        sequence in proptest::prop_oneof![
            0u64..1000,
            999_999_999_999_999_000u64..1_000_000_000_000_001_000,
            proptest::prelude::any::<u64>(),
        ],
    ) {
        let text = format!("{}-{sequence}", uuid::Uuid::from_bytes(instance).simple());
        proptest::prop_assert_eq!(RecordKey::of_parts(instance, sequence), RecordKey::of(&text));
    }
}

/// Issue 33, found writing docs/DEAD_LETTERS.md: a row refused by the write window or by
/// PostgreSQL kept only its record, so `sluice replay` sent a bare record that came back a
/// `malformed_envelope`. Its dead letter now holds the row as an envelope that becomes the same
/// row again — from either encoding, with labels, peer, a text line or another producer's id.
#[test]
fn a_refused_rows_envelope_becomes_the_same_row_again() {
    use crate::envelope::EnvelopeKind::{Binary, Json};
    let with_labels = r#"{"v":1,"id":"not-an-agent's id","ingest_time":"2026-11-30T01:02:03.000004Z","pod":{"name":"web","labels":{"team":"a \"b\"","app":"web"},"annotations":{}},"format":"json","record":{ "a":1.50,  "a" : 2 }}"#;
    let mut messages = vec![with_labels.as_bytes().to_vec(), envelope("text", r#"{"message":"a \"b\""}"#)];
    for line in [r#"{"ts":1764464523.5,"lvl":"ERROR","msg":"boom"}"#, "plain \"quoted\" text", ""] {
        messages.push(written(Binary, line));
        messages.push(written(Json, line));
    }
    for message in messages {
        let Parsed::Row(row) = parse(Some(&message), origin()) else { panic!("a row: {message:?}") };
        let again = row.clone().into_envelope();
        let Parsed::Row(replayed) = parse(Some(&again), origin()) else {
            panic!("{}", String::from_utf8_lossy(&again))
        };
        assert_eq!(replayed, row, "{}", String::from_utf8_lossy(&again));
    }
}
