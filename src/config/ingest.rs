//! `[ingest]` and `[ingest.listeners.NAME]`: the sockets apps write to, their protocols and
//! limits.
//!
//! Owns: the section's schema and checks. Must not: bind a socket (ingest does).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use super::{At, ConfigError};

/// `[ingest]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// The sockets apps write to, by name (the `listener` label of the ingest metrics). Giving
    /// any replaces the default: one `lines` listener named `default` on
    /// `/run/sluice/sluice.sock`.
    pub listeners: BTreeMap<String, ListenerConfig>,
    /// When writers in acknowledged mode hear that a record is safe: `"spooled"` (written to
    /// the disk spool and synced per `buffer.fsync`; needs `buffer.type = "disk"`) or
    /// `"delivered"` (acknowledged by Kafka). Default: `"spooled"` with a disk buffer,
    /// `"delivered"` with a memory buffer. Applies to acknowledged lines and to Forward acks.
    pub ack_point: Option<AckPoint>,
    /// Deepest nesting accepted in a JSON record (objects and arrays); deeper ones are refused
    /// with `reason="too_deep"`. Default `64`.
    pub max_json_depth: u32,
    /// Masking for every listener without its own `redact`. Unset: none.
    pub redact: Option<RedactConfig>,
}

/// `[ingest.redact]` or `[ingest.listeners.NAME.redact]`: what is masked before a record leaves
/// the pod (docs/PROTOCOL.md, "Masking").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RedactConfig {
    /// What replaces a masked value or match: printable, no `"` or `\`, at most 64 bytes.
    /// Default `"[REDACTED]"`.
    pub mask: String,
    /// The rules, applied in order (at most 64).
    pub rules: Vec<RedactRule>,
}

impl Default for RedactConfig {
    fn default() -> Self {
        Self { mask: "[REDACTED]".into(), rules: Vec::new() }
    }
}

/// One masking rule: exactly one of `field`, `preset` and `regex`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RedactRule {
    /// The rule's name: the `rule` label of `sluice_ingest_redactions_total`
    /// (`[a-z0-9_]`, 1-64 characters).
    pub name: String,
    /// A JSON record's field, at any depth (its key as written, ASCII case-insensitive): its
    /// whole value becomes the mask, as a string.
    pub field: Option<String>,
    /// A pattern masked inside string values and text records: `"email"`, `"credit_card"`
    /// (13-19 digits passing the Luhn check), `"bearer_token"`, `"jwt"`.
    pub preset: Option<RedactPreset>,
    /// A regular expression (the `regex` crate's: linear time) masked like a preset.
    pub regex: Option<String>,
}

/// `redact.rules[].preset`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RedactPreset {
    /// E-mail addresses.
    Email,
    /// Payment card numbers (Luhn-checked).
    CreditCard,
    /// `Bearer <token>`, as an `Authorization` header writes it.
    BearerToken,
    /// JSON Web Tokens (`eyJ….….…`).
    Jwt,
}

impl RedactConfig {
    pub(super) fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        if self.mask.is_empty()
            || self.mask.len() > 64
            || self.mask.chars().any(|c| c == '"' || c == '\\' || c.is_control())
        {
            return Err(at.invalid("mask", "1-64 printable bytes without `\"` or `\\`"));
        }
        if self.rules.len() > 64 {
            return Err(at.invalid("rules", "at most 64 rules"));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, rule) in self.rules.iter().enumerate() {
            let key = |name: &str| format!("rules[{i}].{name}");
            if rule.name.is_empty()
                || rule.name.len() > 64
                || !rule.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                return Err(at.invalid(&key("name"), "[a-z0-9_], 1-64 characters (a metric label)"));
            }
            if !names.insert(&rule.name) {
                return Err(at.invalid(&key("name"), format!("`{}` names two rules", rule.name)));
            }
            let set = [rule.field.is_some(), rule.preset.is_some(), rule.regex.is_some()];
            if set.iter().filter(|set| **set).count() != 1 {
                return Err(at.invalid(&key("field"), "set exactly one of field, preset and regex"));
            }
            if rule.field.as_deref().is_some_and(|field| field.is_empty() || field.contains(['"', '\\'])) {
                return Err(at.invalid(&key("field"), "a key's name, without `\"` or `\\`"));
            }
            if let Some(pattern) = &rule.regex {
                match crate::ingest::redact::compile(pattern) {
                    Err(error) => {
                        return Err(at.invalid(
                            &key("regex"),
                            format!("not a regular expression the regex crate takes: {error}"),
                        ));
                    }
                    Ok(regex) if regex.is_match("") => {
                        return Err(at.invalid(
                            &key("regex"),
                            "matches the empty string: it would mask between every character",
                        ));
                    }
                    Ok(_) => {}
                }
            }
        }
        if let Err(error) = crate::ingest::redact::check(self) {
            return Err(at.invalid("rules", format!("the rules together are too large to match at once: {error}")));
        }
        Ok(())
    }
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            listeners: BTreeMap::from([("default".to_string(), ListenerConfig::default())]),
            ack_point: None,
            max_json_depth: 64,
            redact: None,
        }
    }
}

