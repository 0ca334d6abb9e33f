//! The envelope: the one record format on the wire between agent and persister, one Kafka
//! message per record, in one of two encodings (`ship.envelope`; docs/PROTOCOL.md specifies
//! both byte for byte).
//!
//! **Binary** (the default since issue 15): a header of ~50 bytes, then the app's record byte
//! for byte, to the end of the message:
//!
//! ```text
//! 0x02 | header length (u16) | agent instance (16-byte uuid) | sequence (u64) |
//! ingest time (i64 µs since the epoch) | flags | [pid i32] [uid u32 gid u32] |
//! [pod name] [namespace] [container] [node] (each u16 length + UTF-8) |
//! [labels and annotations (u16 length + a JSON object: {"labels":{…},"annotations":{…}})] |
//! the record …
//! ```
//!
//! Integers are big-endian. The record is what the app wrote (syslog and Forward records: the
//! JSON the agent made of them); whether it is a JSON record is the reader's to tell, by the
//! rule below. Measured against the JSON envelope (docs/PERFORMANCE.md): 306 instead of 423
//! bytes for a 256-byte record, and 13% less agent CPU per record at the max rate — the JSON
//! envelope is built, escaped, checked, copied and compressed per record.
//!
//! **JSON** (version 1, what persisters before issue 15 read): a JSON object per message.
//!
//! ```json
//! {"v":1,"id":"<agent instance>-<seq>","ingest_time":"2026-11-30T03:04:05.123456Z",
//!  "pod":{"name":"web-1","namespace":"shop","container":"app","node":"n1",
//!         "labels":{"app":"web"},"annotations":{"team":"payments"}},
//!  "peer":{"pid":42,"uid":1000,"gid":1000},
//!  "format":"json","record":{...the app's line, byte for byte...}}
//! ```
//!
//! A line is a JSON record when its first byte is `{`, its last byte is `}` and it parses as JSON
//! ([`is_json_object`]); the JSON envelope embeds it verbatim, so the persister recovers the
//! exact bytes, and any other line as `{"message": "<line>"}`. Absent pod fields are omitted.
//! A reader tells the two encodings apart by the first byte: `{` or [`BINARY_VERSION`].
//!
//! Owns: writing envelopes (agent) and reading both encodings (persister), and the record id.
//! Must not: re-serialize the app's JSON (that would reorder keys and change numbers), or
//! allocate per record what can be rendered once per process or per connection.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use bytes::{BufMut, BytesMut};
use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::ingest::session::ClientStamp;
use crate::telemetry::outcome::DeadLetterReason;

#[cfg(test)]
mod tests;

/// The JSON envelope's version (its `"v"`), bumped on incompatible change.
pub const VERSION: u32 = 1;

/// The first byte of a binary envelope: its version. A JSON envelope starts with `{`.
pub const BINARY_VERSION: u8 = 2;

/// The fixed part of a binary envelope's header: version, header length, instance, sequence,
/// ingest time, flags.
pub const BINARY_FIXED: usize = 1 + 2 + 16 + 8 + 8 + 1;

/// Longest pod field (`POD_NAME` …) an envelope carries: Kubernetes names are at most 253
/// bytes; anything longer is not from the Downward API, and refused at start-up.
pub const MAX_POD_FIELD: usize = 1024;

/// Flag bits of a binary envelope's header.
mod flag {
    pub const PEER: u8 = 1;
    pub const PID: u8 = 1 << 1;
    pub const POD_NAME: u8 = 1 << 2;
    pub const POD_NAMESPACE: u8 = 1 << 3;
    pub const CONTAINER: u8 = 1 << 4;
    pub const NODE: u8 = 1 << 5;
    /// The pod's labels and annotations (`[agent.pod_info]`).
    pub const POD_INFO: u8 = 1 << 6;
    /// Bits a reader of this version knows; a header with others set is refused.
    pub const KNOWN: u8 = PEER | PID | POD_NAME | POD_NAMESPACE | CONTAINER | NODE | POD_INFO;
}

/// Which encoding the agent writes (`ship.envelope`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EnvelopeKind {
    /// A binary header, then the record as written. Persisters from issue 15 on read it.
    #[default]
    Binary,
    /// The JSON envelope (version 1), which every persister reads: for upgrading agents before
    /// persisters.
    Json,
}

