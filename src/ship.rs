//! Ship: the Kafka producer that moves records from the buffer to the topic.
//!
//! Owns: the producer's settings (acks=all, idempotence, compression, batching, queue limits
//! derived from the buffer budget), handing records to librdkafka, and the delivery report that
//! decides each record's fate: acknowledged (its lease is released), retryable (back into the
//! buffer, lease kept), or given up (counted with a reason). [`classify`] is the one place that
//! decides retryable versus not.
//!
//! The shipper takes work from the buffer in two lanes — records in memory (retried ones first)
//! and, for a disk buffer, the backlog read back from the spool — and alternates between them.
//! A producer that reports a fatal error (the idempotent producer's sequence state is lost) is
//! replaced by a new one; dropping the old one purges its queue, and the purged records come back
//! through their delivery reports as retryable, so none is lost.
//!
//! Must not: treat "handed to librdkafka" as delivered, drop a record because of time alone
//! (a `message.timeout.ms` expiry is retried), or call a librdkafka function that can block from
//! a reader task (`send` never blocks: librdkafka's queue cannot fill before the buffer does;
//! `flush`, metadata requests, producer teardown and spool reads run on the blocking pool).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::buffer::spool::{SpoolPos, SpoolReader};
use crate::buffer::{Buffer, LIBRDKAFKA_SHARE, ProducerShare, Record, Work};
use crate::config::{Config, Sink};
use crate::lifecycle::Tasks;
use crate::telemetry;
use crate::telemetry::outcome::{self, Failed};

mod console;
#[cfg(test)]
mod model;
mod polled;
mod report;
mod settle;
#[cfg(test)]
mod tests;

pub use crate::buffer::InFlight;
pub use report::ShipContext;

/// Most records moved from the buffer to librdkafka per wake-up.
const SEND_BATCH: usize = 512;

/// Room above the largest message for the Kafka record's own framing (`message.max.bytes`).
const MESSAGE_FRAMING: usize = 64 * 1024;

/// Why the producer could not be created.
#[derive(Debug, thiserror::Error)]
#[error("cannot create the Kafka producer: {0}")]
pub struct ShipError(#[from] KafkaError);

/// What to do with a record whose delivery failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Put it back and send it again.
    Retry,
    /// Kafka will never accept it; count it with this reason and let it go.
    GiveUp,
}

/// The one function that decides whether a Kafka error is worth retrying. Only errors about the
/// record itself (too large, invalid) are final: everything about the cluster (timeouts,
/// unreachable brokers, missing topics, authorization) can be fixed by an operator, and the
/// buffer's budget, not time, decides how long a record may wait for that.
pub fn classify(error: &KafkaError) -> Disposition {
    match error.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::BadMessage
            | RDKafkaErrorCode::InvalidArgument,
        ) => Disposition::GiveUp,
        _ => Disposition::Retry,
    }
}

/// A record whose topic the broker does not know (and does not create) goes to the default
/// topic, counted (`sluice_ingest_topic_defaults_total{reason="unknown_topic"}`): true if it was
/// rerouted. A record of the default topic waits, as any record does while Kafka cannot take it.
fn reroute_unknown(topics: &crate::topic::Topics, error: &KafkaError, in_flight: &mut InFlight) -> bool {
    // A topic that does not exist, is not a valid name for the broker, or that the agent may not
    // write: for a routed topic, the default one takes its records (else they would be retried
    // for ever, holding the buffer).
    if !matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::TopicAuthorizationFailed
        )
    ) {
        return false;
    }
    let Some(topic) = &in_flight.topic else { return false };
    match topics.unknown(topic) {
        Some(default) => {
            in_flight.topic = Some(default);
            true
        }
        None => false,
    }
}

/// The reason given to a writer whose record Kafka will never accept.
fn give_up_reason(error: &KafkaError) -> Failed {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize) => {
            Failed::MessageSizeTooLarge
        }
        Some(RDKafkaErrorCode::InvalidRecord) => Failed::InvalidRecord,
        _ => Failed::KafkaRefused,
    }
}

/// The metric label for an error: librdkafka's error name in snake case (a fixed set).
pub fn reason(error: &KafkaError) -> String {
    match error.rdkafka_error_code() {
        Some(code) => outcome::kafka_error(code),
        None => "other".into(),
    }
}

