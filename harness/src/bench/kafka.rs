//! The benchmark's Kafka side: the shipping ceiling (a raw librdkafka producer with the agent's
//! settings), the Kafka Connect peer's input (the same records in the form its JDBC sink reads),
//! making sure a topic exists before a timed run, creating one with a given partition count,
//! counting what a topic holds and deleting one.
//!
//! Owns: those seven calls, all but the creation and the deletion blocking (librdkafka's base
//! clients; callers run them off the async runtime). Must not: produce anything but the ceiling's envelopes and the peer's rows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use serde::Serialize;
use sluice::envelope::{EnvelopeWriter, Peer, PeerFragment, PodMetadata};

use super::{BenchError, Shape};

/// What the shipping ceiling did.
#[derive(Debug, Clone, Serialize)]
pub struct ProducerResult {
    /// Records acknowledged by Kafka.
    pub records: u64,
    /// Bytes of message values acknowledged.
    pub bytes: u64,
    /// Wall time from the first send to the last acknowledgement.
    pub seconds: f64,
    /// Acknowledged records per second.
    pub records_per_second: f64,
    /// MiB of values per second.
    pub mib_per_second: f64,
}

struct Acks {
    ok: AtomicU64,
    failed: AtomicU64,
}

struct AckContext(Arc<Acks>);

impl rdkafka::ClientContext for AckContext {}

impl ProducerContext for AckContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.0.ok.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.0.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// Hands `message` to `producer`, waiting while librdkafka's queue is full.
#[expect(clippy::disallowed_methods, reason = "a blocking call by design, run off the async runtime")]
fn send_waiting<P: rdkafka::message::ToBytes + ?Sized>(
    producer: &ThreadedProducer<AckContext>,
    mut message: BaseRecord<'_, (), P>,
) -> Result<(), BenchError> {
    loop {
        match producer.send(message) {
            Ok(()) => return Ok(()),
            Err((error, back)) if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                message = back;
                std::thread::sleep(Duration::from_micros(200));
            }
            Err((error, _)) => return Err(error.into()),
        }
    }
}

/// This process as a writer's peer, as the agent reads its writers' (`SO_PEERCRED`).
fn own_peer() -> Peer {
    use std::os::unix::fs::MetadataExt;
    let (uid, gid) = std::fs::metadata("/proc/self").map_or((0, 0), |own| (own.uid(), own.gid()));
    Peer { pid: i32::try_from(std::process::id()).ok(), uid, gid }
}

/// The shipping ceiling: a raw librdkafka producer with the agent's settings (acks=all,
/// idempotence, compression, linger, batch size: `sluice::ship::producer_config` for `config`)
/// sending `records` envelopes like the agent's (`ship.envelope`, a writer's peer) for records of `shape` to `topic`, as fast as
/// librdkafka takes them, until every one is acknowledged.
#[expect(clippy::disallowed_methods, reason = "a blocking call by design, run off the async runtime")]
pub fn producer_ceiling(
    config: &sluice::config::Config,
    topic: &str,
    records: u64,
    shape: &Shape,
) -> Result<ProducerResult, BenchError> {
    let buffer = sluice::buffer::Buffer::for_config(config);
    let client = sluice::ship::producer_config(config, &buffer);
    let acks = Arc::new(Acks { ok: AtomicU64::new(0), failed: AtomicU64::new(0) });
    let producer: ThreadedProducer<AckContext> = client.create_with_context(AckContext(Arc::clone(&acks)))?;
    // Connected, topic known (auto-created if need be) before the clock starts, as the agent
    // is when it reports ready.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metadata = producer.client().fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let ready = metadata.topics().iter().any(|t| {
            t.error().is_none() && !t.partitions().is_empty() && t.partitions().iter().all(|p| p.leader() >= 0)
        });
        if ready || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let envelopes = EnvelopeWriter::new(&PodMetadata::default(), config.ship.envelope);
    // The agent carries its writer's credentials: so do these messages.
    let peer = PeerFragment::new(Some(own_peer()));
    let mut envelope = bytes::BytesMut::new();
    let mut bytes = 0u64;
    let started = Instant::now();
    for index in 0..records {
        let line = shape.line(0, index);
        let text = std::str::from_utf8(&line[..line.len() - 1]).unwrap_or_default();
        envelope.clear();
        envelopes.write(text, &peer, chrono::Utc::now(), &mut envelope);
        bytes += envelope.len() as u64;
        send_waiting(&producer, BaseRecord::<(), [u8]>::to(topic).payload(&envelope[..]))?;
    }
    producer.flush(Duration::from_secs(120))?;
    let seconds = started.elapsed().as_secs_f64();
    let failed = acks.failed.load(Ordering::Relaxed);
    if failed > 0 || acks.ok.load(Ordering::Relaxed) != records {
        return Err(BenchError::Undelivered { records, failed: records - acks.ok.load(Ordering::Relaxed) });
    }
    Ok(ProducerResult {
        records,
        bytes,
        seconds,
        records_per_second: records as f64 / seconds,
        mib_per_second: bytes as f64 / seconds / (1024.0 * 1024.0),
    })
}

/// The Kafka Connect schema of [`kafka_connect_input`]'s rows: the key, time, level, format,
/// pod and record columns of the persister's rows (not its Kafka and peer columns;
/// JsonConverter with `schemas.enable`: a JDBC sink needs typed fields, and without a schema
/// registry every value carries its schema).
const KAFKA_CONNECT_SCHEMA: &str = r#"{"type":"struct","name":"sluice.bench.row","optional":false,"fields":[{"field":"agent","type":"string","optional":false},{"field":"seq","type":"int64","optional":false},{"field":"ingest_time","type":"int64","name":"org.apache.kafka.connect.data.Timestamp","version":1,"optional":false},{"field":"level","type":"string","optional":true},{"field":"format","type":"string","optional":false},{"field":"pod_namespace","type":"string","optional":true},{"field":"pod_name","type":"string","optional":true},{"field":"record","type":"string","optional":false}]}"#;

