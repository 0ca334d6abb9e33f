//! The console sink (`ship.sink = "stdout"`, `sluice agent --dry-run`): each record printed as
//! one JSON line instead of being sent to Kafka, so a platform team sees exactly what a config
//! would ship — multiline joins, topic and key templates, masking, headers, the envelope — before
//! it touches Kafka.
//!
//! Owns: how a record is shown (its topic, key, headers and its envelope in the JSON envelope's
//! form, whichever encoding `ship.envelope` chose). Must not: write anything but records to
//! stdout (the agent's own log lines go to stderr), or hold a record: the shipper settles each
//! one as delivered once its line is written.

use rdkafka::message::{Headers as _, OwnedHeaders};
use serde_json::{Map, Value, json};

use crate::envelope::{Body, Envelope};

/// The line printed for one record (without its newline).
pub(super) fn line(topic: &str, key: Option<&[u8]>, headers: Option<&OwnedHeaders>, payload: &[u8]) -> String {
    let mut shown = Map::new();
    shown.insert("topic".into(), topic.into());
    shown.insert("key".into(), key.map_or(Value::Null, |key| String::from_utf8_lossy(key).into()));
    if let Some(headers) = headers {
        let headers: Map<String, Value> =
            headers.iter().map(|header| (header.key.to_string(), header.value.map_or(Value::Null, lossy))).collect();
        shown.insert("headers".into(), headers.into());
    }
    shown.insert("envelope".into(), envelope(payload));
    Value::Object(shown).to_string()
}

fn lossy(bytes: &[u8]) -> Value {
    String::from_utf8_lossy(bytes).into()
}

/// The envelope as the JSON envelope writes it (docs/PROTOCOL.md), decoded from either encoding;
/// one the persister could not read is shown with why, and its bytes as text.
fn envelope(payload: &[u8]) -> Value {
    let envelope = match Envelope::parse(payload) {
        Ok(envelope) => envelope,
        Err(error) => return json!({ "unreadable": error.to_string(), "bytes": lossy(payload) }),
    };
    let mut pod = Map::new();
    for (name, value) in [
        ("name", &envelope.pod.name),
        ("namespace", &envelope.pod.namespace),
        ("container", &envelope.pod.container),
        ("node", &envelope.pod.node),
    ] {
        if let Some(value) = value {
            pod.insert(name.into(), value.as_ref().into());
        }
    }
    for (name, raw) in [("labels", envelope.pod.labels), ("annotations", envelope.pod.annotations)] {
        if let Some(value) = raw.and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok()) {
            pod.insert(name.into(), value);
        }
    }
    let mut shown = Map::new();
    shown.insert("v".into(), 1.into());
    shown.insert("id".into(), envelope.id.text().into_owned().into());
    shown
        .insert("ingest_time".into(), envelope.ingest_time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true).into());
    if !pod.is_empty() {
        shown.insert("pod".into(), pod.into());
    }
    if let Some(peer) = &envelope.peer {
        shown.insert("peer".into(), json!({ "pid": peer.pid, "uid": peer.uid, "gid": peer.gid }));
    }
    let (format, record) = match &envelope.body {
        Body::Json(text) => ("json", serde_json::from_str(text).unwrap_or_else(|_| Value::from(*text))),
        Body::Text(line) => ("text", json!({ "message": line.as_ref() })),
    };
    shown.insert("format".into(), format.into());
    shown.insert("record".into(), record);
    Value::Object(shown)
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
        let record = r#"{"level":"info","message":"hello"}"#;
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
}
