//! `[persist]`: the consumer group that writes to PostgreSQL.
//!
//! Owns: the section's schema and checks. Must not: connect to anything.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use super::{At, ConfigError, valid_address};

/// `[persist]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PersistConfig {
    /// Address of the persister's admin HTTP server. Default `"127.0.0.1:9465"`.
    pub admin_listen: String,
    /// Serve `/config` on the admin server: as `agent.admin_config_endpoint`. Unset (the
    /// default): only when `admin_listen` is a loopback address.
    pub admin_config_endpoint: Option<bool>,
    /// Write the admin server's bound address to this file once it listens: as
    /// `agent.admin_address_file`. Unset (the default): no file.
    pub admin_address_file: Option<PathBuf>,
    /// On SIGTERM, how long to write the batches in hand (retrying if PostgreSQL fails); what is
    /// not written by then is re-read by the next owner. The final offset commit and the
    /// consumer's close then get up to 5 s more (`persist::CLOSE_TIMEOUT`). Default `20s`.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Kafka consumer group. Default `"sluice-persist"`.
    pub group_id: String,
    /// What the persister subscribes to: topic names, or regular expressions starting with `^`
    /// (librdkafka's pattern subscription: topics created later that match are read too, found
    /// within `topic.metadata.refresh.interval.ms`, 5 min by default). Each row stores its topic
    /// (`kafka_topic`). Default: `kafka.topic` — or, when that is a template, the pattern every
    /// topic it renders matches and `kafka.default_topic` (`check-config` shows them).
    pub topics: Vec<String>,
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
    /// partitions (by topic and partition number), so a partition's offsets are stored in
    /// order. Reading and parsing go on while they write. Memory: up to three batches per
    /// writer (one being filled, one waiting, one being written). Default `2`.
    pub writers: usize,
    /// Day partitions older than this many days are dropped; `0` keeps everything. Default `14`.
    pub retention_days: u32,
    /// Dead letters received more than this many days ago are deleted (hourly, with the
    /// partitions' upkeep; counted in `sluice_persist_dead_letters_deleted_total`): read or
    /// replay them before (docs/DEAD_LETTERS.md). `0` keeps them all. Default `30`.
    pub dead_letter_retention_days: u32,
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
    /// Typed columns beside `record`, by column name (`[persist.columns.user_id]`): each filled
    /// from a JSON pointer into the record, added to `log_rows` (and the view `logs`) at start if
    /// missing. A value that does not convert is stored as NULL, counted. At most 32.
    pub columns: BTreeMap<String, ColumnConfig>,
}

/// `[persist.columns.NAME]`: one typed column.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ColumnConfig {
    /// Where the value is in a JSON record: a JSON pointer (RFC 6901), `"/user/id"`.
    pub pointer: String,
    /// `"text"`, `"bigint"`, `"double precision"`, `"boolean"`, `"timestamptz"` or `"jsonb"`.
    #[serde(rename = "type")]
    pub kind: ColumnType,
    /// Index the column (a b-tree on `log_rows`, built on every partition at start: it holds
    /// writes to the table while it builds). Default `false`.
    #[serde(default)]
    pub index: bool,
}

/// `persist.columns.NAME.type`: a PostgreSQL type.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ColumnType {
    /// A string's content; another value's JSON text.
    #[serde(rename = "text")]
    Text,
    /// An integer (or a string holding one) within 64 bits.
    #[serde(rename = "bigint")]
    Bigint,
    /// A number (or a string holding one), finite.
    #[serde(rename = "double precision")]
    DoublePrecision,
    /// `true`/`false` (or those strings).
    #[serde(rename = "boolean")]
    Boolean,
    /// An RFC 3339 string, or a number of seconds, milliseconds, microseconds or nanoseconds
    /// since the epoch (read as `event_time` is).
    #[serde(rename = "timestamptz")]
    Timestamptz,
    /// Any value, as JSON.
    #[serde(rename = "jsonb")]
    Jsonb,
}

impl ColumnType {
    /// The type's name in SQL, as `format_type` writes it.
    pub fn sql(self) -> &'static str {
        match self {
            ColumnType::Text => "text",
            ColumnType::Bigint => "bigint",
            ColumnType::DoublePrecision => "double precision",
            ColumnType::Boolean => "boolean",
            ColumnType::Timestamptz => "timestamp with time zone",
            ColumnType::Jsonb => "jsonb",
        }
    }
}

