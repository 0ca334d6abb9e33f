//! Every way a record ends other than delivered or stored, as types: one enum per counter, each
//! variant with the one word that names it everywhere — the metric's `reason` label, the `NAK`
//! a writer reads, the dead letter's `reason` column, the logs and the docs.
//!
//! Owns: those words ([`Dropped::as_str`] and the like), the list of each kind (`ALL`: the series
//! created at zero, and the docs test that checks docs/METRICS.md lists them), and counting an
//! outcome on its counter (`count`), so a reason can never land on the wrong metric. Vector's
//! `internal_events` are the pattern. Must not: hold records or decide anything — the components
//! decide, this only names and counts what they decided. No reason word is written as a string
//! anywhere else in the crate (a test greps for them).

use rdkafka::types::RDKafkaErrorCode;

use super::{BUFFER_DROPPED, PERSIST_DEAD_LETTERS, PERSIST_LOST, REASON, SHIP_FAILED};

/// Why a record was refused at the socket (`sluice_ingest_records_rejected_total`, per listener;
/// counted by the listener's metrics, which carry its labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Longer than the listener's `max_record_size`.
    TooLarge,
    /// Not valid UTF-8.
    InvalidUtf8,
    /// An empty record.
    Empty,
    /// Contains a NUL byte, or in a JSON record its escape `\u0000` (PostgreSQL text cannot
    /// hold U+0000).
    ContainsNul,
    /// A JSON record with a `\uD800`–`\uDFFF` escape that is not half of a pair (every JSON
    /// query reaching its row would fail).
    UnpairedSurrogate,
    /// JSON nested deeper than `ingest.max_json_depth`.
    TooDeep,
    /// Not a valid frame or message of the listener's protocol.
    Malformed,
    /// Over its rate limit with `action = "drop"`.
    RateLimited,
    /// Cut short: the agent stopped reading before the record's end arrived (the drain shut the
    /// socket's read side, the connection idled out or failed with a record half written). What
    /// the writer had not ended is not stored as if it had.
    Truncated,
}

impl Rejected {
    /// Every reason, for creating the series at zero.
    pub const ALL: [Rejected; 9] = [
        Rejected::TooLarge,
        Rejected::InvalidUtf8,
        Rejected::Empty,
        Rejected::ContainsNul,
        Rejected::UnpairedSurrogate,
        Rejected::TooDeep,
        Rejected::Malformed,
        Rejected::RateLimited,
        Rejected::Truncated,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejected::TooLarge => "too_large",
            Rejected::InvalidUtf8 => "invalid_utf8",
            Rejected::Empty => "empty",
            Rejected::ContainsNul => "contains_nul",
            Rejected::UnpairedSurrogate => "unpaired_surrogate",
            Rejected::TooDeep => "too_deep",
            Rejected::Malformed => "malformed",
            Rejected::RateLimited => "rate_limited",
            Rejected::Truncated => "truncated",
        }
    }
}

/// Why the buffer let a record go (`sluice_buffer_records_dropped_total`). The first three are
/// the `buffer.when_full` policy at work and carry its config words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Full under `when_full = "drop_newest"`: the new record went.
    DropNewest,
    /// Full under `when_full = "drop_oldest"`: the oldest records (or spool segment) went.
    DropOldest,
    /// Full under `when_full = "block"`, and the writer waited `block_timeout` in vain.
    BlockTimeout,
    /// Found damaged in the spool.
    Corrupt,
}

impl Dropped {
    /// Every reason, for creating the series at zero.
    pub const ALL: [Dropped; 4] = [Dropped::DropNewest, Dropped::DropOldest, Dropped::BlockTimeout, Dropped::Corrupt];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::DropNewest => "drop_newest",
            Dropped::DropOldest => "drop_oldest",
            Dropped::BlockTimeout => "block_timeout",
            Dropped::Corrupt => "corrupt",
        }
    }

    /// Counts `records` dropped for this reason.
    pub fn count(self, records: u64) {
        metrics::counter!(BUFFER_DROPPED, REASON => self.as_str()).increment(records);
    }
}

