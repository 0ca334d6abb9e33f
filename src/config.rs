//! Configuration: one TOML file, `SLUICE_SECTION__KEY` environment overrides, merged once into a
//! validated [`Config`] that every other module reads and none re-parses.
//!
//! Owns: the schema (every key, its type, its default), validation that names the key and the
//! file, and redaction of secrets for display. Must not: read the environment or files anywhere
//! else, or let an unknown key pass silently (a typo in a limit must not become "no limit").
//!
//! The same schema serves `sluice agent` and `sluice persist`, so one file (like
//! `config/demo.toml`) can run both; each process reads only the sections it needs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};

pub mod postgres;
pub mod reload;

use self::postgres::redact_url_password;

#[cfg(test)]
mod tests;

/// Prefix of environment variables that override file values: `SLUICE_KAFKA__BROKERS=...`
/// sets `kafka.brokers`. Only names with a `__` section separator are read, so unrelated
/// `SLUICE_*` variables (the test stack's `SLUICE_TEST_KAFKA`) are not mistaken for keys.
pub const ENV_PREFIX: &str = "SLUICE_";

/// What replaces a secret when the config is shown (`check-config`, logs).
pub const REDACTED: &str = "<redacted>";

/// A configuration problem, always naming the key and where it came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or parsed, or a key is unknown or has the wrong type.
    #[error("{file}: {message}")]
    Parse {
        /// The config file (or "environment" when an override is at fault).
        file: String,
        /// Figment's description, which names the key.
        message: String,
    },
    /// A key parsed but its value is not acceptable.
    #[error("{file}: key `{key}`: {message}")]
    Invalid {
        /// The config file.
        file: String,
        /// Dotted key path, e.g. `buffer.max_bytes`.
        key: String,
        /// What is wrong and what would be right.
        message: String,
    },
}

/// The whole validated configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Logging of the sluice process itself.
    pub log: LogConfig,
    /// Kafka connection shared by the agent's producer and the persister's consumer.
    pub kafka: KafkaConfig,
    /// `sluice agent`: process-level settings.
    pub agent: AgentConfig,
    /// `sluice agent`: the socket apps write to.
    pub ingest: IngestConfig,
    /// `sluice agent`: the bounded buffer between the socket and Kafka.
    pub buffer: BufferConfig,
    /// `sluice agent`: how records are produced to Kafka.
    pub ship: ShipConfig,
    /// `sluice persist`: the consumer group that writes to PostgreSQL.
    pub persist: PersistConfig,
    /// `sluice persist`: the database.
    pub postgres: PostgresConfig,
}

/// `[log]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter directive, e.g. `"info"` or `"info,sluice::ship=debug"`. Default `"info"`.
    pub level: String,
    /// `"text"` for people, `"json"` for log collectors, `"auto"`: JSON unless stderr is a
    /// terminal. Default `"auto"`.
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { level: "info".into(), format: LogFormat::Auto }
    }
}

/// How sluice's own log lines are written.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// JSON unless stderr is a terminal.
    Auto,
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[kafka]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, comma-separated `host:port`. Default `"127.0.0.1:9092"`.
    pub brokers: String,
    /// The topic the agent produces to and the persister consumes. Default `"sluice-logs"`.
    pub topic: String,
    /// librdkafka properties passed through to both producer and consumer (TLS, SASL, ...).
    /// Keys that sluice manages itself (acks, idempotence, queue sizes, ...) are rejected here
    /// and must be set through their own key. Values of keys that look secret are redacted
    /// when shown.
    pub properties: BTreeMap<String, String>,
    /// librdkafka properties whose values are secrets, read from environment variables (a
    /// Kubernetes Secret) at start: property name → variable name, e.g.
    /// `"sasl.password" = "SLUICE_KAFKA_SASL_PASSWORD"`. A missing variable is a config error.
    pub properties_from_env: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            topic: "sluice-logs".into(),
            properties: BTreeMap::new(),
            properties_from_env: BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    /// `properties` and the values of `properties_from_env`, for a librdkafka client.
    pub fn client_properties(&self) -> BTreeMap<String, String> {
        let mut properties = self.properties.clone();
        for (property, variable) in &self.properties_from_env {
            if let Ok(value) = std::env::var(variable) {
                properties.insert(property.clone(), value);
            }
        }
        properties
    }
}