/// The columns every row has (`log_rows` and the view `logs`), in the view's order as the migrations
/// made it (typed columns rebuild the view from this list and can only add after it); a typed column
/// may not take one's name.
pub const BASE_COLUMNS: &[&str] = &[
    "agent",
    "seq",
    "ingest_time",
    "event_time",
    "level",
    "message",
    "format",
    "pod_name",
    "pod_namespace",
    "container_name",
    "node_name",
    "peer_pid",
    "peer_uid",
    "peer_gid",
    "record",
    "kafka_topic",
    "kafka_partition",
    "kafka_offset",
    "pod_labels",
    "pod_annotations",
];

impl Default for PersistConfig {
    fn default() -> Self {
        Self {
            admin_listen: "127.0.0.1:9465".into(),
            admin_config_endpoint: None,
            admin_address_file: None,
            drain_timeout: Duration::from_secs(20),
            group_id: "sluice-persist".into(),
            topics: Vec::new(),
            batch_max_records: 5000,
            batch_max_bytes: ByteSize::mib(16),
            batch_max_wait: Duration::from_millis(500),
            writers: 2,
            retention_days: 14,
            dead_letter_retention_days: 30,
            partitions_ahead_days: 3,
            max_clock_skew: Duration::from_secs(24 * 3600),
            properties: BTreeMap::new(),
            columns: BTreeMap::new(),
        }
    }
}

impl PersistConfig {
    /// Checks what types alone cannot.
    pub(super) fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        valid_address(at, "admin_listen", &self.admin_listen)?;
        if self.group_id.is_empty() {
            return Err(at.invalid("group_id", "must not be empty"));
        }
        for (i, topic) in self.topics.iter().enumerate() {
            if topic.starts_with('^') {
                if let Err(error) = regex::Regex::new(topic) {
                    return Err(
                        at.invalid(&format!("topics[{i}]"), format!("`{topic}` is not a regular expression: {error}"))
                    );
                }
            } else if !super::valid_topic(topic) {
                return Err(at.invalid(
                    &format!("topics[{i}]"),
                    format!("`{topic}` is neither a Kafka topic name ([a-zA-Z0-9._-]) nor a pattern starting with `^`"),
                ));
            }
        }
        if self.batch_max_records == 0 || self.batch_max_records > 100_000 {
            return Err(at.invalid("batch_max_records", "must be between 1 and 100000"));
        }
        if self.batch_max_bytes.as_u64() < 1024 || self.batch_max_bytes.as_u64() > 1 << 30 {
            return Err(at.invalid("batch_max_bytes", "must be between 1 KiB and 1 GiB"));
        }
        if self.batch_max_wait.is_zero() {
            return Err(at.invalid("batch_max_wait", "must be greater than zero"));
        }
        if self.writers == 0 || self.writers > 32 {
            return Err(at.invalid("writers", "must be between 1 and 32"));
        }
        if self.partitions_ahead_days > 366 {
            return Err(at.invalid("partitions_ahead_days", "must be at most 366"));
        }
        if self.max_clock_skew < Duration::from_secs(60) || self.max_clock_skew > Duration::from_secs(366 * 86400) {
            return Err(at.invalid("max_clock_skew", "must be between 1m and 366d"));
        }
        if self.columns.len() > 32 {
            return Err(at.invalid("columns", "at most 32 typed columns"));
        }
        for (name, column) in &self.columns {
            // 50: its index's name (`log_rows_NAME_idx`) stays within PostgreSQL's 63 bytes.
            let valid = !name.is_empty()
                && name.len() <= 50
                && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                return Err(at.invalid(&format!("columns.{name}"), "a column name: [a-z_][a-z0-9_]*, at most 50 bytes"));
            }
            if BASE_COLUMNS.contains(&name.as_str()) {
                return Err(at.invalid(&format!("columns.{name}"), "is a column every row has already"));
            }
            if !(column.pointer.is_empty() || column.pointer.starts_with('/')) {
                return Err(at.invalid(
                    &format!("columns.{name}.pointer"),
                    format!("`{}` is not a JSON pointer (\"/user/id\"; RFC 6901)", column.pointer),
                ));
            }
        }
        super::kafka::reject_managed(at, "properties", &self.properties, super::kafka::Clients::Consumer)?;
        super::kafka::reject_refused(at, "properties", &self.properties)
    }
}