impl EnvelopeKind {
    /// The config value (`"binary"`, `"json"`).
    pub fn as_str(self) -> &'static str {
        match self {
            EnvelopeKind::Binary => "binary",
            EnvelopeKind::Json => "json",
        }
    }
}

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
    /// Labels and annotations (`[agent.pod_info]`, re-read while the agent runs).
    pub info: crate::podinfo::PodInfo,
}

/// A pod field longer than [`MAX_POD_FIELD`].
#[derive(Debug, thiserror::Error)]
#[error("{variable} is {len} bytes long; at most {MAX_POD_FIELD} are carried (Kubernetes names are at most 253)")]
pub struct PodFieldTooLong {
    /// The environment variable.
    pub variable: &'static str,
    /// Its length.
    pub len: usize,
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
            info: crate::podinfo::PodInfo::default(),
        }
    }

    /// The fields with their variables and binary flags, in envelope order.
    fn fields(&self) -> [(&'static str, &'static str, u8, &Option<String>); 4] {
        [
            ("POD_NAME", "name", flag::POD_NAME, &self.name),
            ("POD_NAMESPACE", "namespace", flag::POD_NAMESPACE, &self.namespace),
            ("CONTAINER_NAME", "container", flag::CONTAINER, &self.container),
            ("NODE_NAME", "node", flag::NODE, &self.node),
        ]
    }

    /// `namespace/name`, or the host's name where the Downward API gives no pod name.
    pub fn identity(&self) -> String {
        match &self.name {
            Some(name) => format!("{}/{name}", self.namespace.as_deref().unwrap_or("")),
            None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|host| format!("host:{}", host.trim()))
                .unwrap_or_else(|_| "host:".to_string()),
        }
    }

    /// Refuses a field no Kubernetes name can be (it would not fit the binary header).
    pub fn check(&self) -> Result<(), PodFieldTooLong> {
        for (variable, _, _, value) in self.fields() {
            if let Some(value) = value
                && value.len() > MAX_POD_FIELD
            {
                return Err(PodFieldTooLong { variable, len: value.len() });
            }
        }
        Ok(())
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

/// A connection's peer as envelopes carry it, rendered once when the connection is accepted.
#[derive(Debug, Clone, Default)]
pub struct PeerFragment {
    peer: Option<Peer>,
    /// `"peer":{...},`, or empty.
    json: String,
}

impl PeerFragment {
    /// `peer`, or none where the socket cannot tell (datagrams).
    pub fn new(peer: Option<Peer>) -> Self {
        let json = peer.map_or_else(String::new, |peer| {
            let mut out = String::from("\"peer\":{");
            if let Some(pid) = peer.pid {
                let _ = write!(out, "\"pid\":{pid},");
            }
            let _ = write!(out, "\"uid\":{},\"gid\":{}}},", peer.uid, peer.gid);
            out
        });
        Self { peer, json }
    }
}

/// How the app's line was embedded in a JSON envelope, and how a record is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// The line was a JSON object, embedded verbatim.
    Json,
    /// The line was text, embedded as `{"message": line}`.
    Text,
}

/// Writes envelopes for one agent process. The record id is the agent's instance and a
/// sequence: the instance is a fresh UUIDv7 per process start, so ids never repeat across
/// restarts, and the persister can use the id as the key that makes redelivery harmless.
pub struct EnvelopeWriter {
    instance: uuid::Uuid,
    /// The instance as the JSON envelope's id writes it (32 lowercase hex digits).
    instance_text: String,
    sequence: AtomicU64,
    /// The pod's part of each envelope, rendered once (and again when its labels change).
    pod: std::sync::RwLock<std::sync::Arc<PodParts>>,
    /// Whether `pod` was ever replaced: until then (and always without `[agent.pod_info]`) the
    /// write path reads `first`, without the lock.
    pod_changed: std::sync::atomic::AtomicBool,
    first: std::sync::Arc<PodParts>,
    /// [`EnvelopeKind`] as a number: `ship.envelope` may change on a reload.
    kind: AtomicU8,
    /// `namespace/name` of the pod, or the host's name ([`EnvelopeWriter::pod_identity`]).
    pod_identity: String,
}

impl EnvelopeWriter {
    /// A writer with a new instance id.
    pub fn new(pod: &PodMetadata, kind: EnvelopeKind) -> Self {
        Self::with_instance(pod, uuid::Uuid::now_v7(), kind)
    }

