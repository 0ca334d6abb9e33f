//! From a Kafka message to a row: parse the envelope, pick out event time and level, and decide
//! whether the record can be stored as a row at all. A JSON record's message is not picked out:
//! it is stored once, in the record, and the view `logs` derives it (`log_message`, migration V3).
//!
//! Owns: the mapping envelope → columns, and the rules for derived columns (documented in
//! `README.md`). Must not: touch the database, or fail the batch for one bad message (a bad
//! message becomes a [`DeadLetter`]).

use std::borrow::Cow;
use std::fmt;

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::envelope::{Body, Envelope, Format, RecordId};
use crate::telemetry::outcome::DeadLetterReason;

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

/// One row of `log_rows` (the table under the view `logs`).
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct Row {
    pub key: RecordKey,
    pub ingest_time: DateTime<Utc>,
    pub event_time: Option<DateTime<Utc>>,
    pub level: Option<String>,
    /// A text record's line; `None` for a JSON record, whose message stays in `record` (the
    /// view `logs` derives it).
    pub message: Option<String>,
    pub format: &'static str,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    pub container_name: Option<String>,
    pub node_name: Option<String>,
    /// The pod's labels and annotations, JSON objects (`[agent.pod_info]`).
    pub pod_labels: Option<JsonText>,
    pub pod_annotations: Option<JsonText>,
    pub peer_pid: Option<i32>,
    pub peer_uid: Option<i64>,
    pub peer_gid: Option<i64>,
    /// A JSON record's text, as the app wrote it; `None` for a text record (its line is
    /// `message`).
    pub record: Option<JsonText>,
    /// The typed columns' values (`[persist.columns]`, in their order; empty without any).
    pub typed: Vec<Option<super::columns::Typed>>,
    pub origin: Origin,
    /// The envelope's id as it came, when `key` cannot give it back (a hashed id: another
    /// producer's); what [`Row::into_envelope`] writes.
    pub hashed_id: Option<Box<str>>,
}

impl Row {
    /// The row as a JSON envelope (docs/PROTOCOL.md, `v` 1): what a dead letter keeps of a row
    /// PostgreSQL or the write window refuses, so `sluice replay` can send it again once the
    /// cause is fixed and it becomes this same row (same key, same columns). The message itself
    /// is not kept alongside each row: that would double a batch's memory for the rare row that
    /// is refused.
    pub fn into_envelope(self) -> Vec<u8> {
        let string = |text: &str| Value::from(text).to_string();
        let id = match self.hashed_id {
            Some(id) => id.into_string(),
            None => format!("{}-{}", uuid::Uuid::from_bytes(self.key.agent.0).simple(), self.key.seq),
        };
        let time = self.ingest_time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let mut text = format!("{{\"v\":1,\"id\":{},\"ingest_time\":{}", string(&id), string(&time));
        let mut pod: Vec<String> = [
            ("name", self.pod_name),
            ("namespace", self.pod_namespace),
            ("container", self.container_name),
            ("node", self.node_name),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some(format!("\"{name}\":{}", string(&value?))))
        .collect();
        // Labels and annotations as they came (their key order kept).
        pod.extend(
            [("labels", self.pod_labels), ("annotations", self.pod_annotations)]
                .into_iter()
                .filter_map(|(name, map)| Some(format!("\"{name}\":{}", map?.0))),
        );
        if !pod.is_empty() {
            text.push_str(&format!(",\"pod\":{{{}}}", pod.join(",")));
        }
        if self.peer_pid.is_some() || self.peer_uid.is_some() || self.peer_gid.is_some() {
            let peer = serde_json::json!({ "pid": self.peer_pid, "uid": self.peer_uid, "gid": self.peer_gid });
            text.push_str(&format!(",\"peer\":{peer}"));
        }
        // The record last, a JSON record as written (spacing, key order, repeated keys kept).
        text.push_str(&format!(",\"format\":{},\"record\":", string(self.format)));
        match self.record {
            Some(record) => text.push_str(&record.0),
            None => text.push_str(&format!("{{\"message\":{}}}", string(&self.message.unwrap_or_default()))),
        }
        text.push('}');
        text.into_bytes()
    }

    /// The record as the app wrote it: a JSON record's text, a text record's line.
    pub fn into_written(self) -> Vec<u8> {
        match self.record {
            Some(JsonText(text)) => text.into_bytes(),
            None => self.message.unwrap_or_default().into_bytes(),
        }
    }
}

