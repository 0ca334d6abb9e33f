//! Telemetry: every metric name in one place, their help texts, the Prometheus recorder, and the
//! process's own log output.
//!
//! Owns: metric names and label values (so config, code and `docs` say the same word), and the
//! recorder whose `render()` the admin server serves. Must not: open its own HTTP listener (the
//! admin port serves `/metrics`), use unbounded label values (pod UIDs, offsets, keys), or be
//! called per record where a batch count will do.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::sync::Arc;

use crate::config::{LogConfig, LogFormat};

pub mod librdkafka;
pub mod log_format;
pub mod outcome;
pub mod repeats;
pub mod scrape;

/// Label key for the cause of a rejection, drop or failure.
pub const REASON: &str = "reason";

// ---- agent: ingest (every series labelled `listener` and `protocol`)
/// Connections accepted and served (refused ones are counted in [`INGEST_REFUSED`] only).
pub const INGEST_CONNECTIONS: &str = "sluice_ingest_connections_total";
/// Connections currently open.
pub const INGEST_CONNECTIONS_OPEN: &str = "sluice_ingest_connections_open";
/// Connections closed at once, by `reason` (`max_connections`, `peer_denied`).
pub const INGEST_REFUSED: &str = "sluice_ingest_connections_refused_total";
/// Connections closed because no record completed within `idle_timeout`.
pub const INGEST_IDLE_CLOSED: &str = "sluice_ingest_connections_idle_closed_total";
/// Records read from the socket and accepted into the pipeline.
pub const INGEST_RECORDS: &str = "sluice_ingest_records_total";
/// Bytes of accepted records, as the app wrote them (without framing).
pub const INGEST_BYTES: &str = "sluice_ingest_bytes_total";
/// Records refused at the socket, by `reason` (see [`outcome::Rejected`]).
pub const INGEST_REJECTED: &str = "sluice_ingest_records_rejected_total";
/// Records that waited for their rate limit (`action = "throttle"`).
pub const INGEST_THROTTLED: &str = "sluice_ingest_records_throttled_total";
/// Bytes read from connections and not yet turned into records.
pub const INGEST_READ_BUFFER_BYTES: &str = "sluice_ingest_read_buffer_bytes";
/// Records sent to `kafka.default_topic` because the `kafka.topic` template could not route
/// them, by `reason` (`missing_field`, `invalid_topic`, `max_topics`, `unknown_topic`).
pub const INGEST_TOPIC_DEFAULTS: &str = "sluice_ingest_topic_defaults_total";
/// Distinct topics the `kafka.topic` template routes to (at most `kafka.max_topics`).
pub const INGEST_TOPICS: &str = "sluice_ingest_topics";
/// Values and matches masked before records left the pod, by `listener` and `rule` (the name of
/// a `redact` rule).
pub const INGEST_REDACTIONS: &str = "sluice_ingest_redactions_total";
/// Typed column values stored as NULL because they did not convert to the column's type, by
/// `column` (`[persist.columns]`).
pub const PERSIST_UNCONVERTIBLE: &str = "sluice_persist_unconvertible_values_total";
/// Pod labels and annotations kept, by `kind` (`labels`, `annotations`).
pub const POD_INFO_ENTRIES: &str = "sluice_pod_info_entries";
/// Pod labels and annotations not kept at the last read, by `kind` and `reason` (`not_allowed`,
/// `max_bytes`, `malformed`).
pub const POD_INFO_SKIPPED: &str = "sluice_pod_info_skipped";
/// Lines a `multiline` listener joined to the record before them.
pub const INGEST_LINES_JOINED: &str = "sluice_ingest_lines_joined_total";
/// Records a multiline limit cut before their rule ended them, by `reason` (`max_lines`,
/// `max_bytes`, `pool`).
pub const INGEST_RECORDS_SPLIT: &str = "sluice_ingest_records_split_total";
/// OTLP Exports answered, by `transport` (`grpc`, `http`) and `outcome` (`ok`,
/// `partial_success`, `retry`, `refused`).
pub const INGEST_OTLP_EXPORTS: &str = "sluice_ingest_otlp_exports_total";

