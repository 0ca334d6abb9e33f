//! `sluice persist`: a Kafka consumer group member that writes records to PostgreSQL.
//!
//! Owns: the consumer, batching by size and time, the retry of a failed batch, and offset
//! handling. Offsets are *stored* (`enable.auto.offset.store=false`) only after the batch's
//! transaction has committed; librdkafka commits stored offsets periodically, on rebalance
//! (for revoked partitions) and when the consumer closes, and `run` commits synchronously at the
//! end of a drain — commit and close bounded by [`CLOSE_TIMEOUT`], logging the stored offsets
//! it could not commit, so a broker that does not answer cannot hold the exit. A crash therefore redelivers at most the batches since the last commit, and
//! the primary key (record id, ingest time) with `ON CONFLICT DO NOTHING` makes that redelivery
//! add no rows: exactly one row per record.
//!
//! Counting under redelivery: `sluice_persist_rows_written_total` and
//! `sluice_persist_dead_letters_total` count what PostgreSQL reports inserting, so a redelivered
//! row or dead letter counts once (as `sluice_persist_rows_duplicate_total`, or not at all); the
//! parts an isolation committed before an error not about the data are not written again, and
//! are counted as they commit (so also when the drain's deadline cuts their batch off). One
//! part is not: a transaction whose COMMIT is in flight when the deadline drops the write. If
//! PostgreSQL applied it, its rows are stored but counted by nobody here; whoever re-reads them
//! counts them as `sluice_persist_rows_duplicate_total` (dead letters: not at all).
//! `sluice_persist_records_lost_total` has nothing stored to compare with: a redelivered message
//! PostgreSQL refuses again is counted again — also one set aside in a batch the drain's deadline
//! then cut off (counted when it was set aside, and again when it is re-read). The ingest-time window is applied at each delivery,
//! so a message re-read on the other side of it is a row *and* a dead letter: `expired` after a
//! row stored before the crash (until retention drops that day's partition), or a row after an
//! `ingest_time_in_future` dead letter (`dead_letters` has no retention).
//!
//! librdkafka commits a revoked partition's stored offsets during the rebalance only when
//! auto-commit is enabled (librdkafka#1647), and refuses to store offsets for partitions no
//! longer assigned (librdkafka#3774): both are why auto-commit stays on with manual storing.
//!
//! Must not: store an offset before its rows are committed, drop a message (it becomes a row or
//! a dead letter), or give up a batch because PostgreSQL is down (it retries with backoff; the
//! consumer group takes the partitions elsewhere if this member stops polling for too long).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::{join, join_all};
use metrics_exporter_prometheus::PrometheusHandle;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::admin::{AdminError, AdminServer, ConfigEndpoint, ReadinessCheck};
use crate::config::Config;
use crate::config::reload::{self, Reloading};
use crate::lifecycle::Tasks;
use crate::telemetry;
use crate::telemetry::outcome::{DeadLetterReason, Lost};

pub mod row;
pub mod schema;
pub mod writer;

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;

use row::{DeadLetter, Origin, Parsed, Row};
use writer::Writer;

/// librdkafka's prefetch queue per persister (the high-level consumer has one queue for all
/// partitions), in KiB of message values (`queued.max.messages.kbytes`).
const PREFETCH_KIB: u32 = 8 * 1024;
/// Compressed bytes one fetch may return per partition (`max.partition.fetch.bytes`). A fetch
/// lands in the prefetch queue whole, decompressed, even past `PREFETCH_KIB`: with librdkafka's
/// 1 MiB default, 4 partitions and the benchmark's very compressible records (~30×), the queue
/// overshot to 127 MiB and the persister peaked at ~300 MiB RSS draining 500k records; with
/// 256 KiB (and `fetch.max.bytes` at its 1 MiB floor) it peaked at ~145 MiB, no slower.
const FETCH_PARTITION_BYTES: u32 = 256 * 1024;
/// Compressed bytes one fetch may return in all (`fetch.max.bytes`); librdkafka wants at least
/// `message.max.bytes` (1 MB by default).
const FETCH_BYTES: u32 = 1024 * 1024;
/// How often partitions ahead are created and old ones dropped.
const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(3600);
/// How often PostgreSQL is asked `SELECT 1` for `/readyz`, also while no records arrive.
const DATABASE_PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// Longest wait between retries of a failed batch.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long the final offset commit and the consumer's close may take together at the end of a
/// drain. With a broker that answers both take milliseconds; one that does not (a partition, a
/// frozen host) would hold them for `socket.timeout.ms` (60 s) and more, past any grace period.
/// What is not committed is re-read by the next owner and skipped by the unique key, so waiting
/// longer buys nothing but duplicates avoided. 5 s keeps the default drain (20 s) plus this inside
/// the chart's 30 s `terminationGracePeriodSeconds`.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// What stops the persister.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// A PostgreSQL error.
    #[error("postgres: {}", describe_postgres(.0))]
    Postgres(#[source] tokio_postgres::Error),
    /// The TLS settings could not be loaded (`postgres.ca_file`).
    #[error("postgres TLS: {0}")]
    Tls(String),
    /// A value could not be encoded for COPY (a column type the writer does not know).
    #[error("cannot encode a row for COPY: {0}")]
    Encode(String),
    /// Connecting took longer than `postgres.connect_timeout`.
    #[error("postgres: connection attempt timed out")]
    ConnectTimeout,
    /// A migration failed.
    #[error("migration failed: {0}")]
    Migration(String),
    /// The Kafka consumer could not be created or subscribed.
    #[error("kafka consumer: {0}")]
    Kafka(#[from] KafkaError),
    /// The admin server could not bind.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// A task failed (panicked, or ended before it was asked to stop); the persister drained.
    #[error("tasks failed: {}", .0.join("; "))]
    TasksFailed(Vec<String>),
    /// The model test's fake PostgreSQL answering with a SQLSTATE (a `tokio_postgres::Error`
    /// carrying one cannot be made outside that crate).
    #[cfg(test)]
    #[error("postgres (fake) ERROR {code}: {message}")]
    Fake {
        /// The SQLSTATE.
        code: &'static str,
        /// The server's message.
        message: String,
    },
}

/// tokio-postgres says only "db error"; the server's message, code and constraint are what an
/// operator needs.
fn describe_postgres(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut text = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
            if let Some(constraint) = db.constraint() {
                text.push_str(&format!(" (constraint {constraint})"));
            }
            if let Some(detail) = db.detail() {
                text.push_str(&format!("; {detail}"));
            }
            text
        }
        None => {
            // "error performing TLS handshake" alone does not say what to fix: add the causes.
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
    }
}