/// `[agent]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Address of the admin HTTP server (`/metrics`, `/healthz`, `/readyz`, `/config`). Default `"127.0.0.1:9464"`.
    pub admin_listen: String,
    /// Serve `/config` (the running config, secrets redacted) on the admin server: `true` or
    /// `false`. Unset (the default): only when `admin_listen` is a loopback address; elsewhere
    /// `/config` answers 403 saying how to enable it.
    pub admin_config_endpoint: Option<bool>,
    /// On SIGTERM, how long to keep shipping buffered records before giving up on them.
    /// Keep it below the pod's `terminationGracePeriodSeconds`. Default `20s`.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            admin_listen: "127.0.0.1:9464".into(),
            admin_config_endpoint: None,
            drain_timeout: Duration::from_secs(20),
        }
    }
}

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
    pub ack_point: Option<AckPointConfig>,
    /// Deepest nesting accepted in a JSON record (objects and arrays); deeper ones are refused
    /// with `reason="too_deep"`. Default `64`.
    pub max_json_depth: u32,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            listeners: BTreeMap::from([("default".to_string(), ListenerConfig::default())]),
            ack_point: None,
            max_json_depth: 64,
        }
    }
}

/// `ingest.ack_point`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AckPointConfig {
    /// In the disk spool.
    Spooled,
    /// Acknowledged by Kafka.
    Delivered,
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
    #[serde(with = "block_timeout_serde")]
    pub idle_timeout: Option<Duration>,
    /// Only these peer uids may write (checked with `SO_PEERCRED`); empty: anyone who can open
    /// the socket. A denied peer is closed and counted (`reason="peer_denied"`).
    pub allow_uids: Vec<u32>,
    /// Only peers with one of these gids may write; empty: any.
    pub allow_gids: Vec<u32>,
    /// Token buckets per connection or per peer. Unset: no rate limit.
    pub rate_limit: Option<RateLimitConfig>,
}

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
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            rate_limit: None,
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

/// Highest rate a limit may name (governor counts in nanoseconds per token).
const MAX_RATE: u64 = 1_000_000_000;

fn parse_mode(text: &str) -> Option<u32> {
    let bits = u32::from_str_radix(text.trim_start_matches("0o"), 8).ok()?;
    (bits <= 0o777).then_some(bits)
}

/// `[buffer]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BufferConfig {
    /// `"memory"`: records live in memory until Kafka acknowledges them (lost if the agent is
    /// killed). `"disk"`: every record is also written to a spool on disk and sent again after a
    /// restart until Kafka acknowledges it. Default `"memory"`.
    #[serde(rename = "type")]
    pub kind: BufferKind,
    /// Memory budget for records between the socket and a Kafka acknowledgement: a fifth is
    /// librdkafka's queue ([`crate::buffer::LIBRDKAFKA_SHARE`]; at least
    /// [`Config::largest_message`]), the rest holds records — queued, in flight, read back from
    /// the spool — each charged its size plus [`crate::buffer::RECORD_OVERHEAD`]. At least twice
    /// the largest message. Default `64 MiB`.
    pub max_bytes: ByteSize,
    /// Most records held in memory, for the same span. Default `200000`.
    pub max_records: u32,
    /// What a full buffer does to a new record (for `"disk"`: a full spool, `max_disk_bytes`).
    /// Default `"block"`, bounded by `block_timeout`.
    pub when_full: WhenFull,
    /// Under `when_full = "block"`: how long a writer may be held before its record is dropped
    /// and counted (`reason="block_timeout"`). After that the connection's new records are
    /// dropped at once while the buffer stays full, so a stalled Kafka holds an app at most this
    /// long per episode, not per record. `"forever"` blocks as long as it takes. Default `1s`.
    #[serde(with = "block_timeout_serde")]
    pub block_timeout: Option<Duration>,
    /// `"disk"`: the spool directory (created). Default `"/var/lib/sluice/spool"`.
    pub path: PathBuf,
    /// `"disk"`: cap on the spool's files. At least 1 MiB. Default `256 MiB`.
    pub max_disk_bytes: ByteSize,
    /// `"disk"`: when writes are forced to stable storage: `"never"` (the OS decides; survives
    /// a crash of sluice, not of the machine), `"always"` (before a record counts as spooled; one
    /// fsync covers every record written meanwhile), or an interval such as `"10ms"`.
    /// Default `"100ms"`.
    pub fsync: FsyncPolicy,
}

impl Default for BufferConfig {
    fn default() -> Self {
        Self {
            kind: BufferKind::Memory,
            max_bytes: ByteSize::mib(64),
            max_records: 200_000,
            when_full: WhenFull::Block,
            block_timeout: Some(Duration::from_secs(1)),
            path: PathBuf::from("/var/lib/sluice/spool"),
            max_disk_bytes: ByteSize::mib(256),
            fsync: FsyncPolicy::Interval(Duration::from_millis(100)),
        }
    }
}

/// Where buffered records live.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// Memory only.
    Memory,
    /// Memory in front of a disk spool.
    Disk,
}

