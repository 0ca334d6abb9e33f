//! `sluice agent`: wires ingest → buffer → ship with the admin server, and runs the drain.
//!
//! Owns: start-up order (bind everything first, so conflicts fail fast; then spawn), readiness
//! (listening, Kafka reachable, not draining) and the shutdown sequence. Must not: contain
//! pipeline logic of its own, or exit the process.
//!
//! Shutdown, in order: readiness goes false → the listener stops accepting and connections read
//! what is already in their sockets → (disk) the spool writer writes what they accepted and seals
//! its segment → records keep shipping until Kafka has acknowledged all of them or
//! `agent.drain_timeout` passes → the producer is flushed → whatever is still unacknowledged is
//! logged with its count: with a disk buffer it stays in the spool for the next start; with a
//! memory buffer it is lost, logged at ERROR and counted as `reason="drain_timeout"` → the admin
//! server stops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, error, info, info_span, warn};

use crate::admin::{AdminError, AdminServer, ConfigEndpoint, ConfigView, ReadinessCheck};
use crate::buffer::spool::{Spool, SpoolWriter};
use crate::buffer::{Buffer, Policy, spooler};
use crate::config::reload::{self, Reloading};
use crate::config::{BufferKind, Config, KeySource, ShipConfig};
use crate::envelope::{EnvelopeWriter, PodMetadata};
use crate::ingest::{self, IngestContext, IngestError, KeyRule};
use crate::ship::{ShipError, Shipper};
use crate::telemetry;