/// `ingest.ack_point`: the point at which a writer in acknowledged mode hears that its record
/// is safe.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AckPoint {
    /// Written to the disk spool (and synced, if `buffer.fsync` syncs).
    Spooled,
    /// Acknowledged by Kafka (acks=all).
    Delivered,
}

impl AckPoint {
    /// The word used in config and in the protocol.
    pub fn as_str(self) -> &'static str {
        match self {
            AckPoint::Spooled => "spooled",
            AckPoint::Delivered => "delivered",
        }
    }
}

/// What a listener speaks. The names are the `protocol` label of the ingest metrics.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// One record per line (stream).
    Lines,
    /// RFC 6587 octet counting, `LEN SP MSG` (stream): records may contain newlines.
    OctetCounted,
    /// One record per datagram.
    Datagram,
    /// Syslog, RFC 5424 or RFC 3164, parsed into fields (datagram, or stream with newline or
    /// octet-counted framing).
    Syslog,
    /// Fluentd's Forward protocol (msgpack; Message, Forward, PackedForward and
    /// CompressedPackedForward modes; chunk acks) (stream).
    Forward,
    /// OpenTelemetry's OTLP logs: gRPC `LogsService/Export` and HTTP `POST /v1/logs` (protobuf
    /// or JSON, gzip), on the Unix socket and on pod loopback (`addresses`); every Export is
    /// acknowledged (stream).
    Otlp,
}

impl Protocol {
    /// The name used in config and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Lines => "lines",
            Protocol::OctetCounted => "octet_counted",
            Protocol::Datagram => "datagram",
            Protocol::Syslog => "syslog",
            Protocol::Forward => "forward",
            Protocol::Otlp => "otlp",
        }
    }
}

/// Socket type.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// `SOCK_STREAM`: connections.
    Stream,
    /// `SOCK_DGRAM`: one message per datagram.
    Datagram,
}

/// `read_interval`'s default: the writer's socket holds about 250 small writes, 25 ms of them at
/// 10,000 writes/s; a tick every 5 ms leaves room for bursts five times that rate
/// (`ship.linger`, 20 ms by default, adds its wait after the read).
pub const DEFAULT_READ_INTERVAL: Duration = Duration::from_millis(5);

/// Longest `read_interval`: the kernel holds about 250 small writes per connection; a writer
/// whose rate jumps above 250 writes per tick would wait for the next tick.
pub const MAX_READ_INTERVAL: Duration = Duration::from_millis(20);