/// Why the shipper gave a record up (`sluice_ship_records_failed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// Not handed to Kafka (or not written to the spool) before the drain deadline.
    DrainTimeout,
    /// Larger than Kafka (or the current config) accepts.
    MessageSizeTooLarge,
    /// Kafka refused it as an invalid record.
    InvalidRecord,
    /// Kafka refused it for another reason that will not pass (the log line names it).
    KafkaRefused,
    /// Sent to Kafka, whose answer had not come when the drain ended (memory records only): it
    /// may be stored or not, nobody can tell. Not retried, so never stored twice by the agent.
    Unconfirmed,
}

impl Failed {
    /// Every reason, for creating the series at zero.
    pub const ALL: [Failed; 5] = [
        Failed::DrainTimeout,
        Failed::MessageSizeTooLarge,
        Failed::InvalidRecord,
        Failed::KafkaRefused,
        Failed::Unconfirmed,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Failed::DrainTimeout => "drain_timeout",
            Failed::MessageSizeTooLarge => "message_size_too_large",
            Failed::InvalidRecord => "invalid_record",
            Failed::KafkaRefused => "kafka_refused",
            Failed::Unconfirmed => "unconfirmed",
        }
    }

    /// Counts `records` given up for this reason.
    pub fn count(self, records: u64) {
        metrics::counter!(SHIP_FAILED, REASON => self.as_str()).increment(records);
    }
}

/// Why an acknowledged-mode writer hears `NAK n <reason>`: the same word as the metric that
/// counted the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Refused at the socket.
    Rejected(Rejected),
    /// Let go by the buffer.
    Dropped(Dropped),
    /// Given up by the shipper.
    Failed(Failed),
}

impl Refused {
    /// The word after `NAK n`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Rejected(reason) => reason.as_str(),
            Refused::Dropped(reason) => reason.as_str(),
            Refused::Failed(reason) => reason.as_str(),
        }
    }
}

/// A record the agent lets go after the socket took it: dropped by the buffer or given up by the
/// shipper. Unlike [`Refused`] it cannot be a socket rejection (counted by its listener, with the
/// listener's labels), so counting it can never be a no-op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LetGo {
    /// Let go by the buffer.
    Dropped(Dropped),
    /// Given up by the shipper.
    Failed(Failed),
}

impl LetGo {
    /// Counts `records` on the buffer's drop counter or the shipper's give-up counter.
    pub fn count(self, records: u64) {
        match self {
            LetGo::Dropped(reason) => reason.count(records),
            LetGo::Failed(reason) => reason.count(records),
        }
    }
}

impl From<Dropped> for LetGo {
    fn from(reason: Dropped) -> Self {
        LetGo::Dropped(reason)
    }
}

impl From<Failed> for LetGo {
    fn from(reason: Failed) -> Self {
        LetGo::Failed(reason)
    }
}

impl From<LetGo> for Refused {
    fn from(reason: LetGo) -> Self {
        match reason {
            LetGo::Dropped(reason) => Refused::Dropped(reason),
            LetGo::Failed(reason) => Refused::Failed(reason),
        }
    }
}

impl From<Rejected> for Refused {
    fn from(reason: Rejected) -> Self {
        Refused::Rejected(reason)
    }
}

impl From<Dropped> for Refused {
    fn from(reason: Dropped) -> Self {
        Refused::Dropped(reason)
    }
}

impl From<Failed> for Refused {
    fn from(reason: Failed) -> Self {
        Refused::Failed(reason)
    }
}

/// Why a connection was closed at once (`sluice_ingest_connections_refused_total`, per listener).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionRefused {
    /// The listener already serves `max_connections`.
    MaxConnections,
    /// The peer is not in the listener's `allow_uids`/`allow_gids`.
    PeerDenied,
}

impl ConnectionRefused {
    /// Every reason, for creating the series at zero.
    pub const ALL: [ConnectionRefused; 2] = [ConnectionRefused::MaxConnections, ConnectionRefused::PeerDenied];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionRefused::MaxConnections => "max_connections",
            ConnectionRefused::PeerDenied => "peer_denied",
        }
    }
}

