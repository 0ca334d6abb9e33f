//! `sluice agent`: wires ingest → buffer → ship with the admin server, and runs the drain.
//!
//! Owns: the agent's lifecycle — build (bind everything first, so conflicts fail fast), spawn
//! (every task under [`Tasks`]: one that fails starts the drain and the agent exits non-zero),
//! run, drain, report — readiness (listening and not draining; Kafka's state is reported apart) and the shutdown
//! sequence. Must not: contain pipeline logic of its own, or exit the process.
//!
//! Drain, in order (each stage has a token of its own): readiness goes false → listeners stop
//! accepting; connections read while data keeps coming, until they idle or half of
//! `agent.drain_timeout` has passed, then shut their socket's read side (a writer's next write
//! fails), take in what is queued and close → at the deadline whatever still waits gives up,
//! counted `drain_timeout` → only when every connection has finished does (disk) the spool
//! writer write what they accepted and seal its segment → records ship until Kafka has
//! acknowledged all of them (the wait is woken by each settlement) or three quarters of the
//! timeout have passed (or the connections finished, if later) → the producer is closed: what it has not sent is purged, answers to what
//! it sent are awaited until the deadline, then the unanswered are purged (a memory record is
//! counted `unconfirmed`: Kafka may hold it) and every delivery report is served (none can come
//! later) → the final count: with a disk buffer what Kafka did not acknowledge stays in the
//! spool for the next start; what is only in memory is lost, logged at ERROR and counted as
//! `drain_timeout`; one `drain finished` line sums it up → the admin server stops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, error, info, info_span, warn};

use crate::admin::{AdminError, AdminListener, AdminServer, Checks, ConfigEndpoint, ReadinessCheck};
use crate::buffer::ack::AckBudget;
use crate::buffer::spool::{Spool, SpoolOp, SpoolWriter};
use crate::buffer::{Buffer, Policy, spooler};
use crate::config::reload::{self, Reloading};
use crate::config::{BufferKind, Config, EnvelopeKind, KeySource, ShipConfig};
use crate::envelope::{EnvelopeWriter, PodFieldTooLong, PodMetadata};
use crate::ingest::{self, IngestContext, IngestError, KeyRule, KeyRules};
use crate::lifecycle::Tasks;
use crate::ship::{ShipError, Shipper};
use crate::telemetry;
use crate::telemetry::outcome::{Dropped, Failed};

/// How often Kafka's reachability is checked (`sluice_kafka_reachable`, `/healthz/kafka`).
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// How long one reachability check may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// The first wait before checking again while Kafka does not answer (it doubles, up to
/// `PROBE_INTERVAL`).
const PROBE_RETRY: Duration = Duration::from_secs(1);

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
    /// A pod field from the Downward API environment is longer than any Kubernetes name.
    #[error(transparent)]
    Pod(#[from] PodFieldTooLong),
    /// A task failed (panicked, or ended before it was asked to stop); the agent drained.
    #[error("tasks failed: {}", .0.join("; "))]
    TasksFailed(Vec<String>),
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
    /// Records still not acknowledged by Kafka when the agent stopped (for a disk buffer those
    /// that were spooled stay in the spool).
    pub undelivered: usize,
    /// Of those, records lost (counted as `drain_timeout`).
    pub lost: usize,
    /// Records sent to Kafka whose answer had not come at the deadline (counted as
    /// `unconfirmed`): Kafka may hold them.
    pub unconfirmed: usize,
    /// Records connections gave up at the deadline before they reached the buffer (counted as
    /// `drain_timeout` too).
    pub abandoned: usize,
}

