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
//! `ingest_time_in_future` dead letter (until `persist.dead_letter_retention_days` deletes it).
//!
//! librdkafka commits a revoked partition's stored offsets during the rebalance only when
//! auto-commit is enabled (librdkafka#1647), and refuses to store offsets for partitions no
//! longer assigned (librdkafka#3774): both are why auto-commit stays on with manual storing.
//!
//! Must not: store an offset before its rows are committed, drop a message (it becomes a row or
//! a dead letter), or give up a batch because PostgreSQL is down (it retries with backoff; the
//! consumer group takes the partitions elsewhere if this member stops polling for too long).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::admin::{AdminError, AdminListener, AdminServer, Checks, ConfigEndpoint, ReadinessCheck};
use crate::config::Config;
use crate::config::reload::{self, Reloading};
use crate::lifecycle::Tasks;
use crate::telemetry;

pub mod columns;
mod consumer;
mod lanes;
pub mod replay;
pub mod row;
pub mod schema;
pub mod writer;

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;

use consumer::{LagClock, PersistConsumer, PersistContext, consumer_config, report_lag};
use lanes::{Postgres, Run, connect_writer, consume};

/// How often partitions ahead are created and old ones dropped.
const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(3600);
/// How often PostgreSQL is asked `SELECT 1` for its state, also while no records arrive.
const DATABASE_PROBE_INTERVAL: Duration = Duration::from_secs(5);
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
    /// Connecting took longer than `postgres.connect_timeout` per host.
    #[error("postgres: connection attempt timed out")]
    ConnectTimeout,
    /// A batch write got no answer within `postgres.write_timeout`; its connection is dropped.
    #[error("postgres: no answer to a batch write within {}", humantime::format_duration(*.0))]
    WriteTimeout(Duration),
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

