//! `row`: the persister's envelope parsing and row building (`row::parse`, then the ingest-time
//! window), on any Kafka message value and on every envelope the agent writes.
//!
//! The first byte chooses what the rest is:
//! - even, a message value: the rest, byte for byte (and an empty rest is also tried as a
//!   message without a value);
//! - odd, an app's line: if the agent's content checks accept it, the envelope the agent's
//!   `EnvelopeWriter` makes of it is parsed (binary when the first byte's second bit is clear,
//!   JSON when it is set).
//!
//! Every message ends as exactly one of: a row whose every text column PostgreSQL can store (valid
//! UTF-8 without U+0000, the `json` record without an escaped U+0000 or an unpaired surrogate
//! escape either) and that says what
//! the envelope says; or a dead letter with a documented reason, storable error text and the
//! message kept byte for byte. A row the window refuses becomes a dead letter the same way. Every
//! line the agent accepts becomes a row holding that line exactly, unless it holds an escaped
//! U+0000 (then a `contains_nul` dead letter) or an unpaired surrogate escape (then an
//! `unpaired_surrogate` one). Memory stays in proportion to the message.

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use serde_json::Value;
use sluice::envelope::{BINARY_VERSION, EnvelopeKind, EnvelopeWriter, Peer, PeerFragment, PodMetadata};
use sluice::persist::row::{DeadLetter, MAX_ERROR_TEXT, Origin, Parsed, RecordKey, Row, Window, parse};
use sluice::telemetry::outcome::DeadLetterReason;

use crate::alloc::peak_during;

/// The JSON depth the agent is configured with for the line mode: `ingest.max_json_depth` has
/// no upper bound, so the persister must take any depth an agent may pass.
pub const AGENT_MAX_DEPTH: usize = 100_000;
/// Longest level a row keeps (`row.rs`: longer values are not levels).
const MAX_LEVEL_LEN: usize = 32;

/// Memory `parse` may hold for a message of `len` bytes: the record's text or line and,
/// for a record whose NULs are looked for, a tree of it, plus slack.
fn memory_bound(len: usize) -> usize {
    64 * 1024 + 64 * len
}

fn origin() -> Origin {
    Origin { topic: "logs".into(), partition: 3, offset: 42 }
}

/// The window the target applies: rows ingested in 2025 or 2026 may be written.
fn window() -> Window {
    Window {
        oldest_day: NaiveDate::from_ymd_opt(2025, 1, 1),
        latest: Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 59).single().expect("a valid time"),
    }
}

/// The target.
pub fn row(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode % 2 == 0 {
        if rest.is_empty() {
            match parsed(None) {
                Parsed::Dead(letter) => check_dead(&letter, None),
                Parsed::Row(row) => panic!("a row from a message without value: {row:?}"),
            }
        }
        message(rest);
    } else {
        line(rest, if mode & 2 == 0 { EnvelopeKind::Binary } else { EnvelopeKind::Json });
    }
}

fn parsed(value: Option<&[u8]>) -> Parsed {
    let (out, peak) = peak_during(|| parse(value, origin()));
    let len = value.map_or(0, <[u8]>::len);
    assert!(peak <= memory_bound(len), "parse held {peak} bytes for a {len}-byte message");
    out
}

/// Any message value.
pub fn message(value: &[u8]) -> Parsed {
    let out = parsed(Some(value));
    match &out {
        Parsed::Row(row) => check_row(row, value),
        Parsed::Dead(letter) => check_dead(letter, Some(value)),
    }
    out
}

/// The agent's instance in the envelopes `line` writes.
const INSTANCE: &str = "0197a5c0f0e07d3a8f1e2b3c4d5e6f70";

