//! `[ship]`: how the agent produces to Kafka.
//!
//! Owns: the section's schema and checks. Must not: build the producer (ship does).

use std::collections::BTreeMap;
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use super::{At, ConfigError};
pub use crate::envelope::EnvelopeKind;

/// Most static headers (`ship.headers`).
pub const MAX_HEADERS: usize = 32;

/// Most bytes of static headers' names and values together.
pub const MAX_HEADER_BYTES: usize = 4096;

/// What every metadata header's name starts with (`ship.metadata_headers`).
pub const METADATA_HEADER_PREFIX: &str = "sluice.";

/// `ship.linger`'s default (see [`ShipConfig::linger`]).
pub const DEFAULT_LINGER: Duration = Duration::from_millis(20);

/// `[ship]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ShipConfig {
    /// `compression.type`: `none`, `gzip`, `snappy`, `lz4` or `zstd`. Default `"zstd"`.
    pub compression: String,
    /// How long librdkafka waits to fill a batch (`linger.ms`); shorter than `delivery_timeout`.
    /// Default `20ms`: each batch is a produce request, and at 1k–10k records/s each one costs
    /// librdkafka's broker thread a wake-up and a compression context — at 5 ms (200 requests a
    /// second) that thread took 40–50% of the agent's CPU at 10k records/s (docs/PERFORMANCE.md,
    /// "Linger: 20 ms by default"). A record reaches Kafka up to this much later.
    #[serde(with = "humantime_serde")]
    pub linger: Duration,
    /// Largest batch per partition request (`batch.size`), at most half of librdkafka's queue
    /// (a fifth of `buffer.max_bytes`, or the largest message if that is more). Default `1 MiB`.
    pub batch_size: ByteSize,
    /// How long librdkafka may try one send before reporting it failed (`message.timeout.ms`).
    /// A record that times out is put back into the buffer and sent again, never dropped.
    /// From 1s to about 24.8 days (librdkafka's limit), longer than `linger`. Default `2m`.
    #[serde(with = "humantime_serde")]
    pub delivery_timeout: Duration,
    /// The Kafka message key: `"none"`, `"pod_name"`, `"field"` (the JSON record's top-level
    /// field named by `key_field`) or `"template"` (`key_template`). Default `"none"`.
    pub key: KeySource,
    /// The field used when `key = "field"`. Records without it are sent without a key.
    pub key_field: Option<String>,
    /// The key when `key = "template"`: text with `{pod.name}`, `{pod.namespace}`,
    /// `{pod.container}`, `{pod.node}` and `{record.FIELD}` (a JSON record's top-level field),
    /// e.g. `"{pod.namespace}/{record.user_id}"`. A record lacking a field it names is sent
    /// without a key. Applies on reload to records read after it.
    pub key_template: Option<String>,
    /// Kafka headers every record carries, name → value (at most 32 and 4 KiB in all; names not
    /// starting with `sluice.`, which `metadata_headers` uses). Each record's budget in the
    /// buffer counts its headers. Default none.
    pub headers: BTreeMap<String, String>,
    /// Whether each record also carries its metadata as headers — `sluice.id`,
    /// `sluice.ingest_time` (RFC 3339), and `sluice.pod.name`, `sluice.pod.namespace`,
    /// `sluice.pod.container`, `sluice.pod.node` where the Downward API gives them — the same
    /// values as its envelope, readable without decoding it. Default `false`.
    pub metadata_headers: bool,
    /// How records are encoded in Kafka: `"binary"` (a binary header, then the record as
    /// written: fewer bytes and less CPU per record) or `"json"` (the JSON envelope every
    /// persister reads; for upgrading agents before their persisters). docs/PROTOCOL.md
    /// specifies both. Default `"binary"`.
    pub envelope: EnvelopeKind,
    /// librdkafka properties for the producer only, applied after `kafka.properties`.
    pub properties: BTreeMap<String, String>,
    /// Where records go: `"kafka"`, or `"stdout"` — each record printed as one JSON line (its
    /// topic, key, headers and envelope) instead of being sent, to see what a config would ship
    /// (multiline joins, templates, masking) before touching Kafka. `sluice agent --dry-run`
    /// sets it, with a memory buffer: `"stdout"` refuses a disk one (printing settles what it
    /// prints, so it must not read a spool a real run owes to Kafka). Takes effect at start.
    /// Default `"kafka"`.
    pub sink: Sink,
}