/// Runs the agent until `shutdown` is cancelled (a signal, or a task that failed), then drains.
/// Returns an error if a task failed, after the drain. The admin server listens where `admin`
/// says: the binary has it bind `agent.admin_listen` during the build; a test that runs the agent
/// in its own runtime passes a listener it bound on port 0.
pub async fn run(
    config: Config,
    admin: AdminListener,
    reloading: Option<Reloading>,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
) -> Result<DrainReport, AgentError> {
    // ---- Build: everything that can fail to start fails here, before anything runs.
    telemetry::register_agent_series();
    let mut pod = PodMetadata::from_env();
    pod.check()?;
    pod.info = crate::podinfo::first(&config.agent.pod_info);
    let (buffer, spool_writer) = open_buffer(&config).await?;
    // Every task runs under `tasks`; one that fails starts the drain, like a signal.
    let tasks = Tasks::new(shutdown.clone());
    let topics = Arc::new(crate::topic::Topics::new(&config.kafka, &pod));
    let shipper = Arc::new(Shipper::new(&config, buffer.clone(), tasks.clone(), topics.clone())?);
    let admin = AdminServer::open(admin, &config.agent.admin_listen, ConfigEndpoint::agent(&config)).await?;
    let listeners = ingest::bind_all(&config.ingest)?;
    // Announced once everything is bound: a reader of the file may then use the sockets too.
    admin.announce(config.agent.admin_address_file.as_deref())?;
    let envelopes = EnvelopeWriter::new(&pod, config.ship.envelope);
    info!(
        instance = envelopes.instance(),
        topic = %config.kafka.topic,
        buffer = ?config.buffer.kind,
        envelope = config.ship.envelope.as_str(),
        "agent starting"
    );

    // Each stage of the drain stops on a token of its own.
    let stages = Stages::default();
    let draining = Arc::new(AtomicBool::new(false));
    let context = Arc::new(IngestContext {
        buffer: buffer.clone(),
        envelopes,
        key: KeyRules::new(KeyRule::new(&config.ship, &pod)),
        topics,
        ack_point: config.ack_point(),
        max_json_depth: config.ingest.max_json_depth as usize,
        max_message: usize::try_from(config.largest_message()).unwrap_or(usize::MAX),
        stop_reading: stages.stop_reading.clone(),
        abandon: stages.abandon.clone(),
        abandoned: std::sync::atomic::AtomicU64::new(0),
        acks: AckBudget::new(ack_limit(&config), ACK_WINDOW),
        read_pool: ingest::read_pool(&config.ingest),
        inflations: Arc::new(tokio::sync::Semaphore::new(ingest::MAX_INFLATIONS)),
        multiline_pool: Arc::new(tokio::sync::Semaphore::new(ingest::multiline::MULTILINE_POOL_BYTES)),
    });

    // ---- Spawn: every task under `tasks`.
    let ready = readiness(&shipper, &draining);
    let running = Arc::new(RwLock::new(config.clone()));
    reload::publish(None, &reload::fingerprint(&config));
    let background = &stages.background;
    let mut services = vec![tasks.service(
        "admin",
        background.clone(),
        admin.serve(
            metrics,
            refresh(&buffer, &ready),
            Checks { ready: ready.clone(), dependencies: vec![("kafka", kafka_state(&shipper))] },
            crate::admin::config_view(&running),
            background.clone(),
        ),
    )];
    let pod = Arc::new(RwLock::new(pod));
    // The config the key and topic routes were last made from: a reload and a change of the pod's
    // labels each make them again under this lock, from the other's latest (neither reverts the
    // other's change).
    let routing = Arc::new(std::sync::Mutex::new(config.clone()));
    if config.agent.pod_info.path.is_some() {
        let current = pod.read().unwrap_or_else(|poisoned| poisoned.into_inner()).info.clone();
        let (context, pod, routing) = (context.clone(), pod.clone(), routing.clone());
        let changed = move |info: &crate::podinfo::PodInfo| {
            let config = routing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let pod = {
                let mut pod = pod.write().unwrap_or_else(|poisoned| poisoned.into_inner());
                pod.info = info.clone();
                pod.clone()
            };
            context.envelopes.set_pod(&pod);
            // Templates naming a label or annotation render again; the others keep their route
            // (a new route would start over on `kafka.max_topics`).
            let names_pod_info = |template: Option<&str>| {
                template
                    .and_then(|text| crate::template::Template::parse(text).ok())
                    .is_some_and(|t| t.reads_pod_info())
            };
            if names_pod_info(Some(config.kafka.topic.as_str())) {
                context.topics.set(&config.kafka, &pod);
            }
            if names_pod_info(config.ship.key_template.as_deref()) {
                context.key.set(KeyRule::new(&config.ship, &pod));
            }
        };
        let follow = crate::podinfo::follow(config.agent.pod_info.clone(), current, changed, background.clone());
        services.push(tasks.service("pod info", background.clone(), follow.instrument(info_span!("pod_info"))));
    }
    if let Some(reloading) = reloading {
        let live = Live {
            buffer: buffer.clone(),
            context: context.clone(),
            shipper: shipper.clone(),
            pod,
            routing,
            reloading,
        };
        let follow = reload_agent(live, running.clone(), background.clone()).instrument(info_span!("reload"));
        services.push(tasks.service("reload", background.clone(), follow));
    }
    if config.ship.sink == crate::config::Sink::Stdout {
        // Kafka is not used: nothing to probe (its state reads reachable).
        let _ = shipper.probe(PROBE_TIMEOUT).await;
        warn!(
            "ship.sink = \"stdout\": records are printed to stdout (one JSON line each), nothing is sent to Kafka; the buffer is in memory"
        );
    } else {
        let probe = probe_kafka(shipper.clone(), background.clone());
        services.push(tasks.service("probe", background.clone(), probe));
    }
    let spooler_task = spool_writer.map(|writer| {
        let task =
            spooler::run(buffer.clone(), writer, config.buffer.fsync, stages.spooler.clone(), stages.abandon.clone());
        tasks.service("spooler", stages.spooler.clone(), task.instrument(info_span!("spool")))
    });
    let ship_task = {
        let (shipper, stop) = (shipper.clone(), stages.ship.clone());
        tasks.service("shipper", stop.clone(), async move { shipper.run(stop).await }.instrument(info_span!("ship")))
    };
    let connections = TaskTracker::new();
    let listen_tasks: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            let serve = listener.serve(context.clone(), connections.clone(), shutdown.clone());
            tasks.service("listener", shutdown.clone(), serve.instrument(info_span!("ingest")))
        })
        .collect();

    // ---- Run until a signal, or a task that failed.
    shutdown.cancelled().await;

    // ---- Drain.
    draining.store(true, Ordering::Relaxed);
    metrics::gauge!(telemetry::READY).set(0.0);
    let started = Instant::now();
    let deadline = started + config.agent.drain_timeout;
    // The last quarter is kept for Kafka's answers to what was sent (step 5): a record stored in
    // Kafka whose answer had not come must not be counted lost. Nothing is sent after this.
    let sending_stops = deadline - config.agent.drain_timeout / 4;
    info!(buffer = buffer.describe(), deadline_seconds = config.agent.drain_timeout.as_secs_f64(), "draining");
    // 1. No new connections; open ones read while data keeps coming, until they idle or half the
    //    drain timeout has passed: then they stop reading (a writer's next write fails), take in
    //    what is already in their socket, and close. Then comes shipping, and the last quarter waits
    //    for Kafka's answers.
    // 2. A connection still waiting at the deadline (for buffer room, a rate limit, or a writer
    //    reading its acknowledgements) gives up, counting what it holds as `drain_timeout`. Every
    //    wait of a connection ends on `abandon`, so they all finish: only then may the spool
    //    writer stop and the final count be taken (a record pushed later would be in neither).
    //    A datagram listener drains its socket's queue under the same two deadlines.
    let readers_done = async {
        for task in listen_tasks {
            tasks.join(task).await;
        }
        connections.close();
        connections.wait().await;
    };
    tokio::pin!(readers_done);
    let read_deadline = started + config.agent.drain_timeout / 2;
    if tokio::time::timeout_at(read_deadline, &mut readers_done).await.is_err() {
        info!("connections still reading at half the drain timeout: they stop reading now");
        stages.stop_reading.cancel();
        // Until the deadline, not until sending stops: an acknowledged writer hears of what Kafka
        // confirms in the last quarter too (else it would send it again).
        if tokio::time::timeout_at(deadline, &mut readers_done).await.is_err() {
            warn!(buffer = buffer.describe(), "connections still busy at the drain deadline; they give up");
            stages.abandon();
            if tokio::time::timeout(CONNECTIONS_AFTER_ABANDON, &mut readers_done).await.is_err() {
                error!("connections did not finish after the drain deadline: records they read later are not counted");
            }
        }
    }
    // 3. The spool writer writes what the connections accepted, then seals its segment. Waiting
    //    for disk room (the shipper still frees it), it may take until the deadline; then what it
    //    could not write is counted `drain_timeout`.
    stages.spooler.cancel();
    if let Some(task) = spooler_task {
        let spooled = tasks.join(task);
        tokio::pin!(spooled);
        if tokio::time::timeout_at(deadline, &mut spooled).await.is_err() {
            warn!(buffer = buffer.describe(), "the spool writer is still waiting for disk room at the drain deadline");
            stages.abandon();
            spooled.await;
        }
    }
    // 4. Ship until Kafka has every record, or sending stops (connections still busy past that
    //    keep shipping going until they finish, at the deadline at the latest).
    if !buffer.wait_until_delivered(sending_stops).await {
        warn!(
            buffer = buffer.describe(),
            "records not yet acknowledged by kafka: sending stops, and answers to what was sent are awaited until the drain deadline"
        );
    }
    stages.abandon();
    stages.ship.cancel();
    // The shipper's task ends at once (it sends nothing after its stop), or once a producer it is
    // replacing is retired: bounded (a retirement a stuck broker thread holds is counted by
    // `close`, which has the rest of its grace).
    let shipped = tasks.join(ship_task);
    if tokio::time::timeout_at(Instant::now().max(deadline) + SHIPPER_STOP, shipped).await.is_err() {
        tasks.fail("shipper", "did not stop by the drain deadline (a producer being replaced did not let go)");
    }
    // 5. After this no delivery report can come (or one is let go uncounted: the close is
    //    bounded too): every record is delivered, back in the buffer, or counted.
    let closed = shipper.close(deadline).await;

    // ---- Report.
    let report = account_closed(&buffer, context.abandoned.load(Ordering::Relaxed), closed);
    // What stays in the spool that Kafka may hold is marked for the next start (file I/O: off
    // the runtime's workers).
    let remembering = buffer.clone();
    if tokio::task::spawn_blocking(move || remembering.remember_maybe_stored()).await.is_err() {
        error!("keeping the marks of records kafka may hold did not run to its end");
    }
    buffer.report();
    stages.background.cancel();
    for task in services {
        tasks.join(task).await;
    }
    let failures = tasks.failures();
    if !failures.is_empty() {
        return Err(AgentError::TasksFailed(failures));
    }
    Ok(report)
}