/// An app's line through the agent's checks and envelope writer.
pub fn line(bytes: &[u8], kind: EnvelopeKind) {
    let Ok(line) = sluice::ingest::record::validate(bytes, AGENT_MAX_DEPTH) else { return };
    let pod = PodMetadata {
        name: Some("web-\"1\"\\ü".into()),
        namespace: Some("shop".into()),
        container: None,
        node: Some("n1".into()),
        info: Default::default(),
    };
    let instance = uuid::Uuid::parse_str(INSTANCE).expect("a uuid");
    let writer = EnvelopeWriter::with_instance(&pod, instance, kind);
    let peer = PeerFragment::new(Some(Peer { pid: Some(7), uid: 1000, gid: 2000 }));
    let now = Utc.with_ymd_and_hms(2026, 6, 1, 12, 0, 0).single().expect("a valid time");
    let mut envelope = bytes::BytesMut::new();
    writer.write(line, &peer, now, &mut envelope);
    match message(&envelope) {
        Parsed::Row(row) => {
            assert!(!row.record.as_ref().is_some_and(|record| escapes_nul(&record.0)), "a row with an escaped NUL");
            assert!(
                !row.record.as_ref().is_some_and(|record| escapes_unpaired_surrogate(&record.0)),
                "a row with an unpaired surrogate escape"
            );
            assert_eq!(row.key, RecordKey::of(&format!("{INSTANCE}-0")));
            assert_eq!(row.key.seq, 0, "an agent's id is its instance uuid and sequence");
            assert_eq!(row.clone().into_written(), line.as_bytes(), "the row does not hold the line the agent read");
            assert_eq!(row.ingest_time, now);
            assert_eq!(row.pod_name, pod.name);
            assert_eq!((row.peer_pid, row.peer_uid, row.peer_gid), (Some(7), Some(1000), Some(2000)));
            let format = if sluice::envelope::is_json_object(line) { "json" } else { "text" };
            assert_eq!(row.format, format);
        }
        Parsed::Dead(letter) if letter.reason == DeadLetterReason::UnpairedSurrogate => {
            assert!(escapes_unpaired_surrogate(line), "an unpaired_surrogate dead letter for {line:?}");
        }
        Parsed::Dead(letter) => {
            assert_eq!(
                letter.reason,
                DeadLetterReason::ContainsNul,
                "the agent's envelope of {line:?} is a dead letter: {}",
                letter.error
            );
            assert!(escapes_nul(line), "a contains_nul dead letter for a line without NUL: {line:?}");
        }
    }
}

fn check_dead(letter: &DeadLetter, value: Option<&[u8]>) {
    assert!(DeadLetterReason::ALL.contains(&letter.reason), "undocumented dead-letter reason {:?}", letter.reason);
    storable_error(&letter.error);
    assert_eq!(letter.payload.as_deref(), value, "a dead letter keeps the message byte for byte");
    assert_eq!(
        letter.reason == DeadLetterReason::EmptyMessage,
        value.is_none(),
        "empty_message is for a message without value"
    );
    if letter.reason == DeadLetterReason::UnpairedSurrogate {
        let text = value.and_then(|value| std::str::from_utf8(record_part(value)).ok()).unwrap_or_default();
        assert!(escapes_unpaired_surrogate(text), "an unpaired_surrogate dead letter for {text:?}");
    }
    assert_eq!(letter.origin, origin());
}

/// Where the record is in a message: after a binary envelope's header; a JSON envelope's is
/// somewhere in the whole.
fn record_part(value: &[u8]) -> &[u8] {
    match value {
        [BINARY_VERSION, high, low, ..] => {
            value.get(usize::from(u16::from_be_bytes([*high, *low]))..).unwrap_or_default()
        }
        _ => value,
    }
}

fn storable_error(error: &str) {
    assert!(!error.contains('\0'), "dead-letter error text holds NUL: {error:?}");
    assert!(error.len() <= MAX_ERROR_TEXT, "dead-letter error text of {} bytes", error.len());
}

/// PostgreSQL text refuses U+0000 (`String` is valid UTF-8 already).
fn storable(column: &str, text: &str) {
    assert!(!text.contains('\0'), "column {column} holds NUL: {text:?}");
}