// ---- agent: buffer
/// Records held: waiting in the buffer or sent and not yet acknowledged by Kafka.
pub const BUFFER_RECORDS: &str = "sluice_buffer_records";
/// Bytes held, same span as [`BUFFER_RECORDS`].
pub const BUFFER_BYTES: &str = "sluice_buffer_bytes";
/// Configured byte capacity (`buffer.max_bytes`).
pub const BUFFER_CAPACITY_BYTES: &str = "sluice_buffer_capacity_bytes";
/// Configured record capacity (`buffer.max_records`).
pub const BUFFER_CAPACITY_RECORDS: &str = "sluice_buffer_capacity_records";
/// Age of the oldest record not yet acknowledged by Kafka (0 when none is held). With a disk
/// buffer, to the resolution of one spool segment.
pub const BUFFER_OLDEST_AGE: &str = "sluice_buffer_oldest_record_age_seconds";
/// Records dropped by the full-buffer policy, `reason` = the `when_full` value.
pub const BUFFER_DROPPED: &str = "sluice_buffer_records_dropped_total";

// ---- agent: spool (buffer.type = "disk")
/// Bytes of the spool's segment files.
pub const SPOOL_BYTES: &str = "sluice_spool_bytes";
/// Configured spool cap (`buffer.max_disk_bytes`).
pub const SPOOL_CAPACITY_BYTES: &str = "sluice_spool_capacity_bytes";
/// Records in the spool not yet acknowledged by Kafka.
pub const SPOOL_RECORDS: &str = "sluice_spool_records";
/// Spool I/O failures, by `op` (`write`, `fsync`, `read`).
pub const SPOOL_ERRORS: &str = "sluice_spool_errors_total";
/// Records recovered from the spool at start-up.
pub const SPOOL_RECOVERED: &str = "sluice_spool_recovered_records_total";
/// Bytes of spool data skipped as damaged (at start-up, and behind damage found while reading
/// the backlog). The records lost are in `sluice_buffer_records_dropped_total{reason="corrupt"}`:
/// exact when found while reading, one per damaged region at start-up (where a damaged frame's
/// records cannot be counted).
pub const SPOOL_CORRUPT_BYTES: &str = "sluice_spool_corrupt_bytes_total";

// ---- agent: ship
/// Records acknowledged by Kafka (acks=all).
pub const SHIP_DELIVERED: &str = "sluice_ship_records_delivered_total";
/// Bytes of acknowledged records (envelope bytes sent to Kafka).
pub const SHIP_DELIVERED_BYTES: &str = "sluice_ship_bytes_delivered_total";
/// Failed delivery reports, retried or not, by `reason` (librdkafka's error name).
pub const SHIP_DELIVERY_ERRORS: &str = "sluice_ship_delivery_errors_total";
/// Time from ingest to Kafka's acknowledgement, per record.
pub const SHIP_DELIVERY_LATENCY: &str = "sluice_ship_delivery_latency_seconds";
/// Records put back into the buffer after a retryable delivery failure.
pub const SHIP_RETRIED: &str = "sluice_ship_records_retried_total";
/// Records given up: a non-retryable Kafka error, or still undelivered at the drain deadline.
pub const SHIP_FAILED: &str = "sluice_ship_records_failed_total";
/// Producers replaced after a fatal librdkafka error.
pub const SHIP_PRODUCER_RECREATIONS: &str = "sluice_ship_producer_recreations_total";
/// 1 while the last Kafka metadata request succeeded.
pub const KAFKA_REACHABLE: &str = "sluice_kafka_reachable";