impl PersistError {
    /// True when PostgreSQL refused the data itself (a data exception, a constraint, a value too
    /// large): retrying the same rows cannot succeed. Connection and server errors are not.
    pub fn is_rejected_data(&self) -> bool {
        let code = match self {
            PersistError::Postgres(error) => error.code().map(tokio_postgres::error::SqlState::code),
            #[cfg(test)]
            PersistError::Fake { code, .. } => Some(*code),
            _ => None,
        };
        code.is_some_and(|code| ["22", "23", "54"].contains(&code.get(..2).unwrap_or_default()))
    }
}

/// Consumer callbacks: rebalances, commit results and statistics.
struct PersistContext {
    assigned: Arc<AtomicUsize>,
    errors: telemetry::librdkafka::ErrorTotals,
}

/// What this persister has stored per partition: the next offset, and the ingest time of the
/// last record. With the partitions' high watermarks that makes the lag in records and seconds.
#[derive(Default)]
struct LagClock {
    next_offset: std::sync::Mutex<BTreeMap<i32, i64>>,
    last_ingest_ms: std::sync::Mutex<BTreeMap<i32, i64>>,
    /// Partitions whose lag was reported, so a revoked one is reset to 0.
    reported: std::sync::Mutex<std::collections::BTreeSet<i32>>,
}

impl LagClock {
    fn stored(&self, next_offsets: &BTreeMap<(String, i32), i64>) {
        let mut stored = self.next_offset.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for ((_, partition), next) in next_offsets {
            stored.insert(*partition, *next);
        }
    }

    /// The next offsets stored, as `partition=offset` pairs, for a log line.
    fn describe_stored(&self) -> String {
        let stored = self.next_offset.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        stored.iter().map(|(partition, next)| format!("{partition}={next}")).collect::<Vec<_>>().join(",")
    }

    fn next_offset(&self, partition: i32) -> Option<i64> {
        self.next_offset.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(&partition).copied()
    }

    fn persisted(&self, rows: &[Row]) {
        let mut last = self.last_ingest_ms.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for row in rows {
            let ms = row.ingest_time.timestamp_millis();
            let entry = last.entry(row.origin.partition).or_insert(ms);
            *entry = (*entry).max(ms);
        }
    }

    fn report(&self, lag: &std::collections::HashMap<i32, i64>) {
        let now = chrono::Utc::now().timestamp_millis();
        let last = self.last_ingest_ms.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut reported = self.reported.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (partition, records) in lag {
            let label = partition.to_string();
            metrics::gauge!(telemetry::PERSIST_LAG_RECORDS, "partition" => label.clone()).set(*records as f64);
            let seconds = match (records, last.get(partition)) {
                (0, _) | (_, None) => 0.0,
                (_, Some(ms)) => (now - ms).max(0) as f64 / 1000.0,
            };
            metrics::gauge!(telemetry::PERSIST_LAG_SECONDS, "partition" => label).set(seconds);
            reported.insert(*partition);
        }
        for partition in reported.iter().filter(|partition| !lag.contains_key(partition)) {
            metrics::gauge!(telemetry::PERSIST_LAG_RECORDS, "partition" => partition.to_string()).set(0.0);
            metrics::gauge!(telemetry::PERSIST_LAG_SECONDS, "partition" => partition.to_string()).set(0.0);
        }
    }
}

impl ClientContext for PersistContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        // These arrive only while the consumer is polled; the lag has a task of its own.
        telemetry::librdkafka::record(&statistics, &self.errors);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        warn!(%error, reason, "kafka client error");
    }
}