fn check_row(row: &Row, value: &[u8]) {
    for (column, text) in [
        ("level", row.level.as_deref()),
        ("message", row.message.as_deref()),
        ("pod_name", row.pod_name.as_deref()),
        ("pod_namespace", row.pod_namespace.as_deref()),
        ("container_name", row.container_name.as_deref()),
        ("node_name", row.node_name.as_deref()),
        ("record", row.record.as_ref().map(|record| record.0.as_str())),
    ] {
        if let Some(text) = text {
            storable(column, text);
        }
    }
    if let Some(record) = &row.record {
        assert!(!escapes_nul(&record.0), "a record with an escaped NUL: {:?}", record.0);
        assert!(!escapes_unpaired_surrogate(&record.0), "a record with an unpaired surrogate: {:?}", record.0);
    }
    assert_eq!(row.origin, origin());
    if let Some(level) = &row.level {
        assert!(!level.is_empty() && level.len() <= MAX_LEVEL_LEN, "level {level:?}");
        assert!(!level.bytes().any(|b| b.is_ascii_uppercase()), "level {level:?} not lower-cased");
    }
    if let Some(time) = row.event_time {
        assert!((1900..=9999).contains(&time.year()), "event time {time} believed");
    }
    match row.format {
        // The app's JSON is kept verbatim: its bytes are in the message as they were.
        "json" => {
            let record = row.record.as_ref().expect("a JSON record's row holds its text");
            assert!(contains(value, record.0.as_bytes()), "the record is not the message's bytes");
            assert_eq!(row.message, None, "a JSON record's message is not stored beside it (the view derives it)");
        }
        "text" => {
            assert_eq!(row.record, None, "a text record is stored once, as its message");
            assert!(row.message.is_some(), "a text record's line is its message");
        }
        other => panic!("format {other}"),
    }
    agrees_with_envelope(row, value);

    // The window: a row it refuses becomes a storable dead letter with a documented reason.
    if let Some((reason, error)) = window().refuses(row) {
        assert!(
            [DeadLetterReason::Expired, DeadLetterReason::IngestTimeInFuture].contains(&reason),
            "window reason {reason:?}"
        );
        let letter = DeadLetter::new(row.origin.clone(), reason, &error, Some(row.clone().into_written()));
        assert!(DeadLetterReason::ALL.contains(&letter.reason));
        storable_error(&letter.error);
    }
}

/// The row says what the envelope says: a binary one read field by field here (docs/PROTOCOL.md),
/// a JSON one the plain way (a `serde_json::Value`; skipped for envelopes a `Value` cannot hold,
/// nested deeper than serde_json's limit).
fn agrees_with_envelope(row: &Row, value: &[u8]) {
    if value.first() == Some(&BINARY_VERSION) {
        return agrees_with_binary_envelope(row, value);
    }
    let Ok(Value::Object(envelope)) = serde_json::from_slice::<Value>(value) else { return };
    let text = |value: Option<&Value>| value.and_then(Value::as_str).map(str::to_owned);
    assert_eq!(envelope.get("v").and_then(Value::as_u64), Some(1), "a row from an envelope of another version");
    let id = text(envelope.get("id")).expect("a row's envelope has an id");
    assert_eq!(RecordKey::of(&id), row.key, "the key of id {id:?}");
    assert_eq!(text(envelope.get("format")).as_deref(), Some(row.format));
    let ingest = text(envelope.get("ingest_time")).expect("a row's envelope has an ingest time");
    assert_eq!(ingest.parse::<DateTime<Utc>>().ok(), Some(row.ingest_time), "ingest time {ingest}");
    // serde also reads a struct from an array (fields by position); compared for objects only.
    let pod = envelope.get("pod").filter(|pod| pod.is_object());
    for (field, column) in [
        ("name", &row.pod_name),
        ("namespace", &row.pod_namespace),
        ("container", &row.container_name),
        ("node", &row.node_name),
    ] {
        assert_eq!(&text(pod.and_then(|pod| pod.get(field))), column, "pod.{field}");
    }
    let record = envelope.get("record").expect("a row's envelope has a record");
    if row.format == "text" && record.is_object() {
        assert_eq!(text(record.get("message")), row.message, "a text record's line");
    }
    if row.format == "json"
        && let Some(fields) = record.as_object()
        && let Some(Value::Number(number)) = TIME_FIELDS.iter().find_map(|name| fields.get(*name))
        && let (Some(time), Some(number)) = (row.event_time, number.as_f64())
    {
        numeric_time_is_its_number(time, number);
    }
    if let Some(stored) = &row.record
        && let Ok(parsed) = serde_json::from_str::<Value>(&stored.0)
    {
        assert_eq!(&parsed, record, "the record column is not the envelope's record");
    }
}