    /// A writer with a given instance id (tests, fuzzing).
    pub fn with_instance(pod: &PodMetadata, instance: uuid::Uuid, kind: EnvelopeKind) -> Self {
        let first = std::sync::Arc::new(PodParts::new(pod));
        let writer = Self {
            instance,
            instance_text: instance.simple().to_string(),
            sequence: AtomicU64::new(0),
            pod: std::sync::RwLock::new(first.clone()),
            pod_changed: std::sync::atomic::AtomicBool::new(false),
            first,
            kind: AtomicU8::new(0),
            pod_identity: pod.identity(),
        };
        writer.set_kind(kind);
        writer
    }

    /// Envelopes written from now on carry `pod` (its labels and annotations changed).
    pub fn set_pod(&self, pod: &PodMetadata) {
        *self.pod.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = std::sync::Arc::new(PodParts::new(pod));
        self.pod_changed.store(true, Ordering::Release);
    }

    /// The pod's part of the envelope written now.
    fn pod_parts(&self) -> std::borrow::Cow<'_, std::sync::Arc<PodParts>> {
        if self.pod_changed.load(Ordering::Acquire) {
            std::borrow::Cow::Owned(self.pod.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone())
        } else {
            std::borrow::Cow::Borrowed(&self.first)
        }
    }

    /// This process's instance id.
    pub fn instance(&self) -> &str {
        &self.instance_text
    }

    /// Bytes an envelope takes beyond its record (for a JSON envelope, before escapes).
    pub fn headroom(&self) -> usize {
        let pod = self.pod_parts();
        match self.kind() {
            EnvelopeKind::Binary => BINARY_FIXED + 12 + pod.binary.len(),
            EnvelopeKind::Json => 256 + pod.json.len(),
        }
    }
}

/// The pod's part of an envelope, rendered once per pod (and again when its labels change):
/// `"pod":{…},` for the JSON envelope, the binary header's pod flags and fields.
#[derive(Debug)]
struct PodParts {
    json: String,
    flags: u8,
    binary: Vec<u8>,
}

impl PodParts {
    fn new(pod: &PodMetadata) -> Self {
        let mut fields = Vec::new();
        let (mut flags, mut binary) = (0, Vec::new());
        for (_, key, bit, value) in pod.fields() {
            if let Some(value) = value {
                fields.push(format!("{}:{}", json_string(key), json_string(value)));
                // `check` keeps a field within MAX_POD_FIELD; a longer one (never from the
                // Downward API) is cut at a character boundary rather than break the header.
                let mut len = value.len().min(MAX_POD_FIELD);
                while !value.is_char_boundary(len) {
                    len -= 1;
                }
                flags |= bit;
                binary.extend_from_slice(&(len as u16).to_be_bytes());
                binary.extend_from_slice(&value.as_bytes()[..len]);
            }
        }
        let info = pod.info.json();
        if !info.is_empty() {
            // `{"labels":…}` without its braces: fields of the pod object. Capped at load
            // (`agent.pod_info.max_bytes`, at most 32 KiB): the header stays within u16.
            fields.push(info[1..info.len() - 1].to_string());
            flags |= flag::POD_INFO;
            binary.extend_from_slice(&(info.len() as u16).to_be_bytes());
            binary.extend_from_slice(info.as_bytes());
        }
        let json = if fields.is_empty() { String::new() } else { format!("\"pod\":{{{}}},", fields.join(",")) };
        Self { json, flags, binary }
    }
}

impl EnvelopeWriter {
    /// The encoding written from now on (a config reload may change it).
    pub fn set_kind(&self, kind: EnvelopeKind) {
        self.kind.store(kind as u8, Ordering::Relaxed);
    }

    /// The encoding written now.
    pub fn kind(&self) -> EnvelopeKind {
        if self.kind.load(Ordering::Relaxed) == EnvelopeKind::Json as u8 {
            EnvelopeKind::Json
        } else {
            EnvelopeKind::Binary
        }
    }

    /// Appends the envelope of `line` to `out`. `line` is valid UTF-8 without its newline.
    /// Appends, so that one buffer can hold many envelopes (a reader's arena: one allocation for
    /// a read's records, not one each).
    pub fn write(&self, line: &str, peer: &PeerFragment, now: DateTime<Utc>, out: &mut BytesMut) {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        match self.kind() {
            EnvelopeKind::Binary => {
                self.write_binary(self.instance.as_bytes(), sequence, line, peer.peer, now, out);
            }
            EnvelopeKind::Json => self.write_json(&self.instance_text, sequence, line, &peer.json, now, out),
        }
    }