/// Why a Kafka message went to `dead_letters` instead of `logs` (the column `reason` and the
/// label of `sluice_persist_dead_letters_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeadLetterReason {
    /// Not a sluice envelope.
    MalformedEnvelope,
    /// An envelope of a version this persister does not read.
    UnsupportedVersion,
    /// An envelope without a message.
    MissingMessage,
    /// Holds U+0000, which PostgreSQL text cannot (the agent rejects it at the socket with the
    /// same word).
    ContainsNul,
    /// PostgreSQL refused the row.
    RejectedByPostgres,
    /// A Kafka message without a value.
    EmptyMessage,
    /// Older than `retention_days`.
    Expired,
    /// Its ingest time is further ahead of this clock than `max_clock_skew` allows.
    IngestTimeInFuture,
    /// Its ingest time is before the Unix epoch: no agent's clock, and no day partition is made
    /// for it.
    IngestTimeBeforeEpoch,
    /// A JSON record holding a `\uD800`–`\uDFFF` escape that is not half of a pair: `json`
    /// would store it, and every JSON query reaching the row would then fail.
    UnpairedSurrogate,
}

impl DeadLetterReason {
    /// Every reason (docs/METRICS.md lists the same).
    pub const ALL: [DeadLetterReason; 10] = [
        DeadLetterReason::MalformedEnvelope,
        DeadLetterReason::UnsupportedVersion,
        DeadLetterReason::MissingMessage,
        DeadLetterReason::ContainsNul,
        DeadLetterReason::RejectedByPostgres,
        DeadLetterReason::EmptyMessage,
        DeadLetterReason::Expired,
        DeadLetterReason::IngestTimeInFuture,
        DeadLetterReason::IngestTimeBeforeEpoch,
        DeadLetterReason::UnpairedSurrogate,
    ];

    /// The `reason` column and label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::MalformedEnvelope => "malformed_envelope",
            DeadLetterReason::UnsupportedVersion => "unsupported_version",
            DeadLetterReason::MissingMessage => "missing_message",
            DeadLetterReason::ContainsNul => "contains_nul",
            DeadLetterReason::RejectedByPostgres => "rejected_by_postgres",
            DeadLetterReason::EmptyMessage => "empty_message",
            DeadLetterReason::Expired => "expired",
            DeadLetterReason::IngestTimeInFuture => "ingest_time_in_future",
            DeadLetterReason::IngestTimeBeforeEpoch => "ingest_time_before_epoch",
            DeadLetterReason::UnpairedSurrogate => "unpaired_surrogate",
        }
    }

    /// Counts `messages` kept as dead letters for this reason.
    pub fn count(self, messages: u64) {
        metrics::counter!(PERSIST_DEAD_LETTERS, REASON => self.as_str()).increment(messages);
    }
}

/// Why the persister stored a message neither as a row nor as a dead letter
/// (`sluice_persist_records_lost_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// PostgreSQL refused the row and then its dead letter too.
    DeadLetterRejected,
}

impl Lost {
    /// Every reason, for creating the series at zero.
    pub const ALL: [Lost; 1] = [Lost::DeadLetterRejected];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Lost::DeadLetterRejected => "dead_letter_rejected",
        }
    }

    /// Counts `messages` lost for this reason.
    pub fn count(self, messages: u64) {
        metrics::counter!(PERSIST_LOST, REASON => self.as_str()).increment(messages);
    }
}

/// The word for a librdkafka error (the `reason` of `sluice_ship_delivery_errors_total`, and the
/// `kafka_error` field of a give-up's log line): its name in snake case, from librdkafka's fixed
/// set.
pub fn kafka_error(code: RDKafkaErrorCode) -> String {
    let name = format!("{code:?}");
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The delivery errors shown at 0 from the start, so that dashboards and `rate()` see a series
/// before the first failure.
pub const COMMON_DELIVERY_ERRORS: [RDKafkaErrorCode; 3] =
    [RDKafkaErrorCode::MessageTimedOut, RDKafkaErrorCode::MessageSizeTooLarge, RDKafkaErrorCode::AllBrokersDown];

/// What a config reload did (`sluice_config_reloads_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// The new config runs.
    Applied,
    /// It did not validate; the running config stays.
    Rejected,
    /// The file did not change.
    Unchanged,
}