// ---- persist
/// Kafka messages received by the persister.
pub const PERSIST_CONSUMED: &str = "sluice_persist_records_consumed_total";
/// Rows inserted into the logs table (`log_rows`).
pub const PERSIST_ROWS: &str = "sluice_persist_rows_written_total";
/// Records already present (redelivery after a crash or rebalance), skipped by the unique key.
pub const PERSIST_DUPLICATES: &str = "sluice_persist_rows_duplicate_total";
/// Batches committed to PostgreSQL.
pub const PERSIST_BATCHES: &str = "sluice_persist_batches_total";
/// Time to write one batch: COPY (+ insert for a redelivered batch) and commit.
pub const PERSIST_BATCH_SECONDS: &str = "sluice_persist_batch_duration_seconds";
/// Histogram: ingest (the agent's clock) → the row's commit in PostgreSQL, per row.
pub const PERSIST_ROW_LATENCY: &str = "sluice_persist_row_latency_seconds";
/// Batch writes that failed and were retried.
pub const PERSIST_WRITE_ERRORS: &str = "sluice_persist_write_errors_total";
/// Offset stores or commits that failed.
pub const PERSIST_COMMIT_ERRORS: &str = "sluice_persist_commit_errors_total";
/// Messages that could not be parsed as a sluice envelope, kept in `dead_letters`, by `reason`.
pub const PERSIST_DEAD_LETTERS: &str = "sluice_persist_dead_letters_total";
/// Dead letters deleted past `persist.dead_letter_retention_days`.
pub const PERSIST_DEAD_LETTERS_DELETED: &str = "sluice_persist_dead_letters_deleted_total";
/// Messages stored neither as a row nor as a dead letter (PostgreSQL refused the dead letter
/// too), by `reason`; each is logged at ERROR with its topic, partition and offset, where it can
/// still be read from Kafka until the topic's retention ends.
pub const PERSIST_LOST: &str = "sluice_persist_records_lost_total";
/// Partitions currently assigned to this persister.
pub const PERSIST_ASSIGNED_PARTITIONS: &str = "sluice_persist_assigned_partitions";
/// 1 while PostgreSQL answers the persister (its last connect, batch write or probe worked).
pub const PERSIST_POSTGRES_REACHABLE: &str = "sluice_persist_postgres_reachable";
/// Records in the topic not yet persisted, per `partition` (high watermark minus stored offset).
pub const PERSIST_LAG_RECORDS: &str = "sluice_persist_lag_records";
/// While a partition lags: now minus the ingest time of its last persisted record; 0 otherwise.
pub const PERSIST_LAG_SECONDS: &str = "sluice_persist_lag_seconds";
/// Consumer group rebalances seen.
pub const PERSIST_REBALANCES: &str = "sluice_persist_rebalances_total";

// ---- both
/// Config reloads (SIGHUP or a changed file), by `result`: `applied`, `rejected` (did not
/// validate; the running config stays), `unchanged`.
pub const CONFIG_RELOADS: &str = "sluice_config_reloads_total";
/// What every metric name of sluice starts with.
pub const PREFIX: &str = "sluice_";
/// 1 for the running config's fingerprint (`hash`), 0 for earlier ones.
pub const CONFIG_INFO: &str = "sluice_config_info";
/// Always 1; `version` and `git_sha` say which build runs, `role` (`agent`, `persist`) which
/// process — alert rules join on it.
pub const BUILD_INFO: &str = "sluice_build_info";
/// 1 while the process reports ready on `/readyz`.
pub const READY: &str = "sluice_ready";

/// How long after a histogram sample its fold comes. The exporter keeps every sample recorded
/// since the last fold (~16 bytes each, in blocks of 64) until a scrape or an upkeep: without
/// either, the agent grew by that much per delivered record (6M records at 340k/s: RSS 13 → 165
/// MiB on a 64 MiB budget, still climbing). With a fold at most 250 ms after a sample it stayed
/// at 41–64 MiB for the same run.
const UPKEEP_DELAY: std::time::Duration = std::time::Duration::from_millis(250);

/// Folds histogram samples into buckets `UPKEEP_DELAY` after the first sample since the last
/// fold, for as long as the runtime runs: at most four folds a second while records flow, none
/// while nothing is recorded (an idle agent sleeps). It holds no records, so it needs no
/// shutdown step.
async fn keep_histograms_bounded(handle: PrometheusHandle, recorded: Arc<tokio::sync::Notify>) {
    loop {
        recorded.notified().await;
        tokio::time::sleep(UPKEEP_DELAY).await;
        handle.run_upkeep();
    }
}