impl ConsumerContext for PersistContext {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        metrics::counter!(telemetry::PERSIST_REBALANCES).increment(1);
        let count = consumer.assignment().map(|tpl| tpl.count()).unwrap_or(0);
        match rebalance {
            Rebalance::Assign(tpl) => info!(partitions = tpl.count(), "partitions assigned"),
            Rebalance::Revoke(tpl) => info!(partitions = tpl.count(), "partitions revoked"),
            Rebalance::Error(error) => warn!(%error, "rebalance error"),
        }
        self.assigned.store(count, Ordering::Relaxed);
        metrics::gauge!(telemetry::PERSIST_ASSIGNED_PARTITIONS).set(count as f64);
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        match result {
            Ok(()) => {}
            // Nothing new to commit since the last time: not an error.
            Err(KafkaError::ConsumerCommit(rdkafka::error::RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => {
                metrics::counter!(telemetry::PERSIST_COMMIT_ERRORS).increment(1);
                warn!(%error, "offset commit failed; it is retried with the next commit");
            }
        }
    }
}

type PersistConsumer = StreamConsumer<PersistContext>;

fn consumer_config(config: &Config) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (key, value) in config.kafka.client_properties().iter().chain(config.persist.properties.iter()) {
        client.set(key, value);
    }
    client
        .set("bootstrap.servers", &config.kafka.brokers)
        .set("client.id", "sluice-persist")
        .set("statistics.interval.ms", crate::ship::STATISTICS_INTERVAL_MS)
        .set("group.id", &config.persist.group_id)
        // Managed keys (librdkafka's defaults): with TLS, certificate and host name verified.
        .set("enable.ssl.certificate.verification", "true")
        .set("ssl.endpoint.identification.algorithm", "https")
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.commit.interval.ms", "1000");
    let overridden =
        |key: &str| config.persist.properties.contains_key(key) || config.kafka.properties.contains_key(key);
    // librdkafka prefetches up to 64 MiB (plus one 1 MiB-per-partition fetch, decompressed) by
    // default; while PostgreSQL is away the persister stops polling, and this is what it holds on
    // top of its batches.
    for (key, value) in [
        ("queued.max.messages.kbytes", PREFETCH_KIB),
        ("max.partition.fetch.bytes", FETCH_PARTITION_BYTES),
        ("fetch.max.bytes", FETCH_BYTES),
    ] {
        if !overridden(key) {
            client.set(key, value.to_string());
        }
    }
    if !overridden("auto.offset.reset") {
        // A new group starts at the beginning: records produced before the first persister
        // started are still records.
        client.set("auto.offset.reset", "earliest");
    }
    client
}

/// Runs the persister until `shutdown` is cancelled, then finishes the current batch and commits.
pub async fn run(
    config: Config,
    reloading: Option<Reloading>,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
) -> Result<(), PersistError> {
    telemetry::register_persist_series();
    let admin = AdminServer::bind(&config.persist.admin_listen, ConfigEndpoint::persist(&config)).await?;
    let assigned = Arc::new(AtomicUsize::new(0));
    let database_ok = Arc::new(AtomicBool::new(false));
    let draining = Arc::new(AtomicBool::new(false));
    let background = CancellationToken::new();
    let ready = readiness(&assigned, &database_ok, &draining);
    let running = Arc::new(std::sync::RwLock::new(config.clone()));
    reload::publish(None, &reload::fingerprint(&config));
    // Every task under `tasks`; one that fails starts the drain, like a signal.
    let tasks = Tasks::new(shutdown.clone());
    let mut services = vec![tasks.service(
        "admin",
        background.clone(),
        admin.serve(metrics, ready.clone(), crate::agent::config_view(&running), background.clone()),
    )];
    if let Some(reloading) = reloading {
        services.push(tasks.service(
            "reload",
            background.clone(),
            reload_persister(reloading, running.clone(), background.clone()),
        ));
    }

    let result = async {
        let mut writers = Vec::with_capacity(config.persist.writers);
        for _ in 0..config.persist.writers {
            let Some(writer) = connect_writer(&Postgres(&config), &database_ok, &shutdown).await? else {
                return Ok(());
            };
            writers.push(writer);
        }
        let lag = Arc::new(LagClock::default());
        let context =
            PersistContext { assigned: assigned.clone(), errors: telemetry::librdkafka::ErrorTotals::default() };
        let consumer: Arc<PersistConsumer> = Arc::new(consumer_config(&config).create_with_context(context)?);
        consumer.subscribe(&[config.kafka.topic.as_str()])?;
        info!(topic = %config.kafka.topic, group = %config.persist.group_id, "persister consuming");
        let maintenance = tasks.service("maintenance", shutdown.clone(), maintain(config.clone(), shutdown.clone()));
        let lag_stop = CancellationToken::new();
        let lag_task =
            tasks.service("lag", lag_stop.clone(), report_lag(consumer.clone(), lag.clone(), lag_stop.clone()));
        let probe = probe_database(config.postgres.clone(), database_ok.clone(), background.clone());
        let probe = tasks.service("database probe", background.clone(), probe);
        let run = Run {
            config: &config,
            running: &running,
            consumer: consumer.as_ref(),
            database: &Postgres(&config),
            database_ok: &database_ok,
            lag: &lag,
        };
        // Not spawned (it borrows the run), but watched: a panicking lane starts the drain, and
        // only offsets of committed batches were stored.
        tasks.watch("consume", consume(&run, writers, &shutdown)).await;
        draining.store(true, Ordering::Relaxed);
        // The lag task holds the consumer too: stop it first so the consumer closes below.
        lag_stop.cancel();
        tasks.join(lag_task).await;
        // The final commit and the close share one deadline: a broker that does not answer
        // would otherwise hold them (and the exit) for as long as it stays away. A call still
        // running at the deadline is left on its blocking thread (main bounds those too).
        let closed_by = Instant::now() + CLOSE_TIMEOUT;
        let committer = consumer.clone();
        let commit = tokio::task::spawn_blocking(move || committer.commit_consumer_state(CommitMode::Sync));
        match tokio::time::timeout_at(closed_by, commit).await {
            Ok(Ok(Ok(()) | Err(KafkaError::ConsumerCommit(rdkafka::error::RDKafkaErrorCode::NoOffset)))) => {}
            Ok(Ok(Err(error))) => {
                metrics::counter!(telemetry::PERSIST_COMMIT_ERRORS).increment(1);
                warn!(%error, stored = %lag.describe_stored(),
                    "final offset commit failed; offsets stored since the last commit are not committed: the next owner re-reads from it (no duplicate rows)");
            }
            Ok(Err(error)) => tasks.fail("final commit", &error.to_string()),
            Err(_) => {
                metrics::counter!(telemetry::PERSIST_COMMIT_ERRORS).increment(1);
                warn!(timeout_ms = CLOSE_TIMEOUT.as_millis() as u64, stored = %lag.describe_stored(),
                    "final offset commit did not finish in time; offsets stored since the last commit are not committed: the next owner re-reads from it (no duplicate rows)");
            }
        }
        // Closing the consumer leaves the group at once, so its partitions move without waiting
        // for the session timeout. It may block: do it off the runtime's workers, until the same
        // deadline.
        match tokio::time::timeout_at(closed_by, tokio::task::spawn_blocking(move || drop(consumer))).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tasks.fail("consumer close", &error.to_string()),
            Err(_) => warn!(
                timeout_ms = CLOSE_TIMEOUT.as_millis() as u64,
                "the kafka consumer did not close in time; its partitions move when the group's session times out"
            ),
        }
        tasks.join(maintenance).await;
        services.push(probe); // stops with `background`
        Ok::<(), PersistError>(())
    }
    .await;
    draining.store(true, Ordering::Relaxed);
    background.cancel();
    for task in services {
        tasks.join(task).await;
    }
    info!("persister stopped");
    result?;
    let failures = tasks.failures();
    if !failures.is_empty() {
        return Err(PersistError::TasksFailed(failures));
    }
    Ok(())
}