impl Reload {
    /// Every result, for creating the series at zero.
    pub const ALL: [Reload; 3] = [Reload::Applied, Reload::Rejected, Reload::Unchanged];

    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reload::Applied => "applied",
            Reload::Rejected => "rejected",
            Reload::Unchanged => "unchanged",
        }
    }
}

/// Why a record went to the default topic (the `reason` label of
/// `sluice_ingest_topic_defaults_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defaulted {
    /// A pod or record field the template names is missing.
    MissingField,
    /// The rendered name is not a Kafka topic name (`[a-zA-Z0-9._-]`, 1-249 characters).
    InvalidTopic,
    /// The agent already routes to `kafka.max_topics` topics.
    MaxTopics,
    /// The broker does not know the topic (and does not create it).
    UnknownTopic,
}

impl Defaulted {
    /// Every reason, in the order of their counters.
    pub const ALL: [Defaulted; 4] =
        [Defaulted::MissingField, Defaulted::InvalidTopic, Defaulted::MaxTopics, Defaulted::UnknownTopic];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Defaulted::MissingField => "missing_field",
            Defaulted::InvalidTopic => "invalid_topic",
            Defaulted::MaxTopics => "max_topics",
            Defaulted::UnknownTopic => "unknown_topic",
        }
    }
}

/// Why a pod label or annotation was not kept (`sluice_pod_info_skipped{kind, reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodInfoSkip {
    /// Not in `agent.pod_info.labels`/`annotations`, or in `exclude`.
    NotAllowed,
    /// Past `agent.pod_info.max_bytes`.
    MaxBytes,
    /// A line that is not `key="value"`, a file too large or not UTF-8.
    Malformed,
}

