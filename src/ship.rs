//! Ship: the Kafka producer that moves records from the buffer to the topic.
//!
//! Owns: the producer's settings (acks=all, idempotence, compression, batching, queue limits
//! derived from the buffer budget), handing records to librdkafka, and the delivery report that
//! decides each record's fate: acknowledged (its lease is released), retryable (back into the
//! buffer, lease kept), or given up (counted with a reason). [`classify`] is the one place that
//! decides retryable versus not.
//!
//! Must not: treat "handed to librdkafka" as delivered, drop a record because of time alone
//! (a `message.timeout.ms` expiry is retried), or call a librdkafka function that can block from
//! a reader task (`send` never blocks: librdkafka's queue cannot fill before the buffer does;
//! `flush` and metadata requests run on the blocking pool).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use metrics::Counter;
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::buffer::{Buffer, Lease, Record};
use crate::config::Config;
use crate::telemetry;

#[cfg(test)]
mod tests;

/// Most records moved from the buffer to librdkafka per wake-up.
const SEND_BATCH: usize = 512;

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

/// The metric label for an error: librdkafka's error name in snake case (a fixed set).
pub fn reason(error: &KafkaError) -> String {
    match error.rdkafka_error_code() {
        Some(code) => snake_case(&format!("{code:?}")),
        None => "other".into(),
    }
}

fn snake_case(name: &str) -> String {
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

/// The librdkafka settings for the agent's producer.
pub fn producer_config(config: &Config, buffer: &Buffer) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (key, value) in config.kafka.properties.iter().chain(config.ship.properties.iter()) {
        client.set(key, value);
    }
    // librdkafka's queue holds a subset of the buffer's records (each keeps its lease while
    // there), so sizing it from the same budget means it can never be the one that is full.
    let kbytes = buffer.max_bytes().div_ceil(1024) + 1;
    client
        .set("bootstrap.servers", &config.kafka.brokers)
        .set("client.id", "sluice-agent")
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("compression.type", &config.ship.compression)
        .set("linger.ms", config.ship.linger.as_millis().to_string())
        .set("batch.size", config.ship.batch_size.as_u64().to_string())
        .set("message.timeout.ms", config.ship.delivery_timeout.as_millis().to_string())
        .set("queue.buffering.max.kbytes", kbytes.to_string())
        .set("queue.buffering.max.messages", (buffer.max_records() + 1).to_string());
    client
}

/// librdkafka callbacks: delivery reports and client errors.
pub struct ShipContext {
    buffer: Buffer,
    delivered: Counter,
    delivered_bytes: Counter,
    retried: Counter,
}

impl ClientContext for ShipContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal)) {
            error!(%error, reason, "kafka producer reported a fatal error");
        } else {
            warn!(%error, reason, "kafka client error");
        }
    }
}

/// What travels with a record through librdkafka and comes back in its delivery report.
pub struct InFlight {
    lease: Lease,
    retries: u32,
}

impl ProducerContext for ShipContext {
    type DeliveryOpaque = Box<InFlight>;

    /// Runs on the producer's polling thread, never on a reader task.
    fn delivery(&self, result: &DeliveryResult<'_>, in_flight: Box<InFlight>) {
        match result {
            Ok(message) => {
                self.delivered.increment(1);
                self.delivered_bytes.increment(message.payload_len() as u64);
                drop(in_flight);
            }
            Err((error, message)) => {
                let reason = reason(error);
                metrics::counter!(telemetry::SHIP_DELIVERY_ERRORS, telemetry::REASON => reason.clone()).increment(1);
                match classify(error) {
                    Disposition::Retry => {
                        // librdkafka hands back the payload, so the buffer need not keep a copy
                        // of records in flight.
                        self.retried.increment(1);
                        self.buffer.requeue(Record {
                            payload: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
                            key: message.key().map(Bytes::copy_from_slice),
                            lease: in_flight.lease,
                            retries: in_flight.retries.saturating_add(1),
                        });
                    }
                    Disposition::GiveUp => {
                        error!(%error, reason, "kafka refused a record; it is dropped and counted");
                        metrics::counter!(telemetry::SHIP_FAILED, telemetry::REASON => reason).increment(1);
                        drop(in_flight);
                    }
                }
            }
        }
    }
}