/// Runs the persister until `shutdown` is cancelled, then finishes the current batch and commits.
/// The admin server listens where `admin` says (see `agent::run`).
pub async fn run(
    config: Config,
    admin: AdminListener,
    reloading: Option<Reloading>,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
) -> Result<(), PersistError> {
    telemetry::register_persist_series();
    let admin = AdminServer::open(admin, &config.persist.admin_listen, ConfigEndpoint::persist(&config)).await?;
    admin.announce(config.persist.admin_address_file.as_deref())?;
    let health = Arc::new(Health::default());
    let background = CancellationToken::new();
    let ready = health.readiness();
    let running = Arc::new(std::sync::RwLock::new(config.clone()));
    reload::publish(None, &reload::fingerprint(&config));
    // Every task under `tasks`; one that fails starts the drain, like a signal.
    let tasks = Tasks::new(shutdown.clone());
    let mut services = vec![tasks.service(
        "admin",
        background.clone(),
        admin.serve(
            metrics,
            Arc::new(|| {}),
            Checks { ready: ready.clone(), dependencies: vec![("postgres", health.postgres_state())] },
            crate::admin::config_view(&running),
            background.clone(),
        ),
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
            let Some(writer) = connect_writer(&Postgres(&config), &health, &shutdown).await? else {
                return Ok(());
            };
            writers.push(writer);
        }
        let lag = Arc::new(LagClock::default());
        let context =
            PersistContext { health: health.clone(), errors: telemetry::librdkafka::ErrorTotals::default(), lag: lag.clone() };
        let consumer: Arc<PersistConsumer> = Arc::new(consumer_config(&config).create_with_context(context)?);
        let topics = config.subscriptions();
        consumer.subscribe(&topics.iter().map(String::as_str).collect::<Vec<_>>())?;
        info!(topics = %topics.join(", "), group = %config.persist.group_id, "persister consuming");
        let maintenance = tasks.service("maintenance", shutdown.clone(), maintain(config.clone(), shutdown.clone()));
        let lag_stop = CancellationToken::new();
        let lag_task =
            tasks.service("lag", lag_stop.clone(), report_lag(consumer.clone(), lag.clone(), lag_stop.clone()));
        let probe = probe_database(config.postgres.clone(), health.clone(), background.clone());
        let probe = tasks.service("database probe", background.clone(), probe);
        let run = Run {
            config: &config,
            running: &running,
            consumer: consumer.as_ref(),
            database: &Postgres(&config),
            health: &health,
            lag: &lag,
        };
        // Not spawned (it borrows the run), but watched: a panicking lane starts the drain, and
        // only offsets of committed batches were stored.
        tasks.watch("consume", consume(&run, writers, &shutdown)).await;
        health.draining.store(true, Ordering::Relaxed);
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
    health.draining.store(true, Ordering::Relaxed);
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

/// What the persister's health is made of, each part written by the one who knows it: one
/// struct shared by the run, its tasks and the consumer's callbacks.
///
/// Readiness is "alive and able to work": the process runs, its admin port answers and it is not
/// draining. A persister has no Service in front of it, so readiness only steers rollouts and
/// the PodDisruptionBudget: a replica with no partitions (spare: more replicas than the topic has
/// partitions, as KEDA scales them) is ready to take some at the next rebalance, and one waiting
/// for PostgreSQL is ready to write once it is back — if they turned unready, a database outage
/// would make every replica unready and the budget would block every node drain. What they wait
/// for is reported apart: `sluice_persist_assigned_partitions`,
/// `sluice_persist_postgres_reachable`, `/healthz/postgres`, the lag, and their alerts.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// Partitions assigned to this member (the consumer's rebalance callback).
    pub(crate) assigned: AtomicUsize,
    /// PostgreSQL answered the last connect, write or probe.
    database_ok: AtomicBool,
    /// The drain has begun.
    pub(crate) draining: AtomicBool,
    /// PostgreSQL's failures while it is away, collapsed (one line when it goes, one a minute
    /// while it stays away, one when it is back).
    database_failures: telemetry::repeats::Repeats,
}

impl Health {
    /// `/readyz`: ready unless draining; the status line says what this member waits for.
    fn readiness(self: &Arc<Self>) -> ReadinessCheck {
        let health = self.clone();
        Arc::new(move || {
            if health.draining.load(Ordering::Relaxed) {
                return Err("draining".into());
            }
            let mut waits = Vec::new();
            if !health.database_ok.load(Ordering::Relaxed) {
                waits.push("postgres unreachable, retrying");
            }
            if health.assigned.load(Ordering::Relaxed) == 0 {
                waits.push("no partitions assigned");
            }
            Ok(if waits.is_empty() { "ready".into() } else { format!("ready ({})", waits.join("; ")) })
        })
    }

    /// `/healthz/postgres`.
    fn postgres_state(self: &Arc<Self>) -> ReadinessCheck {
        let health = self.clone();
        Arc::new(move || {
            if health.database_ok.load(Ordering::Relaxed) {
                Ok("postgres reachable".into())
            } else {
                Err("postgres unreachable; batches wait and are retried (nothing is lost)".into())
            }
        })
    }

    /// PostgreSQL answered (a connect, a write or the probe).
    pub(crate) fn database_answered(&self) {
        if !self.database_ok.swap(true, Ordering::Relaxed) {
            metrics::gauge!(telemetry::PERSIST_POSTGRES_REACHABLE).set(1.0);
            let failures = self.database_failures.clear();
            info!(failures_not_logged = failures, "postgres reachable");
        }
    }

    /// PostgreSQL failed `doing` (connect, write, probe) with `error`, a failure it is retried
    /// after. Logged the first time, then once a minute with the count while it goes on.
    pub(crate) fn database_failed(&self, doing: &'static str, error: &dyn std::fmt::Display) {
        if self.database_ok.swap(false, Ordering::Relaxed) {
            metrics::gauge!(telemetry::PERSIST_POSTGRES_REACHABLE).set(0.0);
        }
        if let Some(repeated) = self.database_failures.admit(doing) {
            warn!(%error, doing, repeated, "postgres failed; retrying with backoff (further failures are counted in one line a minute)");
        }
    }
}

/// Applies new configs (log level, batch limits) as they come until `stop`.
async fn reload_persister(reloading: Reloading, running: Arc<std::sync::RwLock<Config>>, stop: CancellationToken) {
    reload::follow(&reloading, crate::config::Role::Persist, &running, stop, |current, effective| {
        if current.log.level != effective.log.level
            && let Some(log) = &reloading.log
            && let Err(error) = log.set_level(&effective.log.level)
        {
            warn!(%error, "log level not changed");
        }
        Ok(())
    })
    .await;
}

/// Creates partitions ahead and applies retention (day partitions, dead letters), hourly, on a
/// connection of its own.
async fn maintain(config: Config, stop: CancellationToken) {
    metrics::counter!(telemetry::PERSIST_DEAD_LETTERS_DELETED).increment(0);
    loop {
        let result = async {
            let client = writer::connect(&config.postgres).await?;
            schema::ensure_partitions(&client, &schema::days_ahead(config.persist.partitions_ahead_days)).await?;
            schema::apply_retention(&client, chrono::Utc::now().date_naive(), config.persist.retention_days).await?;
            let deleted =
                schema::apply_dead_letter_retention(&client, config.persist.dead_letter_retention_days).await?;
            if deleted > 0 {
                info!(
                    deleted,
                    dead_letter_retention_days = config.persist.dead_letter_retention_days,
                    "deleted dead letters past their retention"
                );
            }
            Ok::<(), PersistError>(())
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

/// Keeps PostgreSQL's state (`sluice_persist_postgres_reachable`, `/healthz/postgres`) current
/// while the writer is idle, on its own connection.
async fn probe_database(config: crate::config::PostgresConfig, health: Arc<Health>, stop: CancellationToken) {
    let mut client: Option<tokio_postgres::Client> = None;
    loop {
        let check = async {
            if client.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
                client = None;
                client = Some(writer::connect(&config).await?);
            }
            match &client {
                Some(client) => client.simple_query("SELECT 1").await.map(drop).map_err(PersistError::Postgres),
                None => Ok(()),
            }
        };
        // Connecting may take its whole budget (several hosts); a probe that gets no answer
        // drops its connection, which may be one to a server that will never answer again.
        let limit = DATABASE_PROBE_INTERVAL.max(config.connect_budget());
        match tokio::time::timeout(limit, check).await {
            Ok(Ok(())) => health.database_answered(),
            Ok(Err(error)) => health.database_failed("probe", &error),
            Err(_) => {
                client = None;
                health.database_failed("probe", &format!("no answer within {}", humantime::format_duration(limit)));
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(DATABASE_PROBE_INTERVAL) => {}
        }
    }
}