/// The librdkafka settings for the agent's producer, with its queue sized from the buffer's
/// share of the budget (a [`Buffer`], or what a config would make: [`ProducerShare::for_config`]).
pub fn producer_config(config: &Config, share: impl Into<ProducerShare>) -> ClientConfig {
    let share = share.into();
    let mut client = ClientConfig::new();
    for (key, value) in config.kafka.client_properties().iter().chain(config.ship.properties.iter()) {
        client.set(key, value);
    }
    // librdkafka's queue holds a subset of the buffer's records (each keeps its lease while
    // there); its limit is the share of `buffer.max_bytes` set aside for librdkafka's second copy
    // of them (`LIBRDKAFKA_SHARE`), never below the largest message a listener allows (it would
    // get QUEUE_FULL forever). A larger queue costs memory without adding throughput (measured:
    // docs/PERFORMANCE.md). librdkafka refuses a message above `message.max.bytes` (default
    // 1,000,000) at once: it is set from the same largest message plus room for the framing. The
    // broker's (topic's) `max.message.bytes` still bounds the compressed batch.
    let kbytes = share.librdkafka_bytes.div_ceil(1024) + 1;
    let queue_messages = share.max_records / LIBRDKAFKA_SHARE + 1;
    // Half a queue is a full batch, sent without waiting for `linger.ms` (the other half fills
    // meanwhile): a small budget's queue holds fewer than librdkafka's 10,000 messages or
    // `ship.batch_size`, and would otherwise ship at most one queue per linger. Per partition,
    // as librdkafka counts them. A `batch.num.messages` set in the properties is kept.
    let batch_bytes = config.ship.batch_size.as_u64().min(kbytes as u64 * 1024 / 2);
    let batch_messages = (queue_messages / 2).clamp(1, 10_000);
    if client.get("batch.num.messages").is_none() {
        client.set("batch.num.messages", batch_messages.to_string());
    }
    let message_max =
        (share.largest_message + MESSAGE_FRAMING + RecordHeaders::MAX_BYTES).clamp(1_000_000, 1_000_000_000);
    // A client id set in the properties is kept (Kafka's quotas are per client id).
    if client.get("client.id").is_none() {
        client.set("client.id", "sluice-agent");
    }
    // A templated topic's names come from records: the producer does not ask the broker to
    // create them (a hostile field, or every restart's fresh `max_topics`, would create topics
    // without bound). A topic that does not exist sends its records to `kafka.default_topic`,
    // counted `unknown_topic`. Setting the property keeps it (topics created on demand).
    if config.kafka.topic_template().is_some() && client.get("allow.auto.create.topics").is_none() {
        client.set("allow.auto.create.topics", "false");
    }
    client
        .set("bootstrap.servers", &config.kafka.brokers)
        .set("statistics.interval.ms", telemetry::librdkafka::STATISTICS_INTERVAL_MS)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        // librdkafka's defaults, set so that no pass-through can weaken them (they are managed
        // keys): with TLS, the broker's certificate and host name are verified.
        .set("enable.ssl.certificate.verification", "true")
        .set("ssl.endpoint.identification.algorithm", "https")
        .set("compression.type", &config.ship.compression)
        .set("linger.ms", config.ship.linger.as_millis().to_string())
        .set("batch.size", batch_bytes.to_string())
        .set("message.timeout.ms", config.ship.delivery_timeout.as_millis().to_string())
        .set("queue.buffering.max.kbytes", kbytes.to_string())
        .set("message.max.bytes", message_max.to_string())
        .set("queue.buffering.max.messages", queue_messages.to_string());
    client
}

/// librdkafka would not make the agent's producer from a config: what it says, naming the
/// properties.
#[derive(Debug, thiserror::Error)]
#[error("librdkafka refuses the producer these settings make: {0}")]
pub struct ProducerRefused(String);

/// A producer's callbacks that hear nothing: the one [`check_producer`] makes is never used.
struct Unheard;

impl rdkafka::ClientContext for Unheard {
    fn log(&self, _: rdkafka::config::RDKafkaLogLevel, _: &str, _: &str) {}
    fn error(&self, _: KafkaError, _: &str) {}
}