/// The agent's producer and the task that feeds it.
pub struct Shipper {
    producer: ThreadedProducer<ShipContext>,
    topic: String,
    buffer: Buffer,
    reachable: Arc<AtomicBool>,
}

impl Shipper {
    /// Creates the producer. It connects lazily; [`Shipper::probe`] tells when Kafka answers.
    pub fn new(config: &Config, buffer: Buffer) -> Result<Self, ShipError> {
        let context = ShipContext {
            buffer: buffer.clone(),
            delivered: metrics::counter!(telemetry::SHIP_DELIVERED),
            delivered_bytes: metrics::counter!(telemetry::SHIP_DELIVERED_BYTES),
            retried: metrics::counter!(telemetry::SHIP_RETRIED),
        };
        let producer = producer_config(config, &buffer).create_with_context(context)?;
        Ok(Self { producer, topic: config.kafka.topic.clone(), buffer, reachable: Arc::new(AtomicBool::new(false)) })
    }

    /// True while the last metadata request succeeded.
    pub fn reachable(&self) -> Arc<AtomicBool> {
        self.reachable.clone()
    }

    /// Moves records from the buffer into librdkafka until `stop` is cancelled. The caller
    /// cancels `stop` only once the buffer holds nothing (or the drain deadline passed).
    pub async fn run(&self, stop: CancellationToken) {
        let mut batch = Vec::with_capacity(SEND_BATCH);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.buffer.pop_batch(SEND_BATCH, &mut batch) => {}
            }
            if let Some(retries) = batch.iter().map(|record| record.retries).max().filter(|&r| r > 0) {
                // A retried record failed at Kafka a moment ago: give the cluster a breath
                // rather than spinning on an error that is returned at once.
                tokio::time::sleep(Duration::from_millis(100 * u64::from(retries.min(10)))).await;
            }
            for record in batch.drain(..) {
                self.send(record, &stop).await;
            }
        }
        // Records popped but not sent never leave the buffer: there are none here, since the
        // loop only breaks between batches.
    }

    async fn send(&self, record: Record, stop: &CancellationToken) {
        let Record { payload, key, lease, retries } = record;
        let mut base =
            BaseRecord::with_opaque_to(&self.topic, Box::new(InFlight { lease, retries })).payload(&payload[..]);
        if let Some(key) = &key {
            base = base.key(&key[..]);
        }
        loop {
            match self.producer.send(base) {
                Ok(()) => return,
                Err((error, returned)) => {
                    let retryable = classify(&error) == Disposition::Retry;
                    if !retryable || stop.is_cancelled() {
                        let reason = if retryable { "drain_timeout".to_string() } else { reason(&error) };
                        error!(%error, reason, "record not handed to kafka; dropped and counted");
                        metrics::counter!(telemetry::SHIP_FAILED, telemetry::REASON => reason).increment(1);
                        return;
                    }
                    // QueueFull can only happen in the moment a retried record re-enters while
                    // its earlier attempt is still accounted in librdkafka: wait for a report.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    base = returned;
                }
            }
        }
    }

    /// Asks Kafka for the topic's metadata (on the blocking pool) and records the answer.
    pub async fn probe(&self, timeout: Duration) -> bool {
        let producer = self.producer.clone();
        let topic = self.topic.clone();
        let ok = tokio::task::spawn_blocking(move || producer.client().fetch_metadata(Some(&topic), timeout).is_ok())
            .await
            .unwrap_or(false);
        let was = self.reachable.swap(ok, Ordering::Relaxed);
        if ok != was {
            if ok {
                info!(topic = %self.topic, "kafka reachable");
            } else {
                warn!(topic = %self.topic, "kafka unreachable");
            }
        }
        metrics::gauge!(telemetry::KAFKA_REACHABLE).set(if ok { 1.0 } else { 0.0 });
        ok
    }

    /// Waits (on the blocking pool) until librdkafka has no record left or `timeout` passes.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let producer = self.producer.clone();
        tokio::task::spawn_blocking(move || producer.flush(timeout).is_ok()).await.unwrap_or(false)
    }
}