    /// [`EnvelopeWriter::write`] for a record of a client session (`ingest::session`): its id
    /// and key time are the ones the client gave it, the same each time it is sent again.
    pub fn write_stamped(&self, line: &str, peer: &PeerFragment, stamp: &ClientStamp, out: &mut BytesMut) {
        match self.kind() {
            EnvelopeKind::Binary => self.write_binary(&stamp.instance, stamp.seq, line, peer.peer, stamp.time, out),
            EnvelopeKind::Json => {
                let instance = uuid::Uuid::from_bytes(stamp.instance).simple().to_string();
                self.write_json(&instance, stamp.seq, line, &peer.json, stamp.time, out);
            }
        }
    }

    /// Who this agent's pod is, for the instance of a client session's records
    /// ([`crate::ingest::session::session_instance`]): `namespace/name` from the Downward API, or
    /// the host's name outside Kubernetes.
    pub fn pod_identity(&self) -> &str {
        &self.pod_identity
    }

    fn write_binary(
        &self,
        instance: &[u8; 16],
        sequence: u64,
        line: &str,
        peer: Option<Peer>,
        now: DateTime<Utc>,
        out: &mut BytesMut,
    ) {
        let pod = self.pod_parts();
        let mut flags = pod.flags;
        let mut peer_len = 0;
        if let Some(peer) = peer {
            flags |= flag::PEER;
            peer_len += 8;
            if peer.pid.is_some() {
                flags |= flag::PID;
                peer_len += 4;
            }
        }
        let header = BINARY_FIXED + peer_len + pod.binary.len();
        out.reserve(header + line.len());
        out.put_u8(BINARY_VERSION);
        // At most BINARY_FIXED + 12 + 4 × (2 + MAX_POD_FIELD) + 2 + 32 KiB: below u16::MAX.
        out.put_u16(header as u16);
        out.extend_from_slice(instance);
        out.put_u64(sequence);
        out.put_i64(now.timestamp_micros());
        out.put_u8(flags);
        if let Some(peer) = peer {
            if let Some(pid) = peer.pid {
                out.put_i32(pid);
            }
            out.put_u32(peer.uid);
            out.put_u32(peer.gid);
        }
        out.extend_from_slice(&pod.binary);
        out.extend_from_slice(line.as_bytes());
    }

    fn write_json(
        &self,
        instance_text: &str,
        sequence: u64,
        line: &str,
        peer_json: &str,
        now: DateTime<Utc>,
        out: &mut BytesMut,
    ) {
        let format = if is_json_object(line) { Format::Json } else { Format::Text };
        let pod = self.pod_parts();
        out.reserve(line.len() + 160 + pod.json.len() + peer_json.len());
        out.extend_from_slice(b"{\"v\":1,\"id\":\"");
        out.extend_from_slice(instance_text.as_bytes());
        out.put_u8(b'-');
        out.extend_from_slice(itoa::Buffer::new().format(sequence).as_bytes());
        out.extend_from_slice(b"\",\"ingest_time\":\"");
        write_rfc3339_micros(now, out);
        out.extend_from_slice(b"\",");
        out.extend_from_slice(pod.json.as_bytes());
        out.extend_from_slice(peer_json.as_bytes());
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

/// A record's id as its envelope carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordId<'a> {
    /// A JSON envelope's `"id"`: `<instance>-<sequence>` as the agent writes it, or any text
    /// another producer wrote.
    Text(Cow<'a, str>),
    /// A binary envelope's instance and sequence: the same record as the text id
    /// `<instance as 32 lowercase hex digits>-<sequence>`.
    Parts {
        /// The agent instance.
        instance: [u8; 16],
        /// The record's number within it.
        sequence: u64,
    },
}

impl RecordId<'_> {
    /// The id as text: a JSON envelope's as it is, a binary one's as `<instance>-<sequence>`
    /// (the text id the JSON envelope would carry for the same record).
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            RecordId::Text(id) => Cow::Borrowed(id.as_ref()),
            RecordId::Parts { instance, sequence } => {
                Cow::Owned(format!("{}-{sequence}", uuid::Uuid::from_bytes(*instance).simple()))
            }
        }
    }
}

