//! The persister's Kafka side: the consumer's librdkafka settings, its context (rebalances and
//! commits as librdkafka reports them), storing offsets, and the lag it measures.
//!
//! Owns: what the consumer is told and what it reports. Must not: store an offset the lanes did
//! not hand it (they hand only offsets below what PostgreSQL committed), or write to PostgreSQL.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::BorrowedMessage;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::lanes::Source;
use super::row::Row;
use crate::config::Config;
use crate::telemetry;

/// librdkafka's prefetch queue per persister (the high-level consumer has one queue for all
/// partitions), in KiB of message values (`queued.max.messages.kbytes`).
pub(super) const PREFETCH_KIB: u32 = 8 * 1024;
/// Compressed bytes one fetch may return per partition (`max.partition.fetch.bytes`). A fetch
/// lands in the prefetch queue whole, decompressed, even past `PREFETCH_KIB`: with librdkafka's
/// 1 MiB default, 4 partitions and the benchmark's very compressible records (~30×), the queue
/// overshot to 127 MiB and the persister peaked at ~300 MiB RSS draining 500k records; with
/// 256 KiB (and `fetch.max.bytes` at its 1 MiB floor) it peaked at ~145 MiB, no slower. A
/// partition's records also arrive in runs of one fetch each: 256 KiB is ~25k records here, five
/// batches for one lane while the other lane's writer waited. 64 KiB (issue 34, by hand on one
/// 1M-record topic, three runs each alternating): 160–164k → 180–185k rows/s, peak RSS
/// 142–147 → 93–96 MiB (docs/PERFORMANCE.md).
pub(super) const FETCH_PARTITION_BYTES: u32 = 64 * 1024;
/// Compressed bytes one fetch may return in all (`fetch.max.bytes`); librdkafka wants at least
/// `message.max.bytes` (1 MB by default).
pub(super) const FETCH_BYTES: u32 = 1024 * 1024;
/// How long librdkafka postpones a partition's next fetch once the prefetch queue is past
/// `PREFETCH_KIB` or `queued.min.messages` (`fetch.queue.backoff.ms`; its default is 1000).
/// With the small queue above, the default left the queue empty and PostgreSQL idle between
/// fetches: `sluice-bench persist` (500k 256 B records, the same topic) 63.0–63.7k rows/s with
/// the default, 97.4–116.1k with 10 ms (peak RSS 114–121 → 139–141 MiB); by hand, 0 ms polls
/// for nothing (74k), 1 ms 82k. It applies only while the queue is full: an idle persister
/// fetches as before.
pub(super) const FETCH_QUEUE_BACKOFF_MS: u32 = 10;

/// Consumer callbacks: rebalances, commit results and statistics.
pub(super) struct PersistContext {
    /// Readiness: the rebalance callback keeps `assigned` current.
    pub(super) health: Arc<super::Health>,
    pub(super) errors: telemetry::librdkafka::ErrorTotals,
    /// Forgets a revoked partition's offsets: taken back later, its lag is not the old one's.
    pub(super) lag: Arc<LagClock>,
}

/// A partition of a topic: the persister may read several topics (`persist.topics`), each with
/// its own partition 0.
pub(super) type TopicPartition = (String, i32);

/// What this persister has stored per topic partition: the next offset, and the ingest time of
/// the last record. With the partitions' high watermarks that makes the lag in records and
/// seconds.
#[derive(Default)]
pub(super) struct LagClock {
    pub(super) next_offset: std::sync::Mutex<BTreeMap<TopicPartition, i64>>,
    pub(super) last_ingest_ms: std::sync::Mutex<BTreeMap<TopicPartition, i64>>,
    /// Partitions whose lag was reported, so a revoked one is reset to 0.
    pub(super) reported: std::sync::Mutex<std::collections::BTreeSet<TopicPartition>>,
}