/// A record id (`<agent instance>-<sequence>`, see `crate::envelope`) as the key of `log_rows`:
/// a uuid and a bigint, compared as bytes and 24 bytes wide, where the id as text cost
/// PostgreSQL a collation-aware comparison of ~37 bytes per index step.
///
/// The id is split at its last `-`. The part after it is the sequence if it is `0` or a number
/// without leading zeros of at most 18 digits (so it fits a bigint and no two spellings of one
/// number exist). The part before it is the agent: an instance of exactly 32 lowercase hex
/// digits with the RFC 4122 variant (`[89ab]` as its 17th digit: what sluice's agents write,
/// a UUIDv7) is that uuid; any other instance is the first 16 bytes of its SHA-256 with the
/// variant bits set to `111` (the reserved variant), so a hashed agent never equals an agent's
/// own uuid, whatever hex a producer writes. An id with no such sequence is hashed whole, with
/// sequence -1 (which no sequence is). Two ids meet only if SHA-256 collides in 125 bits:
/// redelivery stays harmless for any id, and migration V2 computes the same key in SQL for
/// rows stored before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordKey {
    /// The agent instance.
    pub agent: AgentId,
    /// The record's sequence number within it; -1 when the id has none.
    pub seq: i64,
}

/// An agent instance as a uuid (`logs.agent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId(pub [u8; 16]);

impl RecordKey {
    /// The key of record id `id`.
    pub fn of(id: &str) -> Self {
        if let Some((instance, seq)) = id.rsplit_once('-')
            && let Some(seq) = sequence(seq)
        {
            return Self { agent: AgentId::of(instance), seq };
        }
        Self { agent: AgentId::hashed(id), seq: -1 }
    }
}

impl RecordKey {
    /// The key of a binary envelope's id: the same as the text id `<instance as 32 lowercase
    /// hex digits>-<sequence>` ([`RecordKey::of`]), so a record redelivered in the other
    /// encoding (a spool written before an upgrade) is still one row.
    pub fn of_parts(instance: [u8; 16], sequence: u64) -> Self {
        match i64::try_from(sequence) {
            Ok(seq) if seq < MAX_SEQUENCE => Self { agent: AgentId::of_bytes(instance), seq },
            _ => Self::of(&format!("{}-{sequence}", uuid::Uuid::from_bytes(instance).simple())),
        }
    }
}

/// Sequences below this (18 digits) are taken as they are (see [`RecordKey`]).
const MAX_SEQUENCE: i64 = 1_000_000_000_000_000_000;

impl AgentId {
    /// The id of an instance given as 16 bytes: the same as [`AgentId::of`] of their hex.
    pub fn of_bytes(instance: [u8; 16]) -> Self {
        if instance[8] & 0xc0 == 0x80 {
            return Self(instance);
        }
        Self::hashed(&uuid::Uuid::from_bytes(instance).simple().to_string())
    }

    /// The uuid of agent instance `instance`.
    pub fn of(instance: &str) -> Self {
        let bytes = instance.as_bytes();
        if bytes.len() == 32
            && bytes.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            && matches!(bytes[16], b'8' | b'9' | b'a' | b'b')
        {
            let mut id = [0; 16];
            for (i, pair) in bytes.chunks_exact(2).enumerate() {
                id[i] = (hex_digit(pair[0]) << 4) | hex_digit(pair[1]);
            }
            return Self(id);
        }
        Self::hashed(instance)
    }

    /// Made from a hash of the id (an id not an agent's own): the id cannot be read back from it.
    pub fn is_hashed(&self) -> bool {
        self.0[8] & 0xe0 == 0xe0
    }

    fn hashed(text: &str) -> Self {
        let digest = openssl::sha::sha256(text.as_bytes());
        let mut id = [0; 16];
        id.copy_from_slice(&digest[..16]);
        // The reserved variant: disjoint from the RFC 4122 uuids taken as they are.
        id[8] = (id[8] & 0x1f) | 0xe0;
        Self(id)
    }
}

/// `<agent uuid>/<seq>`, as `SELECT agent::text || '/' || seq` prints it.
impl fmt::Display for RecordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", uuid::Uuid::from_bytes(self.agent.0).hyphenated(), self.seq)
    }
}

fn hex_digit(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        _ => digit - b'a' + 10,
    }
}

/// `text` as a sequence number: `0`, or 1 to 18 digits not starting with `0`.
fn sequence(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    let canonical = text == "0"
        || (matches!(bytes.first(), Some(b'1'..=b'9')) && bytes.len() <= 18 && bytes.iter().all(u8::is_ascii_digit));
    if canonical { text.parse().ok() } else { None }
}