/// The Kafka Connect peer's input: `records` records of `shape` — the same lines the agent
/// is sent — into `topic`, each as one row (agent, seq, ingest time, level, pod, the record)
/// in JsonConverter's JSON with its schema, written before the peer starts (untimed). Returns
/// the values' mean size in bytes.
pub fn kafka_connect_input(brokers: &str, topic: &str, records: u64, shape: &Shape) -> Result<f64, BenchError> {
    let acks = Arc::new(Acks { ok: AtomicU64::new(0), failed: AtomicU64::new(0) });
    let producer: ThreadedProducer<AckContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("compression.type", "zstd")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("enable.idempotence", "true")
        // A broker gone: fail within 30 s rather than wait out the default 5 minutes.
        .set("message.timeout.ms", "30000")
        .create_with_context(AckContext(Arc::clone(&acks)))?;
    let agent = uuid::Uuid::now_v7();
    let started_ms = chrono::Utc::now().timestamp_millis();
    let mut bytes = 0u64;
    for index in 0..records {
        let line = shape.line(0, index);
        let text = std::str::from_utf8(&line[..line.len() - 1]).unwrap_or_default();
        let level = serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|record| record.get("level")?.as_str().map(str::to_owned));
        let payload = serde_json::json!({
            "agent": agent.to_string(),
            "seq": index,
            "ingest_time": started_ms + i64::try_from(index / 1000).unwrap_or(0),
            "level": level,
            "format": "json",
            "pod_namespace": "bench",
            "pod_name": "bench-pod",
            "record": text,
        });
        let value = format!(r#"{{"schema":{KAFKA_CONNECT_SCHEMA},"payload":{payload}}}"#);
        bytes += value.len() as u64;
        send_waiting(&producer, BaseRecord::<(), str>::to(topic).payload(value.as_str()))?;
    }
    producer.flush(Duration::from_secs(120))?;
    let delivered = acks.ok.load(Ordering::Relaxed);
    if delivered != records {
        return Err(BenchError::Undelivered { records, failed: records - delivered });
    }
    Ok(bytes as f64 / records.max(1) as f64)
}

/// Makes sure `topic` exists (auto-created by a metadata request, as a producer's first send
/// would) and every partition has a leader, so a timed run does not include topic creation.
#[expect(clippy::disallowed_methods, reason = "a blocking call by design, run off the async runtime")]
pub fn ensure_topic(brokers: &str, topic: &str) -> Result<(), BenchError> {
    let consumer: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", brokers).set("allow.auto.create.topics", "true").create()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let ready = metadata.topics().iter().any(|t| {
            t.error().is_none() && !t.partitions().is_empty() && t.partitions().iter().all(|p| p.leader() >= 0)
        });
        if ready || Instant::now() > deadline {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Creates `topic` with `partitions` partitions (one replica: the stack has one broker), for a
/// run that needs a partition count other than the broker's default. Async, like the deletion.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) -> Result<(), BenchError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for result in admin.create_topics(&[new], &options).await? {
        result.map_err(|(_, code)| rdkafka::error::KafkaError::AdminOp(code))?;
    }
    Ok(())
}

/// Deletes `topic` (the Kafka Connect peer's input, ~1 KB a record; the capacity run's topics).
pub async fn delete_topic(brokers: &str, topic: &str) -> Result<(), BenchError> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.delete_topics(&[topic], &options).await? {
        result.map_err(|(_, code)| rdkafka::error::KafkaError::AdminOp(code))?;
    }
    Ok(())
}

/// What a topic holds, read to its end.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct TopicRecords {
    /// Messages.
    pub messages: u64,
    /// Distinct record ids among the envelopes (rsyslog's raw lines count by content).
    pub distinct: u64,
}

/// Reads `topic` from its beginning to its current end and counts messages and distinct record
/// ids: after an outage the agent may have sent a record twice (at least once into Kafka; the
/// persister stores one row per id).
pub fn topic_records(brokers: &str, topic: &str) -> Result<TopicRecords, BenchError> {
    use rdkafka::Message as _;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "sluice-bench")
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut assignment = rdkafka::TopicPartitionList::new();
    let mut remaining = 0u64;
    for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
        let (low, high) = consumer.fetch_watermarks(topic, partition.id(), Duration::from_secs(10))?;
        if high > low {
            assignment.add_partition_offset(topic, partition.id(), rdkafka::Offset::Offset(low))?;
            remaining += u64::try_from(high - low).unwrap_or(0);
        }
    }
    let mut ids = std::collections::HashSet::new();
    let mut messages = 0u64;
    if remaining > 0 {
        consumer.assign(&assignment)?;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while messages < remaining && Instant::now() < deadline {
        let Some(message) = consumer.poll(Duration::from_secs(1)) else { continue };
        let message = message?;
        messages += 1;
        let payload = message.payload().unwrap_or_default();
        match sluice::envelope::Envelope::parse(payload) {
            Ok(envelope) => ids.insert(envelope.id.text().into_owned().into_bytes()),
            Err(_) => ids.insert(payload.to_vec()),
        };
    }
    Ok(TopicRecords { messages, distinct: ids.len() as u64 })
}

/// Messages in `topic` (the sum over partitions of high minus low watermark).
pub fn topic_count(brokers: &str, topic: &str) -> Result<u64, BenchError> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut total = 0;
    for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
        let (low, high) = consumer.fetch_watermarks(topic, partition.id(), Duration::from_secs(10))?;
        total += u64::try_from(high - low).unwrap_or(0);
    }
    Ok(total)
}
