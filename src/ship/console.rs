//! The console sink (`ship.sink = "stdout"`, `sluice agent --dry-run`): each record printed as
//! one JSON line instead of being sent to Kafka, so a platform team sees exactly what a config
//! would ship — multiline joins, topic and key templates, masking, headers, the envelope — before
//! it touches Kafka.
//!
//! Owns: how a record is shown (its topic, key, headers and its envelope in the JSON envelope's
//! form, whichever encoding `ship.envelope` chose, the record's text exactly as written). Must not: write anything but records to
//! stdout (the agent's own log lines go to stderr), or hold a record: the shipper settles each
//! one as delivered once its line is written.

use rdkafka::message::{Headers as _, OwnedHeaders};
use serde_json::{Map, Value, json};

use crate::persist::row::{Origin, Parsed};

/// The line printed for one record (without its newline).
pub(super) fn line(topic: &str, key: Option<&[u8]>, headers: Option<&OwnedHeaders>, payload: &[u8]) -> String {
    let mut shown = Map::new();
    shown.insert("topic".into(), topic.into());
    shown.insert("key".into(), key.map_or(Value::Null, lossy));
    if let Some(headers) = headers {
        let headers: Map<String, Value> =
            headers.iter().map(|header| (header.key.to_string(), header.value.map_or(Value::Null, lossy))).collect();
        shown.insert("headers".into(), headers.into());
    }
    // The envelope last, as text: its record exactly as it will be stored.
    let mut line = Value::Object(shown).to_string();
    line.pop();
    line.push_str(",\"envelope\":");
    line.push_str(&envelope(payload));
    line.push('}');
    // One line, whatever the record: a raw newline in JSON text can only be whitespace between
    // tokens (a multiline join of pretty-printed JSON), where a space means the same.
    if line.contains(['\n', '\r']) {
        line = line.replace(['\n', '\r'], " ");
    }
    line
}

fn lossy(bytes: &[u8]) -> Value {
    String::from_utf8_lossy(bytes).into()
}

/// The envelope as the JSON envelope writes it (docs/PROTOCOL.md): a JSON envelope as it is
/// shipped, a binary one as the JSON envelope of the row a persister makes of it (the record's
/// text exactly as written); one a persister would keep as a dead letter, in either encoding,
/// is shown with why, and its bytes.
fn envelope(payload: &[u8]) -> String {
    let origin = Origin { topic: String::new(), partition: 0, offset: 0 };
    match crate::persist::row::parse(Some(payload), origin) {
        Parsed::Row(row) => match std::str::from_utf8(payload) {
            Ok(text) if payload.first() == Some(&b'{') => text.to_string(),
            _ => String::from_utf8(row.into_envelope()).unwrap_or_default(),
        },
        Parsed::Dead(letter) => json!({ "unreadable": letter.error, "bytes": lossy(payload) }).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use chrono::TimeZone as _;

    use super::line;
    use crate::envelope::{EnvelopeKind, EnvelopeWriter, PeerFragment, PodMetadata};

    fn written(kind: EnvelopeKind, record: &str) -> Vec<u8> {
        let pod = PodMetadata { name: Some("web-1".into()), namespace: Some("shop".into()), ..Default::default() };
        let writer = EnvelopeWriter::new(&pod, kind);
        let mut out = BytesMut::new();
        let now = chrono::Utc.with_ymd_and_hms(2026, 12, 7, 1, 2, 3).single().expect("a time");
        writer.write(record, &PeerFragment::new(None), now, &mut out);
        out.to_vec()
    }

    #[test]
    fn shows_both_envelope_encodings_as_the_same_json_envelope() {
        let record = r#"{"message":"hello", "level":"info","n":1.50}"#;
        for kind in [EnvelopeKind::Binary, EnvelopeKind::Json] {
            let shown = line("logs", None, None, &written(kind, record));
            assert!(shown.contains(record), "the record exactly as it is stored: {shown}");
        }
        let binary: serde_json::Value =
            serde_json::from_str(&line("logs", Some(b"web-1"), None, &written(EnvelopeKind::Binary, record)))
                .expect("a JSON line");
        let json: serde_json::Value =
            serde_json::from_str(&line("logs", Some(b"web-1"), None, &written(EnvelopeKind::Json, record)))
                .expect("a JSON line");
        assert_eq!(binary["envelope"]["record"]["message"], "hello");
        assert_eq!(binary["envelope"]["pod"]["namespace"], "shop");
        assert_eq!(binary["envelope"]["ingest_time"], "2026-12-07T01:02:03.000000Z");
        // The ids differ (each writer is an instance of its own); everything else is the same.
        let without_id = |mut value: serde_json::Value| {
            value["envelope"].as_object_mut().expect("an object").remove("id");
            value
        };
        assert_eq!(without_id(binary), without_id(json));
    }

    #[test]
    fn shows_a_text_record_as_its_message_and_an_unreadable_one_with_why() {
        let shown: serde_json::Value =
            serde_json::from_str(&line("logs", None, None, &written(EnvelopeKind::Binary, "plain line")))
                .expect("a JSON line");
        assert_eq!(shown["key"], serde_json::Value::Null);
        assert_eq!(shown["envelope"]["format"], "text");
        assert_eq!(shown["envelope"]["record"]["message"], "plain line");
        let shown: serde_json::Value =
            serde_json::from_str(&line("logs", None, None, b"\xffnot one")).expect("a JSON line");
        assert!(shown["envelope"]["unreadable"].as_str().expect("why").contains("not a sluice envelope"), "{shown}");
    }

    /// Found by the second cold review: a JSON record joined from pretty-printed lines holds raw
    /// newlines between its tokens, and was printed over several lines; and a JSON envelope a
    /// persister would refuse was shown as if it were fine.
    #[test]
    fn a_record_is_one_line_and_a_json_envelope_the_persister_refuses_is_shown_why() {
        for kind in [EnvelopeKind::Binary, EnvelopeKind::Json] {
            let shown = line("logs", None, None, &written(kind, "{\n  \"message\": \"a\\nb\"\n}"));
            assert_eq!(shown.lines().count(), 1, "{shown}");
            let value: serde_json::Value = serde_json::from_str(&shown).expect("a JSON line");
            assert_eq!(value["envelope"]["record"]["message"], "a\nb", "{shown}");
        }
        let nul = br#"{"v":1,"id":"x-1","ingest_time":"2026-12-07T01:02:03Z","format":"json","record":{"m":"\u0000"}}"#;
        let value: serde_json::Value = serde_json::from_str(&line("logs", None, None, nul)).expect("a JSON line");
        assert!(value["envelope"]["unreadable"].as_str().expect("why").contains("U+0000"), "{value}");
    }
}
