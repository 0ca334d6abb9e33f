//! librdkafka's statistics (its `statistics.interval.ms` callback) mapped to Sluice metric names,
//! and its log lines and client errors written collapsed.
//!
//! Owns: which of librdkafka's figures an SRE sees and under what name, and how its lines reach
//! the log ([`client_error`], [`log`]: the first of a kind, then one a minute with the count of
//! its repeats, [`super::repeats`]). Must not: export librdkafka's raw names or per-message
//! detail; labels stay small (broker id, partition); write a line per repeat of a failed
//! connection (during an outage librdkafka reports one every few tens of milliseconds).
//! librdkafka's counters restart with a replaced producer, so they are turned into increments
//! here rather than exported as absolute values that could go backwards.

use std::collections::HashMap;
use std::sync::Mutex;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::statistics::Statistics;

use super::REASON;
use super::repeats::{REMINDER_EVERY, Repeats, librdkafka_kind};

/// The Kafka client's lines of this process (its producer's or its consumer's), collapsed. One
/// for the process, so a replaced producer does not start the count over.
static LINES: Repeats = Repeats::new(REMINDER_EVERY);

/// A client error librdkafka reports (its `error_cb`: a broker down, all brokers down, an
/// authentication failure): retried by librdkafka, so a WARN — written the first time, then
/// once a minute with the count while it repeats.
pub fn client_error(error: &KafkaError, reason: &str) {
    let kind = match error.rdkafka_error_code() {
        Some(code) => format!("{code:?}"),
        None => error.to_string(),
    };
    if let Some(repeated) = LINES.admit(&kind) {
        tracing::warn!(%error, reason, repeated, "kafka client error");
    }
}

/// One of librdkafka's own log lines (its `log_cb`), collapsed by facility and text, at a level
/// Sluice's rules give it: librdkafka logs a refused connection at ERROR, but it is retried and
/// recovers by itself, so it is a WARN here; only what librdkafka calls critical and above is
/// an ERROR. Keeps librdkafka's target, so `log.level = "info,librdkafka=off"` still silences it.
/// The lines its `debug` property asks for go to `librdkafka::debug`, uncollapsed, so that
/// `"info,librdkafka=warn,librdkafka::debug=debug"` shows them without librdkafka's info lines.
pub fn log(level: RDKafkaLogLevel, facility: &str, message: &str) {
    if matches!(level, RDKafkaLogLevel::Debug) {
        tracing::debug!(target: "librdkafka::debug", "librdkafka: {facility} {message}");
        return;
    }
    let Some(repeated) = LINES.admit(&librdkafka_kind(facility, message)) else { return };
    match level {
        RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical => {
            tracing::error!(target: "librdkafka", repeated, "librdkafka: {facility} {message}");
        }
        RDKafkaLogLevel::Error | RDKafkaLogLevel::Warning => {
            tracing::warn!(target: "librdkafka", repeated, "librdkafka: {facility} {message}");
        }
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info | RDKafkaLogLevel::Debug => {
            tracing::info!(target: "librdkafka", repeated, "librdkafka: {facility} {message}");
        }
    }
}

/// Kafka answers again: the kinds of the outage are forgotten (the next failure is written at
/// once). Returns how many of their lines were counted and not written.
pub fn answered() -> u64 {
    LINES.clear()
}

/// How often librdkafka reports its statistics (`statistics.interval.ms`), for the producer
/// and the consumer alike.
pub const STATISTICS_INTERVAL_MS: &str = "5000";
/// Messages in librdkafka's queues (producer: waiting to be sent or acknowledged; consumer:
/// fetched, not yet consumed).
pub const QUEUE_MESSAGES: &str = "sluice_kafka_queue_messages";
/// Bytes of those messages.
pub const QUEUE_BYTES: &str = "sluice_kafka_queue_bytes";
/// Requests sent to brokers and not yet answered, plus those waiting to be sent.
pub const REQUESTS_IN_FLIGHT: &str = "sluice_kafka_requests_in_flight";
/// Average broker round-trip time over the last statistics window, per broker.
pub const BROKER_RTT: &str = "sluice_kafka_broker_rtt_seconds";
/// Transport errors, by `reason` (`send`, `receive`, `timeout`).
pub const ERRORS: &str = "sluice_kafka_errors_total";

/// Describes the metrics above (called once at start).
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_gauge!(QUEUE_MESSAGES, "Messages in librdkafka's queues.");
    describe_gauge!(QUEUE_BYTES, Unit::Bytes, "Bytes of messages in librdkafka's queues.");
    describe_gauge!(REQUESTS_IN_FLIGHT, "Kafka requests waiting to be sent or answered.");
    describe_gauge!(BROKER_RTT, Unit::Seconds, "Average broker round-trip time, per broker.");
    describe_counter!(ERRORS, "Kafka transport errors, by reason.");
    for reason in ["send", "receive", "timeout"] {
        metrics::counter!(ERRORS, REASON => reason).increment(0);
    }
}

/// Turns librdkafka's cumulative error counts into increments.
#[derive(Default)]
pub struct ErrorTotals {
    last: Mutex<HashMap<(String, &'static str), u64>>,
}

/// Publishes one statistics report.
pub fn record(statistics: &Statistics, totals: &ErrorTotals) {
    metrics::gauge!(QUEUE_MESSAGES).set(statistics.msg_cnt as f64);
    metrics::gauge!(QUEUE_BYTES).set(statistics.msg_size as f64);
    let mut in_flight = 0;
    let mut last = totals.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for broker in statistics.brokers.values().filter(|broker| broker.nodeid >= 0) {
        in_flight += broker.outbuf_cnt.max(0) + broker.waitresp_cnt.max(0);
        if let Some(rtt) = &broker.rtt
            && rtt.avg > 0
        {
            metrics::gauge!(BROKER_RTT, "broker" => broker.nodeid.to_string()).set(rtt.avg as f64 / 1e6);
        }
        for (reason, total) in [("send", broker.txerrs), ("receive", broker.rxerrs), ("timeout", broker.req_timeouts)] {
            let seen = last.entry((broker.name.clone(), reason)).or_insert(0);
            // A smaller total means a new client (replaced producer): count from zero again.
            let delta = if total >= *seen { total - *seen } else { total };
            *seen = total;
            if delta > 0 {
                metrics::counter!(ERRORS, REASON => reason).increment(delta);
            }
        }
    }
    metrics::gauge!(REQUESTS_IN_FLIGHT).set(in_flight as f64);
}