/// Where the shipper sends records (`ship.sink`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Sink {
    /// The Kafka topic (`kafka.topic`): the product.
    #[default]
    Kafka,
    /// The agent's standard output, one JSON line per record; nothing reaches Kafka. Each printed
    /// record counts as delivered.
    Stdout,
}

impl Default for ShipConfig {
    fn default() -> Self {
        Self {
            compression: "zstd".into(),
            linger: DEFAULT_LINGER,
            batch_size: ByteSize::mib(1),
            delivery_timeout: Duration::from_secs(120),
            key: KeySource::None,
            key_field: None,
            key_template: None,
            headers: BTreeMap::new(),
            metadata_headers: false,
            envelope: EnvelopeKind::Binary,
            properties: BTreeMap::new(),
            sink: Sink::Kafka,
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
    /// A template over the pod and the record (`ship.key_template`).
    Template,
}

impl ShipConfig {
    /// Checks what types alone cannot.
    pub(super) fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        if !["none", "gzip", "snappy", "lz4", "zstd"].contains(&self.compression.as_str()) {
            return Err(at.invalid(
                "compression",
                format!("`{}` is not one of none, gzip, snappy, lz4, zstd", self.compression),
            ));
        }
        if self.linger > Duration::from_secs(900) {
            return Err(at.invalid("linger", "must be at most 900s"));
        }
        if self.delivery_timeout < Duration::from_secs(1) {
            return Err(at.invalid("delivery_timeout", "must be at least 1s"));
        }
        // librdkafka takes `message.timeout.ms` up to i32::MAX and refuses it ≤ `linger.ms`, both
        // in whole milliseconds (as they are handed over).
        if self.delivery_timeout.as_millis() > i32::MAX as u128 {
            return Err(
                at.invalid("delivery_timeout", "must be at most 2147483647ms, about 24.8 days (librdkafka's limit)")
            );
        }
        if self.linger.as_millis() >= self.delivery_timeout.as_millis() {
            return Err(at.invalid(
                "linger",
                format!(
                    "must be shorter than ship.delivery_timeout ({})",
                    humantime::format_duration(self.delivery_timeout)
                ),
            ));
        }
        if self.batch_size.as_u64() == 0 || self.batch_size.as_u64() > i32::MAX as u64 {
            return Err(at.invalid("batch_size", "must be between 1 B and 2 GiB"));
        }
        match (self.key, &self.key_field) {
            (KeySource::Field, None) => return Err(at.invalid("key_field", "is required when ship.key = \"field\"")),
            (KeySource::Field, Some(field)) if field.is_empty() => {
                return Err(at.invalid("key_field", "must not be empty"));
            }
            _ => {}
        }
        match (self.key, &self.key_template) {
            (KeySource::Template, None) => {
                return Err(at.invalid("key_template", "is required when ship.key = \"template\""));
            }
            (KeySource::Template, Some(template)) => {
                if let Err(error) = crate::template::Template::parse(template) {
                    return Err(at.invalid("key_template", error.to_string()));
                }
            }
            _ => {}
        }
        if self.headers.len() > MAX_HEADERS {
            return Err(at.invalid("headers", format!("at most {MAX_HEADERS} headers")));
        }
        if self.headers.iter().map(|(name, value)| name.len() + value.len()).sum::<usize>() > MAX_HEADER_BYTES {
            return Err(at.invalid("headers", "at most 4 KiB of names and values in all (each record carries them)"));
        }
        for (name, value) in &self.headers {
            if name.is_empty() || name.starts_with(METADATA_HEADER_PREFIX) || name.len() > 255 || value.len() > 4096 {
                return Err(at.invalid(
                    &format!("headers.{name}"),
                    "a header name is 1–255 bytes not starting with `sluice.`, its value at most 4 KiB",
                ));
            }
        }
        super::kafka::reject_managed(at, "properties", &self.properties, super::kafka::Clients::Producer)?;
        super::kafka::reject_refused(at, "properties", &self.properties)
    }
}