/// A record's JSON text as the agent embedded it, stored into the `json` column as it is (the
/// record as written: spacing, key order, repeated keys and every digit kept): the persister
/// does not build a tree only to print it again. The agent checked its syntax; what `json`
/// would take but its functions refuse (`\u0000`, unpaired surrogates) is a dead letter
/// before it gets there, and PostgreSQL's own refusals go through the batch's rejected-row
/// isolation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonText(pub String);

/// A message kept in `dead_letters` instead of `logs`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// Where it came from.
    pub origin: Origin,
    /// Why.
    pub reason: DeadLetterReason,
    /// Human-readable detail, always storable as PostgreSQL text (see [`DeadLetter::new`]).
    pub error: String,
    /// The message value, byte for byte (`bytea`: any bytes can be stored).
    pub payload: Option<Vec<u8>>,
}

/// Longest error text kept with a dead letter: PostgreSQL's "failing row contains (…)" detail
/// can carry a whole record.
pub const MAX_ERROR_TEXT: usize = 2048;

impl DeadLetter {
    /// A dead letter whose error text can always be stored: a parser's or PostgreSQL's message
    /// may quote the bad input, and a text column refuses U+0000 (SQLSTATE 22021), so NUL is
    /// written as `\u0000`; the text is cut at [`MAX_ERROR_TEXT`] bytes.
    pub fn new(origin: Origin, reason: DeadLetterReason, error: &str, payload: Option<Vec<u8>>) -> Self {
        Self { origin, reason, error: storable_text(error, MAX_ERROR_TEXT), payload }
    }

    /// The same letter with its error text reduced to printable ASCII: the last form tried
    /// before PostgreSQL's refusal of the letter itself counts it as lost (a database whose
    /// encoding cannot hold a character of the message, say).
    pub fn ascii_only(&self) -> Self {
        let error: String = self
            .error
            .chars()
            .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' })
            .take(MAX_ERROR_TEXT)
            .collect();
        Self { error, ..self.clone() }
    }
}

/// `text` with U+0000 escaped as `\u0000`, at most `max` bytes (cut at a character boundary,
/// marked with `…`).
pub fn storable_text(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.chars() {
        let piece_len = if c == '\0' { 6 } else { c.len_utf8() };
        if out.len() + piece_len > max.saturating_sub('…'.len_utf8()) {
            out.push('…');
            break;
        }
        if c == '\0' {
            out.push_str("\\u0000");
        } else {
            out.push(c);
        }
    }
    out
}

/// Either a row or a dead letter.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// A storable record.
    Row(Box<Row>),
    /// Not storable; kept aside.
    Dead(DeadLetter),
}

/// The ingest times a row may have when it is written: not before the Unix epoch
/// ([`Window::FLOOR`]), not older than what retention keeps (its day partition would be dropped,
/// and the row with it, uncounted), not further ahead than the clock skew allows (a wrong clock
/// would create partitions years ahead). Outside it a row becomes a dead letter with reason
/// `ingest_time_before_epoch`, `expired` or `ingest_time_in_future`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The oldest day kept (`None`: retention keeps everything).
    pub oldest_day: Option<NaiveDate>,
    /// The latest ingest time accepted.
    pub latest: DateTime<Utc>,
}

impl Window {
    /// The floor under every window, whatever retention keeps: the Unix epoch. An ingest time is
    /// a Unix time the agent read from its clock; one before it is not a time but another
    /// producer's bytes, and a year before 1 would name a day partition PostgreSQL refuses
    /// (`logs_-00010101`, 42601): with `retention_days = 0` the batch was retried for ever and the
    /// partition wedged, then the next replica.
    pub const FLOOR: DateTime<Utc> = DateTime::UNIX_EPOCH;

    /// Why `row` may not be written now, if it may not: the dead-letter reason and its text.
    pub fn refuses(&self, row: &Row) -> Option<(DeadLetterReason, String)> {
        if row.ingest_time < Self::FLOOR {
            return Some((
                DeadLetterReason::IngestTimeBeforeEpoch,
                format!("ingest_time {} is before the Unix epoch (1970-01-01): not an agent's clock", row.ingest_time),
            ));
        }
        if let Some(oldest) = self.oldest_day
            && row.ingest_time.date_naive() < oldest
        {
            return Some((
                DeadLetterReason::Expired,
                format!(
                    "ingest_time {} is older than the retention period (oldest day kept: {oldest})",
                    row.ingest_time
                ),
            ));
        }
        if row.ingest_time > self.latest {
            return Some((
                DeadLetterReason::IngestTimeInFuture,
                format!(
                    "ingest_time {} is ahead of this persister's clock by more than persist.max_clock_skew (latest accepted: {})",
                    row.ingest_time, self.latest
                ),
            ));
        }
        None
    }
}

