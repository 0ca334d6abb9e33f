//! The Rust half of the benchmark harness (`sluice bench …`, driven by `scripts/bench`): the
//! load generator that times every write call, the two ceilings Sluice is compared with, and
//! counting what reached Kafka.
//!
//! Owns: writing records the way an app does (one blocking `write` per record, from one thread
//! per connection) while recording each call's latency; the ingest ceiling (the same writer
//! into a reader that discards); the shipping ceiling (a raw librdkafka producer with the
//! agent's settings sending the same envelopes); the count of messages in a topic. Must not:
//! start or stop services, or judge results (the script verifies counts and writes reports).
//!
//! Latencies are kept as one `u32` of nanoseconds per record and sorted at the end (exact
//! percentiles; 4 bytes a record is nothing next to the records themselves).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use serde::Serialize;

use crate::envelope::{EnvelopeWriter, PodMetadata};

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A socket could not be opened, written or read.
    #[error("socket {path}: {source}")]
    Socket {
        /// The socket's path.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Kafka refused or failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The record sample could not be read, or has no lines.
    #[error("sample {path}: {source}")]
    Sample {
        /// The sample's path.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// Not every record was acknowledged.
    #[error("{failed} of {records} records were not acknowledged by Kafka")]
    Undelivered {
        /// Records sent.
        records: u64,
        /// Records whose delivery failed.
        failed: u64,
    },
}

/// What to write.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Records in total.
    pub records: u64,
    /// Concurrent connections (one thread each).
    pub connections: u32,
    /// Records per second over all connections; 0: as fast as possible.
    pub rate: u64,
    /// What the records look like.
    pub shape: Shape,
}

/// What the benchmark's records look like.
#[derive(Debug, Clone)]
pub enum Shape {
    /// A numbered JSON log line padded to this many bytes, newline included (`record`).
    Padded(usize),
    /// Lines of a JSON log sample (`bench/sample.jsonl`), taken in turn; each connection starts
    /// at a different line.
    Sample(Arc<Vec<Vec<u8>>>),
}

impl Shape {
    /// Reads a sample: one record per non-empty line.
    pub fn sample(path: &Path) -> Result<Self, BenchError> {
        let text = std::fs::read(path).map_err(|source| BenchError::Sample { path: path.to_path_buf(), source })?;
        let lines: Vec<Vec<u8>> =
            text.split(|byte| *byte == b'\n').filter(|line| !line.is_empty()).map(|line| line.to_vec()).collect();
        if lines.is_empty() {
            return Err(BenchError::Sample {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, "the sample has no lines"),
            });
        }
        Ok(Shape::Sample(Arc::new(lines)))
    }

    /// Record `index` of `connection`, newline included.
    pub fn line(&self, connection: u32, index: u64) -> Vec<u8> {
        match self {
            Shape::Padded(size) => record(connection, index, *size),
            Shape::Sample(lines) => {
                let at = (index as usize).wrapping_add(connection as usize * 7919) % lines.len();
                let mut line = Vec::with_capacity(lines[at].len() + 1);
                line.extend_from_slice(&lines[at]);
                line.push(b'\n');
                line
            }
        }
    }
}

/// Write-call latency percentiles, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest call.
    pub max_us: f64,
}

/// One bucket of the write-latency distribution: calls that took at most `le_us` (and more than
/// the previous bucket's bound).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Bucket {
    /// Upper bound in microseconds.
    pub le_us: f64,
    /// Calls in this bucket.
    pub count: u64,
}

/// The distribution of `sorted` nanoseconds in buckets doubling from 0.25 µs (empty buckets
/// left out).
pub fn histogram(sorted: &[u32]) -> Vec<Bucket> {
    let mut buckets = Vec::new();
    let mut bound = 250u64;
    let mut from = 0;
    while from < sorted.len() {
        let upto = sorted.partition_point(|&n| u64::from(n) <= bound);
        if upto > from {
            buckets.push(Bucket { le_us: bound as f64 / 1000.0, count: (upto - from) as u64 });
        }
        from = upto;
        bound *= 2;
    }
    buckets
}

impl Latency {
    /// Percentiles of `nanos` (sorted in place).
    pub fn of(nanos: &mut [u32]) -> Self {
        if nanos.is_empty() {
            return Self::default();
        }
        nanos.sort_unstable();
        let at = |q: f64| {
            let index = ((nanos.len() as f64 * q).ceil() as usize).clamp(1, nanos.len()) - 1;
            f64::from(nanos[index]) / 1000.0
        };
        Self {
            p50_us: at(0.5),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: f64::from(nanos[nanos.len() - 1]) / 1000.0,
        }
    }
}