/// Most records one acknowledged-mode connection may have numbered and not yet reported to its
/// writer (see `AckBudget`): a writer that never reads its acknowledgements is held there.
const ACK_WINDOW: u64 = 8192;

/// Most unreported acknowledged records over all connections: a quarter of `buffer.max_records`
/// (and at least one window), each costing at most `ACK_STATE_BYTES`.
fn ack_limit(config: &Config) -> usize {
    (config.buffer.max_records as usize / 4).max(ACK_WINDOW as usize)
}

/// How long the shipper's task may take to stop once told, at the deadline at the earliest: it
/// stops within milliseconds unless a producer it is replacing cannot be let go (a broker thread
/// stuck in DNS or a connect); within `ship::CLOSE_GRACE`, so the close still has a part of it.
const SHIPPER_STOP: Duration = Duration::from_secs(1);

/// How long connections may take to finish after the drain deadline told them to give up
/// (every wait of theirs ends on it: this only guards against a bug).
const CONNECTIONS_AFTER_ABANDON: Duration = Duration::from_secs(5);

/// The tokens of the drain's stages, cancelled in this order: connections stop reading, give
/// up waiting (`abandon`), the spool writer stops, the shipper stops, the background tasks
/// (admin, probe, reload) stop last so `/readyz` and `/metrics` show the drain.
#[derive(Default)]
struct Stages {
    stop_reading: CancellationToken,
    abandon: CancellationToken,
    spooler: CancellationToken,
    ship: CancellationToken,
    background: CancellationToken,
}