/// `buffer.fsync`: `"never"`, `"always"`, or an interval like `"10ms"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Never force writes.
    Never,
    /// Force at most this long after a write.
    Interval(Duration),
    /// Force before a record counts as spooled (group commit).
    Always,
}

impl std::fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsyncPolicy::Never => f.write_str("never"),
            FsyncPolicy::Always => f.write_str("always"),
            FsyncPolicy::Interval(every) => write!(f, "{}", humantime::format_duration(*every)),
        }
    }
}

impl Serialize for FsyncPolicy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FsyncPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            "never" => Ok(FsyncPolicy::Never),
            "always" => Ok(FsyncPolicy::Always),
            interval => humantime::parse_duration(interval).map(FsyncPolicy::Interval).map_err(|_| {
                serde::de::Error::custom(format!("`{text}` is not \"never\", \"always\" or an interval like \"10ms\""))
            }),
        }
    }
}

/// `block_timeout`: a duration, or `"forever"` for no limit.
mod block_timeout_serde {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => serializer.collect_str(&humantime::format_duration(*duration)),
            None => serializer.serialize_str("forever"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text == "forever" {
            return Ok(None);
        }
        humantime::parse_duration(&text)
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("`{text}` is not a duration like \"1s\" or \"forever\"")))
    }
}

/// What happens to a new record when the buffer is full. The variant names are the metric's
/// `reason` label for records dropped by policy.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    /// The connection's reader waits for room: it stops reading, the kernel socket buffer fills
    /// and the writer's `write()` blocks (or returns `EAGAIN` when non-blocking) — for at most
    /// `block_timeout`, then records are dropped with `reason="block_timeout"`.
    Block,
    /// The new record is discarded and counted (`reason="drop_newest"`); reading never stops.
    DropNewest,
    /// The oldest records not yet handed to Kafka are discarded to make room and counted
    /// (`reason="drop_oldest"`); for `"disk"`, the oldest spool segment. Reading never stops.
    DropOldest,
}

impl WhenFull {
    /// The name used in config, logs and docs; a drop under `drop_newest` or `drop_oldest` is
    /// counted with the same word.
    pub fn as_str(self) -> &'static str {
        match self {
            WhenFull::Block => "block",
            WhenFull::DropNewest => crate::telemetry::outcome::Dropped::DropNewest.as_str(),
            WhenFull::DropOldest => crate::telemetry::outcome::Dropped::DropOldest.as_str(),
        }
    }
}

/// `[ship]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ShipConfig {
    /// `compression.type`: `none`, `gzip`, `snappy`, `lz4` or `zstd`. Default `"zstd"`.
    pub compression: String,
    /// How long librdkafka waits to fill a batch (`linger.ms`). Default `5ms`.
    #[serde(with = "humantime_serde")]
    pub linger: Duration,
    /// Largest batch per partition request (`batch.size`). Default `1 MiB`.
    pub batch_size: ByteSize,
    /// How long librdkafka may try one send before reporting it failed (`message.timeout.ms`).
    /// A record that times out is put back into the buffer and sent again, never dropped.
    /// Default `2m`.
    #[serde(with = "humantime_serde")]
    pub delivery_timeout: Duration,
    /// The Kafka message key: `"none"`, `"pod_name"`, or `"field"` (the JSON record's top-level
    /// field named by `key_field`). Default `"none"`.
    pub key: KeySource,
    /// The field used when `key = "field"`. Records without it are sent without a key.
    pub key_field: Option<String>,
    /// librdkafka properties for the producer only, applied after `kafka.properties`.
    pub properties: BTreeMap<String, String>,
}

impl Default for ShipConfig {
    fn default() -> Self {
        Self {
            compression: "zstd".into(),
            linger: Duration::from_millis(5),
            batch_size: ByteSize::mib(1),
            delivery_timeout: Duration::from_secs(120),
            key: KeySource::None,
            key_field: None,
            properties: BTreeMap::new(),
        }
    }
}

/// Where a record's Kafka key comes from.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    /// No key: librdkafka spreads records over partitions.
    None,
    /// The pod name from the Downward API (`POD_NAME`): one pod's records stay in order.
    PodName,
    /// A top-level field of JSON records (`ship.key_field`).
    Field,
}