/// Fields that name the event time, in order of preference.
const TIME_FIELDS: &[&str] = &["@timestamp", "timestamp", "time", "ts"];
/// Fields that name the level.
const LEVEL_FIELDS: &[&str] = &["level", "severity", "lvl", "log.level"];
/// Longest level kept; longer values are not levels.
const MAX_LEVEL_LEN: usize = 32;

/// Turns one Kafka message value into a row or a dead letter.
pub fn parse(value: Option<&[u8]>, origin: Origin) -> Parsed {
    let Some(bytes) = value else {
        return dead(origin, DeadLetterReason::EmptyMessage, "message has no value".into(), None);
    };
    let envelope = match Envelope::parse(bytes) {
        Ok(envelope) => envelope,
        Err(error) => return dead(origin, error.reason(), error.to_string(), Some(bytes)),
    };
    // PostgreSQL's text cannot hold U+0000, and `json` holds an unpaired surrogate escape only
    // to fail every query that reads it: such a record is kept as bytes instead.
    // A text record stores only its line: the rest of a JSON envelope's object is not looked at.
    let unstorable = match &envelope.body {
        Body::Json(record) if record.contains('\0') => Some(DeadLetterReason::ContainsNul),
        Body::Json(record) => crate::storable::unstorable_escape(record).map(|escape| match escape {
            crate::storable::Unstorable::Nul => DeadLetterReason::ContainsNul,
            crate::storable::Unstorable::UnpairedSurrogate => DeadLetterReason::UnpairedSurrogate,
        }),
        Body::Text(line) if line.contains('\0') => Some(DeadLetterReason::ContainsNul),
        Body::Text(_) => None,
    };
    match unstorable {
        Some(DeadLetterReason::ContainsNul) => {
            return dead(
                origin,
                DeadLetterReason::ContainsNul,
                "record contains U+0000, which PostgreSQL text cannot store".into(),
                Some(bytes),
            );
        }
        Some(reason) => {
            return dead(
                origin,
                reason,
                "record contains a \\u escape of an unpaired UTF-16 surrogate (U+D800 to U+DFFF), which PostgreSQL's JSON functions refuse".into(),
                Some(bytes),
            );
        }
        None => {}
    }
    let pod = &envelope.pod;
    let text_id = match &envelope.id {
        RecordId::Text(id) => Some(id),
        RecordId::Parts { .. } => None,
    };
    let pod_info = [pod.labels, pod.annotations].into_iter().flatten().map(|map| map.get());
    if [text_id, pod.name.as_ref(), pod.namespace.as_ref(), pod.container.as_ref(), pod.node.as_ref()]
        .into_iter()
        .flatten()
        .any(|text| text.contains('\0'))
        || pod_info.clone().any(|map| map.contains('\0') || crate::storable::unstorable_escape(map).is_some())
    {
        return dead(
            origin,
            DeadLetterReason::ContainsNul,
            "envelope id or pod field contains U+0000, which PostgreSQL text cannot store".into(),
            Some(bytes),
        );
    }
    let format = envelope.body.format();
    let (event_time, level, message, record) = match envelope.body {
        // The message stays in the record: `log_message` in migration V3 derives it.
        Body::Json(record) => {
            let fields = match serde_json::from_str::<DerivedFields<'_>>(record) {
                Ok(fields) => fields,
                Err(error) => return dead(origin, DeadLetterReason::MalformedEnvelope, error.to_string(), Some(bytes)),
            };
            (
                fields.first(TIME_FIELDS).and_then(|value| event_time(&value)),
                fields.first(LEVEL_FIELDS).and_then(|value| level(&value)),
                None,
                Some(JsonText(record.to_owned())),
            )
        }
        Body::Text(line) => (None, None, Some(line.into_owned()), None),
    };
    let peer = envelope.peer.unwrap_or_default();
    let key = match &envelope.id {
        RecordId::Text(id) => RecordKey::of(id),
        RecordId::Parts { instance, sequence } => RecordKey::of_parts(*instance, *sequence),
    };
    let hashed_id = key.agent.is_hashed().then(|| envelope.id.text().into_owned().into_boxed_str());
    Parsed::Row(Box::new(Row {
        key,
        ingest_time: envelope.ingest_time,
        event_time,
        level,
        message,
        format: match format {
            Format::Json => "json",
            Format::Text => "text",
        },
        pod_name: envelope.pod.name.map(Into::into),
        pod_namespace: envelope.pod.namespace.map(Into::into),
        container_name: envelope.pod.container.map(Into::into),
        node_name: envelope.pod.node.map(Into::into),
        pod_labels: envelope.pod.labels.map(|map| JsonText(map.get().to_owned())),
        pod_annotations: envelope.pod.annotations.map(|map| JsonText(map.get().to_owned())),
        peer_pid: peer.pid,
        peer_uid: peer.uid.map(i64::from),
        peer_gid: peer.gid.map(i64::from),
        record,
        typed: Vec::new(),
        origin,
        hashed_id,
    }))
}

