//! Configuration: one TOML file, `SLUICE_SECTION__KEY` environment overrides, merged once into a
//! validated [`Config`] that every other module reads and none re-parses.
//!
//! Owns: the schema (every key, its type, its default: one file per section beside this one,
//! each with its own checks), validation that names the key and the file (the checks that span
//! two sections are here), and redaction of secrets for display (`redact`). Must not: read the environment or files anywhere
//! else, or let an unknown key pass silently (a typo in a limit must not become "no limit").
//!
//! The same schema serves `sluice agent` and `sluice persist`, so one file (like
//! `config/demo.toml`) can run both; each process reads only the sections it needs.

use std::path::Path;

use bytesize::ByteSize;
use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};

mod agent;
mod buffer;
mod ingest;
mod kafka;
mod log;
mod persist;
pub mod postgres;
mod redact;
pub mod reload;
mod serde_helpers;
mod ship;

pub use self::agent::{AgentConfig, PodInfoConfig};
pub use self::buffer::{BufferConfig, BufferKind, Fsync, MIN_BUFFER_BYTES, MIN_DISK_BYTES, WhenFull};
pub use self::ingest::{
    AckPoint, IngestConfig, ListenerConfig, MultilineConfig, MultilinePreset, Protocol, RateLimitAction,
    RateLimitConfig, RateLimitKey, RedactConfig, RedactPreset, RedactRule, Transport,
};
pub use self::kafka::{KafkaConfig, valid_topic};
pub use self::log::{LogConfig, LogFormat};
pub use self::persist::{BASE_COLUMNS, ColumnConfig, ColumnType, PersistConfig};
pub use self::postgres::{PostgresConfig, valid_identifier};
pub use self::ship::{DEFAULT_LINGER, EnvelopeKind, KeySource, ShipConfig, Sink};

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

/// Room for a record's envelope beyond the record itself, in [`Config::largest_message`]: the
/// id, times, pod and peer fields and a `pod_name` key take well under 1 KiB (Kubernetes names
/// are at most 253 bytes); a key taken from a JSON field is part of the record's own bytes.
pub const ENVELOPE_HEADROOM: u64 = 4 * 1024;

impl Config {
    /// The effective `ingest.ack_point`.
    pub fn ack_point(&self) -> AckPoint {
        match (self.ingest.ack_point, self.buffer.kind) {
            (Some(AckPoint::Delivered), _) | (None, BufferKind::Memory) => AckPoint::Delivered,
            (Some(AckPoint::Spooled), _) | (None, BufferKind::Disk) => AckPoint::Spooled,
        }
    }

    /// What the persister subscribes to: `persist.topics`, or by default `kafka.topic` — when
    /// that is a template, the pattern of every topic it renders and `kafka.default_topic`.
    pub fn subscriptions(&self) -> Vec<String> {
        if !self.persist.topics.is_empty() {
            return self.persist.topics.clone();
        }
        match self.kafka.topic_pattern() {
            Some(pattern) => vec![pattern, self.kafka.fallback_topic().to_string()],
            None => vec![self.kafka.topic.clone()],
        }
    }

    /// The largest `max_record_size` of any listener.
    pub fn largest_record(&self) -> u64 {
        self.ingest.listeners.values().map(|listener| listener.max_record_size.as_u64()).max().unwrap_or(0)
    }

    /// The largest Kafka message (envelope and key) a record may become: twice the largest
    /// record (JSON-escaping a text line grows it; the ingest sink refuses a record whose
    /// message would be larger, `reason="too_large"`) plus [`ENVELOPE_HEADROOM`] and, with
    /// `agent.pod_info`, its `max_bytes` of labels and annotations. librdkafka's queue and
    /// `message.max.bytes`, the backlog reader's chunk and the budget are sized to take it.
    pub fn largest_message(&self) -> u64 {
        let pod_info = if self.agent.pod_info.path.is_some() { self.agent.pod_info.max_bytes.as_u64() + 64 } else { 0 };
        self.largest_record().saturating_mul(2).saturating_add(ENVELOPE_HEADROOM).saturating_add(pod_info)
    }

    /// The listener with the largest `max_record_size`, for error messages.
    fn largest_record_listener(&self) -> &str {
        self.ingest
            .listeners
            .iter()
            .max_by_key(|(_, listener)| listener.max_record_size.as_u64())
            .map_or("default", |(name, _)| name.as_str())
    }