/// The Prometheus recorder, with every histogram telling [`keep_histograms_bounded`] that it
/// holds a sample to fold (one atomic operation per sample; the task wakes once per fold).
struct NoticingRecorder {
    inner: PrometheusRecorder,
    recorded: Arc<tokio::sync::Notify>,
}

/// A histogram of [`NoticingRecorder`].
struct NoticedHistogram {
    inner: metrics::Histogram,
    recorded: Arc<tokio::sync::Notify>,
}

impl metrics::HistogramFn for NoticedHistogram {
    fn record(&self, value: f64) {
        self.inner.record(value);
        self.recorded.notify_one();
    }

    /// One notice for all of them (a batch of deliveries records its runs of equal latency so).
    fn record_many(&self, value: f64, count: usize) {
        self.inner.record_many(value, count);
        self.recorded.notify_one();
    }
}

impl metrics::Recorder for NoticingRecorder {
    fn describe_counter(&self, key: metrics::KeyName, unit: Option<Unit>, description: metrics::SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: metrics::KeyName, unit: Option<Unit>, description: metrics::SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: metrics::KeyName, unit: Option<Unit>, description: metrics::SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &metrics::Key, metadata: &metrics::Metadata<'_>) -> metrics::Counter {
        self.inner.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &metrics::Key, metadata: &metrics::Metadata<'_>) -> metrics::Gauge {
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &metrics::Key, metadata: &metrics::Metadata<'_>) -> metrics::Histogram {
        let inner = self.inner.register_histogram(key, metadata);
        metrics::Histogram::from_arc(Arc::new(NoticedHistogram { inner, recorded: self.recorded.clone() }))
    }
}

/// The recorder could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install the metrics recorder: {0}")]
pub struct RecorderError(String);

/// Installs the process-wide Prometheus recorder, describes every metric and starts its upkeep
/// (`keep_histograms_bounded`). Call once, from `main`, inside the runtime; the returned handle
/// renders the text the admin server serves.
pub fn install_recorder(role: &'static str) -> Result<PrometheusHandle, RecorderError> {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
        )
        .map_err(|error| RecorderError(error.to_string()))?
        // How fresh rows are: a persister that fell behind is minutes late, not 30 s. (A full
        // name outranks the suffix rule above.)
        .set_buckets_for_metric(
            Matcher::Full(PERSIST_ROW_LATENCY.into()),
            &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0],
        )
        .map_err(|error| RecorderError(error.to_string()))?
        .build_recorder();
    let handle = recorder.handle();
    let recorded = Arc::new(tokio::sync::Notify::new());
    metrics::set_global_recorder(NoticingRecorder { inner: recorder, recorded: recorded.clone() })
        .map_err(|error| RecorderError(error.to_string()))?;
    tokio::spawn(keep_histograms_bounded(handle.clone(), recorded));
    describe_all();
    process_collector().describe();
    metrics::gauge!(
        BUILD_INFO,
        "version" => env!("CARGO_PKG_VERSION"),
        "git_sha" => env!("SLUICE_GIT_SHA"),
        "role" => role
    )
    .set(1.0);
    Ok(handle)
}

/// The process's own figures (`process_*`: resident and virtual memory, CPU seconds, open and
/// maximum file descriptors, threads, start time), the names every Prometheus client library
/// uses, read from `/proc` when `/metrics` is scraped (never on a timer: an idle sidecar stays
/// idle). Bounded memory is the product's promise; these let an SRE see it kept.
pub fn collect_process_metrics() {
    process_collector().collect();
}

fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: std::sync::OnceLock<metrics_process::Collector> = std::sync::OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// The counters (`sluice_*_total`) of a rendered scrape as one JSON object, series → value
/// (`{"sluice_buffer_records_dropped_total{reason=\"drop_newest\"}":3,…}`): what a process logs
/// as its last word ("final counts", the field `counts`), so what it counted after the last
/// scrape (a drain's drops, say) is not lost with it. The JSON log format writes it as an object.
pub fn final_counts(exposition: &str) -> String {
    let counts: serde_json::Map<String, serde_json::Value> = crate::telemetry::scrape::Scrape::parse(exposition)
        .samples()
        .iter()
        .filter(|sample| sample.name.starts_with(PREFIX) && sample.name.ends_with("_total"))
        .map(|sample| {
            // Counters are whole numbers: written as integers.
            let value = if sample.value.fract() == 0.0 && (0.0..9.0e15).contains(&sample.value) {
                serde_json::Value::from(sample.value as u64)
            } else {
                serde_json::Value::from(sample.value)
            };
            (sample.series().to_string(), value)
        })
        .collect();
    serde_json::Value::Object(counts).to_string()
}

fn describe_all() {
    describe_counter!(INGEST_CONNECTIONS, "Connections accepted and served, per listener.");
    describe_gauge!(INGEST_CONNECTIONS_OPEN, "Connections currently open, per listener.");
    describe_counter!(INGEST_REFUSED, "Connections closed at once, by reason.");
    describe_counter!(INGEST_IDLE_CLOSED, "Connections closed after idle_timeout without a record.");
    describe_counter!(INGEST_RECORDS, "Records read from the socket and accepted.");
    describe_counter!(INGEST_BYTES, Unit::Bytes, "Bytes of accepted records as written by the app.");
    describe_counter!(INGEST_REJECTED, "Records refused at the socket, by reason.");
    describe_counter!(INGEST_THROTTLED, "Records that waited for their rate limit.");
    describe_gauge!(INGEST_READ_BUFFER_BYTES, Unit::Bytes, "Bytes read from connections, not yet records.");
    describe_counter!(INGEST_TOPIC_DEFAULTS, "Records sent to kafka.default_topic, by reason.");
    describe_gauge!(INGEST_TOPICS, "Distinct topics the kafka.topic template routes to.");
    describe_counter!(INGEST_REDACTIONS, "Values and matches masked, by listener and rule.");
    describe_counter!(PERSIST_UNCONVERTIBLE, "Typed column values stored as NULL: they did not convert, by column.");
    describe_gauge!(POD_INFO_ENTRIES, "Pod labels and annotations records carry, by kind.");
    describe_gauge!(POD_INFO_SKIPPED, "Pod labels and annotations not kept at the last read, by kind and reason.");
    describe_counter!(INGEST_LINES_JOINED, "Lines joined to the record before them (multiline).");
    describe_counter!(INGEST_RECORDS_SPLIT, "Records a multiline limit cut, by reason.");
    describe_counter!(INGEST_OTLP_EXPORTS, "OTLP Exports answered, by transport and outcome.");
    describe_gauge!(BUFFER_RECORDS, "Records held until Kafka acknowledges them.");
    describe_gauge!(BUFFER_BYTES, Unit::Bytes, "Bytes held until Kafka acknowledges them.");
    describe_gauge!(BUFFER_CAPACITY_BYTES, Unit::Bytes, "Buffer byte capacity (buffer.max_bytes).");
    describe_gauge!(BUFFER_CAPACITY_RECORDS, "Buffer record capacity (buffer.max_records).");
    describe_counter!(BUFFER_DROPPED, "Records dropped by the full-buffer policy, by reason.");
    describe_gauge!(BUFFER_OLDEST_AGE, Unit::Seconds, "Age of the oldest record not yet acknowledged by Kafka.");
    describe_histogram!(SHIP_DELIVERY_LATENCY, Unit::Seconds, "Time from ingest to Kafka's acknowledgement.");
    describe_gauge!(SPOOL_BYTES, Unit::Bytes, "Bytes of the spool's segment files.");
    describe_gauge!(SPOOL_CAPACITY_BYTES, Unit::Bytes, "Spool cap (buffer.max_disk_bytes).");
    describe_gauge!(SPOOL_RECORDS, "Records in the spool not yet acknowledged by Kafka.");
    describe_counter!(SPOOL_ERRORS, "Spool I/O failures, by op.");
    describe_counter!(SPOOL_RECOVERED, "Records recovered from the spool at start-up.");
    describe_counter!(SPOOL_CORRUPT_BYTES, Unit::Bytes, "Bytes of spool data skipped as damaged.");
    describe_counter!(SHIP_DELIVERED, "Records acknowledged by Kafka.");
    describe_counter!(SHIP_DELIVERED_BYTES, Unit::Bytes, "Bytes of records acknowledged by Kafka.");
    describe_counter!(SHIP_DELIVERY_ERRORS, "Failed Kafka delivery reports, by reason.");
    describe_counter!(SHIP_RETRIED, "Records put back into the buffer after a retryable failure.");
    describe_counter!(SHIP_FAILED, "Records given up, by reason.");
    describe_counter!(SHIP_PRODUCER_RECREATIONS, "Producers replaced after a fatal librdkafka error.");
    describe_gauge!(KAFKA_REACHABLE, "1 while Kafka answers metadata requests.");
    describe_counter!(PERSIST_CONSUMED, "Kafka messages received by the persister.");
    describe_counter!(PERSIST_ROWS, "Rows inserted into the logs table (log_rows).");
    describe_counter!(PERSIST_DUPLICATES, "Redelivered records skipped by the unique key.");
    describe_counter!(PERSIST_BATCHES, "Batches committed to PostgreSQL.");
    describe_histogram!(
        PERSIST_BATCH_SECONDS,
        Unit::Seconds,
        "Time to COPY (+ insert for a redelivered batch) and commit one batch."
    );
    describe_histogram!(
        PERSIST_ROW_LATENCY,
        Unit::Seconds,
        "Time from ingest (the agent's clock) to the row's commit in PostgreSQL."
    );
    describe_counter!(PERSIST_WRITE_ERRORS, "Batch writes that failed and were retried.");
    describe_counter!(PERSIST_COMMIT_ERRORS, "Kafka offset stores or commits that failed.");
    describe_counter!(PERSIST_DEAD_LETTERS, "Messages kept in dead_letters, by reason.");
    describe_counter!(PERSIST_DEAD_LETTERS_DELETED, "Dead letters deleted past dead_letter_retention_days.");
    describe_counter!(PERSIST_LOST, "Messages PostgreSQL refused as a row and as a dead letter, by reason.");
    describe_gauge!(PERSIST_ASSIGNED_PARTITIONS, "Partitions assigned to this persister.");
    describe_gauge!(PERSIST_POSTGRES_REACHABLE, "1 while PostgreSQL answers the persister.");
    describe_counter!(PERSIST_REBALANCES, "Consumer group rebalances seen.");
    describe_gauge!(BUILD_INFO, "Always 1; the version label names the build.");
    describe_gauge!(READY, "1 while /readyz answers 200.");
    describe_counter!(CONFIG_RELOADS, "Config reloads, by result.");
    describe_gauge!(CONFIG_INFO, "1 for the running config's fingerprint.");
    for result in outcome::Reload::ALL {
        metrics::counter!(CONFIG_RELOADS, "result" => result.as_str()).increment(0);
    }
    describe_gauge!(PERSIST_LAG_RECORDS, "Records in the topic not yet persisted, per partition.");
    describe_gauge!(PERSIST_LAG_SECONDS, Unit::Seconds, "Age of the last persisted record while a partition lags.");
    librdkafka::describe();
}