/// How often Kafka's reachability is checked for `/readyz`.
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// How long one reachability check may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How often gauges (buffer depth) are published.
const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The ingest socket.
    #[error(transparent)]
    Ingest(#[from] IngestError),
    /// The admin server.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// The Kafka producer.
    #[error(transparent)]
    Ship(#[from] ShipError),
    /// The disk spool could not be opened.
    #[error("cannot open the spool in {path}: {source}")]
    Spool {
        /// The spool directory.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What the drain achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainReport {
    /// Records still not acknowledged by Kafka when the agent stopped (for a disk buffer they
    /// stay in the spool).
    pub undelivered: usize,
}

/// Runs the agent until `shutdown` is cancelled, then drains.
pub async fn run(
    config: Config,
    reloading: Option<Reloading>,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
) -> Result<DrainReport, AgentError> {
    telemetry::register_agent_series();
    let pod = PodMetadata::from_env();
    let (buffer, spooler) = open_buffer(&config).await?;
    let shipper = Arc::new(Shipper::new(&config, buffer.clone())?);
    let admin = AdminServer::bind(&config.agent.admin_listen, ConfigEndpoint::agent(&config)).await?;
    let listeners = ingest::bind_all(&config.ingest)?;
    let envelopes = EnvelopeWriter::new(&pod);
    info!(instance = envelopes.instance(), topic = %config.kafka.topic, buffer = ?config.buffer.kind, "agent starting");

    let draining = Arc::new(AtomicBool::new(false));
    let abandon = CancellationToken::new();
    let context = Arc::new(IngestContext {
        buffer: buffer.clone(),
        envelopes,
        key: std::sync::RwLock::new(KeyRule::new(&config.ship, &pod)),
        ack_point: config.ack_point(),
        max_json_depth: config.ingest.max_json_depth as usize,
        max_message: usize::try_from(config.largest_message()).unwrap_or(usize::MAX),
        abandon: abandon.clone(),
    });

    let background = CancellationToken::new();
    let ready = readiness(&shipper, &draining);
    let running = Arc::new(RwLock::new(config.clone()));
    reload::publish(None, &reload::fingerprint(&config));
    let admin_task = tokio::spawn(admin.serve(metrics, ready.clone(), config_view(&running), background.clone()));
    if let Some(reloading) = reloading {
        let live = Live { buffer: buffer.clone(), context: context.clone(), shipper: shipper.clone(), pod, reloading };
        tokio::spawn(reload_agent(live, running.clone(), background.clone()).instrument(info_span!("reload")));
    }
    let probe_task = tokio::spawn(probe_kafka(shipper.clone(), buffer.clone(), ready, background.clone()));
    let spooler_stop = CancellationToken::new();
    let spooler_task = spooler.map(|writer| {
        let task = spooler::run(buffer.clone(), writer, config.spool().fsync, spooler_stop.clone());
        tokio::spawn(task.instrument(info_span!("spool")))
    });
    let ship_stop = CancellationToken::new();
    let ship_task = {
        let shipper = shipper.clone();
        let stop = ship_stop.clone();
        tokio::spawn(async move { shipper.run(stop).await }.instrument(info_span!("ship")))
    };
    let connections = TaskTracker::new();
    let listen_tasks: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            let serve = listener.serve(context.clone(), connections.clone(), shutdown.clone());
            tokio::spawn(serve.instrument(info_span!("ingest")))
        })
        .collect();

    shutdown.cancelled().await;
    draining.store(true, Ordering::Relaxed);
    metrics::gauge!(telemetry::READY).set(0.0);
    let deadline = Instant::now() + config.agent.drain_timeout;
    info!(buffer = buffer.describe(), deadline_seconds = config.agent.drain_timeout.as_secs_f64(), "draining");

    for task in listen_tasks {
        let _ = task.await;
    }
    connections.close();
    let connections_done = tokio::time::timeout_at(deadline, connections.wait()).await.is_ok();
    if !connections_done {
        // Readers still waiting for room give up their record, counted.
        warn!(buffer = buffer.describe(), "connections still reading at the drain deadline");
        abandon.cancel();
    }
    // The spool writer writes what the readers accepted, then seals its segment.
    spooler_stop.cancel();
    if let Some(task) = spooler_task {
        let _ = task.await;
    }
    while undelivered(&buffer) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    abandon.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(1), connections.wait()).await;
    ship_stop.cancel();
    let _ = ship_task.await;
    let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
    shipper.flush(remaining).await;

    let undelivered = undelivered(&buffer);
    buffer.report();
    match (undelivered, buffer.spool().is_some()) {
        (0, _) => info!("drained: every accepted record was acknowledged by kafka"),
        (count, true) => {
            warn!(undelivered = count, "records not yet acknowledged by kafka stay in the spool for the next start")
        }
        (count, false) => {
            error!(undelivered = count, "records not acknowledged by kafka before the drain deadline are lost");
            metrics::counter!(telemetry::SHIP_FAILED, telemetry::REASON => "drain_timeout").increment(count);
        }
    }
    background.cancel();
    let _ = tokio::join!(admin_task, probe_task);
    Ok(DrainReport { undelivered: undelivered as usize })
}

/// `/config`: the running config, secrets redacted.
pub fn config_view(running: &Arc<RwLock<Config>>) -> ConfigView {
    let running = running.clone();
    Arc::new(move || running.read().unwrap_or_else(|poisoned| poisoned.into_inner()).to_redacted_toml())
}

/// What a config reload can change in a running agent.
struct Live {
    buffer: Buffer,
    context: Arc<IngestContext>,
    shipper: Arc<Shipper>,
    pod: PodMetadata,
    reloading: Reloading,
}

impl Live {
    fn apply(&self, old: &Config, new: &Config) {
        if old.log.level != new.log.level
            && let Some(log) = &self.reloading.log
            && let Err(error) = log.set_level(&new.log.level)
        {
            warn!(%error, "log level not changed");
        }
        self.buffer.set_policy(Policy { when_full: new.buffer.when_full, block_timeout: new.buffer.block_timeout });
        if (old.ship.key, &old.ship.key_field) != (new.ship.key, &new.ship.key_field) {
            *self.context.key.write().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                KeyRule::new(&new.ship, &self.pod);
        }
        if producer_settings(old) != producer_settings(new) {
            self.shipper.reconfigure(new);
        }
    }
}

/// What the producer is built from (the key is chosen by the readers, not the producer).
fn producer_settings(config: &Config) -> (ShipConfig, &str, &std::collections::BTreeMap<String, String>) {
    let ship = ShipConfig { key: KeySource::None, key_field: None, ..config.ship.clone() };
    (ship, &config.kafka.brokers, &config.kafka.properties)
}