fn dead(origin: Origin, reason: DeadLetterReason, error: String, payload: Option<&[u8]>) -> Parsed {
    Parsed::Dead(DeadLetter::new(origin, reason, &error, payload.map(<[u8]>::to_vec)))
}

/// Every name a derived column is read from.
const DERIVED_FIELD_NAMES: &[&[&str]] = &[TIME_FIELDS, LEVEL_FIELDS];

/// The top-level fields of a record that derived columns come from, as raw JSON, found in one
/// pass that builds nothing for the other fields. A name given twice keeps its last value, as
/// `->>` and `jsonb` do. A record that is not an object has none.
struct DerivedFields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl DerivedFields<'_> {
    /// The value of the first of `names` present, in order of preference.
    fn first(&self, names: &[&str]) -> Option<Value> {
        names.iter().find_map(|name| {
            let (_, raw) = self.0.iter().rev().find(|(key, _)| key == name)?;
            serde_json::from_str(raw.get()).ok()
        })
    }
}

impl<'de> Deserialize<'de> for DerivedFields<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// A key, borrowed unless it has escapes.
        struct Key<'a>(Cow<'a, str>);
        impl<'de> Deserialize<'de> for Key<'de> {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct KeyVisitor;
                impl<'de> Visitor<'de> for KeyVisitor {
                    type Value = Key<'de>;
                    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                        formatter.write_str("an object key")
                    }
                    fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Key<'de>, E> {
                        Ok(Key(Cow::Borrowed(key)))
                    }
                    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key<'de>, E> {
                        Ok(Key(Cow::Owned(key.to_owned())))
                    }
                }
                deserializer.deserialize_str(KeyVisitor)
            }
        }

        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = DerivedFields<'de>;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut found = Vec::new();
                while let Some(Key(key)) = map.next_key()? {
                    if DERIVED_FIELD_NAMES.iter().any(|names| names.contains(&key.as_ref())) {
                        found.push((key, map.next_value::<&'de RawValue>()?));
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(DerivedFields(found))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(DerivedFields(Vec::new()))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(DerivedFields(Vec::new()))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(DerivedFields(Vec::new()))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(DerivedFields(Vec::new()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(DerivedFields(Vec::new()))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(DerivedFields(Vec::new()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(DerivedFields(Vec::new()))
            }
        }
        deserializer.deserialize_any(FieldsVisitor)
    }
}

/// RFC 3339 strings, or numbers of seconds, milliseconds, microseconds or nanoseconds since the
/// epoch (told apart by magnitude). Years outside 1900–9999 are not believed.
pub fn event_time(value: &Value) -> Option<DateTime<Utc>> {
    let time = match value {
        Value::String(text) => DateTime::parse_from_rfc3339(text).ok()?.with_timezone(&Utc),
        Value::Number(number) => {
            let n = number.as_f64()?;
            let unit: i128 = match n.abs() {
                a if a < 1e11 => 1_000_000_000,
                a if a < 1e14 => 1_000_000,
                a if a < 1e17 => 1_000,
                _ => 1,
            };
            // In nanoseconds as an i128, split in integers: one i64 of nanoseconds ends in 2262
            // and `as` saturates, so a huge number read as that year. An integer is exact; a
            // fraction as exact as f64 is (its i128 saturates far beyond any time chrono holds,
            // which is then no time at all).
            let nanos = match number.as_i64() {
                Some(integer) => i128::from(integer) * unit,
                None => (n * unit as f64) as i128,
            };
            let seconds = i64::try_from(nanos.div_euclid(1_000_000_000)).ok()?;
            DateTime::from_timestamp(seconds, nanos.rem_euclid(1_000_000_000) as u32)?
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
