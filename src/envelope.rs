//! The envelope: the one record format on the wire between agent and persister, a JSON object per
//! Kafka message.
//!
//! ```json
//! {"v":1,"id":"<agent instance>-<seq>","ingest_time":"2026-11-30T03:04:05.123456Z",
//!  "pod":{"name":"web-1","namespace":"shop","container":"app","node":"n1"},
//!  "peer":{"pid":42,"uid":1000,"gid":1000},
//!  "format":"json","record":{...the app's line, byte for byte...}}
//! ```
//!
//! A line is a JSON record when its first byte is `{`, its last byte is `}` and it parses as JSON;
//! it is then embedded verbatim, so the persister recovers the exact bytes. Any other line is a
//! text record, embedded as `{"message": "<line>"}`. Absent pod fields are omitted.
//!
//! Owns: writing envelopes (agent) and reading them (persister), and the record id. Must not:
//! re-serialize the app's JSON (that would reorder keys and change numbers), or allocate per
//! record what can be rendered once per process or per connection.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{BufMut, BytesMut};
use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::telemetry::outcome::DeadLetterReason;

#[cfg(test)]
mod tests;

/// Envelope format version, bumped on incompatible change.
pub const VERSION: u32 = 1;

/// The pod the agent runs in, from the Downward API environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodMetadata {
    /// `POD_NAME`
    pub name: Option<String>,
    /// `POD_NAMESPACE`
    pub namespace: Option<String>,
    /// `CONTAINER_NAME`
    pub container: Option<String>,
    /// `NODE_NAME`
    pub node: Option<String>,
}

impl PodMetadata {
    /// Reads `POD_NAME`, `POD_NAMESPACE`, `CONTAINER_NAME`, `NODE_NAME`; empty values count as absent.
    pub fn from_env() -> Self {
        let read = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        Self {
            name: read("POD_NAME"),
            namespace: read("POD_NAMESPACE"),
            container: read("CONTAINER_NAME"),
            node: read("NODE_NAME"),
        }
    }
}

/// Who is on the other end of a connection (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peer {
    /// Process id, when the kernel reports one.
    pub pid: Option<i32>,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// How the app's line was embedded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// The line was a JSON object, embedded verbatim.
    Json,
    /// The line was text, embedded as `{"message": line}`.
    Text,
}

/// Writes envelopes for one agent process. The record id is `<instance>-<sequence>`: the
/// instance is a fresh UUIDv7 per process start, so ids never repeat across restarts, and the
/// persister can use the id as the key that makes redelivery harmless.
pub struct EnvelopeWriter {
    instance: String,
    sequence: AtomicU64,
    /// `"pod":{...},` rendered once, or empty.
    pod_fragment: String,
}

impl EnvelopeWriter {
    /// A writer with a new instance id.
    pub fn new(pod: &PodMetadata) -> Self {
        Self::with_instance(pod, uuid::Uuid::now_v7().simple().to_string())
    }

    /// A writer with a given instance id (tests; later, a spool replaying its own ids).
    pub fn with_instance(pod: &PodMetadata, instance: String) -> Self {
        let mut fields = Vec::new();
        for (key, value) in
            [("name", &pod.name), ("namespace", &pod.namespace), ("container", &pod.container), ("node", &pod.node)]
        {
            if let Some(value) = value {
                fields.push(format!("{}:{}", json_string(key), json_string(value)));
            }
        }
        let pod_fragment = if fields.is_empty() { String::new() } else { format!("\"pod\":{{{}}},", fields.join(",")) };
        Self { instance, sequence: AtomicU64::new(0), pod_fragment }
    }

    /// This process's instance id.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// `"peer":{...},` for a connection, rendered once when it is accepted.
    pub fn peer_fragment(peer: &Peer) -> String {
        let mut out = String::from("\"peer\":{");
        if let Some(pid) = peer.pid {
            let _ = write!(out, "\"pid\":{pid},");
        }
        let _ = write!(out, "\"uid\":{},\"gid\":{}}},", peer.uid, peer.gid);
        out
    }

    /// Appends the envelope of `line` to `out` and returns its format. `line` is valid UTF-8
    /// without its newline. Appends, so that one buffer can hold many envelopes (a reader's
    /// arena: one allocation for a read's records, not one each).
    pub fn write(&self, line: &str, peer_fragment: &str, now: DateTime<Utc>, out: &mut BytesMut) -> Format {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let format = if is_json_object(line) { Format::Json } else { Format::Text };
        out.reserve(line.len() + 160 + self.pod_fragment.len() + peer_fragment.len());
        out.extend_from_slice(b"{\"v\":1,\"id\":\"");
        out.extend_from_slice(self.instance.as_bytes());
        out.put_u8(b'-');
        out.extend_from_slice(itoa::Buffer::new().format(sequence).as_bytes());
        out.extend_from_slice(b"\",\"ingest_time\":\"");
        write_rfc3339_micros(now, out);
        out.extend_from_slice(b"\",");
        out.extend_from_slice(self.pod_fragment.as_bytes());
        out.extend_from_slice(peer_fragment.as_bytes());
        match format {
            Format::Json => {
                out.extend_from_slice(b"\"format\":\"json\",\"record\":");
                out.extend_from_slice(line.as_bytes());
                out.put_u8(b'}');
            }
            Format::Text => {
                out.extend_from_slice(b"\"format\":\"text\",\"record\":{\"message\":");
                // Writing a &str into memory cannot fail.
                let _ = serde_json::to_writer((&mut *out).writer(), line);
                out.extend_from_slice(b"}}");
            }
        }
        format
    }
}