impl PodInfoSkip {
    /// Every reason.
    pub const ALL: [PodInfoSkip; 3] = [PodInfoSkip::NotAllowed, PodInfoSkip::MaxBytes, PodInfoSkip::Malformed];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PodInfoSkip::NotAllowed => "not_allowed",
            PodInfoSkip::MaxBytes => "max_bytes",
            PodInfoSkip::Malformed => "malformed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every word, each once: two outcomes of one counter never share a label.
    #[test]
    fn every_reason_has_one_word_and_no_word_two_meanings_on_one_counter() {
        let mut words: Vec<&str> = Dropped::ALL.iter().map(|r| r.as_str()).collect();
        words.extend(Failed::ALL.iter().map(|r| r.as_str()));
        words.extend(Rejected::ALL.iter().map(|r| r.as_str()));
        let mut unique = words.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), words.len(), "a NAK word names one outcome: {words:?}");
        let letters: Vec<&str> = DeadLetterReason::ALL.iter().map(|r| r.as_str()).collect();
        assert!(
            letters.contains(&Rejected::ContainsNul.as_str()),
            "NUL has one name at the socket and in dead letters"
        );
    }

    /// The production code outside this module and `telemetry` (tests aside) names no reason
    /// and no metric as a string: it uses these types and the `telemetry` constants.
    #[test]
    fn no_reason_word_or_metric_name_is_written_as_a_string_outside_telemetry() {
        let mut words: Vec<&str> = Vec::new();
        words.extend(Rejected::ALL.iter().map(|r| r.as_str()));
        words.extend(Dropped::ALL.iter().map(|r| r.as_str()));
        words.extend(Failed::ALL.iter().map(|r| r.as_str()));
        words.extend(ConnectionRefused::ALL.iter().map(|r| r.as_str()));
        words.extend(DeadLetterReason::ALL.iter().map(|r| r.as_str()));
        words.extend(Lost::ALL.iter().map(|r| r.as_str()));
        words.extend(Reload::ALL.iter().map(|r| r.as_str()));
        let mut offences = Vec::new();
        for file in crate::test_support::rust_files(&["src"], |_| true) {
            let relative = file.strip_prefix("src/").unwrap_or(&file).to_owned();
            let name = relative.rsplit('/').next().unwrap_or_default();
            if name == "tests.rs" || name == "model.rs" {
                continue;
            }
            let path = crate::test_support::crate_root().join(&file);
            let in_telemetry = relative == "telemetry.rs" || relative.starts_with("telemetry/");
            let text = std::fs::read_to_string(&path).expect("source");
            // An inline test module closes the file by convention: it is a test.
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
            for (number, line) in code.lines().enumerate() {
                let trimmed = line.trim_start();
                if trimmed.starts_with("//") {
                    continue;
                }
                // A config key may be the word of what it governs (`max_connections`): only
                // as the key argument of `key(…)` or `invalid(…)` is the word allowed.
                let named = words.iter().find(|word| {
                    let quoted = format!("\"{word}\"");
                    line.matches(&quoted).count()
                        > line.matches(&format!("key({quoted}")).count()
                            + line.matches(&format!("invalid({quoted}")).count()
                });
                let metric = !in_telemetry && line.contains("\"sluice_");
                if (named.is_some() && !in_telemetry) || metric {
                    offences.push(format!("{relative}:{}: {}", number + 1, line.trim()));
                }
            }
        }
        assert!(offences.is_empty(), "use telemetry::outcome and the telemetry constants:\n{}", offences.join("\n"));
    }

    /// Tests, the harness and the benchmarks, and the crate's own test modules, name metrics
    /// through the `telemetry` constants too (a Prometheus text fixture is data: it may spell
    /// them, but not as a quoted literal that starts with the name).
    #[test]
    fn no_metric_name_is_written_as_a_string_outside_telemetry_in_tests_and_tools_either() {
        let mut offences = Vec::new();
        let descend = |dir: &str| !dir.ends_with("target");
        for relative in crate::test_support::rust_files(&["src", "tests", "harness", "benches"], descend) {
            if relative == "src/telemetry.rs" || relative.starts_with("src/telemetry/") {
                continue;
            }
            let path = crate::test_support::crate_root().join(&relative);
            let text = std::fs::read_to_string(&path).expect("source");
            for (number, line) in text.lines().enumerate() {
                if line.contains(&format!("\"{}", super::super::PREFIX)) && !line.trim_start().starts_with("//") {
                    offences.push(format!("{relative}:{}: {}", number + 1, line.trim()));
                }
            }
        }
        assert!(offences.is_empty(), "use the telemetry constants:\n{}", offences.join("\n"));
    }

    /// docs/METRICS.md lists every reason of each counter, and docs/PROTOCOL.md every NAK word.
    #[test]
    fn the_docs_list_every_reason() {
        let metrics_doc = include_str!("../../docs/METRICS.md");
        let line = |metric: &str| {
            metrics_doc.lines().find(|line| line.starts_with(&format!("| `{metric}`"))).unwrap_or_default().to_owned()
        };
        let mut lists: Vec<(&str, Vec<&str>)> = vec![
            (super::super::INGEST_REJECTED, Rejected::ALL.iter().map(|r| r.as_str()).collect()),
            (BUFFER_DROPPED, Dropped::ALL.iter().map(|r| r.as_str()).collect()),
            (SHIP_FAILED, Failed::ALL.iter().map(|r| r.as_str()).collect()),
            (PERSIST_DEAD_LETTERS, DeadLetterReason::ALL.iter().map(|r| r.as_str()).collect()),
            (PERSIST_LOST, Lost::ALL.iter().map(|r| r.as_str()).collect()),
            (super::super::INGEST_REFUSED, ConnectionRefused::ALL.iter().map(|r| r.as_str()).collect()),
        ];
        lists.push((super::super::CONFIG_RELOADS, Reload::ALL.iter().map(|r| r.as_str()).collect()));
        for (metric, words) in &lists {
            let documented = line(metric);
            for word in words {
                assert!(documented.contains(&format!("`{word}`")), "docs/METRICS.md: {metric} does not list `{word}`");
            }
        }
        let protocol = include_str!("../../docs/PROTOCOL.md");
        let nak =
            protocol.split("NAK <n> <reason>").nth(1).and_then(|rest| rest.split("ACK <n>").next()).unwrap_or_default();
        for word in lists[..3].iter().flat_map(|(_, words)| words) {
            assert!(nak.contains(word), "docs/PROTOCOL.md's NAK list lacks {word}");
        }
    }
}