    /// Reads `path`, applies `SLUICE_*__*` environment overrides, validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Self::load_with(path, Environment::Read)
    }

    /// Reads `path` and validates it, with or without the environment: without it
    /// (`check-config --no-env`), `SLUICE_*__*` overrides are not applied and the variables
    /// `kafka.properties_from_env` names need not be set — a config checked in CI, away from its
    /// secrets.
    pub fn load_with(path: &Path, environment: Environment) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        if !path.is_file() {
            return Err(ConfigError::Parse { file, message: "no such file".into() });
        }
        let mut figment = Figment::new().merge(Toml::file_exact(path));
        if environment == Environment::Read {
            figment = figment.merge(Env::prefixed(ENV_PREFIX).filter(|key| key.as_str().contains("__")).split("__"));
        }
        let config: Config =
            figment.extract().map_err(|error| ConfigError::Parse { file: file.clone(), message: describe(&error) })?;
        config.validate_in(&file, environment)?;
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

    /// `sluice agent --dry-run`: records printed (`ship.sink = "stdout"`), in a memory buffer —
    /// never the spool a real run owes to Kafka (printing settles what it prints).
    pub fn dry_run(&mut self) {
        self.ship.sink = Sink::Stdout;
        self.buffer.kind = BufferKind::Memory;
        if self.ingest.ack_point == Some(AckPoint::Spooled) {
            // Nothing is spooled: acknowledged once held, as with any memory buffer.
            self.ingest.ack_point = None;
        }
    }

    /// Checks what types alone cannot. Every error names its key. Each section checks itself;
    /// what involves two sections is checked here.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        self.validate_in(file, Environment::Read)
    }

    fn validate_in(&self, file: &str, environment: Environment) -> Result<(), ConfigError> {
        let at = At { file, prefix: String::new(), environment };
        self.log.validate(&at.within("log"))?;
        self.kafka.validate(&at.within("kafka"))?;
        self.agent.validate(&at.within("agent"))?;
        self.ingest.validate(&at.within("ingest"))?;
        self.buffer.validate(&at.within("buffer"))?;
        self.ship.validate(&at.within("ship"))?;
        self.persist.validate(&at.within("persist"))?;
        self.postgres.validate(&at.within("postgres"))?;
        self.validate_buffer_against_records(&at.within("buffer"))?;
        if self.ship.sink == Sink::Stdout && self.buffer.kind == BufferKind::Disk {
            return Err(at.invalid(
                "ship.sink",
                "\"stdout\" settles every record it prints, so it must not read a spool a real run owes to \
                 Kafka: use buffer.type = \"memory\" (sluice agent --dry-run does)",
            ));
        }
        if self.ingest.ack_point == Some(AckPoint::Spooled) && self.buffer.kind != BufferKind::Disk {
            return Err(at.invalid("ingest.ack_point", "\"spooled\" needs buffer.type = \"disk\""));
        }
        Ok(())
    }

    /// The buffer must hold the largest message a listener's record may become: a message that
    /// fits neither librdkafka's share nor the leases waits forever for room that cannot exist.
    fn validate_buffer_against_records(&self, at: &At<'_>) -> Result<(), ConfigError> {
        let record = self.largest_record();
        let buffer = self.buffer.max_bytes.as_u64();
        let largest = self.largest_message();
        if buffer < largest.saturating_mul(2) {
            return Err(at.invalid(
                "max_bytes",
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
        if self.buffer.kind != BufferKind::Disk {
            return Ok(());
        }
        // A disk buffer also keeps one backlog chunk (at least the largest message) from the
        // readers, so the backlog always moves: three largest messages.
        if buffer < largest.saturating_mul(3).saturating_add(1024) {
            return Err(at.invalid(
                "max_bytes",
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
        if self.buffer.max_disk_bytes.as_u64() < record.saturating_mul(8) {
            return Err(at.invalid(
                "max_disk_bytes",
                format!("must be at least 8 x the largest max_record_size of a listener ({})", ByteSize(record * 8)),
            ));
        }
        Ok(())
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
            let kind = match &error.kind {
                figment::error::Kind::InvalidType(found, expected) => {
                    format!("invalid type: found {found}, expected {}", in_words(expected))
                }
                figment::error::Kind::InvalidValue(found, expected) => {
                    format!("invalid value {found}, expected {}", in_words(expected))
                }
                kind => kind.to_string(),
            };
            if key.is_empty() { format!("{kind}{origin}") } else { format!("key `{key}`: {kind}{origin}") }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a key takes, in the config's words: serde names the Rust type (`usize`, `f64`) and
/// bytesize says "parsable string".
fn in_words(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number, 0 or more".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "parsable string" => SIZE_IN_WORDS.into(),
        other => other.into(),
    }
}

/// How a size is written (bytesize's reading, which `check-config` shows).
pub const SIZE_IN_WORDS: &str = "a size: bytes as a number, or text such as \"64 MiB\" (KiB, MiB, GiB: \
                                 powers of 1024; KB, MB, GB: powers of 1000, so \"64MB\" is 61.0 MiB)";

/// Which process a config runs: each reads only its own sections, and says which it is in
/// `sluice_build_info{role}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `sluice agent`
    Agent,
    /// `sluice persist`
    Persist,
}

impl Role {
    /// The `role` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Persist => "persist",
        }
    }
}

/// Where a validation error is: the file, and the dotted key of the section being checked.
pub(crate) struct At<'a> {
    file: &'a str,
    prefix: String,
    /// Whether the environment is read: the variables a config names must then be set.
    environment: Environment,
}

/// Whether a config is read with its environment ([`Config::load_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Environment {
    /// `SLUICE_*__*` overrides applied, the variables the config names required: what runs.
    Read,
    /// The file alone (`check-config --no-env`).
    Ignored,
}

impl<'a> At<'a> {
    /// The same file, one level down (`ingest` → `ingest.listeners.default`).
    fn within(&self, section: &str) -> At<'a> {
        At { file: self.file, prefix: self.key(section), environment: self.environment }
    }

    fn key(&self, key: &str) -> String {
        if self.prefix.is_empty() { key.to_string() } else { format!("{}.{key}", self.prefix) }
    }

    /// `key` (relative to this section) is not acceptable.
    fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { file: self.file.to_string(), key: self.key(key), message: message.into() }
    }
}

/// An `ip:port` the admin server can bind.
fn valid_address(at: &At<'_>, key: &str, address: &str) -> Result<(), ConfigError> {
    if address.parse::<std::net::SocketAddr>().is_err() {
        return Err(at.invalid(key, format!("`{address}` is not an ip:port address")));
    }
    Ok(())
}