/// `[ingest.listeners.NAME]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ListenerConfig {
    /// What the socket speaks. Default `"lines"`.
    pub protocol: Protocol,
    /// Path of the Unix socket. Its directory is created. Default `"/run/sluice/sluice.sock"`.
    pub socket: PathBuf,
    /// `"stream"` or `"datagram"`; only `syslog` offers a choice (default `"datagram"`, what
    /// `logger -u` and most syslog libraries send). Unset: the protocol's own.
    pub transport: Option<Transport>,
    /// Permission bits set on the socket after bind, as an octal string. Never world-writable
    /// unless you write so. Default `"0660"`.
    pub socket_mode: String,
    /// Group (name or number) given to the socket after bind, e.g. the app's group. Unset: the
    /// agent's own group.
    pub socket_group: Option<String>,
    /// Longest accepted record (a line, a frame, a datagram, a Forward message). A longer one is
    /// discarded and counted with `reason="too_large"`. Default `1 MiB`.
    pub max_record_size: ByteSize,
    /// Most connections open at once; more are accepted and closed at once, counted with
    /// `reason="max_connections"`. Default `1024`.
    pub max_connections: u32,
    /// A connection that sends nothing for this long is closed (`reason="idle"`). `"forever"`
    /// keeps idle connections. Default `"10m"`.
    #[serde(with = "super::serde_helpers::duration_or_forever")]
    pub idle_timeout: Option<Duration>,
    /// Stream connections: while a connection is busy its socket is read in ticks at most this
    /// far apart, instead of waking the agent for every `write()` (see `src/ingest/paced.rs`);
    /// a record waits at most this long before it is read. The socket holds about 250 writes
    /// between ticks; a writer bursting more within one tick waits for it. `"0s"`: read each
    /// write as it comes. Default `"5ms"`.
    #[serde(with = "humantime_serde")]
    pub read_interval: Duration,
    /// Only these peer uids may write (checked with `SO_PEERCRED`); empty: anyone who can open
    /// the socket. A denied peer is closed and counted (`reason="peer_denied"`).
    pub allow_uids: Vec<u32>,
    /// Only peers with one of these gids may write; empty: any.
    pub allow_gids: Vec<u32>,
    /// Token buckets per connection or per peer. Unset: no rate limit.
    pub rate_limit: Option<RateLimitConfig>,
    /// `otlp` only: TCP addresses on the pod's loopback served beside the Unix socket, each
    /// answering gRPC and HTTP alike. Unset: `["127.0.0.1:4317", "127.0.0.1:4318"]`, the
    /// OpenTelemetry SDKs' default endpoints; `[]`: the Unix socket only. Loopback addresses
    /// only, and refused where the pod shares the node's network (`allow_host_network`).
    pub addresses: Option<Vec<SocketAddr>>,
    /// `otlp` only: bind `addresses` even where the pod shares the node's network
    /// (`hostNetwork: true`, seen as `POD_IP` = `HOST_IP`), where every process on the node can
    /// reach them. Default `false`.
    pub allow_host_network: bool,
    /// `otlp` only: largest Export request, as sent and once inflated (gzip); a larger one is
    /// refused whole (HTTP 413, gRPC `RESOURCE_EXHAUSTED`) and counted `too_large`. Each record
    /// in it is still bounded by `max_record_size`. Default `4 MiB` (gRPC's own default).
    pub max_message_size: ByteSize,
    /// `otlp` only: longest an Export waits — for its turn, for buffer room (`when_full =
    /// "block"`), for a rate limit (`throttle`) and for its records to reach
    /// `ingest.ack_point` — before it is answered "retry later" (gRPC `UNAVAILABLE` with
    /// `RetryInfo`, HTTP 503 with `Retry-After`). Below the SDKs' own 10 s timeout. Default
    /// `"8s"`.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
    /// `lines` only: join continuation lines into one record (stack traces). Unset: one record
    /// per line.
    pub multiline: Option<MultilineConfig>,
    /// This listener's masking, in place of `ingest.redact`. Unset: `ingest.redact`.
    pub redact: Option<RedactConfig>,
}

/// `[ingest.listeners.NAME.multiline]`: which lines continue the record before them. Exactly
/// one of `preset`, `start` and `continuation`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MultilineConfig {
    /// `"java"` (exceptions, `Caused by:`, frames: every JVM logger's stack trace), `"python"`
    /// (tracebacks, chained ones too, after the message `logging.exception` writes), `"go"`
    /// (panics and `fatal error:` with their goroutines).
    pub preset: Option<MultilinePreset>,
    /// A regular expression (the `regex` crate's: linear time): a line matching it begins a
    /// record; every other line continues the record before it.
    pub start: Option<String>,
    /// A regular expression: a line matching it continues the record before it; every other
    /// line begins a record.
    pub continuation: Option<String>,
    /// Most lines in one record; the next line then begins a record of its own (counted in
    /// `sluice_ingest_records_split_total{reason="max_lines"}`). Default `500`.
    pub max_lines: u32,
    /// Most bytes in one record (at most the listener's `max_record_size`); likewise cut
    /// (`reason="max_bytes"`). Unset: `256 KiB`, or `max_record_size` if smaller.
    pub max_bytes: Option<ByteSize>,
    /// A record whose next line has not come after this long is handed on (the last record of
    /// a burst is not held). Default `"1s"`.
    #[serde(with = "humantime_serde")]
    pub flush_timeout: Duration,
}

