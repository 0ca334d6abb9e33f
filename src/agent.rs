//! `sluice agent`: wires ingest → buffer → ship with the admin server, and runs the drain.
//!
//! Owns: start-up order (bind everything first, so conflicts fail fast; then spawn), readiness
//! (listening, Kafka reachable, not draining) and the shutdown sequence. Must not: contain
//! pipeline logic of its own, or exit the process.
//!
//! Shutdown, in order: readiness goes false → the listener stops accepting and connections read
//! what is already in their sockets → records left in the buffer keep shipping until Kafka has
//! acknowledged all of them or `agent.drain_timeout` passes → the producer is flushed → whatever
//! is still held is logged with its count and counted as `reason="drain_timeout"` → the admin
//! server stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, error, info, info_span};

use crate::admin::{AdminError, AdminServer, ReadinessCheck};
use crate::buffer::Buffer;
use crate::config::Config;
use crate::envelope::{EnvelopeWriter, PodMetadata};
use crate::ingest::{IngestContext, IngestError, KeyRule, Listener};
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
}

/// What the drain achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainReport {
    /// Records still not acknowledged by Kafka when the agent stopped.
    pub undelivered: usize,
}

/// Runs the agent until `shutdown` is cancelled, then drains.
pub async fn run(
    config: Config,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
) -> Result<DrainReport, AgentError> {
    telemetry::register_agent_series();
    let pod = PodMetadata::from_env();
    let buffer = Buffer::new(&config.buffer);
    let shipper = Arc::new(Shipper::new(&config, buffer.clone())?);
    let admin = AdminServer::bind(&config.agent.admin_listen).await?;
    let listener = Listener::bind(&config.ingest)?;
    let envelopes = EnvelopeWriter::new(&pod);
    info!(instance = envelopes.instance(), topic = %config.kafka.topic, "agent starting");

    let draining = Arc::new(AtomicBool::new(false));
    let abandon = CancellationToken::new();
    let context = Arc::new(IngestContext {
        buffer: buffer.clone(),
        envelopes,
        max_record_size: usize::try_from(config.ingest.max_record_size.as_u64()).unwrap_or(usize::MAX),
        key: KeyRule::new(&config.ship, &pod),
        abandon: abandon.clone(),
    });

    let background = CancellationToken::new();
    let ready = readiness(&shipper, &draining);
    let admin_task = tokio::spawn(admin.serve(metrics, ready.clone(), background.clone()));
    let probe_task = tokio::spawn(probe_kafka(shipper.clone(), buffer.clone(), ready, background.clone()));
    let ship_stop = CancellationToken::new();
    let ship_task = {
        let shipper = shipper.clone();
        let stop = ship_stop.clone();
        tokio::spawn(async move { shipper.run(stop).await }.instrument(info_span!("ship")))
    };
    let connections = TaskTracker::new();
    let listen_task =
        tokio::spawn(listener.serve(context, connections.clone(), shutdown.clone()).instrument(info_span!("ingest")));

    shutdown.cancelled().await;
    draining.store(true, Ordering::Relaxed);
    metrics::gauge!(telemetry::READY).set(0.0);
    let deadline = Instant::now() + config.agent.drain_timeout;
    info!(held = buffer.held_records(), deadline_seconds = config.agent.drain_timeout.as_secs_f64(), "draining");

    let _ = listen_task.await;
    connections.close();
    if tokio::time::timeout_at(deadline, connections.wait()).await.is_err() {
        // Readers still waiting for room give up their record, counted.
        abandon.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(1), connections.wait()).await;
    }
    while buffer.held_records() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ship_stop.cancel();
    let _ = ship_task.await;
    let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
    shipper.flush(remaining).await;

    let undelivered = buffer.held_records();
    buffer.report();
    if undelivered > 0 {
        error!(undelivered, "records not acknowledged by kafka before the drain deadline are lost");
        metrics::counter!(telemetry::SHIP_FAILED, telemetry::REASON => "drain_timeout").increment(undelivered as u64);
    } else {
        info!("drained: every accepted record was acknowledged by kafka");
    }
    background.cancel();
    let _ = tokio::join!(admin_task, probe_task);
    Ok(DrainReport { undelivered })
}

fn readiness(shipper: &Shipper, draining: &Arc<AtomicBool>) -> ReadinessCheck {
    let reachable = shipper.reachable();
    let draining = draining.clone();
    Arc::new(move || {
        if draining.load(Ordering::Relaxed) {
            Err("draining".into())
        } else if !reachable.load(Ordering::Relaxed) {
            Err("kafka metadata not reachable".into())
        } else {
            Ok(())
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