/// `[persist]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PersistConfig {
    /// Address of the persister's admin HTTP server. Default `"127.0.0.1:9465"`.
    pub admin_listen: String,
    /// Serve `/config` on the admin server: as `agent.admin_config_endpoint`. Unset (the
    /// default): only when `admin_listen` is a loopback address.
    pub admin_config_endpoint: Option<bool>,
    /// On SIGTERM, how long to write the batches in hand (retrying if PostgreSQL fails); what is
    /// not written by then is re-read by the next owner. The final offset commit and the
    /// consumer's close then get up to 5 s more (`persist::CLOSE_TIMEOUT`). Default `20s`.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Kafka consumer group. Default `"sluice-persist"`.
    pub group_id: String,
    /// A batch is written when it holds this many records... Default `5000`.
    pub batch_max_records: usize,
    /// ...or this many bytes of Kafka message values (a batch is closed before a message that
    /// would take it past this; one message larger than this is written alone)... Default
    /// `16 MiB`.
    pub batch_max_bytes: ByteSize,
    /// ...or when its first record has waited this long. Default `500ms`.
    #[serde(with = "humantime_serde")]
    pub batch_max_wait: Duration,
    /// PostgreSQL connections writing batches at the same time, each for a fixed share of the
    /// partitions (partition number modulo `writers`), so a partition's offsets are stored in
    /// order. Reading and parsing go on while they write. Memory: up to three batches per
    /// writer (one being filled, one waiting, one being written). Default `2`.
    pub writers: usize,
    /// Day partitions older than this many days are dropped; `0` keeps everything. Default `14`.
    pub retention_days: u32,
    /// Day partitions are created this many days ahead. Default `3`.
    pub partitions_ahead_days: u32,
    /// A record whose `ingest_time` is further ahead of this persister's clock than this is kept
    /// in `dead_letters` (`reason="ingest_time_in_future"`) instead of `logs`: an agent with a
    /// wrong clock must not create day partitions years ahead. (A record older than
    /// `retention_days` is a dead letter too, `reason="expired"`.) Default `1d`.
    #[serde(with = "humantime_serde")]
    pub max_clock_skew: Duration,
    /// librdkafka properties for the consumer only, applied after `kafka.properties`.
    pub properties: BTreeMap<String, String>,
}

impl Default for PersistConfig {
    fn default() -> Self {
        Self {
            admin_listen: "127.0.0.1:9465".into(),
            admin_config_endpoint: None,
            drain_timeout: Duration::from_secs(20),
            group_id: "sluice-persist".into(),
            batch_max_records: 5000,
            batch_max_bytes: ByteSize::mib(16),
            batch_max_wait: Duration::from_millis(500),
            writers: 2,
            retention_days: 14,
            partitions_ahead_days: 3,
            max_clock_skew: Duration::from_secs(24 * 3600),
            properties: BTreeMap::new(),
        }
    }
}

/// `[postgres]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// Connection URL, `postgres://user:password@host:port/db`. The password is redacted when
    /// shown; prefer `SLUICE_POSTGRES__URL` from a Secret. Default
    /// `"postgres://postgres@127.0.0.1:5432/sluice"`.
    pub url: String,
    /// Schema holding sluice's tables (created if missing). A plain lower-case identifier.
    /// Default `"sluice"`.
    pub schema: String,
    /// How long one connection attempt may take. Default `10s`.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// The CA certificate (PEM) that signed the server's certificate, when it is not one the
    /// system trusts. TLS follows the URL's `sslmode`: `disable`, `prefer` or `require`. A URL
    /// without `sslmode` means `require` when `ca_file` is set and `prefer` (TLS when the server
    /// offers it, plaintext otherwise) when not. With TLS the certificate and host name are
    /// always verified (libpq's `verify-full`). `sluice check-config` says which applies.
    pub ca_file: Option<PathBuf>,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/sluice".into(),
            schema: "sluice".into(),
            connect_timeout: Duration::from_secs(10),
            ca_file: None,
        }
    }
}

/// librdkafka properties that sluice sets itself; setting them through a pass-through map
/// would silently weaken a guarantee (acks, idempotence) or a bound (queue sizes).
const MANAGED_KAFKA_PROPERTIES: &[(&str, &str)] = &[
    ("bootstrap.servers", "kafka.brokers"),
    ("metadata.broker.list", "kafka.brokers"),
    ("acks", "(always `all`)"),
    ("request.required.acks", "(always `all`)"),
    ("enable.idempotence", "(always `true`)"),
    ("queue.buffering.max.kbytes", "buffer.max_bytes"),
    ("queue.buffering.max.messages", "buffer.max_records"),
    ("message.timeout.ms", "ship.delivery_timeout"),
    ("delivery.timeout.ms", "ship.delivery_timeout"),
    ("compression.type", "ship.compression"),
    ("compression.codec", "ship.compression"),
    ("linger.ms", "ship.linger"),
    ("queue.buffering.max.ms", "ship.linger"),
    ("batch.size", "ship.batch_size"),
    ("group.id", "persist.group_id"),
    ("enable.auto.commit", "(managed by the persister)"),
    ("enable.auto.offset.store", "(managed by the persister)"),
    // librdkafka verifies brokers' certificates and host names by default; there is no sluice
    // key to turn that off, so neither may a pass-through map.
    ("enable.ssl.certificate.verification", "(always verified)"),
    ("ssl.endpoint.identification.algorithm", "(always verified)"),
];