impl rdkafka::producer::ProducerContext for Unheard {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// Makes the producer `config` would make, with nothing opened (no broker is named, so no
/// connection is tried), and lets it go at once. librdkafka checks each property as it is set
/// (config validation does that one by one) and how they go together only when a client is made
/// (`max.in.flight` above 5 or `retries = 0` with idempotence, a SASL mechanism this build lacks,
/// ...): a config the agent cannot run is refused before it runs — at start, naming the maps
/// (exit 78), and at a reload, whole (it was reported applied, and every producer made with it
/// failed). A few milliseconds. Properties naming files (certificates, keys, keytabs, plugins)
/// are left out: `check-config` runs where the pod's files are not (CI), and the agent reads them
/// when it makes its producer.
pub fn check_producer(config: &Config) -> Result<(), ProducerRefused> {
    let mut client = producer_config(config, ProducerShare::for_config(config));
    client.remove("bootstrap.servers");
    let files: Vec<String> = client
        .config_map()
        .keys()
        .filter(|name| {
            name.ends_with(".location")
                || name.ends_with(".file")
                || name.ends_with("keytab")
                || **name == "plugin.library.paths"
        })
        .map(|name| name.to_string())
        .collect();
    for name in files {
        client.remove(&name);
    }
    client.set_log_level(rdkafka::config::RDKafkaLogLevel::Emerg);
    match client.create_with_context::<_, rdkafka::producer::BaseProducer<Unheard>>(Unheard) {
        Ok(producer) => {
            drop(producer);
            Ok(())
        }
        Err(KafkaError::ClientCreation(why)) => Err(ProducerRefused(why)),
        Err(other) => Err(ProducerRefused(other.to_string())),
    }
}

type Producer_ = polled::Polled;

/// Retires a producer that is no longer the shipper's: lets it deliver for up to `flush` (less if
/// `hurry` is cancelled: the drain has stopped sending), then purges what it still holds (queued
/// and in flight) and waits for every delivery report before letting it go. rdkafka's own drop
/// flushes for only 500 ms after its purge: reports not served in that time were lost with their
/// leases and records. Blocking: run it on the blocking pool.
///
/// The wait has no deadline of its own because a purge makes librdkafka fail every message at
/// once; it says every `RETIRE_REPORT_EVERY` how many it still waits for. (A broker thread stuck
/// in DNS or a connect can hold it: the drain stops waiting at its deadline, `Shipper::close`.)
fn retire(old: Arc<Producer_>, flush: Duration, hurry: &CancellationToken) {
    use rdkafka::producer::PurgeConfig;
    let flushing = std::time::Instant::now();
    while flushing.elapsed() < flush && !hurry.is_cancelled() && old.in_flight_count() > 0 {
        let _ = old.flush(RETIRE_FLUSH_SLICE.min(flush.saturating_sub(flushing.elapsed())));
    }
    crate::lifecycle::fail_point_stall("purge");
    old.purge(PurgeConfig::default().queue().inflight());
    let started = std::time::Instant::now();
    let mut next_report = RETIRE_REPORT_EVERY;
    while old.in_flight_count() > 0 {
        // Serves the delivery reports the purge produced.
        let _ = old.flush(Duration::from_millis(100));
        if started.elapsed() >= next_report {
            warn!(waiting = old.in_flight_count(), "a replaced kafka producer still owes delivery reports");
            next_report += RETIRE_REPORT_EVERY;
        }
    }
    // Reported, and perhaps still queued for the settling thread: settled before it is gone.
    old.context().settler.settle_now();
    drop(old);
}

/// How long one `flush` of a producer being retired lasts, so the drain's stop is seen within it.
const RETIRE_FLUSH_SLICE: Duration = Duration::from_millis(100);

/// How long after the drain deadline the final close of the producer may still take (the purge
/// and the delivery reports it makes, served at once) before the drain stops waiting for it and
/// counts what it still holds: 2 s, inside the chart's grace period of the default drain (25 s
/// of 30 s) with the final count.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// What closing the producer at the end of the drain left: records sent whose answer never came
/// (`unconfirmed`, counted), and records librdkafka still held when the drain stopped waiting
/// for it (`stuck`: a broker thread stuck in DNS or a connect; counted by the final count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Closed {
    /// Counted `unconfirmed` by the producer's last purge.
    pub unconfirmed: u64,
    /// Still held by librdkafka (the current producer or one being retired) at the deadline.
    pub stuck: u64,
}

/// The agent's producer and the task that feeds it.
pub struct Shipper {
    /// The producer's settings; a config reload may replace them.
    config: RwLock<ClientConfig>,
    /// Settings waiting to be applied by the shipper's loop (a reload).
    pending: std::sync::Mutex<Option<ClientConfig>>,
    /// Signalled when `pending` is set, so an idle shipper applies it at once.
    reconfigured: tokio::sync::Notify,
    producer: RwLock<Arc<Producer_>>,
    /// Producers replaced after a fatal error (also `sluice_ship_producer_recreations_total`).
    recreations: std::sync::atomic::AtomicU64,
    /// How long a producer replaced with new settings may take to deliver what it holds.
    reconfigure_flush: Duration,
    /// Each record's topic: its own, and where it goes if the broker does not know it.
    topics: Arc<crate::topic::Topics>,
    /// The headers each record carries (`ship.headers`, `ship.metadata_headers`); a reload
    /// replaces them.
    headers: RwLock<Arc<RecordHeaders>>,
    buffer: Buffer,
    reachable: Arc<AtomicBool>,
    reached_once: Arc<AtomicBool>,
    /// The agent's tasks (a panic while settling fails them).
    tasks: Tasks,
    /// Held by every producer's polling thread while it runs.
    polling: Arc<()>,
    /// Producers being retired (on the blocking pool): the drain counts what they still hold if
    /// their retirement does not end by its deadline.
    retiring: std::sync::Mutex<Vec<Arc<Producer_>>>,
    /// Producers replaced after a fatal error in a row, none of which Kafka stored a record of
    /// (a producer fatal from birth: a missing ACL): each replacement waits longer.
    fatal_streak: std::sync::atomic::AtomicU32,
    /// Where records go (`ship.sink`, fixed at start): with `stdout` the producer is created
    /// without brokers and never used.
    sink: Sink,
    /// Set once printing to stdout failed (a closed pipe): the agent is draining; said once.
    stdout_failing: AtomicBool,
    /// What Kafka said of the default topic at the last probe that reached it, if not that it is
    /// there: `Broker: Unknown topic or partition`, `Broker: Topic authorization failed` (no
    /// Describe; a principal that may Describe but not Write is seen only in delivery errors).
    topic_error: std::sync::Mutex<Option<String>>,
}