/// Creates the agent's labelled series at zero (a series that appears only on the first event
/// hides that event from `increase()`).
pub fn register_agent_series() {
    for code in outcome::COMMON_DELIVERY_ERRORS {
        metrics::counter!(SHIP_DELIVERY_ERRORS, REASON => outcome::kafka_error(code)).increment(0);
    }
    for reason in outcome::Failed::ALL {
        reason.count(0);
    }
    // The ingest series are created per listener when it binds.
    for name in [SHIP_DELIVERED, SHIP_DELIVERED_BYTES, SHIP_RETRIED] {
        metrics::counter!(name).increment(0);
    }
}

/// Creates the persister's series at zero.
pub fn register_persist_series() {
    for name in [
        PERSIST_CONSUMED,
        PERSIST_ROWS,
        PERSIST_DUPLICATES,
        PERSIST_BATCHES,
        PERSIST_WRITE_ERRORS,
        PERSIST_COMMIT_ERRORS,
        PERSIST_REBALANCES,
    ] {
        metrics::counter!(name).increment(0);
    }
    for reason in outcome::DeadLetterReason::ALL {
        reason.count(0);
    }
    for reason in outcome::Lost::ALL {
        reason.count(0);
    }
    metrics::gauge!(PERSIST_ASSIGNED_PARTITIONS).set(0.0);
    metrics::gauge!(PERSIST_POSTGRES_REACHABLE).set(0.0);
}