fn readiness(assigned: &Arc<AtomicUsize>, database_ok: &Arc<AtomicBool>, draining: &Arc<AtomicBool>) -> ReadinessCheck {
    let (assigned, database_ok, draining) = (assigned.clone(), database_ok.clone(), draining.clone());
    Arc::new(move || {
        if draining.load(Ordering::Relaxed) {
            Err("draining".into())
        } else if !database_ok.load(Ordering::Relaxed) {
            Err("postgres not reachable".into())
        } else if assigned.load(Ordering::Relaxed) == 0 {
            Err("no partitions assigned".into())
        } else {
            Ok("ready".into())
        }
    })
}

/// The database as batching sees it: where writers come from. [`Postgres`] in production, the
/// model test's fake PostgreSQL (`model.rs`) in tests.
trait Database {
    type Writer: BatchWriter;
    /// One attempt to connect a writer ([`connect_writer`] retries).
    async fn connect(&self) -> Result<Self::Writer, PersistError>;
}

/// One writer's transactions, as batching sees them ([`Writer`] in production).
trait BatchWriter {
    /// Writes rows and dead letters in one transaction (see [`Writer::write`]).
    async fn write(&mut self, rows: &[Row], dead: &[DeadLetter]) -> Result<writer::Written, PersistError>;
    /// False once the connection has failed; the caller reconnects.
    fn is_usable(&self) -> bool;
}

/// The consumer as batching sees it: messages in, offsets stored ([`PersistConsumer`] in
/// production).
trait Source {
    type Message<'a>: Message
    where
        Self: 'a;
    async fn recv(&self) -> KafkaResult<Self::Message<'_>>;
    /// Stores the next offset per partition (see [`store_offsets`]).
    fn store(&self, next_offsets: &BTreeMap<(String, i32), i64>);
}

/// The configured PostgreSQL.
struct Postgres<'a>(&'a Config);

impl Database for Postgres<'_> {
    type Writer = Writer;

    /// Connects, migrates and prepares a writer.
    async fn connect(&self) -> Result<Writer, PersistError> {
        let config = self.0;
        let mut client = writer::connect(&config.postgres).await?;
        // Cheap when there is nothing to do, and guarded by an advisory lock.
        schema::migrate(&mut client, &config.postgres.schema).await?;
        schema::ensure_partitions(&client, &schema::days_ahead(config.persist.partitions_ahead_days)).await?;
        Writer::new(client).await
    }
}

impl BatchWriter for Writer {
    async fn write(&mut self, rows: &[Row], dead: &[DeadLetter]) -> Result<writer::Written, PersistError> {
        Writer::write(self, rows, dead).await
    }

    fn is_usable(&self) -> bool {
        Writer::is_usable(self)
    }
}

impl Source for PersistConsumer {
    type Message<'a> = BorrowedMessage<'a>;

    async fn recv(&self) -> KafkaResult<BorrowedMessage<'_>> {
        StreamConsumer::recv(self).await
    }

    fn store(&self, next_offsets: &BTreeMap<(String, i32), i64>) {
        store_offsets(self, next_offsets);
    }
}