/// What an envelope carries besides its metadata: the record, as the persister stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body<'a> {
    /// A JSON record: its text as the app wrote it (one JSON object, syntax checked).
    Json(&'a str),
    /// A text record: its line.
    Text(Cow<'a, str>),
}

impl Body<'_> {
    /// The record as the app wrote it: a JSON record's text, a text record's line.
    pub fn written(&self) -> &str {
        match self {
            Body::Json(text) => text,
            Body::Text(line) => line,
        }
    }

    /// How the record is stored.
    pub fn format(&self) -> Format {
        match self {
            Body::Json(_) => Format::Json,
            Body::Text(_) => Format::Text,
        }
    }
}

/// An envelope as read by the persister, in either encoding; borrows from the Kafka message.
#[derive(Debug)]
pub struct Envelope<'a> {
    /// Record id, unique across agent restarts.
    pub id: RecordId<'a>,
    /// When the agent read the record.
    pub ingest_time: DateTime<Utc>,
    /// The agent's pod.
    pub pod: PodFields<'a>,
    /// The writing process.
    pub peer: Option<PeerFields>,
    /// The record.
    pub body: Body<'a>,
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
    /// The pod's labels, a JSON object (`[agent.pod_info]`).
    #[serde(borrow, default)]
    pub labels: Option<&'a RawValue>,
    /// The pod's annotations, a JSON object.
    #[serde(borrow, default)]
    pub annotations: Option<&'a RawValue>,
}

/// Labels and annotations as a binary header carries them.
#[derive(Deserialize)]
struct PodInfoFields<'a> {
    #[serde(borrow, default)]
    labels: Option<&'a RawValue>,
    #[serde(borrow, default)]
    annotations: Option<&'a RawValue>,
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
    /// A binary envelope that does not hold what its header says.
    #[error("not a sluice envelope: {0}")]
    MalformedBinary(&'static str),
    /// A version this build does not know.
    #[error("envelope version {0} is not supported (this build reads {VERSION} and {BINARY_VERSION})")]
    UnsupportedVersion(u32),
    /// A text record without its `message` string.
    #[error("text record without a message string")]
    MissingMessage,
}

impl EnvelopeError {
    /// The `reason` label of the dead-letter metric.
    pub fn reason(&self) -> DeadLetterReason {
        match self {
            EnvelopeError::Malformed(_) | EnvelopeError::MalformedBinary(_) => DeadLetterReason::MalformedEnvelope,
            EnvelopeError::UnsupportedVersion(_) => DeadLetterReason::UnsupportedVersion,
            EnvelopeError::MissingMessage => DeadLetterReason::MissingMessage,
        }
    }
}

/// A JSON envelope as serde reads it.
#[derive(Deserialize)]
struct JsonEnvelope<'a> {
    v: u32,
    #[serde(borrow)]
    id: Cow<'a, str>,
    ingest_time: DateTime<Utc>,
    #[serde(default, borrow)]
    pod: PodFields<'a>,
    #[serde(default)]
    peer: Option<PeerFields>,
    format: Format,
    #[serde(borrow)]
    record: &'a RawValue,
}

