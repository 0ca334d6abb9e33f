//! `[buffer]`: the bounded buffer between the socket and Kafka, and its disk spool.
//!
//! Owns: the section's schema and its own checks (what it must hold relative to the listeners'
//! records is checked by [`super::Config::validate`], which sees both). Must not: size anything
//! (buffer does).

use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use super::{At, ConfigError};

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
    /// [`super::Config::largest_message`]), the rest holds records — queued, in flight, read back from
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
    #[serde(with = "super::serde_helpers::duration_or_forever")]
    pub block_timeout: Option<Duration>,
    /// `"disk"`: the spool directory (created). Default `"/var/lib/sluice/spool"`.
    pub path: PathBuf,
    /// `"disk"`: cap on the spool's files. At least 1 MiB. Default `256 MiB`.
    pub max_disk_bytes: ByteSize,
    /// `"disk"`: when writes are forced to stable storage: `"never"` (the OS decides; survives
    /// a crash of sluice, not of the machine), `"always"` (before a record counts as spooled; one
    /// fsync covers every record written meanwhile), or an interval such as `"10ms"`.
    /// Default `"100ms"`.
    pub fsync: Fsync,
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
            fsync: Fsync::Interval(Duration::from_millis(100)),
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

/// `buffer.fsync`, when written records are forced to stable storage: `"never"`, `"always"`, or
/// an interval like `"10ms"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// Never; the OS writes back when it likes. Survives a crash of sluice, not of the machine.
    Never,
    /// At most this long after a write (one fsync covers everything written meanwhile).
    Interval(Duration),
    /// Before a record counts as spooled (group commit: one fsync per batch of writes).
    Always,
}

impl std::fmt::Display for Fsync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fsync::Never => f.write_str("never"),
            Fsync::Always => f.write_str("always"),
            Fsync::Interval(every) => write!(f, "{}", humantime::format_duration(*every)),
        }
    }
}

impl Serialize for Fsync {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Fsync {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            "never" => Ok(Fsync::Never),
            "always" => Ok(Fsync::Always),
            interval => humantime::parse_duration(interval).map(Fsync::Interval).map_err(|_| {
                serde::de::Error::custom(format!("`{text}` is not \"never\", \"always\" or an interval like \"10ms\""))
            }),
        }
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

/// Smallest spool accepted: a few segments.
pub const MIN_DISK_BYTES: u64 = 1024 * 1024;

/// Smallest buffer accepted: a sidecar may get only tens of MiB, but below this the buffer
/// cannot hold even a few maximum-size records.
pub const MIN_BUFFER_BYTES: u64 = 64 * 1024;

impl BufferConfig {
    /// Checks what types alone cannot.
    pub(super) fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        let bytes = self.max_bytes.as_u64();
        if bytes < MIN_BUFFER_BYTES {
            return Err(at.invalid("max_bytes", format!("must be at least {}", ByteSize(MIN_BUFFER_BYTES))));
        }
        // librdkafka's queue is sized from the buffer and caps at 2097151 KiB / 10M messages.
        if bytes > 2 * 1024 * 1024 * 1024 - 1024 {
            return Err(at.invalid("max_bytes", "must be below 2 GiB (librdkafka's queue limit)"));
        }
        if self.kind == BufferKind::Disk {
            if self.max_disk_bytes.as_u64() < MIN_DISK_BYTES {
                return Err(at.invalid("max_disk_bytes", format!("must be at least {}", ByteSize(MIN_DISK_BYTES))));
            }
            if self.path.as_os_str().is_empty() {
                return Err(at.invalid("path", "must be a directory path"));
            }
        }
        if let Fsync::Interval(every) = self.fsync
            && (every.is_zero() || every > Duration::from_secs(60))
        {
            return Err(at.invalid("fsync", "an interval must be between 1ms and 60s"));
        }
        if self.block_timeout.is_some_and(|timeout| timeout.is_zero()) {
            return Err(at.invalid("block_timeout", "must be greater than zero (or \"forever\")"));
        }
        if self.max_records == 0 || self.max_records > 10_000_000 {
            return Err(at.invalid("max_records", "must be between 1 and 10000000"));
        }
        if self.kind == BufferKind::Disk && self.max_records < 2 {
            // The backlog's reserve takes one record slot readers never get.
            return Err(at.invalid("max_records", "with buffer.type = \"disk\" must be at least 2"));
        }
        Ok(())
    }
}