/// Appends `time` as RFC 3339 in UTC with microseconds (`2026-11-30T03:04:05.123456Z`), as
/// chrono's `to_rfc3339_opts(SecondsFormat::Micros, true)` writes it, without its `String`: the
/// envelope is written once per record.
pub fn write_rfc3339_micros(time: DateTime<Utc>, out: &mut BytesMut) {
    fn digits(out: &mut BytesMut, value: u32, width: usize) {
        let mut buffer = [b'0'; 10];
        let mut rest = value;
        for slot in buffer[..width].iter_mut().rev() {
            *slot = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        out.extend_from_slice(&buffer[..width]);
    }
    let naive = time.naive_utc();
    let year = naive.year();
    if !(0..=9999).contains(&year) {
        // Outside what four digits hold (never from a clock): chrono's own rendering.
        out.extend_from_slice(time.to_rfc3339_opts(SecondsFormat::Micros, true).as_bytes());
        return;
    }
    digits(out, year as u32, 4);
    out.put_u8(b'-');
    digits(out, naive.month(), 2);
    out.put_u8(b'-');
    digits(out, naive.day(), 2);
    out.put_u8(b'T');
    digits(out, naive.hour(), 2);
    out.put_u8(b':');
    digits(out, naive.minute(), 2);
    out.put_u8(b':');
    // A leap second is written as second 60, as chrono writes it.
    let nanos = naive.nanosecond();
    digits(out, naive.second() + nanos / 1_000_000_000, 2);
    out.put_u8(b'.');
    digits(out, (nanos % 1_000_000_000) / 1000, 6);
    out.put_u8(b'Z');
}

/// True when the whole line is one JSON object with no surrounding whitespace.
pub fn is_json_object(line: &str) -> bool {
    line.starts_with('{') && line.ends_with('}') && serde_json::from_str::<&RawValue>(line).is_ok()
}

fn json_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// An envelope as read by the persister; borrows from the Kafka message.
#[derive(Debug, Deserialize)]
pub struct Envelope<'a> {
    /// Format version.
    pub v: u32,
    /// Record id, unique across agent restarts.
    #[serde(borrow)]
    pub id: Cow<'a, str>,
    /// When the agent read the record.
    pub ingest_time: DateTime<Utc>,
    /// The agent's pod.
    #[serde(default, borrow)]
    pub pod: PodFields<'a>,
    /// The writing process.
    #[serde(default)]
    pub peer: Option<PeerFields>,
    /// How `record` was embedded.
    pub format: Format,
    /// The record as embedded.
    #[serde(borrow)]
    pub record: &'a RawValue,
}

/// Pod fields of a read envelope.
#[derive(Debug, Default, Deserialize)]
#[allow(missing_docs)]
pub struct PodFields<'a> {
    #[serde(borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub namespace: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub container: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub node: Option<Cow<'a, str>>,
}

/// Peer fields of a read envelope.
#[derive(Debug, Default, Deserialize)]
#[allow(missing_docs)]
pub struct PeerFields {
    pub pid: Option<i32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// Why a Kafka message is not a usable envelope.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// Not JSON, or missing or mistyped fields.
    #[error("not a sluice envelope: {0}")]
    Malformed(#[from] serde_json::Error),
    /// A version this build does not know.
    #[error("envelope version {0} is not supported (this build reads {VERSION})")]
    UnsupportedVersion(u32),
    /// A text record without its `message` string.
    #[error("text record without a message string")]
    MissingMessage,
}

impl EnvelopeError {
    /// The `reason` label of the dead-letter metric.
    pub fn reason(&self) -> DeadLetterReason {
        match self {
            EnvelopeError::Malformed(_) => DeadLetterReason::MalformedEnvelope,
            EnvelopeError::UnsupportedVersion(_) => DeadLetterReason::UnsupportedVersion,
            EnvelopeError::MissingMessage => DeadLetterReason::MissingMessage,
        }
    }
}

impl<'a> Envelope<'a> {
    /// Parses and checks an envelope.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, EnvelopeError> {
        let envelope: Envelope<'a> = serde_json::from_slice(bytes)?;
        if envelope.v != VERSION {
            return Err(EnvelopeError::UnsupportedVersion(envelope.v));
        }
        Ok(envelope)
    }

    /// The app's line exactly as it was written.
    pub fn payload(&self) -> Result<Cow<'a, str>, EnvelopeError> {
        match self.format {
            Format::Json => Ok(Cow::Borrowed(self.record.get())),
            Format::Text => {
                #[derive(Deserialize)]
                struct Text<'b> {
                    #[serde(borrow)]
                    message: Cow<'b, str>,
                }
                let text: Text<'a> =
                    serde_json::from_str(self.record.get()).map_err(|_| EnvelopeError::MissingMessage)?;
                Ok(text.message)
            }
        }
    }
}