/// The Kafka headers records carry: `ship.headers` as configured, and with
/// `ship.metadata_headers` each record's id and ingest time (read from its envelope) and the
/// pod's fields — the values its envelope holds, readable without decoding it.
#[derive(Debug, Default)]
pub struct RecordHeaders {
    fixed: Vec<(String, String)>,
    /// The pod's fields as `sluice.pod.*` headers, when metadata headers are on.
    pod: Option<Vec<(&'static str, String)>>,
}

impl RecordHeaders {
    /// The most a record's headers may take: static ones are capped at 4 KiB in all (config), the
    /// metadata ones are below 2 KiB (an id, a time, four Kubernetes names).
    pub const MAX_BYTES: usize = 8 * 1024;

    /// What librdkafka holds beside each record for these headers (their names and values, and
    /// its own ~40 bytes per header), charged to each record's budget (`Buffer::cost`).
    pub fn bytes(&self) -> usize {
        const PER_HEADER: usize = 40;
        let fixed: usize = self.fixed.iter().map(|(name, value)| name.len() + value.len() + PER_HEADER).sum();
        let metadata = self.pod.as_ref().map_or(0, |pod| {
            let id_and_time = "sluice.id".len() + 60 + "sluice.ingest_time".len() + 32 + 2 * PER_HEADER;
            id_and_time + pod.iter().map(|(name, value)| name.len() + value.len() + PER_HEADER).sum::<usize>()
        });
        fixed + metadata
    }

    /// The headers `config` asks for (the pod's fields from the Downward API's environment).
    pub fn new(config: &Config) -> Self {
        let fixed = config.ship.headers.iter().map(|(name, value)| (name.clone(), value.clone())).collect();
        let pod = config.ship.metadata_headers.then(|| {
            let pod = crate::envelope::PodMetadata::from_env();
            [
                ("sluice.pod.name", pod.name),
                ("sluice.pod.namespace", pod.namespace),
                ("sluice.pod.container", pod.container),
                ("sluice.pod.node", pod.node),
            ]
            .into_iter()
            .filter_map(|(name, value)| value.map(|value| (name, value)))
            .collect()
        });
        Self { fixed, pod }
    }

    /// The headers of the record whose envelope is `payload`; none when none are configured.
    pub fn for_record(&self, payload: &[u8]) -> Option<rdkafka::message::OwnedHeaders> {
        use rdkafka::message::{Header, OwnedHeaders};
        if self.fixed.is_empty() && self.pod.is_none() {
            return None;
        }
        let mut headers = OwnedHeaders::new_with_capacity(self.fixed.len() + 6);
        for (name, value) in &self.fixed {
            headers = headers.insert(Header { key: name, value: Some(value.as_bytes()) });
        }
        if let Some(pod) = &self.pod {
            if let Ok(envelope) = crate::envelope::Envelope::parse(payload) {
                let id = envelope.id.text();
                headers = headers.insert(Header { key: "sluice.id", value: Some(id.as_bytes()) });
                let time = envelope.ingest_time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
                headers = headers.insert(Header { key: "sluice.ingest_time", value: Some(time.as_bytes()) });
            }
            for (name, value) in pod {
                headers = headers.insert(Header { key: name, value: Some(value.as_bytes()) });
            }
        }
        Some(headers)
    }
}

/// [`producer_config`] for the sink the agent runs: printing (`ship.sink = "stdout"`), the
/// producer — kept so the rest of the shipper is the same — knows no broker, so it never
/// connects, and says nothing of it (librdkafka warns of a missing `bootstrap.servers`).
fn sink_config(config: &Config, buffer: &Buffer) -> ClientConfig {
    let mut client = producer_config(config, buffer);
    if config.ship.sink == Sink::Stdout {
        client.remove("bootstrap.servers");
        client.set("log_level", "3");
    }
    client
}

/// How long a producer being replaced with new settings may take to deliver what it holds
/// before what it still holds is purged (and comes back to the buffer).
const RECONFIGURE_FLUSH: Duration = Duration::from_secs(10);

/// The first wait before replacing a producer that failed without ever delivering (it doubles
/// with each such producer in a row, up to [`FATAL_BACKOFF_MAX`]).
const FATAL_BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait between replacements of producers that fail at birth.
const FATAL_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// How often a producer being retired says it still waits for delivery reports.
const RETIRE_REPORT_EVERY: Duration = Duration::from_secs(10);

impl Shipper {
    /// Creates the producer. It connects lazily; [`Shipper::probe`] tells when Kafka answers.
    /// A panic while settling delivered records fails `tasks` (the agent drains and exits
    /// non-zero).
    pub fn new(
        config: &Config,
        buffer: Buffer,
        tasks: Tasks,
        topics: Arc<crate::topic::Topics>,
    ) -> Result<Self, ShipError> {
        let client = sink_config(config, &buffer);
        let headers = RecordHeaders::new(config);
        buffer.set_header_bytes(headers.bytes());
        let polling = Arc::new(());
        let producer = Self::create(&client, &buffer, &tasks, &polling, &topics)?;
        metrics::counter!(telemetry::SHIP_PRODUCER_RECREATIONS).increment(0);
        Ok(Self {
            config: RwLock::new(client),
            pending: std::sync::Mutex::new(None),
            reconfigured: tokio::sync::Notify::new(),
            producer: RwLock::new(Arc::new(producer)),
            recreations: std::sync::atomic::AtomicU64::new(0),
            reconfigure_flush: RECONFIGURE_FLUSH,
            topics,
            headers: RwLock::new(Arc::new(headers)),
            buffer,
            reachable: Arc::new(AtomicBool::new(false)),
            reached_once: Arc::new(AtomicBool::new(false)),
            tasks,
            polling,
            retiring: std::sync::Mutex::new(Vec::new()),
            fatal_streak: std::sync::atomic::AtomicU32::new(0),
            sink: config.ship.sink,
            stdout_failing: AtomicBool::new(false),
            topic_error: std::sync::Mutex::new(None),
        })
    }