/// Connects, migrates and prepares a writer, retrying until it works or shutdown begins.
async fn connect_writer<D: Database>(
    database: &D,
    database_ok: &AtomicBool,
    shutdown: &CancellationToken,
) -> Result<Option<D::Writer>, PersistError> {
    let mut backoff = Duration::from_millis(200);
    loop {
        match database.connect().await {
            Ok(writer) => {
                database_ok.store(true, Ordering::Relaxed);
                return Ok(Some(writer));
            }
            // A migration that fails will fail again: stop instead of looping.
            Err(error @ PersistError::Migration(_)) => return Err(error),
            Err(error) => {
                database_ok.store(false, Ordering::Relaxed);
                warn!(%error, retry_in_ms = backoff.as_millis() as u64, "cannot use postgres yet");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Records collected for the next write.
#[derive(Default)]
struct Batch {
    rows: Vec<Row>,
    dead: Vec<DeadLetter>,
    /// Next offset to store per (topic, partition): last offset in the batch + 1.
    next_offsets: BTreeMap<(String, i32), i64>,
    started: Option<Instant>,
    /// Bytes of the Kafka message values added (for `persist.batch_max_bytes`).
    bytes: usize,
    /// What has committed: everything once [`write_isolating`] returned `Ok`; the parts an
    /// isolation committed before an error not about the data interrupted it, which are not
    /// written (or counted) again when the rest is retried.
    committed: Committed,
}

/// The committed parts of a batch.
#[derive(Default)]
struct Committed {
    rows: Vec<Row>,
}

impl Committed {
    /// Counts a part as it commits, from what PostgreSQL reported inserting (a redelivered row is
    /// a duplicate, a redelivered dead letter is not counted again) — not when the whole batch
    /// has: a batch the drain's deadline cuts off after parts of it committed leaves those rows
    /// in PostgreSQL, and its next reader finds them already stored.
    fn add(&mut self, part: Part, written: writer::Written) {
        metrics::counter!(telemetry::PERSIST_ROWS).increment(written.inserted);
        metrics::counter!(telemetry::PERSIST_DUPLICATES).increment(written.duplicates);
        self.rows.extend(part.rows);
        let mut by_reason: BTreeMap<DeadLetterReason, u64> = BTreeMap::new();
        let mut letters_already_stored = 0;
        for (letter, stored) in part.dead.into_iter().zip(written.dead_letters_stored) {
            if stored {
                *by_reason.entry(letter.reason).or_default() += 1;
                warn!(
                    topic = %letter.origin.topic, partition = letter.origin.partition, offset = letter.origin.offset,
                    reason = letter.reason.as_str(), "message kept in dead_letters"
                );
            } else {
                letters_already_stored += 1;
            }
        }
        for (reason, letters) in by_reason {
            reason.count(letters);
        }
        if letters_already_stored > 0 {
            debug!(letters = letters_already_stored, "dead letters already stored (redelivered)");
        }
    }
}

impl Batch {
    fn len(&self) -> usize {
        self.rows.len() + self.dead.len()
    }

    /// Moves rows that may not be written now (see [`row::Window`]) to the dead letters.
    fn set_aside_outside(&mut self, window: &row::Window) {
        if self.rows.iter().all(|row| window.refuses(row).is_none()) {
            return;
        }
        let rows = std::mem::take(&mut self.rows);
        for row in rows {
            match window.refuses(&row) {
                None => self.rows.push(row),
                Some((reason, error)) => {
                    self.dead.push(DeadLetter::new(row.origin, reason, &error, Some(row.payload.into_bytes())));
                }
            }
        }
    }

    fn add(&mut self, parsed: Parsed, origin: &Origin, bytes: usize) {
        self.started.get_or_insert_with(Instant::now);
        self.bytes += bytes;
        let next = self.next_offsets.entry((origin.topic.clone(), origin.partition)).or_insert(0);
        *next = (*next).max(origin.offset + 1);
        match parsed {
            Parsed::Row(row) => self.rows.push(*row),
            Parsed::Dead(letter) => self.dead.push(letter),
        }
    }
}

/// How big a batch may grow: `persist.batch_max_records` and `persist.batch_max_bytes`.
#[derive(Debug, Clone, Copy)]
struct BatchLimits {
    records: usize,
    /// Bytes of Kafka message values.
    bytes: usize,
}

/// Adds a message of `bytes` to its lane's batch; returns the batches this closed, in order: the
/// batch in hand, if the message would take it past the byte cap, then the batch holding the
/// message, if it reached either cap. So a batch stays within the byte cap unless it is one
/// message larger than the cap, which is written alone rather than held back.
fn add_closing(batch: &mut Batch, parsed: Parsed, origin: &Origin, bytes: usize, limits: BatchLimits) -> Vec<Batch> {
    let mut closed = Vec::new();
    if batch.len() > 0 && batch.bytes.saturating_add(bytes) > limits.bytes {
        closed.push(std::mem::take(batch));
    }
    batch.add(parsed, origin, bytes);
    if batch.len() >= limits.records || batch.bytes >= limits.bytes {
        closed.push(std::mem::take(batch));
    }
    closed
}

/// What the consume loop and the batch writer share for one run.
struct Run<'a, D, C> {
    config: &'a Config,
    /// The running config: batch limits may change with a reload.
    running: &'a std::sync::RwLock<Config>,
    consumer: &'a C,
    /// Where a writer whose connection failed gets a new one.
    database: &'a D,
    database_ok: &'a AtomicBool,
    lag: &'a LagClock,
}

/// Reads and batches while the writers write: one lane per writer, a partition always in the same
/// lane (so its batches commit, and its offsets are stored, in order), at most one batch waiting
/// per lane. On shutdown the batches in hand are handed over and written until the drain deadline;
/// what is not committed by then is re-read by the partition's next owner.
async fn consume<D: Database, C: Source>(run: &Run<'_, D, C>, writers: Vec<D::Writer>, shutdown: &CancellationToken) {
    let drain_deadline = CancellationToken::new();
    let mut senders = Vec::with_capacity(writers.len());
    let mut lanes = Vec::with_capacity(writers.len());
    for writer in writers {
        let (sender, batches) = tokio::sync::mpsc::channel(1);
        senders.push(sender);
        lanes.push(write_lane(run, writer, batches, &drain_deadline));
    }
    let work = join(read_batches(run, senders, shutdown, &drain_deadline), join_all(lanes));
    let deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(run.config.persist.drain_timeout).await;
    };
    tokio::select! {
        _ = work => {}
        _ = deadline => {
            drain_deadline.cancel();
            warn!("drain deadline passed before every batch in hand was written; the rest will be re-read");
        }
    }
}

/// Consumes and fills one batch per lane; hands a batch to its lane's writer when it is full (by
/// records or by bytes, see [`add_closing`]) or its first record has waited `batch_max_wait`. Waiting for a busy writer is the backpressure:
/// the consumer is not polled meanwhile.
async fn read_batches<D, C: Source>(
    run: &Run<'_, D, C>,
    lanes: Vec<tokio::sync::mpsc::Sender<Batch>>,
    shutdown: &CancellationToken,
    drain_deadline: &CancellationToken,
) {
    let Run { consumer, running, .. } = *run;
    let consumed = metrics::counter!(telemetry::PERSIST_CONSUMED);
    let mut batches: Vec<Batch> = lanes.iter().map(|_| Batch::default()).collect();
    // Closed batches whose hand-over shutdown interrupted: handed over first below.
    let mut unsent: Vec<(usize, Batch)> = Vec::new();
    'reading: loop {
        let (limits, max_wait) = {
            let running = running.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            let persist = &running.persist;
            let bytes = usize::try_from(persist.batch_max_bytes.as_u64()).unwrap_or(usize::MAX);
            (BatchLimits { records: persist.batch_max_records, bytes }, persist.batch_max_wait)
        };
        let flush_at = batches.iter().filter_map(|batch| batch.started).min().map(|started| started + max_wait);
        let received = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            _ = sleep_until_opt(flush_at) => None,
            message = consumer.recv() => Some(message),
        };
        let ready: Vec<(usize, Batch)> = match received {
            Some(Ok(message)) => {
                consumed.increment(1);
                let origin = Origin {
                    topic: message.topic().to_string(),
                    partition: message.partition(),
                    offset: message.offset(),
                };
                let lane = lane_of(origin.partition, lanes.len());
                let bytes = message.payload().map_or(0, <[u8]>::len);
                let parsed = row::parse(message.payload(), origin.clone());
                add_closing(&mut batches[lane], parsed, &origin, bytes, limits)
                    .into_iter()
                    .map(|batch| (lane, batch))
                    .collect()
            }
            Some(Err(error)) => {
                warn!(%error, "kafka consume error");
                continue;
            }
            None => {
                let now = Instant::now();
                batches
                    .iter_mut()
                    .enumerate()
                    .filter(|(_, batch)| batch.started.is_some_and(|at| at + max_wait <= now))
                    .map(|(lane, batch)| (lane, std::mem::take(batch)))
                    .collect()
            }
        };
        let mut ready = ready.into_iter();
        while let Some((lane, batch)) = ready.next() {
            tokio::select! {
                biased;
                permit = lanes[lane].reserve() => match permit {
                    Ok(permit) => permit.send(batch),
                    Err(_) => break 'reading, // the writer stopped: shutting down
                },
                _ = shutdown.cancelled() => {
                    unsent.push((lane, batch));
                    unsent.extend(ready);
                    break 'reading;
                }
            }
        }
    }
    // Shutting down with records in hand: hand them over so their offsets can be committed —
    // closed batches not yet handed over first, so a partition's batches still commit in order
    // (dropping one would let the batch in hand after it store offsets past its records).
    let in_hand = batches.into_iter().enumerate().filter(|(_, batch)| batch.len() > 0);
    for (lane, batch) in unsent.into_iter().chain(in_hand) {
        tokio::select! {
            _ = lanes[lane].send(batch) => {}
            _ = drain_deadline.cancelled() => break,
        }
    }
}