impl Default for MultilineConfig {
    fn default() -> Self {
        Self {
            preset: None,
            start: None,
            continuation: None,
            max_lines: 500,
            max_bytes: None,
            flush_timeout: Duration::from_secs(1),
        }
    }
}

/// `multiline.preset`: a language's stack traces.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MultilinePreset {
    /// JVM exceptions.
    Java,
    /// Python tracebacks.
    Python,
    /// Go panics.
    Go,
}

/// The loopback addresses an `otlp` listener serves when `addresses` is unset: the OpenTelemetry
/// SDKs' default gRPC and HTTP endpoints.
pub const OTLP_DEFAULT_ADDRESSES: [&str; 2] = ["127.0.0.1:4317", "127.0.0.1:4318"];

/// `max_message_size`'s default.
pub const OTLP_DEFAULT_MESSAGE_SIZE: u64 = 4 * 1024 * 1024;

/// `export_timeout`'s default.
pub const OTLP_DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(8);

impl Default for ListenerConfig {
    fn default() -> Self {
        Self {
            protocol: Protocol::Lines,
            socket: PathBuf::from("/run/sluice/sluice.sock"),
            transport: None,
            socket_mode: "0660".into(),
            socket_group: None,
            max_record_size: ByteSize::mib(1),
            max_connections: 1024,
            idle_timeout: Some(Duration::from_secs(600)),
            read_interval: DEFAULT_READ_INTERVAL,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            rate_limit: None,
            addresses: None,
            allow_host_network: false,
            max_message_size: ByteSize::b(OTLP_DEFAULT_MESSAGE_SIZE),
            export_timeout: OTLP_DEFAULT_EXPORT_TIMEOUT,
            multiline: None,
            redact: None,
        }
    }
}

impl ListenerConfig {
    /// The socket mode as permission bits (validated at load).
    pub fn socket_mode_bits(&self) -> u32 {
        parse_mode(&self.socket_mode).unwrap_or(0o660)
    }

    /// The socket type this listener uses.
    pub fn transport(&self) -> Transport {
        match (self.protocol, self.transport) {
            (Protocol::Datagram, _) => Transport::Datagram,
            (Protocol::Syslog, transport) => transport.unwrap_or(Transport::Datagram),
            _ => Transport::Stream,
        }
    }

    /// `max_record_size` in bytes.
    pub fn max_record_bytes(&self) -> usize {
        usize::try_from(self.max_record_size.as_u64()).unwrap_or(usize::MAX)
    }

    /// `max_message_size` in bytes.
    pub fn max_message_bytes(&self) -> usize {
        usize::try_from(self.max_message_size.as_u64()).unwrap_or(usize::MAX)
    }

    /// The TCP addresses this listener serves: `otlp`'s (its default where unset), none for the
    /// other protocols.
    pub fn tcp_addresses(&self) -> Vec<SocketAddr> {
        match (self.protocol, &self.addresses) {
            (Protocol::Otlp, Some(addresses)) => addresses.clone(),
            (Protocol::Otlp, None) => {
                OTLP_DEFAULT_ADDRESSES.iter().filter_map(|address| address.parse().ok()).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// `[ingest.listeners.NAME.rate_limit]`: token buckets (governor) in records/s and bytes/s.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// Sustained records per second; unset: no record limit.
    pub records_per_second: Option<u32>,
    /// Sustained bytes per second; unset: no byte limit.
    pub bytes_per_second: Option<ByteSize>,
    /// How far above the rate a writer may burst, in seconds of rate. Default `1s`.
    #[serde(with = "humantime_serde")]
    pub burst: Duration,
    /// `"connection"`: a bucket per connection; `"peer"`: per writing uid (all its connections
    /// share it). Default `"connection"`.
    pub key: RateLimitKey,
    /// `"throttle"`: stop reading that writer until tokens return (backpressure to it alone);
    /// `"drop"`: read and discard, counted as `reason="rate_limited"`. Default `"throttle"`.
    pub action: RateLimitAction,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            records_per_second: None,
            bytes_per_second: None,
            burst: Duration::from_secs(1),
            key: RateLimitKey::Connection,
            action: RateLimitAction::Throttle,
        }
    }
}

/// What a rate limit bucket belongs to.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitKey {
    /// One bucket per connection.
    Connection,
    /// One bucket per writing uid.
    Peer,
}

/// What exceeding a rate limit does.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitAction {
    /// Stop reading until tokens return.
    Throttle,
    /// Discard and count.
    Drop,
}