impl Stages {
    /// The drain deadline: whatever waits gives up (reading stops first, if it had not).
    fn abandon(&self) {
        self.stop_reading.cancel();
        self.abandon.cancel();
    }
}

/// The final count, after the shipper is closed: records still held in memory are lost (memory
/// buffer, or accepted but never written to the spool, or held in memory after `drop_oldest`
/// deleted their segment) and counted as `drain_timeout` — unless an earlier attempt may have
/// stored them in Kafka (`Record::maybe_stored`) or librdkafka still held them when the drain
/// stopped waiting for it (`closed.stuck`): those are `unconfirmed`, like the records whose answer
/// never came (`closed.unconfirmed`, counted by the close); with a disk buffer, spooled records
/// not yet acknowledged stay in the spool for the next start.
pub(crate) fn account_closed(buffer: &Buffer, abandoned: u64, closed: crate::ship::Closed) -> DrainReport {
    // A spooled record is owed by its segment (it stays for the next start) unless drop_oldest
    // deleted that: an orphan, counted here — unconfirmed if it was sent with no answer.
    let maybe_stored = buffer.queued_maybe_stored() as u64;
    let (held, in_spool, stuck) = match buffer.spool() {
        // What librdkafka still holds of a disk buffer is spooled: it stays in the spool.
        Some(spool) => (buffer.queued_intake() as u64 + spool.orphaned(), spool.undelivered(), 0),
        // librdkafka's count may include events that are no record: never more than is held.
        None => {
            let held = buffer.held_records() as u64;
            (held, 0, closed.stuck.min(held.saturating_sub(maybe_stored)))
        }
    };
    let lost = held.saturating_sub(maybe_stored + stuck);
    if maybe_stored + stuck > 0 {
        error!(
            unconfirmed = maybe_stored + stuck,
            "records kafka may hold (an attempt failed after the broker may have written them, or librdkafka still held them at the deadline) were not confirmed before the drain deadline; counted as unconfirmed"
        );
        Failed::Unconfirmed.count(maybe_stored + stuck);
    }
    // Records the shipper left unsent once sending stopped are counted already (`Buffer::unsent`):
    // in the report, not again on the counters.
    let (unsent_lost, unsent_unconfirmed) = buffer.unsent_counts();
    let unconfirmed = closed.unconfirmed + maybe_stored + stuck + unsent_unconfirmed;
    if lost > 0 {
        error!(lost, "records not acknowledged by kafka before the drain deadline are lost");
        Failed::DrainTimeout.count(lost);
    }
    let lost = lost + unsent_lost;
    if in_spool > 0 {
        warn!(undelivered = in_spool, "records not yet acknowledged by kafka stay in the spool for the next start");
    }
    if lost == 0 && in_spool == 0 && abandoned == 0 && unconfirmed == 0 {
        info!("drained: every accepted record was acknowledged by kafka");
    }
    // One line with the whole drain's outcome, beside the counters (a scrape may miss the end).
    info!(lost, unconfirmed, in_spool, abandoned, "drain finished");
    DrainReport {
        undelivered: (lost + in_spool) as usize,
        lost: lost as usize,
        unconfirmed: unconfirmed as usize,
        abandoned: abandoned as usize,
    }
}