/// Which lane (writer) a partition's records go through.
fn lane_of(partition: i32, lanes: usize) -> usize {
    partition.rem_euclid(lanes as i32) as usize
}

/// One writer: writes the batches handed to it, in order, until its lane is closed (shutdown) or
/// the drain deadline interrupts a batch's retries.
async fn write_lane<D: Database, C: Source>(
    run: &Run<'_, D, C>,
    mut writer: D::Writer,
    mut batches: tokio::sync::mpsc::Receiver<Batch>,
    drain_deadline: &CancellationToken,
) {
    while let Some(batch) = batches.recv().await {
        if !write_batch(run, &mut writer, drain_deadline, batch).await {
            break;
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes a batch, retrying until it commits; then stores its offsets. Returns false if `stop`
/// interrupted the retries (the batch's offsets are not stored: it will be re-read). Only errors
/// that are not about the data are retried (PostgreSQL away, a lock timeout): what PostgreSQL
/// refuses is isolated and set aside, so a batch is never retried unchanged forever.
async fn write_batch<D: Database, C: Source>(
    run: &Run<'_, D, C>,
    writer: &mut D::Writer,
    stop: &CancellationToken,
    mut batch: Batch,
) -> bool {
    let Run { config, consumer, database, database_ok, lag, .. } = *run;
    let mut backoff = Duration::from_millis(100);
    crate::lifecycle::fail_point("persist_write");
    loop {
        batch.set_aside_outside(&window(config));
        let started = Instant::now();
        match write_isolating(writer, &mut batch).await {
            Ok(()) => {
                database_ok.store(true, Ordering::Relaxed);
                let committed = std::mem::take(&mut batch.committed);
                metrics::histogram!(telemetry::PERSIST_BATCH_SECONDS).record(started.elapsed().as_secs_f64());
                metrics::counter!(telemetry::PERSIST_BATCHES).increment(1);
                let committed_ms = chrono::Utc::now().timestamp_millis();
                let row_latency = metrics::histogram!(telemetry::PERSIST_ROW_LATENCY);
                for row in &committed.rows {
                    row_latency.record((committed_ms - row.ingest_time.timestamp_millis()).max(0) as f64 / 1000.0);
                }
                lag.persisted(&committed.rows);
                lag.stored(&batch.next_offsets);
                consumer.store(&batch.next_offsets);
                return true;
            }
            Err(error) => {
                metrics::counter!(telemetry::PERSIST_WRITE_ERRORS).increment(1);
                error!(%error, records = batch.len(), retry_in_ms = backoff.as_millis() as u64, "batch write failed; retrying");
                if !writer.is_usable() {
                    database_ok.store(false, Ordering::Relaxed);
                    match connect_writer(database, database_ok, stop).await {
                        Ok(Some(new_writer)) => *writer = new_writer,
                        Ok(None) => return false,
                        Err(error) => {
                            error!(%error, "cannot reconnect to postgres");
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The ingest times rows may be written with now (see [`row::Window`]).
fn window(config: &Config) -> row::Window {
    let now = chrono::Utc::now();
    let skew = chrono::Duration::from_std(config.persist.max_clock_skew).unwrap_or(chrono::Duration::days(1));
    row::Window {
        oldest_day: schema::retention_cutoff(now.date_naive(), config.persist.retention_days),
        latest: now + skew,
    }
}

/// Writes the batch. When PostgreSQL refuses something in it (a data error: SQLSTATE class 22,
/// 23 or 54), the batch is split in halves, and halves that are refused again are split again,
/// until each refused message stands alone: a refused row becomes a dead letter
/// (`rejected_by_postgres`, with PostgreSQL's error), a refused dead letter is tried once more
/// with an ASCII-only error text and then counted as lost. k bad messages in n cost about
/// 2·k·log2(n) transactions. Each part commits on its own; that is safe because the batch's
/// offsets are stored only when every part has committed, and writing a part again adds nothing.
/// What commits moves to `batch.committed`. Any other error returns at once with what has not
/// committed back in `batch.rows` and `batch.dead`, for the caller to retry: the committed parts
/// are neither written nor counted twice.
async fn write_isolating(writer: &mut impl BatchWriter, batch: &mut Batch) -> Result<(), PersistError> {
    let whole = match writer.write(&batch.rows, &batch.dead).await {
        Ok(written) => {
            let part = Part { rows: std::mem::take(&mut batch.rows), dead: std::mem::take(&mut batch.dead) };
            batch.committed.add(part, written);
            return Ok(());
        }
        Err(error) if error.is_rejected_data() => error,
        Err(error) => return Err(error),
    };
    warn!(error = %whole, records = batch.len(), "postgres refuses something in this batch; splitting it to find what");
    let mut pending = vec![(
        Part { rows: std::mem::take(&mut batch.rows), dead: std::mem::take(&mut batch.dead) },
        Some(whole.to_string()),
    )];
    while let Some((mut part, refused)) = pending.pop() {
        let refused = match refused {
            Some(error) => error,
            None => match writer.write(&part.rows, &part.dead).await {
                Ok(written) => {
                    batch.committed.add(part, written);
                    continue;
                }
                Err(error) if error.is_rejected_data() => error.to_string(),
                Err(error) => {
                    // Not about the data: what has not committed goes back, the caller retries it.
                    for (rest, _) in pending {
                        part.append(rest);
                    }
                    batch.rows = part.rows;
                    batch.dead = part.dead;
                    return Err(error);
                }
            },
        };
        if part.len() > 1 {
            let (left, right) = part.halves();
            pending.push((right, None));
            pending.push((left, None));
        } else if let Some(row) = part.rows.pop() {
            error!(error = %refused, topic = %row.origin.topic, partition = row.origin.partition, offset = row.origin.offset,
                "postgres rejects a record; it goes to dead_letters");
            let letter = DeadLetter::new(
                row.origin,
                DeadLetterReason::RejectedByPostgres,
                &refused,
                Some(row.payload.into_bytes()),
            );
            pending.push((Part { rows: Vec::new(), dead: vec![letter] }, None));
        } else if let Some(letter) = part.dead.pop() {
            let plain = letter.ascii_only();
            if plain.error != letter.error {
                pending.push((Part { rows: Vec::new(), dead: vec![plain] }, None));
            } else {
                // Counted here, not when the batch has committed, like the parts (Committed::add).
                Lost::DeadLetterRejected.count(1);
                error!(
                    topic = %letter.origin.topic, partition = letter.origin.partition, offset = letter.origin.offset,
                    reason = letter.reason.as_str(), error = %refused,
                    "postgres refused this message as a row and as a dead letter; it is not stored (read it from kafka at this offset)"
                );
            }
        }
    }
    Ok(())
}

/// Rows and dead letters written in one transaction while a refused batch is isolated.
#[derive(Default)]
struct Part {
    rows: Vec<Row>,
    dead: Vec<DeadLetter>,
}

impl Part {
    fn len(&self) -> usize {
        self.rows.len() + self.dead.len()
    }

    fn append(&mut self, mut other: Part) {
        self.rows.append(&mut other.rows);
        self.dead.append(&mut other.dead);
    }

    /// Two halves, each non-empty when `len() >= 2`: rows first, then dead letters, cut in the
    /// middle.
    fn halves(mut self) -> (Part, Part) {
        let at = self.len() / 2;
        let rows = self.rows.len();
        let right_rows = self.rows.split_off(at.min(rows));
        let right_dead = self.dead.split_off(at.saturating_sub(rows));
        (self, Part { rows: right_rows, dead: right_dead })
    }
}

fn store_offsets(consumer: &PersistConsumer, next_offsets: &BTreeMap<(String, i32), i64>) {
    for ((topic, partition), next) in next_offsets {
        let mut tpl = TopicPartitionList::new();
        if tpl.add_partition_offset(topic, *partition, Offset::Offset(*next)).is_err() {
            continue;
        }
        // Fails for a partition revoked meanwhile: its new owner re-reads from the last commit,
        // and the unique key turns that into duplicates skipped, not duplicate rows.
        if let Err(error) = consumer.store_offsets(&tpl) {
            debug!(%error, topic, partition, "offset not stored (partition no longer assigned)");
        }
    }
}

/// Applies new configs (log level, batch limits) as they come until `stop`.
async fn reload_persister(reloading: Reloading, running: Arc<std::sync::RwLock<Config>>, stop: CancellationToken) {
    let path = reloading.path.clone();
    reload::follow(path, reload::Role::Persist, &running, stop, |current, effective| {
        if current.log.level != effective.log.level
            && let Some(log) = &reloading.log
            && let Err(error) = log.set_level(&effective.log.level)
        {
            warn!(%error, "log level not changed");
        }
    })
    .await;
}

/// How often the consumer lag is measured.
const LAG_INTERVAL: Duration = Duration::from_secs(5);

/// Measures the lag of the assigned partitions every few seconds: high watermark minus what this
/// persister stored (or, before it stored anything, the group's committed offset). It asks the
/// brokers itself, because librdkafka's statistics stop while the consume loop waits for
/// PostgreSQL — exactly when the lag matters.
async fn report_lag(consumer: Arc<PersistConsumer>, lag: Arc<LagClock>, stop: CancellationToken) {
    loop {
        let (client, clock) = (consumer.clone(), lag.clone());
        // A measurement waits up to 2 s per request on a broker that does not answer: the drain
        // does not wait for it (the blocking thread finishes it and lets its consumer go).
        let measured = tokio::select! {
            measured = tokio::task::spawn_blocking(move || measure_lag(&client, &clock)) => measured.unwrap_or_default(),
            _ = stop.cancelled() => break,
        };
        lag.report(&measured);
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(LAG_INTERVAL) => {}
        }
    }
}

fn measure_lag(consumer: &PersistConsumer, clock: &LagClock) -> std::collections::HashMap<i32, i64> {
    let timeout = Duration::from_secs(2);
    let mut lag = std::collections::HashMap::new();
    let Ok(assignment) = consumer.assignment() else { return lag };
    let mut unknown = TopicPartitionList::new();
    for element in assignment.elements() {
        if clock.next_offset(element.partition()).is_none() {
            unknown.add_partition(element.topic(), element.partition());
        }
    }
    let committed = if unknown.count() > 0 { consumer.committed_offsets(unknown, timeout).ok() } else { None };
    for element in assignment.elements() {
        let Ok((low, high)) = consumer.fetch_watermarks(element.topic(), element.partition(), timeout) else {
            continue;
        };
        let position = clock.next_offset(element.partition()).or_else(|| {
            committed
                .as_ref()
                .and_then(|tpl| tpl.find_partition(element.topic(), element.partition()))
                .and_then(|found| found.offset().to_raw())
                .filter(|offset| *offset >= 0)
        });
        lag.insert(element.partition(), (high - position.unwrap_or(low)).max(0));
    }
    lag
}

/// Creates partitions ahead and applies retention, hourly, on a connection of its own.
async fn maintain(config: Config, stop: CancellationToken) {
    loop {
        let result = async {
            let client = writer::connect(&config.postgres).await?;
            schema::ensure_partitions(&client, &schema::days_ahead(config.persist.partitions_ahead_days)).await?;
            schema::apply_retention(&client, chrono::Utc::now().date_naive(), config.persist.retention_days).await
        }
        .await;
        if let Err(error) = result {
            warn!(%error, "partition maintenance failed; retrying next round");
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(MAINTENANCE_INTERVAL) => {}
        }
    }
}

/// Keeps the database flag of `/readyz` current while the writer is idle, on its own connection.
async fn probe_database(config: crate::config::PostgresConfig, database_ok: Arc<AtomicBool>, stop: CancellationToken) {
    let mut client: Option<tokio_postgres::Client> = None;
    loop {
        let check = async {
            if client.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
                client = writer::connect(&config).await.ok();
            }
            match &client {
                Some(client) => client.simple_query("SELECT 1").await.is_ok(),
                None => false,
            }
        };
        let ok = tokio::time::timeout(DATABASE_PROBE_INTERVAL, check).await.unwrap_or(false);
        if database_ok.swap(ok, Ordering::Relaxed) != ok {
            if ok {
                info!("postgres reachable");
            } else {
                warn!("postgres unreachable");
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(DATABASE_PROBE_INTERVAL) => {}
        }
    }
}