impl<'a> Envelope<'a> {
    /// Parses and checks an envelope of either encoding.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, EnvelopeError> {
        match bytes.first() {
            Some(&BINARY_VERSION) => Self::parse_binary(bytes),
            // Control characters other than JSON's whitespace: a binary envelope of a version
            // this build does not know.
            Some(&version) if version < 0x20 && !matches!(version, b'\t' | b'\n' | b'\r') => {
                Err(EnvelopeError::UnsupportedVersion(u32::from(version)))
            }
            _ => Self::parse_json(bytes),
        }
    }

    fn parse_json(bytes: &'a [u8]) -> Result<Self, EnvelopeError> {
        let envelope: JsonEnvelope<'a> = serde_json::from_slice(bytes)?;
        if envelope.v != VERSION {
            return Err(EnvelopeError::UnsupportedVersion(envelope.v));
        }
        for map in [envelope.pod.labels, envelope.pod.annotations].into_iter().flatten() {
            if !map.get().starts_with('{') {
                return Err(EnvelopeError::MalformedBinary("the pod's labels or annotations are not a JSON object"));
            }
        }
        let body = match envelope.format {
            Format::Json => Body::Json(envelope.record.get()),
            Format::Text => {
                #[derive(Deserialize)]
                struct Text<'b> {
                    #[serde(borrow)]
                    message: Cow<'b, str>,
                }
                let text: Text<'a> =
                    serde_json::from_str(envelope.record.get()).map_err(|_| EnvelopeError::MissingMessage)?;
                Body::Text(text.message)
            }
        };
        Ok(Self {
            id: RecordId::Text(envelope.id),
            ingest_time: envelope.ingest_time,
            pod: envelope.pod,
            peer: envelope.peer,
            body,
        })
    }

    fn parse_binary(bytes: &'a [u8]) -> Result<Self, EnvelopeError> {
        if bytes.len() < BINARY_FIXED {
            return Err(EnvelopeError::MalformedBinary("the message ends inside the binary header"));
        }
        let header = usize::from(u16::from_be_bytes([bytes[1], bytes[2]]));
        if header < BINARY_FIXED || header > bytes.len() {
            return Err(EnvelopeError::MalformedBinary("the binary header's length is not within the message"));
        }
        let mut reader = Reader { bytes: &bytes[3..header] };
        let instance: [u8; 16] = reader.array().ok_or_else(short)?;
        let sequence = u64::from_be_bytes(reader.array().ok_or_else(short)?);
        let micros = i64::from_be_bytes(reader.array().ok_or_else(short)?);
        let ingest_time = DateTime::from_timestamp_micros(micros)
            .ok_or(EnvelopeError::MalformedBinary("the ingest time is out of range"))?;
        let flags = reader.take(1).ok_or_else(short)?[0];
        if flags & !flag::KNOWN != 0 {
            return Err(EnvelopeError::MalformedBinary("the header has flags this build does not know"));
        }
        let pid = if flags & flag::PID != 0 {
            if flags & flag::PEER == 0 {
                return Err(EnvelopeError::MalformedBinary("a pid without a peer"));
            }
            Some(i32::from_be_bytes(reader.array().ok_or_else(short)?))
        } else {
            None
        };
        let peer = if flags & flag::PEER != 0 {
            let uid = u32::from_be_bytes(reader.array().ok_or_else(short)?);
            let gid = u32::from_be_bytes(reader.array().ok_or_else(short)?);
            Some(PeerFields { pid, uid: Some(uid), gid: Some(gid) })
        } else {
            None
        };
        let mut text = |bit: u8| -> Result<Option<Cow<'a, str>>, EnvelopeError> {
            if flags & bit == 0 {
                return Ok(None);
            }
            let len = usize::from(u16::from_be_bytes(reader.array().ok_or_else(short)?));
            let field = reader.take(len).ok_or_else(short)?;
            let field =
                std::str::from_utf8(field).map_err(|_| EnvelopeError::MalformedBinary("a pod field is not UTF-8"))?;
            Ok(Some(Cow::Borrowed(field)))
        };
        let mut pod = PodFields {
            name: text(flag::POD_NAME)?,
            namespace: text(flag::POD_NAMESPACE)?,
            container: text(flag::CONTAINER)?,
            node: text(flag::NODE)?,
            labels: None,
            annotations: None,
        };
        if let Some(info) = text(flag::POD_INFO)? {
            let Cow::Borrowed(info) = info else { unreachable!("binary fields are borrowed") };
            let fields: PodInfoFields<'a> = serde_json::from_str(info).map_err(|_| {
                EnvelopeError::MalformedBinary("the pod's labels and annotations are not a JSON object")
            })?;
            (pod.labels, pod.annotations) = (fields.labels, fields.annotations);
        }
        for map in [pod.labels, pod.annotations].into_iter().flatten() {
            if !map.get().starts_with('{') {
                return Err(EnvelopeError::MalformedBinary("the pod's labels or annotations are not a JSON object"));
            }
        }
        if !reader.bytes.is_empty() {
            return Err(EnvelopeError::MalformedBinary("the binary header is longer than its fields"));
        }
        let record = std::str::from_utf8(&bytes[header..])
            .map_err(|_| EnvelopeError::MalformedBinary("the record is not UTF-8"))?;
        let body = if is_json_object(record) { Body::Json(record) } else { Body::Text(Cow::Borrowed(record)) };
        Ok(Self { id: RecordId::Parts { instance, sequence }, ingest_time, pod, peer, body })
    }
}

/// The error for a header that ends before its fields do.
fn short() -> EnvelopeError {
    EnvelopeError::MalformedBinary("the binary header ends inside its fields")
}

/// Reads a binary header's fields in order.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < len {
            return None;
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Some(taken)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
}