/// [`account_closed`] after a close that left nothing in librdkafka, with `unconfirmed` counted
/// by it (the model-based test's drain).
#[cfg(test)]
pub(crate) fn account(buffer: &Buffer, abandoned: u64, unconfirmed: u64) -> DrainReport {
    account_closed(buffer, abandoned, crate::ship::Closed { unconfirmed, stuck: 0 })
}

/// What a config reload can change in a running agent.
struct Live {
    buffer: Buffer,
    context: Arc<IngestContext>,
    shipper: Arc<Shipper>,
    /// The pod, its labels as last read (`[agent.pod_info]`).
    pod: Arc<RwLock<PodMetadata>>,
    /// The config the routes were last made from (shared with the pod-info follower).
    routing: Arc<std::sync::Mutex<Config>>,
    reloading: Reloading,
}

impl Live {
    fn pod(&self) -> PodMetadata {
        self.pod.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Applies what changed, or refuses the whole config first: one librdkafka would not make a
    /// producer of (it was reported applied, and every producer made with it failed).
    fn apply(&self, old: &Config, new: &Config) -> Result<(), String> {
        let reconfigure = producer_settings(old) != producer_settings(new);
        if reconfigure {
            crate::ship::check_producer(new).map_err(|refused| refused.to_string())?;
        }
        if old.log.level != new.log.level
            && let Some(log) = &self.reloading.log
            && let Err(error) = log.set_level(&new.log.level)
        {
            warn!(%error, "log level not changed");
        }
        self.buffer.set_policy(Policy { when_full: new.buffer.when_full, block_timeout: new.buffer.block_timeout });
        let mut routing = self.routing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *routing = new.clone();
        if (old.ship.key, &old.ship.key_field, &old.ship.key_template)
            != (new.ship.key, &new.ship.key_field, &new.ship.key_template)
        {
            self.context.key.set(KeyRule::new(&new.ship, &self.pod()));
        }
        if (&old.kafka.topic, &old.kafka.default_topic, old.kafka.max_topics)
            != (&new.kafka.topic, &new.kafka.default_topic, new.kafka.max_topics)
        {
            // Records already routed keep their topic; the ones read from now on take the new.
            self.context.topics.set(&new.kafka, &self.pod());
            info!(topic = %new.kafka.topic, "kafka.topic applied to records read from now on");
        }
        drop(routing);
        if old.ship.envelope != new.ship.envelope {
            self.context.envelopes.set_kind(new.ship.envelope);
        }
        if reconfigure {
            self.shipper.reconfigure(new);
        }
        Ok(())
    }
}

/// What the producer is built from (the key and the envelope are the readers', not the
/// producer's; whether the topic is a template is).
fn producer_settings(config: &Config) -> (ShipConfig, &str, &std::collections::BTreeMap<String, String>, bool) {
    let ship = ShipConfig {
        key: KeySource::None,
        key_field: None,
        key_template: None,
        envelope: EnvelopeKind::Binary,
        ..config.ship.clone()
    };
    // A templated topic turns the producer's topic auto-creation off (`ship::producer_config`).
    (ship, &config.kafka.brokers, &config.kafka.properties, config.kafka.topic_template().is_some())
}

/// Applies new configs as they come (SIGHUP or a changed file) until `stop`.
async fn reload_agent(live: Live, running: Arc<RwLock<Config>>, stop: CancellationToken) {
    reload::follow(&live.reloading, crate::config::Role::Agent, &running, stop, |current, effective| {
        live.apply(current, effective)
    })
    .await;
}

/// The memory buffer, or for `buffer.type = "disk"` the spool (recovered from disk) with the
/// buffer in front of it and the writer for the spooler task.
async fn open_buffer(config: &Config) -> Result<(Buffer, Option<SpoolWriter>), AgentError> {
    if config.buffer.kind == BufferKind::Memory {
        return Ok((Buffer::for_config(config), None));
    }
    let spool_config = crate::buffer::spool::SpoolConfig::for_config(config);
    let dir = spool_config.dir.clone();
    let (spool, writer, recovered) = tokio::task::spawn_blocking(move || Spool::open(spool_config))
        .await
        .map_err(|error| AgentError::Spool { path: dir.clone(), source: std::io::Error::other(error) })?
        .map_err(|source| AgentError::Spool { path: dir.clone(), source })?;
    metrics::counter!(telemetry::SPOOL_RECOVERED).increment(recovered.records);
    for op in SpoolOp::ALL {
        metrics::counter!(telemetry::SPOOL_ERRORS, "op" => op.as_str()).increment(0);
    }
    // A damaged region's records cannot be told apart: each counts as one, its bytes as bytes.
    Dropped::Corrupt.count(recovered.corrupt_regions);
    metrics::counter!(telemetry::SPOOL_CORRUPT_BYTES).increment(recovered.corrupt_bytes);
    let buffer = Buffer::for_config_with_spool(config, spool, writer.end());
    Ok((buffer, Some(writer)))
}

/// The agent's `/readyz` rule: ready once its sockets accept records (everything is bound
/// before the admin server answers), until the drain begins. Kafka is not part of it: in a pod,
/// a sidecar's readiness is its app's, so an agent that followed Kafka would take every app pod
/// out of its Service during a Kafka outage (or a SASL typo) and stall every rollout — the
/// coupling Sluice exists to remove. Records wait in the buffer under its policy meanwhile;
/// Kafka's state is [`kafka_state`] (`/healthz/kafka`), `sluice_kafka_reachable`, `sluice status`
/// and an alert. The status line says when Kafka is not answering.
fn readiness(shipper: &Arc<Shipper>, draining: &Arc<AtomicBool>) -> ReadinessCheck {
    let kafka = kafka_state(shipper);
    let draining = draining.clone();
    Arc::new(move || {
        if draining.load(Ordering::Relaxed) {
            return Err("draining".into());
        }
        Ok(match kafka() {
            Ok(_) => "ready".into(),
            Err(why) => format!("ready (accepting records; {why})"),
        })
    })
}

/// Kafka's state for `/healthz/kafka`: reachable, or why not — never answered since the start
/// (a wrong `kafka.brokers`, TLS or SASL), or unreachable now (an outage). Never a reason for the
/// agent to be unready.
fn kafka_state(shipper: &Arc<Shipper>) -> ReadinessCheck {
    let reachable = shipper.reachable();
    let reached_once = shipper.reached_once();
    let shipper = shipper.clone();
    Arc::new(move || {
        if !reached_once.load(Ordering::Relaxed) {
            Err("kafka has not answered since the agent started (check kafka.brokers, TLS and SASL); records are buffered".into())
        } else if !reachable.load(Ordering::Relaxed) {
            Err("kafka unreachable; records are buffered".into())
        } else if let Some(error) = shipper.topic_error() {
            Err(format!(
                "kafka reachable, but topic {} is missing or hidden ({error}); records are buffered",
                shipper.default_topic()
            ))
        } else {
            Ok("kafka reachable".into())
        }
    })
}

/// The gauges computed when `/metrics` is asked for: readiness and the buffer's.
fn refresh(buffer: &Buffer, ready: &ReadinessCheck) -> crate::admin::Refresh {
    let (buffer, ready) = (buffer.clone(), ready.clone());
    Arc::new(move || {
        metrics::gauge!(telemetry::READY).set(if ready().is_ok() { 1.0 } else { 0.0 });
        buffer.report();
    })
}

/// Keeps Kafka's reachability current until `stop`: a metadata request every `PROBE_INTERVAL`;
/// while Kafka does not answer, sooner (from a second, doubling), so its return is seen quickly.
/// Says what changed in one line each: Kafka unreachable (and, while it stays so, a reminder
/// once a minute), Kafka reachable again with how long it was away and how many of the Kafka
/// client's lines were counted and not written meanwhile (`telemetry::librdkafka`).
async fn probe_kafka(shipper: Arc<Shipper>, stop: CancellationToken) {
    let mut outage: Option<Outage> = None;
    let mut missing: Option<Outage> = None;
    let mut started = true;
    let mut retry = PROBE_RETRY;
    loop {
        let now = Instant::now();
        let next = match shipper.probe(PROBE_TIMEOUT).await {
            Ok(()) => {
                let topic = shipper.default_topic();
                match (shipper.topic_error(), &mut missing) {
                    (Some(kafka_error), None) => {
                        warn!(%topic, %kafka_error, "kafka answers but the topic does not exist or the agent may not see it (create it, or grant the agent Describe and Write); its records wait in the buffer under the buffer's policy");
                        missing = Some(Outage { began: now, reminded: now });
                    }
                    (Some(kafka_error), Some(since))
                        if now.duration_since(since.reminded) >= telemetry::repeats::REMINDER_EVERY =>
                    {
                        since.reminded = now;
                        warn!(%topic, %kafka_error, missing_for_seconds = now.duration_since(since.began).as_secs(), "the topic is still missing or hidden; its records wait in the buffer");
                    }
                    (None, Some(since)) => {
                        info!(%topic, missing_for_seconds = now.duration_since(since.began).as_secs(), "the topic is there now");
                        missing = None;
                    }
                    _ => {}
                }
                if let Some(outage) = outage.take() {
                    info!(
                        unreachable_for_seconds = now.duration_since(outage.began).as_secs(),
                        client_lines_not_logged = telemetry::librdkafka::answered(),
                        "kafka reachable again"
                    );
                } else if started {
                    info!("kafka reachable");
                }
                retry = PROBE_RETRY;
                PROBE_INTERVAL
            }
            Err(error) => {
                match &mut outage {
                    None if started => {
                        warn!(%error, "kafka has not answered since the agent started (check kafka.brokers, TLS and SASL); records are buffered under the buffer's policy")
                    }
                    None => warn!(%error, "kafka unreachable; records are buffered under the buffer's policy"),
                    Some(outage) if now.duration_since(outage.reminded) >= telemetry::repeats::REMINDER_EVERY => {
                        outage.reminded = now;
                        warn!(
                            %error,
                            unreachable_for_seconds = now.duration_since(outage.began).as_secs(),
                            "kafka still unreachable; records are buffered under the buffer's policy"
                        );
                    }
                    Some(_) => {}
                }
                outage.get_or_insert(Outage { began: now, reminded: now });
                let next = retry;
                retry = (retry * 2).min(PROBE_INTERVAL);
                next
            }
        };
        started = false;
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(next) => {}
        }
    }
}

/// Kafka not answering, since `began`; the last line about it was written at `reminded`.
struct Outage {
    began: Instant,
    reminded: Instant,
}