/// [`agrees_with_envelope`] for a binary envelope, read as the protocol's text says.
fn agrees_with_binary_envelope(row: &Row, value: &[u8]) {
    let header = usize::from(u16::from_be_bytes([value[1], value[2]]));
    let instance = &value[3..19];
    let sequence = u64::from_be_bytes(value[19..27].try_into().expect("8 bytes"));
    let micros = i64::from_be_bytes(value[27..35].try_into().expect("8 bytes"));
    let flags = value[35];
    let hex: String = instance.iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(row.key, RecordKey::of(&format!("{hex}-{sequence}")), "the key of a binary id");
    assert_eq!(row.ingest_time.timestamp_micros(), micros, "the ingest time");
    let mut at = 36;
    let mut take = |len: usize| {
        let bytes = &value[at..at + len];
        at += len;
        bytes
    };
    let int = |bytes: &[u8]| bytes.iter().fold(0u64, |n, &byte| (n << 8) | u64::from(byte));
    let pid = (flags & 2 != 0).then(|| int(take(4)) as u32 as i32);
    let (uid, gid) = if flags & 1 != 0 { (Some(int(take(4)) as i64), Some(int(take(4)) as i64)) } else { (None, None) };
    assert_eq!((row.peer_pid, row.peer_uid, row.peer_gid), (pid, uid, gid), "the peer");
    for (bit, column) in [(4, &row.pod_name), (8, &row.pod_namespace), (16, &row.container_name), (32, &row.node_name)]
    {
        let field = (flags & bit != 0).then(|| {
            let len = int(take(2)) as usize;
            String::from_utf8(take(len).to_vec()).expect("a row's pod field is UTF-8")
        });
        assert_eq!(&field, column, "pod field {bit}");
    }
    drop(take);
    assert_eq!(at, header, "the header is its fields");
    let record = std::str::from_utf8(&value[header..]).expect("a row's record is UTF-8");
    let stored = row.record.as_ref().map_or_else(|| row.message.clone().unwrap_or_default(), |json| json.0.clone());
    assert_eq!(stored, record, "the row holds the record after the header, as it is");
    assert_eq!(row.format == "json", sluice::envelope::is_json_object(record), "the record's format");
}

/// Fields that name the event time, in order of preference (as `row.rs` reads them).
const TIME_FIELDS: &[&str] = &["@timestamp", "timestamp", "time", "ts"];

/// A numeric event time is the instant the number names, in the unit its magnitude says
/// (seconds below 1e11, milliseconds below 1e14, microseconds below 1e17, else nanoseconds).
fn numeric_time_is_its_number(time: DateTime<Utc>, number: f64) {
    let seconds = match number.abs() {
        a if a < 1e11 => number,
        a if a < 1e14 => number / 1e3,
        a if a < 1e17 => number / 1e6,
        _ => number / 1e9,
    };
    let got = time.timestamp() as f64 + f64::from(time.timestamp_subsec_nanos()) / 1e9;
    assert!((got - seconds).abs() <= 1e-3 + seconds.abs() * 1e-12, "event time {time} from the number {number}");
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|window| window == needle)
}

/// True if a string in JSON text `json` holds `\u` escapes whose UTF-16 code units do not
/// decode (a surrogate without its other half): told by `char::decode_utf16`, not by the
/// persister's own scan.
pub fn escapes_unpaired_surrogate(json: &str) -> bool {
    let bytes = json.as_bytes();
    let mut units: Vec<u16> = Vec::new();
    let (mut in_string, mut at) = (false, 0);
    while at < bytes.len() {
        let byte = bytes[at];
        if !in_string {
            if byte == b'"' {
                in_string = true;
                units.clear();
            }
            at += 1;
            continue;
        }
        match byte {
            b'"' => {
                if char::decode_utf16(units.iter().copied()).any(|unit| unit.is_err()) {
                    return true;
                }
                in_string = false;
                at += 1;
            }
            b'\\' => {
                let escaped = bytes.get(at + 2..at + 6).and_then(|hex| std::str::from_utf8(hex).ok());
                match escaped.and_then(|hex| u16::from_str_radix(hex, 16).ok()) {
                    Some(unit) if bytes.get(at + 1) == Some(&b'u') => {
                        units.push(unit);
                        at += 6;
                    }
                    // Any other escape is one ordinary character.
                    _ => {
                        units.push(u16::from(b'a'));
                        at += 2;
                    }
                }
            }
            // Raw text is valid UTF-8: an ordinary character stands in for each byte.
            _ => {
                units.push(u16::from(b'a'));
                at += 1;
            }
        }
    }
    false
}

/// True if JSON text `json` has the escape `\u0000` inside a string, read one byte at a time
/// (any depth; `\\u0000` is a backslash and text, not a NUL).
pub fn escapes_nul(json: &str) -> bool {
    let bytes = json.as_bytes();
    let (mut in_string, mut at) = (false, 0);
    while at < bytes.len() {
        match bytes[at] {
            b'"' => in_string = !in_string,
            b'\\' if in_string => {
                if bytes.get(at + 1..at + 6) == Some(b"u0000") {
                    return true;
                }
                at += 1;
            }
            _ => {}
        }
        at += 1;
    }
    false
}