/// Changes the log filter of a running process (config reload).
pub struct LogHandle(tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>);

/// The target of the "final counts" line a process logs as its last word: enabled at INFO
/// whatever `log.level` says, since a count that only a debug level shows is a count lost.
pub const FINAL_COUNTS_TARGET: &str = "sluice::final_counts";

/// The filter for `log.level`, with the final counts always on.
fn log_filter(level: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    let filter = tracing_subscriber::EnvFilter::try_new(level).map_err(|error| error.to_string())?;
    let always = format!("{FINAL_COUNTS_TARGET}=info")
        .parse()
        .map_err(|error: tracing_subscriber::filter::ParseError| error.to_string())?;
    Ok(filter.add_directive(always))
}

impl LogHandle {
    /// Applies a new `log.level` directive.
    pub fn set_level(&self, level: &str) -> Result<(), String> {
        let filter = log_filter(level)?;
        self.0.reload(filter).map_err(|error| error.to_string())
    }
}

/// Installs the `tracing` subscriber for sluice's own logs (stderr). Call once, from `main`.
/// `format = "auto"` writes JSON unless stderr is a terminal. Returns the handle that changes
/// the level later, or `None` if a subscriber was already installed (tests).
pub fn init_logging(config: &LogConfig) -> Option<LogHandle> {
    use std::io::IsTerminal as _;

    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter = log_filter(&config.level).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let terminal = std::io::stderr().is_terminal();
    let json = match config.format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !terminal,
    };
    let registry = tracing_subscriber::registry().with(filter);
    let installed = if json {
        let layer = tracing_subscriber::fmt::layer()
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(log_format::FlatJson)
            .with_writer(std::io::stderr);
        registry.with(layer).try_init()
    } else {
        registry.with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(terminal)).try_init()
    };
    installed.ok().map(|()| LogHandle(handle))
}

#[cfg(test)]
mod tests {
    use super::{FINAL_COUNTS_TARGET, final_counts, log_filter};

    #[test]
    fn the_final_counts_are_logged_whatever_the_level() {
        let captured = crate::test_support::Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(log_filter("error").expect("filter"))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("an ordinary line");
            tracing::info!(target: FINAL_COUNTS_TARGET, counts = r#"{"sluice_x_total":1}"#, "final counts");
        });
        let text = captured.text();
        assert!(text.contains("final counts"), "{text}");
        assert!(!text.contains("an ordinary line"), "{text}");
    }

    #[test]
    fn final_counts_keep_every_counter_and_nothing_else() {
        let scrape = "# HELP sluice_ship_records_delivered_total Delivered.\n\
                      # TYPE sluice_ship_records_delivered_total counter\n\
                      sluice_ship_records_delivered_total 12\n\
                      sluice_buffer_records_dropped_total{reason=\"drop_newest\"} 3\n\
                      sluice_buffer_records 5\n\
                      sluice_ship_delivery_latency_seconds_bucket{le=\"0.1\"} 4\n\
                      sluice_ship_delivery_latency_seconds_count 4\n\
                      other_total 1\n";
        let counts: serde_json::Value = serde_json::from_str(&final_counts(scrape)).expect("an object");
        assert_eq!(
            counts,
            serde_json::json!({
                "sluice_ship_records_delivered_total": 12,
                "sluice_buffer_records_dropped_total{reason=\"drop_newest\"}": 3,
            })
        );
    }
}