impl LagClock {
    /// A partition was revoked: what this persister stored for it no longer measures its lag
    /// (another replica may persist it meanwhile; given back, it starts from the group's commit).
    pub(super) fn forget(&self, partitions: impl Iterator<Item = TopicPartition> + Clone) {
        let mut stored = self.next_offset.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut last = self.last_ingest_ms.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for partition in partitions {
            stored.remove(&partition);
            last.remove(&partition);
        }
    }

    pub(super) fn stored(&self, next_offsets: &BTreeMap<(String, i32), i64>) {
        let mut stored = self.next_offset.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (partition, next) in next_offsets {
            stored.insert(partition.clone(), *next);
        }
    }

    /// The next offsets stored, as `partition=offset` pairs, for a log line.
    pub(super) fn describe_stored(&self) -> String {
        let stored = self.next_offset.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        stored
            .iter()
            .map(|((topic, partition), next)| format!("{topic}/{partition}={next}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(super) fn next_offset(&self, partition: &TopicPartition) -> Option<i64> {
        self.next_offset.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(partition).copied()
    }

    pub(super) fn persisted(&self, rows: &[Row]) {
        let mut last = self.last_ingest_ms.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for row in rows {
            let ms = row.ingest_time.timestamp_millis();
            let entry = last.entry((row.origin.topic.clone(), row.origin.partition)).or_insert(ms);
            *entry = (*entry).max(ms);
        }
    }

    /// Publishes the lag `measure_lag` found for `assigned` partitions. A partition it could
    /// not measure this time (its watermarks did not come within the timeout) keeps its last
    /// figure — reporting 0 would say "caught up" exactly when the brokers are slow; one no
    /// longer assigned goes to 0.
    pub(super) fn report(
        &self,
        lag: &std::collections::HashMap<TopicPartition, i64>,
        assigned: &std::collections::BTreeSet<TopicPartition>,
    ) {
        let now = chrono::Utc::now().timestamp_millis();
        let last = self.last_ingest_ms.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut reported = self.reported.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let labels =
            |(topic, partition): &TopicPartition| [("topic", topic.clone()), ("partition", partition.to_string())];
        for (partition, records) in lag {
            metrics::gauge!(telemetry::PERSIST_LAG_RECORDS, &labels(partition)).set(*records as f64);
            let seconds = match (records, last.get(partition)) {
                (0, _) | (_, None) => 0.0,
                (_, Some(ms)) => (now - ms).max(0) as f64 / 1000.0,
            };
            metrics::gauge!(telemetry::PERSIST_LAG_SECONDS, &labels(partition)).set(seconds);
            reported.insert(partition.clone());
        }
        for partition in reported.iter().filter(|partition| !assigned.contains(*partition)) {
            metrics::gauge!(telemetry::PERSIST_LAG_RECORDS, &labels(partition)).set(0.0);
            metrics::gauge!(telemetry::PERSIST_LAG_SECONDS, &labels(partition)).set(0.0);
        }
        reported.retain(|partition| assigned.contains(partition));
    }
}

impl ClientContext for PersistContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        // These arrive only while the consumer is polled; the lag has a task of its own.
        telemetry::librdkafka::record(&statistics, &self.errors);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        telemetry::librdkafka::client_error(&error, reason);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        telemetry::librdkafka::log(level, facility, message);
    }
}