/// What a load run did.
#[derive(Debug, Clone, Serialize)]
pub struct LoadResult {
    /// Records written.
    pub records: u64,
    /// Bytes written (newlines included).
    pub bytes: u64,
    /// Wall time from the first write to the last connection's close.
    pub seconds: f64,
    /// Records per second.
    pub records_per_second: f64,
    /// MiB per second.
    pub mib_per_second: f64,
    /// How long each `write` call took: what the app feels.
    pub write_latency: Latency,
    /// The whole distribution of write-call latency.
    pub write_latency_histogram: Vec<Bucket>,
}

/// The record a benchmark writes: a JSON log line of exactly `size` bytes with its newline
/// (at least the bare record, ~60 bytes), numbered by connection and index.
pub fn record(connection: u32, index: u64, size: usize) -> Vec<u8> {
    let mut line = format!(r#"{{"level":"info","conn":{connection},"n":{index},"msg":""#).into_bytes();
    let fill = size.saturating_sub(line.len() + 3);
    line.resize(line.len() + fill, b'x');
    line.extend_from_slice(b"\"}\n");
    line
}

/// Writes the load to `socket`, one blocking `write` per record, timing each.
pub fn load(socket: &Path, options: &LoadOptions) -> Result<LoadResult, BenchError> {
    let error = |source| BenchError::Socket { path: socket.to_path_buf(), source };
    let connections = options.connections.max(1);
    let mut streams = Vec::new();
    for _ in 0..connections {
        streams.push(UnixStream::connect(socket).map_err(error)?);
    }
    let started = Instant::now();
    let threads: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(connection, stream)| {
            let connection = connection as u32;
            let share = options.records / u64::from(connections)
                + u64::from(u64::from(connection) < options.records % u64::from(connections));
            let rate = options.rate as f64 / f64::from(connections);
            let shape = options.shape.clone();
            std::thread::spawn(move || write_connection(stream, connection, share, rate, &shape))
        })
        .collect();
    let mut bytes = 0;
    let mut nanos = Vec::with_capacity(options.records as usize);
    for thread in threads {
        let (written, mut latencies) =
            thread.join().map_err(|_| error(std::io::Error::other("writer panicked")))?.map_err(error)?;
        bytes += written;
        nanos.append(&mut latencies);
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(LoadResult {
        records: options.records,
        bytes,
        seconds,
        records_per_second: options.records as f64 / seconds,
        mib_per_second: bytes as f64 / seconds / (1024.0 * 1024.0),
        write_latency: Latency::of(&mut nanos),
        write_latency_histogram: histogram(&nanos),
    })
}

#[expect(clippy::disallowed_methods, reason = "a plain thread per connection, no async runtime: blocking is the point")]
fn write_connection(
    mut stream: UnixStream,
    connection: u32,
    records: u64,
    rate: f64,
    shape: &Shape,
) -> std::io::Result<(u64, Vec<u32>)> {
    // Records are made before the clock starts for each call: the app's own formatting is not
    // what is measured.
    let mut latencies = Vec::with_capacity(records as usize);
    let mut bytes = 0;
    let started = Instant::now();
    for index in 0..records {
        if rate > 0.0 {
            let due = started + Duration::from_secs_f64(index as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let line = shape.line(connection, index);
        let call = Instant::now();
        stream.write_all(&line)?;
        latencies.push(u32::try_from(call.elapsed().as_nanos()).unwrap_or(u32::MAX));
        bytes += line.len() as u64;
    }
    stream.shutdown(std::net::Shutdown::Write)?;
    Ok((bytes, latencies))
}

/// The ingest ceiling: the same writers into a Unix socket whose reader threads only count
/// newlines and discard. Returns the writers' view (throughput and write latency).
pub fn socket_ceiling(dir: &Path, options: &LoadOptions) -> Result<LoadResult, BenchError> {
    let path = dir.join("ceiling.sock");
    let error = |source| BenchError::Socket { path: path.clone(), source };
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(error)?;
    let lines = Arc::new(AtomicU64::new(0));
    let connections = options.connections.max(1);
    let reader = {
        let lines = Arc::clone(&lines);
        std::thread::spawn(move || -> std::io::Result<()> {
            let mut readers = Vec::new();
            for _ in 0..connections {
                let (mut stream, _) = listener.accept()?;
                let lines = Arc::clone(&lines);
                readers.push(std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(read) = stream.read(&mut buf) {
                        if read == 0 {
                            break;
                        }
                        lines.fetch_add(memchr::memchr_iter(b'\n', &buf[..read]).count() as u64, Ordering::Relaxed);
                    }
                }));
            }
            for reader in readers {
                let _ = reader.join();
            }
            Ok(())
        })
    };
    let result = load(&path, options);
    let _ = reader.join();
    let _ = std::fs::remove_file(&path);
    let result = result?;
    let read = lines.load(Ordering::Relaxed);
    if read != result.records {
        return Err(error(std::io::Error::other(format!("the reader saw {read} of {} records", result.records))));
    }
    Ok(result)
}

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

/// The shipping ceiling: a raw librdkafka producer with the agent's settings (acks=all,
/// idempotence, compression, linger, batch size: `producer_config` for `config`) sending
/// `records` envelopes like the agent's for records of `shape` to `topic`, as fast as
/// librdkafka takes them, until every one is acknowledged.
#[expect(clippy::disallowed_methods, reason = "runs on the main thread of `sluice bench`, no async runtime")]
pub fn producer_ceiling(
    config: &crate::config::Config,
    topic: &str,
    records: u64,
    shape: &Shape,
) -> Result<ProducerResult, BenchError> {
    let buffer = crate::buffer::Buffer::for_config(config);
    let client = crate::ship::producer_config(config, &buffer);
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
    let envelopes = EnvelopeWriter::new(&PodMetadata::default());
    let mut envelope = Vec::new();
    let mut bytes = 0u64;
    let started = Instant::now();
    for index in 0..records {
        let line = shape.line(0, index);
        let text = std::str::from_utf8(&line[..line.len() - 1]).unwrap_or_default();
        envelopes.write(text, "", chrono::Utc::now(), &mut envelope);
        bytes += envelope.len() as u64;
        let mut message = BaseRecord::<(), [u8]>::to(topic).payload(&envelope[..]);
        loop {
            match producer.send(message) {
                Ok(()) => break,
                Err((error, back))
                    if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) =>
                {
                    message = back;
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err((error, _)) => return Err(error.into()),
            }
        }
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

/// Makes sure `topic` exists (auto-created by a metadata request, as a producer's first send
/// would) and every partition has a leader, so a timed run does not include topic creation.
#[expect(clippy::disallowed_methods, reason = "runs on the main thread of `sluice bench`, no async runtime")]
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
        match crate::envelope::Envelope::parse(payload) {
            Ok(envelope) => ids.insert(envelope.id.into_owned().into_bytes()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_exact_ranks_of_the_sorted_latencies() {
        let mut nanos: Vec<u32> = (1..=1000).rev().map(|n| n * 1000).collect();
        let latency = Latency::of(&mut nanos);
        assert_eq!(latency, Latency { p50_us: 500.0, p99_us: 990.0, p999_us: 999.0, max_us: 1000.0 });
        assert_eq!(Latency::of(&mut []), Latency::default());
    }

    #[test]
    fn the_histogram_counts_every_call_once_in_doubling_buckets() {
        let sorted = [100, 250, 251, 900, 5_000_000];
        let buckets = histogram(&sorted);
        assert_eq!(buckets.iter().map(|b| b.count).sum::<u64>(), 5);
        assert_eq!(buckets[0], Bucket { le_us: 0.25, count: 2 });
        assert_eq!(buckets[1], Bucket { le_us: 0.5, count: 1 });
        assert_eq!(buckets[2], Bucket { le_us: 1.0, count: 1 });
        assert!(buckets[3].le_us >= 5000.0);
    }

    #[test]
    fn records_have_the_requested_size_with_their_newline() {
        for size in [64, 256, 1024] {
            let size = size.max(record(3, 17, 0).len());
            let line = record(3, 17, size);
            assert_eq!(line.len(), size);
            assert_eq!(line.last(), Some(&b'\n'));
            assert!(serde_json::from_slice::<serde_json::Value>(&line[..size - 1]).is_ok());
        }
    }

    #[test]
    fn sample_records_are_its_lines_in_turn_with_a_newline_each_connection_from_its_own_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sample.jsonl");
        std::fs::write(&path, "{\"a\":1}\n\n{\"b\":2}\n{\"c\":3}").expect("sample written");
        let shape = Shape::sample(&path).expect("a sample");
        let lines: Vec<Vec<u8>> = (0..4).map(|index| shape.line(0, index)).collect();
        assert_eq!(lines, [&b"{\"a\":1}\n"[..], b"{\"b\":2}\n", b"{\"c\":3}\n", b"{\"a\":1}\n"]);
        assert_ne!(shape.line(1, 0), shape.line(0, 0));
        std::fs::write(&path, "\n\n").expect("empty sample written");
        assert!(matches!(Shape::sample(&path), Err(BenchError::Sample { .. })));
    }

    #[test]
    fn the_committed_sample_is_json_lines() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/sample.jsonl");
        let Shape::Sample(lines) = Shape::sample(&path).expect("bench/sample.jsonl") else { panic!("a sample") };
        assert_eq!(lines.len(), 1000);
        for line in lines.iter() {
            assert!(serde_json::from_slice::<serde_json::Value>(line).is_ok_and(|value| value.is_object()));
        }
    }

    #[test]
    fn the_socket_ceiling_reads_every_record_it_times() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = LoadOptions { records: 10_000, connections: 2, rate: 0, shape: Shape::Padded(256) };
        let result = socket_ceiling(dir.path(), &options).expect("ceiling run");
        assert_eq!((result.records, result.bytes), (10_000, 2_560_000));
        assert!(result.write_latency.max_us >= result.write_latency.p50_us);
    }
}
