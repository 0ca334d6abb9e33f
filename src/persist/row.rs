//! From a Kafka message to a row: parse the envelope, pick out event time, level and message,
//! and decide whether the record can be stored as a row at all.
//!
//! Owns: the mapping envelope → columns, and the rules for derived columns (documented in
//! `README.md`). Must not: touch the database, or fail the batch for one bad message (a bad
//! message becomes a [`DeadLetter`]).

use chrono::{DateTime, Datelike, TimeZone, Utc};
use serde_json::Value;

use crate::envelope::{Envelope, Format};

#[cfg(test)]
mod tests;

/// Where a message came from in Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// One row of `logs`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct Row {
    pub record_id: String,
    pub ingest_time: DateTime<Utc>,
    pub event_time: Option<DateTime<Utc>>,
    pub level: Option<String>,
    pub message: Option<String>,
    pub format: &'static str,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    pub container_name: Option<String>,
    pub node_name: Option<String>,
    pub peer_pid: Option<i32>,
    pub peer_uid: Option<i64>,
    pub peer_gid: Option<i64>,
    pub record: Value,
    pub payload: String,
    pub origin: Origin,
}

/// A message kept in `dead_letters` instead of `logs`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// Where it came from.
    pub origin: Origin,
    /// Metric label: why.
    pub reason: &'static str,
    /// Human-readable detail.
    pub error: String,
    /// The message value, byte for byte.
    pub payload: Option<Vec<u8>>,
}

/// Either a row or a dead letter.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// A storable record.
    Row(Box<Row>),
    /// Not storable; kept aside.
    Dead(DeadLetter),
}

/// Fields that name the event time, in order of preference.
const TIME_FIELDS: &[&str] = &["@timestamp", "timestamp", "time", "ts"];
/// Fields that name the level.
const LEVEL_FIELDS: &[&str] = &["level", "severity", "lvl", "log.level"];
/// Fields that name the message.
const MESSAGE_FIELDS: &[&str] = &["message", "msg"];
/// Longest level kept; longer values are not levels.
const MAX_LEVEL_LEN: usize = 32;

/// Turns one Kafka message value into a row or a dead letter.
pub fn parse(value: Option<&[u8]>, origin: Origin) -> Parsed {
    let Some(bytes) = value else {
        return dead(origin, "empty_message", "message has no value".into(), None);
    };
    let envelope = match Envelope::parse(bytes) {
        Ok(envelope) => envelope,
        Err(error) => return dead(origin, error.reason(), error.to_string(), Some(bytes)),
    };
    let payload = match envelope.payload() {
        Ok(payload) => payload,
        Err(error) => return dead(origin, error.reason(), error.to_string(), Some(bytes)),
    };
    let record: Value = match serde_json::from_str(envelope.record.get()) {
        Ok(record) => record,
        Err(error) => return dead(origin, "malformed_envelope", error.to_string(), Some(bytes)),
    };
    // PostgreSQL's text and jsonb cannot hold U+0000; such a record is kept as bytes instead.
    // The substring test is a cheap filter; the walk decides.
    if payload.contains('\0') || (envelope.record.get().contains("u0000") && contains_nul(&record)) {
        return dead(
            origin,
            "nul_character",
            "record contains U+0000, which PostgreSQL text cannot store".into(),
            Some(bytes),
        );
    }
    let (event_time, level, message) = match envelope.format {
        Format::Json => (
            first(&record, TIME_FIELDS).and_then(event_time),
            first(&record, LEVEL_FIELDS).and_then(level),
            first(&record, MESSAGE_FIELDS).and_then(|v| v.as_str().map(str::to_owned)),
        ),
        Format::Text => (None, None, Some(payload.to_string())),
    };
    let peer = envelope.peer.unwrap_or_default();
    Parsed::Row(Box::new(Row {
        record_id: envelope.id.into_owned(),
        ingest_time: envelope.ingest_time,
        event_time,
        level,
        message,
        format: match envelope.format {
            Format::Json => "json",
            Format::Text => "text",
        },
        pod_name: envelope.pod.name.map(Into::into),
        pod_namespace: envelope.pod.namespace.map(Into::into),
        container_name: envelope.pod.container.map(Into::into),
        node_name: envelope.pod.node.map(Into::into),
        peer_pid: peer.pid,
        peer_uid: peer.uid.map(i64::from),
        peer_gid: peer.gid.map(i64::from),
        record,
        payload: payload.into_owned(),
        origin,
    }))
}

fn dead(origin: Origin, reason: &'static str, error: String, payload: Option<&[u8]>) -> Parsed {
    Parsed::Dead(DeadLetter { origin, reason, error, payload: payload.map(<[u8]>::to_vec) })
}

fn contains_nul(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map.iter().any(|(key, value)| key.contains('\0') || contains_nul(value)),
        _ => false,
    }
}

fn first<'v>(record: &'v Value, names: &[&str]) -> Option<&'v Value> {
    let object = record.as_object()?;
    names.iter().find_map(|name| object.get(*name))
}

/// RFC 3339 strings, or numbers of seconds, milliseconds, microseconds or nanoseconds since the
/// epoch (told apart by magnitude). Years outside 1900–9999 are not believed.
pub fn event_time(value: &Value) -> Option<DateTime<Utc>> {
    let time = match value {
        Value::String(text) => DateTime::parse_from_rfc3339(text).ok()?.with_timezone(&Utc),
        Value::Number(number) => {
            let n = number.as_f64()?;
            let nanos = match n.abs() {
                a if a < 1e11 => n * 1e9,
                a if a < 1e14 => n * 1e6,
                a if a < 1e17 => n * 1e3,
                _ => n,
            };
            Utc.timestamp_nanos(nanos as i64)
        }
        _ => return None,
    };
    (1900..=9999).contains(&time.year()).then_some(time)
}

/// A level string (lower-cased), or a numeric level as bunyan/pino write them.
pub fn level(value: &Value) -> Option<String> {
    match value {
        Value::String(text) if !text.is_empty() && text.len() <= MAX_LEVEL_LEN => Some(text.to_ascii_lowercase()),
        Value::Number(number) => Some(
            match number.as_u64()? {
                10 => "trace",
                20 => "debug",
                30 => "info",
                40 => "warn",
                50 => "error",
                60 => "fatal",
                _ => return None,
            }
            .to_string(),
        ),
        _ => None,
    }
}