/// Smallest spool accepted: a few segments.
pub const MIN_DISK_BYTES: u64 = 1024 * 1024;

/// Smallest buffer accepted: a sidecar may get only tens of MiB, but below this the buffer
/// cannot hold even a few maximum-size records.
pub const MIN_BUFFER_BYTES: u64 = 64 * 1024;

/// Room for a record's envelope beyond the record itself, in [`Config::largest_message`]: the
/// id, times, pod and peer fields and a `pod_name` key take well under 1 KiB (Kubernetes names
/// are at most 253 bytes); a key taken from a JSON field is part of the record's own bytes.
pub const ENVELOPE_HEADROOM: u64 = 4 * 1024;

impl Config {
    /// The effective `ingest.ack_point`.
    pub fn ack_point(&self) -> crate::buffer::ack::AckPoint {
        use crate::buffer::ack::AckPoint;
        match (self.ingest.ack_point, self.buffer.kind) {
            (Some(AckPointConfig::Delivered), _) | (None, BufferKind::Memory) => AckPoint::Delivered,
            (Some(AckPointConfig::Spooled), _) | (None, BufferKind::Disk) => AckPoint::Spooled,
        }
    }

    /// The largest `max_record_size` of any listener.
    pub fn largest_record(&self) -> u64 {
        self.ingest.listeners.values().map(|listener| listener.max_record_size.as_u64()).max().unwrap_or(0)
    }

    /// The largest Kafka message (envelope and key) a record may become: twice the largest
    /// record (JSON-escaping a text line grows it; the ingest sink refuses a record whose
    /// message would be larger, `reason="too_large"`) plus [`ENVELOPE_HEADROOM`]. librdkafka's
    /// queue and `message.max.bytes`, the backlog reader's chunk and the budget are sized to take
    /// it.
    pub fn largest_message(&self) -> u64 {
        self.largest_record().saturating_mul(2).saturating_add(ENVELOPE_HEADROOM)
    }

    /// The listener with the largest `max_record_size`, for error messages.
    fn largest_record_listener(&self) -> &str {
        self.ingest
            .listeners
            .iter()
            .max_by_key(|(_, listener)| listener.max_record_size.as_u64())
            .map_or("default", |(name, _)| name.as_str())
    }

    /// Spool settings for `buffer.type = "disk"`.
    pub fn spool(&self) -> crate::buffer::spool::SpoolConfig {
        use crate::buffer::spool::{Fsync, SpoolConfig};
        let max_bytes = self.buffer.max_disk_bytes.as_u64();
        let record = usize::try_from(self.largest_record()).unwrap_or(usize::MAX);
        SpoolConfig {
            dir: self.buffer.path.clone(),
            max_bytes,
            // Several segments fit under the cap, so delivered ones can be freed while others fill.
            segment_bytes: (max_bytes / 8).clamp(64 * 1024, 16 * 1024 * 1024),
            fsync: match self.buffer.fsync {
                FsyncPolicy::Never => Fsync::Never,
                FsyncPolicy::Always => Fsync::Always,
                FsyncPolicy::Interval(every) => Fsync::Interval(every),
            },
            // JSON-escaping a text line can grow it up to six times; the envelope adds a little.
            max_body: record.saturating_mul(6).saturating_add(64 * 1024),
        }
    }