impl ConsumerContext for PersistContext {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        metrics::counter!(telemetry::PERSIST_REBALANCES).increment(1);
        let count = consumer.assignment().map(|tpl| tpl.count()).unwrap_or(0);
        match rebalance {
            Rebalance::Assign(tpl) => info!(partitions = tpl.count(), "partitions assigned"),
            Rebalance::Revoke(tpl) => {
                info!(partitions = tpl.count(), "partitions revoked");
                self.lag
                    .forget(tpl.elements().iter().map(|element| (element.topic().to_string(), element.partition())));
            }
            Rebalance::Error(error) => warn!(%error, "rebalance error"),
        }
        self.health.assigned.store(count, Ordering::Relaxed);
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

pub(super) type PersistConsumer = StreamConsumer<PersistContext>;

pub(super) fn consumer_config(config: &Config) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (key, value) in config.kafka.client_properties().iter().chain(config.persist.properties.iter()) {
        client.set(key, value);
    }
    // A client id set in the properties is kept (Kafka's quotas are per client id).
    if client.get("client.id").is_none() {
        client.set("client.id", "sluice-persist");
    }
    client
        .set("bootstrap.servers", &config.kafka.brokers)
        .set("statistics.interval.ms", telemetry::librdkafka::STATISTICS_INTERVAL_MS)
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
        ("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS),
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

impl Source for PersistConsumer {
    type Message<'a> = BorrowedMessage<'a>;

    async fn recv(&self) -> KafkaResult<BorrowedMessage<'_>> {
        StreamConsumer::recv(self).await
    }

    fn store(&self, next_offsets: &BTreeMap<(String, i32), i64>) {
        store_offsets(self, next_offsets);
    }
}

pub(super) fn store_offsets(consumer: &PersistConsumer, next_offsets: &BTreeMap<(String, i32), i64>) {
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

/// How often the consumer lag is measured.
pub(super) const LAG_INTERVAL: Duration = Duration::from_secs(5);

/// Measures the lag of the assigned partitions every few seconds: high watermark minus what this
/// persister stored (or, before it stored anything, the group's committed offset). It asks the
/// brokers itself, because librdkafka's statistics stop while the consume loop waits for
/// PostgreSQL — exactly when the lag matters.
pub(super) async fn report_lag(consumer: Arc<PersistConsumer>, lag: Arc<LagClock>, stop: CancellationToken) {
    loop {
        let (client, clock) = (consumer.clone(), lag.clone());
        // A measurement waits up to 2 s per request on a broker that does not answer: the drain
        // does not wait for it (the blocking thread finishes it and lets its consumer go).
        let measured = tokio::select! {
            measured = tokio::task::spawn_blocking(move || measure_lag(&client, &clock)) => measured,
            _ = stop.cancelled() => break,
        };
        // A measurement that could not even read the assignment changes nothing.
        match measured {
            Ok(Some((lag_by_partition, assigned))) => lag.report(&lag_by_partition, &assigned),
            Ok(None) => {}
            Err(error) => warn!(%error, "the consumer lag measurement failed; the gauges keep their figures"),
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(LAG_INTERVAL) => {}
        }
    }
}

/// The lag of each assigned partition whose watermarks came in time, and the assigned
/// partitions; `None` if the assignment could not be read.
pub(super) fn measure_lag(
    consumer: &PersistConsumer,
    clock: &LagClock,
) -> Option<(std::collections::HashMap<TopicPartition, i64>, std::collections::BTreeSet<TopicPartition>)> {
    let timeout = Duration::from_secs(2);
    let mut lag = std::collections::HashMap::new();
    let assignment = consumer.assignment().ok()?;
    let key = |element: &rdkafka::topic_partition_list::TopicPartitionListElem<'_>| {
        (element.topic().to_string(), element.partition())
    };
    let assigned = assignment.elements().iter().map(key).collect();
    let mut unknown = TopicPartitionList::new();
    for element in assignment.elements() {
        if clock.next_offset(&key(&element)).is_none() {
            unknown.add_partition(element.topic(), element.partition());
        }
    }
    let committed = if unknown.count() > 0 { consumer.committed_offsets(unknown, timeout).ok() } else { None };
    for element in assignment.elements() {
        let Ok((low, high)) = consumer.fetch_watermarks(element.topic(), element.partition(), timeout) else {
            continue;
        };
        let position = clock.next_offset(&key(&element)).or_else(|| {
            committed
                .as_ref()
                .and_then(|tpl| tpl.find_partition(element.topic(), element.partition()))
                .and_then(|found| found.offset().to_raw())
                .filter(|offset| *offset >= 0)
        });
        lag.insert(key(&element), (high - position.unwrap_or(low)).max(0));
    }
    Some((lag, assigned))
}