impl ListenerConfig {
    /// The `otlp`-only keys: set only there, and within their bounds.
    fn validate_otlp(&self, at: &At<'_>) -> Result<(), ConfigError> {
        if self.protocol != Protocol::Otlp {
            let defaults = ListenerConfig::default();
            let set = [
                ("addresses", self.addresses.is_some()),
                ("allow_host_network", self.allow_host_network),
                ("max_message_size", self.max_message_size != defaults.max_message_size),
                ("export_timeout", self.export_timeout != defaults.export_timeout),
            ];
            if let Some((key, _)) = set.iter().find(|(_, set)| *set) {
                return Err(
                    at.invalid(key, format!("applies to protocol = \"otlp\" only, not {}", self.protocol.as_str()))
                );
            }
            return Ok(());
        }
        if let Some(address) = self.tcp_addresses().iter().find(|address| !address.ip().is_loopback()) {
            return Err(at.invalid(
                "addresses",
                format!(
                    "{address} is not a loopback address: an OTLP listener serves its own pod only (127.0.0.1, ::1)"
                ),
            ));
        }
        if !self.tcp_addresses().is_empty() {
            // TCP carries no peer credentials.
            let peer_keys = [
                ("allow_uids", !self.allow_uids.is_empty()),
                ("allow_gids", !self.allow_gids.is_empty()),
                ("rate_limit.key", self.rate_limit.as_ref().is_some_and(|limit| limit.key == RateLimitKey::Peer)),
            ];
            if let Some((key, _)) = peer_keys.iter().find(|(_, set)| *set) {
                return Err(at.invalid(
                    key,
                    "a TCP connection carries no peer credentials: set addresses = [] to serve the Unix socket only",
                ));
            }
        }
        let message = self.max_message_size.as_u64();
        if !(1024..=64 * 1024 * 1024).contains(&message) {
            return Err(at.invalid("max_message_size", "must be between 1 KiB and 64 MiB"));
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&self.export_timeout) {
            return Err(at.invalid("export_timeout", "must be between 100ms and 60s (the SDKs give up after 10s)"));
        }
        Ok(())
    }
}

impl MultilineConfig {
    /// `max_bytes` for a listener whose records are at most `max_record_size`.
    pub fn max_bytes(&self, max_record_size: ByteSize) -> usize {
        let max = self.max_bytes.unwrap_or(ByteSize::kib(256).min(max_record_size));
        usize::try_from(max.as_u64()).unwrap_or(usize::MAX)
    }

    fn validate(&self, at: &At<'_>, max_record_size: ByteSize) -> Result<(), ConfigError> {
        let rules = [self.preset.is_some(), self.start.is_some(), self.continuation.is_some()];
        if rules.iter().filter(|set| **set).count() != 1 {
            return Err(at.invalid("preset", "set exactly one of preset, start and continuation"));
        }
        for (key, pattern) in [("start", &self.start), ("continuation", &self.continuation)] {
            if let Some(pattern) = pattern
                && let Err(error) = regex::bytes::RegexBuilder::new(pattern).size_limit(1 << 20).build()
            {
                return Err(at.invalid(key, format!("not a regular expression the regex crate takes: {error}")));
            }
        }
        if self.max_lines < 2 {
            return Err(at.invalid("max_lines", "must be at least 2 (1 joins nothing)"));
        }
        if self.max_bytes.is_some_and(|max| max.as_u64() < 64 || max > max_record_size) {
            return Err(at.invalid("max_bytes", "must be between 64 B and the listener's max_record_size"));
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(60)).contains(&self.flush_timeout) {
            return Err(at.invalid("flush_timeout", "must be between 10ms and 60s"));
        }
        Ok(())
    }
}

/// Highest rate a limit may name (governor counts in nanoseconds per token).
const MAX_RATE: u64 = 1_000_000_000;

fn parse_mode(text: &str) -> Option<u32> {
    let bits = u32::from_str_radix(text.trim_start_matches("0o"), 8).ok()?;
    (bits <= 0o777).then_some(bits)
}