    /// A producer with a fatal flag of its own: a retiring producer's late errors never mark
    /// its replacement.
    fn create(
        client: &ClientConfig,
        buffer: &Buffer,
        tasks: &Tasks,
        polling: &Arc<()>,
        topics: &Arc<crate::topic::Topics>,
    ) -> Result<Producer_, ShipError> {
        let context = ShipContext::new(buffer.clone(), tasks.clone(), topics.clone());
        Ok(Producer_::create(client, context, polling.clone())?)
    }

    fn producer(&self) -> Arc<Producer_> {
        self.producer.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Asks the shipper to continue with new producer settings (config reload). It replaces the
    /// producer between batches (at once if idle); the old one first delivers what it holds (for
    /// up to `RECONFIGURE_FLUSH`), and whatever it still holds then comes back to the buffer.
    pub fn reconfigure(&self, config: &Config) {
        let headers = RecordHeaders::new(config);
        self.buffer.set_header_bytes(headers.bytes());
        *self.headers.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(headers);
        let client = sink_config(config, &self.buffer);
        *self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(client);
        self.reconfigured.notify_one();
    }

    /// Polling threads running: the current producer's, and those of producers let go whose
    /// thread has not ended yet.
    #[cfg(test)]
    fn polling_threads(&self) -> usize {
        Arc::strong_count(&self.polling) - 1
    }

    /// Producers replaced after a fatal error so far.
    pub fn recreations(&self) -> u64 {
        self.recreations.load(Ordering::Relaxed)
    }

    /// Replaces the producer: after a fatal error, or with new settings. The old one is retired
    /// on the blocking pool ([`retire`]): every record it still holds comes back to the buffer
    /// through its (retryable) delivery report before it is gone. A fatal producer that never
    /// delivered a record (refused at birth: a missing ACL, an unauthorised cluster) is replaced
    /// only after a backoff (1 s, doubling to a minute with each in a row): its replacement would
    /// fail the same way, and each costs librdkafka's threads and sockets. `stop` ends the wait
    /// (nothing is replaced then).
    async fn recreate(&self, stop: &CancellationToken) {
        let current = self.producer();
        if current.context().fatal.load(Ordering::Relaxed) {
            if current.context().delivered_any.load(Ordering::Relaxed) {
                self.fatal_streak.store(0, Ordering::Relaxed);
            } else {
                let streak = self.fatal_streak.fetch_add(1, Ordering::Relaxed);
                let wait = FATAL_BACKOFF.saturating_mul(1 << streak.min(16)).min(FATAL_BACKOFF_MAX);
                warn!(
                    wait_seconds = wait.as_secs(),
                    in_a_row = streak + 1,
                    "the kafka producer failed before delivering anything; replaced after a backoff"
                );
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
        drop(current);
        let pending = self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        let reconfigured = pending.is_some();
        if let Some(client) = pending {
            *self.config.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = client;
        }
        let client = self.config.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let fresh = match Self::create(&client, &self.buffer, &self.tasks, &self.polling, &self.topics) {
            Ok(producer) => Arc::new(producer),
            Err(error) => {
                error!(%error, "cannot create a replacement producer; retrying");
                if reconfigured {
                    // Try the new settings again next time.
                    *self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(client);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                return;
            }
        };
        let old =
            std::mem::replace(&mut *self.producer.write().unwrap_or_else(|poisoned| poisoned.into_inner()), fresh);
        let fatal = old.context().fatal.load(Ordering::Relaxed);
        if fatal {
            self.recreations.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(telemetry::SHIP_PRODUCER_RECREATIONS).increment(1);
            warn!("kafka producer replaced after a fatal error");
        } else {
            info!("kafka producer replaced with new settings");
        }
        // A fatal producer can deliver nothing more: purge it at once. One with old settings
        // delivers what it holds, until the drain stops sending.
        let flush = if fatal { Duration::ZERO } else { self.reconfigure_flush };
        self.retiring.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(old.clone());
        let hurry = stop.clone();
        let retiring = old.clone();
        if tokio::task::spawn_blocking(move || retire(retiring, flush, &hurry)).await.is_err() {
            error!("retiring the old kafka producer did not run to its end");
        }
        self.retiring
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .retain(|producer| !Arc::ptr_eq(producer, &old));
    }

    fn must_recreate(&self) -> bool {
        self.producer().context().fatal.load(Ordering::Relaxed)
            || self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).is_some()
    }

    #[cfg(test)]
    fn set_reconfigure_flush(&mut self, flush: Duration) {
        self.reconfigure_flush = flush;
    }

    /// True while the last metadata request succeeded.
    pub fn reachable(&self) -> Arc<AtomicBool> {
        self.reachable.clone()
    }

    /// Why records for the default topic cannot be delivered although Kafka answers (the topic
    /// does not exist, or the agent may not see it), as of the last probe; `None` if they can.
    pub fn topic_error(&self) -> Option<String> {
        self.topic_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// The topic records go to when they name none (`kafka.topic`, or `kafka.default_topic`
    /// with a template): the one [`Shipper::probe`] asks about.
    pub fn default_topic(&self) -> String {
        self.topics.default_topic().to_string()
    }

    /// True once any metadata request succeeded.
    pub fn reached_once(&self) -> Arc<AtomicBool> {
        self.reached_once.clone()
    }

    /// Moves records from the buffer into librdkafka until `stop` is cancelled. The caller
    /// cancels `stop` only once the buffer holds nothing (or the drain deadline passed).
    pub async fn run(&self, stop: CancellationToken) {
        let mut batch = Vec::with_capacity(SEND_BATCH);
        let mut reader = self.buffer.spool().map(|spool| spool.reader());
        let mut prefer_backlog = true;
        loop {
            // A reload that comes as the drain stops sending waits for the next start: a new
            // producer now would only purge what the old one still waits to hear of.
            let fatal = self.producer().context().fatal.load(Ordering::Relaxed);
            if self.must_recreate() && (fatal || !stop.is_cancelled()) {
                self.recreate(&stop).await;
            }
            let work = tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.reconfigured.notified() => continue,
                work = self.buffer.next_work(prefer_backlog) => work,
            };
            prefer_backlog = !prefer_backlog;
            crate::lifecycle::fail_point("ship");
            match work {
                Work::Memory => {
                    self.buffer.pop_batch(SEND_BATCH, &mut batch);
                    if let Some(retries) = batch.iter().map(|record| record.retries).max().filter(|&r| r > 0) {
                        // A retried record failed at Kafka a moment ago: give the cluster a
                        // breath rather than spinning on an error that is returned at once.
                        tokio::time::sleep(Duration::from_millis(100 * u64::from(retries.min(10)))).await;
                    }
                    for record in batch.drain(..) {
                        self.send_or_leave(record, &stop).await;
                    }
                }
                Work::Backlog { from, upto } => {
                    if let Some(taken) = reader.take() {
                        reader = Some(self.ship_backlog(taken, from, upto, &stop).await);
                    }
                }
            }
        }
    }

    /// Reads one chunk of the backlog from the spool and sends it.
    async fn ship_backlog(
        &self,
        reader: SpoolReader,
        from: SpoolPos,
        upto: SpoolPos,
        stop: &CancellationToken,
    ) -> SpoolReader {
        let Some(lease) = self.buffer.try_backlog_lease() else {
            // No room now: what holds it is in flight (wait for its reports) or in memory (the
            // other lane sends it). Either way, come back shortly.
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
            return reader;
        };
        let (reader, records, _rest) = self.buffer.next_backlog(reader, lease, from, upto).await;
        for record in records {
            self.send_or_leave(record, stop).await;
        }
        reader
    }

    /// Sends `record`, unless sending has stopped (the drain): then it is left unsent (back to the
    /// spool, or counted) — nothing is handed to Kafka after that, whose answer would come after
    /// the final count.
    async fn send_or_leave(&self, record: Record, stop: &CancellationToken) {
        if stop.is_cancelled() {
            let (_, _, in_flight) = InFlight::new(record);
            self.buffer.unsent(*in_flight);
            return;
        }
        self.send(record, stop).await;
    }

    async fn send(&self, record: Record, stop: &CancellationToken) {
        let (payload, key, in_flight) = InFlight::new(record);
        let topic = in_flight.topic.clone().unwrap_or_else(|| self.topics.default_topic());
        let headers = self.headers.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let headers = headers.for_record(&payload);
        if self.sink == Sink::Stdout {
            return self.print(&topic, key.as_deref(), headers.as_ref(), &payload, in_flight, stop).await;
        }
        let mut producer = self.producer();
        let mut base = BaseRecord::with_opaque_to(&topic, in_flight).payload(&payload[..]);
        if let Some(key) = &key {
            base = base.key(&key[..]);
        }
        if let Some(headers) = headers {
            base = base.headers(headers);
        }
        loop {
            match producer.send(base) {
                Ok(()) => return,
                Err((error, returned)) => {
                    if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal))
                        || producer.context().fatal.load(Ordering::Relaxed)
                    {
                        // A fatal idempotent producer refuses every produce: replace it here,
                        // not between batches, and send this record with the new one.
                        producer.context().fatal.store(true, Ordering::Relaxed);
                        if stop.is_cancelled() {
                            self.buffer.unsent(*returned.delivery_opaque);
                            return;
                        }
                        self.recreate(stop).await;
                        if stop.is_cancelled() {
                            self.buffer.unsent(*returned.delivery_opaque);
                            return;
                        }
                        producer = self.producer();
                        base = returned;
                        continue;
                    }
                    let retryable = classify(&error) == Disposition::Retry;
                    if retryable && stop.is_cancelled() {
                        // Shutting down with librdkafka full: a spooled record stays owed on disk
                        // for the next start; a memory-only one is lost and counted.
                        self.buffer.unsent(*returned.delivery_opaque);
                        return;
                    }
                    if !retryable {
                        let failed = give_up_reason(&error);
                        error!(%error, kafka_error = reason(&error), reason = failed.as_str(), "kafka refused a record; it is dropped and counted");
                        self.buffer.give_up(*returned.delivery_opaque, failed);
                        return;
                    }
                    let mut in_flight = returned.delivery_opaque;
                    if reroute_unknown(&self.topics, &error, &mut in_flight) {
                        // librdkafka knows the topic does not exist: sent again, to the default
                        // topic, by the shipper's next turn.
                        self.buffer.retry(*in_flight, &payload, key.as_deref());
                        return;
                    }
                    let returned = BaseRecord { delivery_opaque: in_flight, ..returned };
                    // QueueFull: librdkafka holds its share of the budget; wait for reports.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    base = returned;
                }
            }
        }
    }

    /// The console sink ([`console`]): the record printed as one JSON line and settled as
    /// delivered (a memory buffer: settling touches no file). Stdout that cannot be written (a
    /// closed pipe: `sluice agent --dry-run | head`) has no reader left: the agent drains and
    /// exits non-zero, as `yes | head` ends, each record it can no longer print counted
    /// ([`Buffer::unsent`]). A write still blocked (a reader that stopped reading) when the
    /// drain stops the shipper is given up the same way; its bytes may still reach a reader that
    /// resumes before the exit (counted lost, printed).
    async fn print(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        headers: Option<&rdkafka::message::OwnedHeaders>,
        payload: &[u8],
        in_flight: Box<InFlight>,
        stop: &CancellationToken,
    ) {
        use tokio::io::AsyncWriteExt as _;
        let mut line = console::line(topic, key, headers, payload);
        line.push('\n');
        let mut stdout = tokio::io::stdout();
        let written = tokio::select! {
            written = async { stdout.write_all(line.as_bytes()).await?; stdout.flush().await } => Some(written),
            _ = stop.cancelled() => None,
        };
        match written {
            Some(Ok(())) => {
                metrics::counter!(telemetry::SHIP_DELIVERED).increment(1);
                metrics::counter!(telemetry::SHIP_DELIVERED_BYTES).increment(payload.len() as u64);
                self.buffer.settle_delivered(&mut vec![*in_flight]);
            }
            Some(Err(error)) => {
                // Never to be printed by this process: counted as the drain counts what it
                // could not send (`drain_timeout`; its writer hears so).
                self.buffer.unsent(*in_flight);
                if !self.stdout_failing.swap(true, Ordering::Relaxed) {
                    self.tasks.fail("stdout-sink", &format!("cannot print records to stdout: {error}"));
                }
            }
            None => self.buffer.unsent(*in_flight),
        }
    }

    /// Asks Kafka for the topic's metadata (on the blocking pool) and records the answer in the
    /// reachability flags and `sluice_kafka_reachable`; the caller says what changed.
    pub async fn probe(&self, timeout: Duration) -> Result<(), KafkaError> {
        if self.sink == Sink::Stdout {
            // Nothing is sent to Kafka: it is not asked either, and not what holds records up.
            self.reached_once.store(true, Ordering::Relaxed);
            self.reachable.store(true, Ordering::Relaxed);
            metrics::gauge!(telemetry::KAFKA_REACHABLE).set(1.0);
            return Ok(());
        }
        let producer = self.producer();
        let topic = self.topics.default_topic().to_string();
        let answer = tokio::task::spawn_blocking(move || {
            // The topic's own error (it does not exist, or the agent may not see it): Kafka
            // answered, but records for it can only wait.
            producer.client().fetch_metadata(Some(&topic), timeout).map(|metadata| {
                metadata.topics().iter().find(|found| found.name() == topic).and_then(|found| found.error())
            })
        })
        .await
        .unwrap_or_else(|_| Err(KafkaError::MetadataFetch(RDKafkaErrorCode::Fail)));
        let answer = answer.map(|topic_error| {
            // Only what lasts until an operator acts: a leader being elected passes by itself.
            let lasting = topic_error.map(RDKafkaErrorCode::from).filter(|code| {
                matches!(code, RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::TopicAuthorizationFailed)
            });
            *self.topic_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                lasting.map(|code| code.to_string());
        });
        let ok = answer.is_ok();
        self.reachable.store(ok, Ordering::Relaxed);
        if ok {
            self.reached_once.store(true, Ordering::Relaxed);
        }
        metrics::gauge!(telemetry::KAFKA_REACHABLE).set(if ok { 1.0 } else { 0.0 });
        answer
    }

    /// The end of the drain, once the shipper's task has stopped: what librdkafka has not sent
    /// yet is purged (never stored, it comes back to the buffer); the answers to what it has sent
    /// are awaited until `deadline`; then what is still unanswered is purged too and counted
    /// [`Failed::Unconfirmed`] (with a disk buffer it stays in the spool), and every delivery
    /// report is served (`retire`). After this no report can come, so the final count of what is
    /// undelivered stays true: a record is never both stored and counted lost, unless an earlier,
    /// replaced producer sent it too (see ARCHITECTURE.md).
    ///
    /// Bounded: a purge waits for every broker thread, and one stuck in DNS or a connect would
    /// hold the drain past the pod's grace period, so the kubelet's SIGKILL came before the final
    /// count. At `deadline` + [`CLOSE_GRACE`] the drain stops waiting: what librdkafka still
    /// holds (in this producer and in any being retired) is returned as `stuck` for the final
    /// count, and a report that comes later is let go uncounted.
    pub async fn close(&self, deadline: tokio::time::Instant) -> Closed {
        use rdkafka::producer::PurgeConfig;
        let producer = self.producer();
        let answers_until = deadline.into_std();
        let closing = producer.clone();
        let closed = tokio::task::spawn_blocking(move || {
            let producer = closing;
            crate::lifecycle::fail_point_stall("purge");
            producer.purge(PurgeConfig::default().queue());
            let in_flight = producer.in_flight_count();
            if in_flight > 0 {
                info!(in_flight, "waiting for kafka's answers to the records it was sent, until the drain deadline");
                let _ = producer.flush(answers_until.saturating_duration_since(std::time::Instant::now()));
            }
            producer.context().last_purge.store(true, Ordering::Relaxed);
            retire(producer.clone(), Duration::ZERO, &CancellationToken::new());
            producer.context().unconfirmed.load(Ordering::Relaxed)
        });
        let unconfirmed = match tokio::time::timeout_at(deadline + CLOSE_GRACE, closed).await {
            Ok(Ok(unconfirmed)) => unconfirmed,
            Ok(Err(_)) => {
                error!("closing the kafka producer did not run to its end");
                0
            }
            Err(_) => return self.stop_waiting(&producer).await,
        };
        // Producers still being retired (the shipper's task stopped waiting for one).
        let retiring = self.retiring.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        if retiring.iter().any(|old| old.in_flight_count() > 0) {
            let stuck = self.stop_waiting(&producer).await;
            return Closed { unconfirmed, stuck: stuck.stuck };
        }
        if unconfirmed > 0 {
            error!(
                unconfirmed,
                "records sent to kafka got no answer before the drain deadline: stored or not, nobody can tell; counted as unconfirmed"
            );
        }
        Closed { unconfirmed, stuck: 0 }
    }

    /// The drain stops waiting for librdkafka (`close`): later reports are let go uncounted
    /// (`given_up`, once any report being served has finished), what the reports already served
    /// brought is settled, and what the current producer and any being retired still hold is
    /// returned as stuck (librdkafka's count may include a report in flight at that instant or an
    /// event that is no record: over-counted as `unconfirmed`, never lost uncounted; the final
    /// count caps it by what is held).
    async fn stop_waiting(&self, current: &Arc<Producer_>) -> Closed {
        let retiring = self.retiring.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let producers: Vec<Arc<Producer_>> = std::iter::once(current.clone()).chain(retiring).collect();
        for producer in &producers {
            producer.context().given_up.store(true, Ordering::SeqCst);
        }
        let quiet = async {
            while producers.iter().any(|producer| producer.context().serving.load(Ordering::SeqCst) > 0) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(1), quiet).await.is_err() {
            warn!("a delivery report was still being served when the drain stopped waiting");
        }
        // Settled off the runtime's workers: settling may delete a spool file.
        let settlers: Vec<_> = producers.iter().map(|producer| producer.context().settler.clone()).collect();
        let settled = tokio::task::spawn_blocking(move || settlers.iter().for_each(|settler| settler.settle_now()));
        if tokio::time::timeout(Duration::from_secs(1), settled).await.is_err() {
            warn!("settling what kafka stored did not finish when the drain stopped waiting");
        }
        let stuck: u64 = producers.iter().map(|producer| producer.in_flight_count().max(0) as u64).sum();
        let unconfirmed = current.context().unconfirmed.load(Ordering::Relaxed);
        error!(
            stuck,
            grace_seconds = CLOSE_GRACE.as_secs(),
            "closing the kafka producer did not end by the drain deadline (a broker thread stuck in DNS or a connect?); what it still holds is counted now"
        );
        Closed { unconfirmed, stuck }
    }
}

/// The backlog lane's read, by the name the model-based test drives it
/// ([`Buffer::next_backlog`]).
#[cfg(test)]
async fn read_backlog(
    buffer: &Buffer,
    reader: crate::buffer::spool::SpoolReader,
    lease: crate::buffer::Lease,
    from: SpoolPos,
    upto: SpoolPos,
) -> (crate::buffer::spool::SpoolReader, Vec<Record>, crate::buffer::Lease) {
    buffer.next_backlog(reader, lease, from, upto).await
}