    /// Reads `path`, applies `SLUICE_*__*` environment overrides, validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        if !path.is_file() {
            return Err(ConfigError::Parse { file, message: "no such file".into() });
        }
        let env = Env::prefixed(ENV_PREFIX).filter(|key| key.as_str().contains("__")).split("__");
        let config: Config = Figment::new()
            .merge(Toml::file_exact(path))
            .merge(env)
            .extract()
            .map_err(|error| ConfigError::Parse { file: file.clone(), message: describe(&error) })?;
        config.validate(&file)?;
        Ok(config)
    }

    /// Parses a TOML string without environment overrides (tests, examples).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let config: Config = Figment::new()
            .merge(Toml::string(text))
            .extract()
            .map_err(|error| ConfigError::Parse { file: "<string>".into(), message: describe(&error) })?;
        config.validate("<string>")?;
        Ok(config)
    }

    /// Checks what types alone cannot. Every error names its key.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let invalid =
            |key: &str, message: String| ConfigError::Invalid { file: file.to_string(), key: key.to_string(), message };
        if tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            return Err(invalid("log.level", format!("`{}` is not a tracing filter", self.log.level)));
        }
        if self.kafka.brokers.trim().is_empty() {
            return Err(invalid("kafka.brokers", "must name at least one host:port".into()));
        }
        if !valid_topic(&self.kafka.topic) {
            return Err(invalid(
                "kafka.topic",
                format!("`{}` is not a Kafka topic name ([a-zA-Z0-9._-], 1-249 chars)", self.kafka.topic),
            ));
        }
        for (property, variable) in &self.kafka.properties_from_env {
            if std::env::var_os(variable).is_none() {
                return Err(invalid(
                    &format!("kafka.properties_from_env.\"{property}\""),
                    format!("environment variable {variable} is not set"),
                ));
            }
        }
        for (section, properties) in [
            ("kafka.properties", &self.kafka.properties),
            ("kafka.properties_from_env", &self.kafka.properties_from_env),
            ("ship.properties", &self.ship.properties),
            ("persist.properties", &self.persist.properties),
        ] {
            for key in properties.keys() {
                if let Some((_, instead)) = MANAGED_KAFKA_PROPERTIES.iter().find(|(name, _)| name == key) {
                    return Err(invalid(
                        &format!("{section}.\"{key}\""),
                        format!("is managed by sluice; use {instead}"),
                    ));
                }
            }
        }
        if self.ingest.listeners.is_empty() {
            return Err(invalid("ingest.listeners", "must name at least one listener".into()));
        }
        let mut sockets = std::collections::BTreeSet::new();
        for (name, listener) in &self.ingest.listeners {
            let key = |field: &str| format!("ingest.listeners.{name}.{field}");
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
                return Err(invalid(&format!("ingest.listeners.{name}"), "a listener name is [A-Za-z0-9_-]+".into()));
            }
            if parse_mode(&listener.socket_mode).is_none() {
                return Err(invalid(
                    &key("socket_mode"),
                    format!("`{}` is not an octal permission like \"0660\"", listener.socket_mode),
                ));
            }
            if listener.socket.as_os_str().is_empty() || !sockets.insert(listener.socket.clone()) {
                return Err(invalid(&key("socket"), "must be a path no other listener uses".into()));
            }
            match (listener.protocol, listener.transport) {
                (Protocol::Syslog, _) | (_, None) => {}
                (Protocol::Datagram, Some(Transport::Datagram)) => {}
                (Protocol::Lines | Protocol::OctetCounted | Protocol::Forward, Some(Transport::Stream)) => {}
                (protocol, Some(_)) => {
                    return Err(invalid(
                        &key("transport"),
                        format!("{} has one transport; only syslog offers a choice", protocol.as_str()),
                    ));
                }
            }
            let record = listener.max_record_size.as_u64();
            if !(64..=64 * 1024 * 1024).contains(&record) {
                return Err(invalid(&key("max_record_size"), "must be between 64 B and 64 MiB".into()));
            }
            if listener.transport() == Transport::Datagram && record > 16 * 1024 * 1024 {
                return Err(invalid(&key("max_record_size"), "a datagram listener takes at most 16 MiB".into()));
            }
            if listener.transport() == Transport::Datagram {
                if !listener.allow_uids.is_empty() {
                    return Err(invalid(&key("allow_uids"), "datagram sockets carry no peer credentials".into()));
                }
                if !listener.allow_gids.is_empty() {
                    return Err(invalid(&key("allow_gids"), "datagram sockets carry no peer credentials".into()));
                }
                if listener.rate_limit.as_ref().is_some_and(|limit| limit.key == RateLimitKey::Peer) {
                    return Err(invalid(
                        &key("rate_limit.key"),
                        "datagram sockets carry no peer credentials; use \"connection\" (one bucket per socket)".into(),
                    ));
                }
            }
            if listener.max_connections == 0 {
                return Err(invalid(&key("max_connections"), "must be at least 1".into()));
            }
            if listener.idle_timeout.is_some_and(|timeout| timeout.is_zero()) {
                return Err(invalid(&key("idle_timeout"), "must be greater than zero (or \"forever\")".into()));
            }
            if let Some(limit) = &listener.rate_limit {
                if limit.records_per_second.is_none() && limit.bytes_per_second.is_none() {
                    return Err(invalid(&key("rate_limit"), "needs records_per_second or bytes_per_second".into()));
                }
                let rates = [limit.records_per_second.map(u64::from), limit.bytes_per_second.map(|b| b.as_u64())];
                if rates.into_iter().flatten().any(|rate| !(1..=MAX_RATE).contains(&rate)) {
                    return Err(invalid(
                        &key("rate_limit"),
                        format!("rates must be between 1 and {MAX_RATE} per second"),
                    ));
                }
                if limit.burst.is_zero() {
                    return Err(invalid(&key("rate_limit.burst"), "must be greater than zero".into()));
                }
            }
        }
        if self.ingest.max_json_depth == 0 {
            return Err(invalid("ingest.max_json_depth", "must be at least 1".into()));
        }
        let record = self.largest_record();
        let buffer = self.buffer.max_bytes.as_u64();
        if buffer < MIN_BUFFER_BYTES {
            return Err(invalid("buffer.max_bytes", format!("must be at least {}", ByteSize(MIN_BUFFER_BYTES))));
        }
        // librdkafka's share must take the largest message, and the leases hold it besides: a
        // message that fits neither waits forever for room that cannot exist.
        let largest = self.largest_message();
        if buffer < largest.saturating_mul(2) {
            return Err(invalid(
                "buffer.max_bytes",
                format!(
                    "must be at least {} ({} bytes): twice the largest message a record may become \
                     (2 x ingest.listeners.{}.max_record_size of {}, plus {} for its envelope), so \
                     that librdkafka's queue and the buffer can each take one; raise \
                     buffer.max_bytes or lower max_record_size",
                    ByteSize(largest * 2),
                    largest * 2,
                    self.largest_record_listener(),
                    ByteSize(record),
                    ByteSize(ENVELOPE_HEADROOM),
                ),
            ));
        }
        // A disk buffer also keeps one backlog chunk (at least the largest message) from the
        // readers, so the backlog always moves: three largest messages.
        if self.buffer.kind == BufferKind::Disk && buffer < largest.saturating_mul(3).saturating_add(1024) {
            return Err(invalid(
                "buffer.max_bytes",
                format!(
                    "with buffer.type = \"disk\" must be at least {} ({} bytes): three times the largest \
                     message a record may become (2 x ingest.listeners.{}.max_record_size of {}, plus {} \
                     for its envelope), so that librdkafka's queue, the backlog reader and the readers \
                     can each take one; raise buffer.max_bytes or lower max_record_size",
                    ByteSize(largest * 3 + 1024),
                    largest * 3 + 1024,
                    self.largest_record_listener(),
                    ByteSize(record),
                    ByteSize(ENVELOPE_HEADROOM),
                ),
            ));
        }
        // librdkafka's queue is sized from the buffer and caps at 2097151 KiB / 10M messages.
        if buffer > 2 * 1024 * 1024 * 1024 - 1024 {
            return Err(invalid("buffer.max_bytes", "must be below 2 GiB (librdkafka's queue limit)".into()));
        }
        if self.buffer.kind == BufferKind::Disk {
            if self.buffer.max_disk_bytes.as_u64() < MIN_DISK_BYTES {
                return Err(invalid("buffer.max_disk_bytes", format!("must be at least {}", ByteSize(MIN_DISK_BYTES))));
            }
            if self.buffer.max_disk_bytes.as_u64() < record.saturating_mul(8) {
                return Err(invalid(
                    "buffer.max_disk_bytes",
                    format!(
                        "must be at least 8 x the largest max_record_size of a listener ({})",
                        ByteSize(record * 8)
                    ),
                ));
            }
            if self.buffer.path.as_os_str().is_empty() {
                return Err(invalid("buffer.path", "must be a directory path".into()));
            }
        }
        if self.ingest.ack_point == Some(AckPointConfig::Spooled) && self.buffer.kind != BufferKind::Disk {
            return Err(invalid("ingest.ack_point", "\"spooled\" needs buffer.type = \"disk\"".into()));
        }
        if let FsyncPolicy::Interval(every) = self.buffer.fsync
            && (every.is_zero() || every > Duration::from_secs(60))
        {
            return Err(invalid("buffer.fsync", "an interval must be between 1ms and 60s".into()));
        }
        if self.buffer.block_timeout.is_some_and(|timeout| timeout.is_zero()) {
            return Err(invalid("buffer.block_timeout", "must be greater than zero (or \"forever\")".into()));
        }
        if self.buffer.max_records == 0 || self.buffer.max_records > 10_000_000 {
            return Err(invalid("buffer.max_records", "must be between 1 and 10000000".into()));
        }
        if self.buffer.kind == BufferKind::Disk && self.buffer.max_records < 2 {
            // The backlog's reserve takes one record slot readers never get.
            return Err(invalid("buffer.max_records", "with buffer.type = \"disk\" must be at least 2".into()));
        }
        if !["none", "gzip", "snappy", "lz4", "zstd"].contains(&self.ship.compression.as_str()) {
            return Err(invalid(
                "ship.compression",
                format!("`{}` is not one of none, gzip, snappy, lz4, zstd", self.ship.compression),
            ));
        }
        if self.ship.linger > Duration::from_secs(900) {
            return Err(invalid("ship.linger", "must be at most 900s".into()));
        }
        if self.ship.delivery_timeout < Duration::from_secs(1) {
            return Err(invalid("ship.delivery_timeout", "must be at least 1s".into()));
        }
        if self.ship.batch_size.as_u64() == 0 || self.ship.batch_size.as_u64() > i32::MAX as u64 {
            return Err(invalid("ship.batch_size", "must be between 1 B and 2 GiB".into()));
        }
        match (self.ship.key, &self.ship.key_field) {
            (KeySource::Field, None) => {
                return Err(invalid("ship.key_field", "is required when ship.key = \"field\"".into()));
            }
            (KeySource::Field, Some(field)) if field.is_empty() => {
                return Err(invalid("ship.key_field", "must not be empty".into()));
            }
            _ => {}
        }
        for (key, address) in
            [("agent.admin_listen", &self.agent.admin_listen), ("persist.admin_listen", &self.persist.admin_listen)]
        {
            if address.parse::<std::net::SocketAddr>().is_err() {
                return Err(invalid(key, format!("`{address}` is not an ip:port address")));
            }
        }
        if self.persist.group_id.is_empty() {
            return Err(invalid("persist.group_id", "must not be empty".into()));
        }
        if self.persist.batch_max_records == 0 || self.persist.batch_max_records > 100_000 {
            return Err(invalid("persist.batch_max_records", "must be between 1 and 100000".into()));
        }
        if self.persist.batch_max_bytes.as_u64() < 1024 || self.persist.batch_max_bytes.as_u64() > 1 << 30 {
            return Err(invalid("persist.batch_max_bytes", "must be between 1 KiB and 1 GiB".into()));
        }
        if self.persist.batch_max_wait.is_zero() {
            return Err(invalid("persist.batch_max_wait", "must be greater than zero".into()));
        }
        if self.persist.writers == 0 || self.persist.writers > 32 {
            return Err(invalid("persist.writers", "must be between 1 and 32".into()));
        }
        if self.persist.partitions_ahead_days > 366 {
            return Err(invalid("persist.partitions_ahead_days", "must be at most 366".into()));
        }
        if self.persist.max_clock_skew < Duration::from_secs(60)
            || self.persist.max_clock_skew > Duration::from_secs(366 * 86400)
        {
            return Err(invalid("persist.max_clock_skew", "must be between 1m and 366d".into()));
        }
        if self.postgres.url.parse::<tokio_postgres::Config>().is_err() {
            return Err(invalid("postgres.url", "is not a PostgreSQL connection URL".into()));
        }
        if !valid_identifier(&self.postgres.schema) {
            return Err(invalid(
                "postgres.schema",
                format!(
                    "`{}` must be a lower-case identifier ([a-z_][a-z0-9_]*, at most 48 chars)",
                    self.postgres.schema
                ),
            ));
        }
        Ok(())
    }

    /// A copy safe to print: passwords in URLs and secret-looking Kafka properties replaced.
    pub fn redacted(&self) -> Config {
        let mut shown = self.clone();
        for properties in [&mut shown.kafka.properties, &mut shown.ship.properties, &mut shown.persist.properties] {
            for (key, value) in properties.iter_mut() {
                if is_secret_key(key) {
                    *value = REDACTED.into();
                }
            }
        }
        shown.postgres.url = redact_url_password(&shown.postgres.url);
        shown
    }

    /// The effective config as TOML, secrets redacted.
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(&self.redacted()).unwrap_or_else(|error| format!("# cannot render: {error}\n"))
    }
}

/// One line per problem: the key, what is wrong, and the environment variable if one set it.
fn describe(error: &figment::Error) -> String {
    error
        .clone()
        .into_iter()
        .map(|error| {
            let key = error.path.join(".");
            let origin = match &error.metadata {
                Some(metadata) if metadata.name.contains("environment") => {
                    let variable: Vec<String> = error.path.iter().map(|part| part.to_ascii_uppercase()).collect();
                    format!(" (set by environment variable {ENV_PREFIX}{})", variable.join("__"))
                }
                _ => String::new(),
            };
            if key.is_empty() {
                format!("{}{origin}", error.kind)
            } else {
                format!("key `{key}`: {}{origin}", error.kind)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn valid_topic(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// A PostgreSQL identifier safe to use unquoted (it is still quoted where used).
pub fn valid_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && name.len() <= 48
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    // `sasl.oauthbearer.config` carries client ids and secrets as `key=value` pairs.
    ["password", "secret", "token", "jaas", "key.pem", "private", "oauthbearer.config"]
        .iter()
        .any(|word| key.contains(word))
}