impl IngestConfig {
    /// Checks what types alone cannot.
    pub(super) fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        if self.listeners.is_empty() {
            return Err(at.invalid("listeners", "must name at least one listener"));
        }
        let mut sockets = BTreeSet::new();
        let mut addresses = BTreeSet::new();
        for (name, listener) in &self.listeners {
            if listener.tcp_addresses().iter().any(|address| !addresses.insert(*address)) {
                return Err(
                    at.invalid(&format!("listeners.{name}.addresses"), "must be addresses no other listener uses")
                );
            }
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
                return Err(at.invalid(&format!("listeners.{name}"), "a listener name is [A-Za-z0-9_-]+"));
            }
            if listener.socket.as_os_str().is_empty() || !sockets.insert(listener.socket.clone()) {
                return Err(at.invalid(&format!("listeners.{name}.socket"), "must be a path no other listener uses"));
            }
            listener.validate(&at.within(&format!("listeners.{name}")))?;
        }
        if self.max_json_depth == 0 {
            return Err(at.invalid("max_json_depth", "must be at least 1"));
        }
        if let Some(redact) = &self.redact {
            redact.validate(&at.within("redact"))?;
        }
        Ok(())
    }
}

impl ListenerConfig {
    /// Checks what types alone cannot (the socket's uniqueness is the section's to check).
    fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        if parse_mode(&self.socket_mode).is_none() {
            return Err(
                at.invalid("socket_mode", format!("`{}` is not an octal permission like \"0660\"", self.socket_mode))
            );
        }
        match (self.protocol, self.transport) {
            (Protocol::Syslog, _) | (_, None) => {}
            (Protocol::Datagram, Some(Transport::Datagram)) => {}
            (
                Protocol::Lines | Protocol::OctetCounted | Protocol::Forward | Protocol::Otlp,
                Some(Transport::Stream),
            ) => {}
            (protocol, Some(_)) => {
                return Err(at.invalid(
                    "transport",
                    format!("{} has one transport; only syslog offers a choice", protocol.as_str()),
                ));
            }
        }
        let record = self.max_record_size.as_u64();
        if !(64..=64 * 1024 * 1024).contains(&record) {
            return Err(at.invalid("max_record_size", "must be between 64 B and 64 MiB"));
        }
        if self.transport() == Transport::Datagram {
            if record > 16 * 1024 * 1024 {
                return Err(at.invalid("max_record_size", "a datagram listener takes at most 16 MiB"));
            }
            if !self.allow_uids.is_empty() {
                return Err(at.invalid("allow_uids", "datagram sockets carry no peer credentials"));
            }
            if !self.allow_gids.is_empty() {
                return Err(at.invalid("allow_gids", "datagram sockets carry no peer credentials"));
            }
            if self.rate_limit.as_ref().is_some_and(|limit| limit.key == RateLimitKey::Peer) {
                return Err(at.invalid(
                    "rate_limit.key",
                    "datagram sockets carry no peer credentials; use \"connection\" (one bucket per socket)",
                ));
            }
        }
        if self.max_connections == 0 {
            return Err(at.invalid("max_connections", "must be at least 1"));
        }
        self.validate_otlp(at)?;
        if let Some(multiline) = &self.multiline {
            if self.protocol != Protocol::Lines {
                return Err(at.invalid("multiline", "applies to protocol = \"lines\" only"));
            }
            multiline.validate(&at.within("multiline"), self.max_record_size)?;
        }
        if let Some(redact) = &self.redact {
            redact.validate(&at.within("redact"))?;
        }
        if self.read_interval > MAX_READ_INTERVAL {
            return Err(at.invalid(
                "read_interval",
                "must be at most 20ms (a connection's socket holds about 250 writes between two reads)",
            ));
        }
        if self.idle_timeout.is_some_and(|timeout| timeout.is_zero()) {
            return Err(at.invalid("idle_timeout", "must be greater than zero (or \"forever\")"));
        }
        if let Some(limit) = &self.rate_limit {
            if limit.records_per_second.is_none() && limit.bytes_per_second.is_none() {
                return Err(at.invalid("rate_limit", "needs records_per_second or bytes_per_second"));
            }
            let rates = [limit.records_per_second.map(u64::from), limit.bytes_per_second.map(|b| b.as_u64())];
            if rates.into_iter().flatten().any(|rate| !(1..=MAX_RATE).contains(&rate)) {
                return Err(at.invalid("rate_limit", format!("rates must be between 1 and {MAX_RATE} per second")));
            }
            if limit.burst.is_zero() {
                return Err(at.invalid("rate_limit.burst", "must be greater than zero"));
            }
        }
        Ok(())
    }
}