/// Applies new configs as they come (SIGHUP or a changed file) until `stop`.
async fn reload_agent(live: Live, running: Arc<RwLock<Config>>, stop: CancellationToken) {
    let path = live.reloading.path.clone();
    reload::follow(path, reload::Role::Agent, &running, stop, |current, effective| live.apply(current, effective))
        .await;
}

/// Records not yet acknowledged by Kafka: in memory, or (disk type) in the spool.
fn undelivered(buffer: &Buffer) -> u64 {
    match buffer.spool() {
        Some(spool) => spool.undelivered() + buffer.queued_intake() as u64,
        None => buffer.held_records() as u64,
    }
}

/// The memory buffer, or for `buffer.type = "disk"` the spool (recovered from disk) with the
/// buffer in front of it and the writer for the spooler task.
async fn open_buffer(config: &Config) -> Result<(Buffer, Option<SpoolWriter>), AgentError> {
    if config.buffer.kind == BufferKind::Memory {
        return Ok((Buffer::for_config(config), None));
    }
    let spool_config = config.spool();
    let dir = spool_config.dir.clone();
    let (spool, writer, recovered) = tokio::task::spawn_blocking(move || Spool::open(spool_config))
        .await
        .map_err(|error| AgentError::Spool { path: dir.clone(), source: std::io::Error::other(error) })?
        .map_err(|source| AgentError::Spool { path: dir.clone(), source })?;
    metrics::counter!(telemetry::SPOOL_RECOVERED).increment(recovered.records);
    for op in ["write", "fsync", "read"] {
        metrics::counter!(telemetry::SPOOL_ERRORS, "op" => op).increment(0);
    }
    // A damaged region's records cannot be told apart: each counts as one, its bytes as bytes.
    metrics::counter!(telemetry::BUFFER_DROPPED, telemetry::REASON => "corrupt").increment(recovered.corrupt_regions);
    metrics::counter!(telemetry::SPOOL_CORRUPT_BYTES).increment(recovered.corrupt_bytes);
    let buffer = Buffer::for_config_with_spool(config, spool, writer.end());
    Ok((buffer, Some(writer)))
}

/// The agent's `/readyz` rule. Not ready until the socket listens and Kafka has answered once
/// (a wrong broker address fails the rollout), and not ready while draining. A Kafka outage
/// *after* that does not make the agent unready: a sidecar that turns unready takes its whole
/// pod out of service, which is the coupling Sluice exists to remove. The outage shows in the
/// body, in `sluice_kafka_reachable`, and in the buffer's depth.
fn readiness(shipper: &Shipper, draining: &Arc<AtomicBool>) -> ReadinessCheck {
    let reachable = shipper.reachable();
    let reached_once = shipper.reached_once();
    let draining = draining.clone();
    Arc::new(move || {
        if draining.load(Ordering::Relaxed) {
            Err("draining".into())
        } else if !reached_once.load(Ordering::Relaxed) {
            Err("kafka has not answered yet".into())
        } else if !reachable.load(Ordering::Relaxed) {
            Ok("ready; kafka unreachable, records are buffered".into())
        } else {
            Ok("ready".into())
        }
    })
}

/// Keeps the reachability flag and the gauges current until `stop`.
async fn probe_kafka(shipper: Arc<Shipper>, buffer: Buffer, ready: ReadinessCheck, stop: CancellationToken) {
    let mut next_probe = Instant::now();
    loop {
        if Instant::now() >= next_probe {
            let ok = shipper.probe(PROBE_TIMEOUT).await;
            // Retry soon while unreachable so readiness follows a recovering broker quickly.
            next_probe = Instant::now() + if ok { PROBE_INTERVAL } else { Duration::from_secs(1) };
        }
        metrics::gauge!(telemetry::READY).set(if ready().is_ok() { 1.0 } else { 0.0 });
        buffer.report();
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(REPORT_INTERVAL) => {}
        }
    }
}
