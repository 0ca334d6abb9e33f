//! The benchmark (`sluice-bench`, behind `scripts/bench`, `scripts/bench-spool` and
//! `scripts/bench-connections`): Sluice next to the machine's own limits in the same run.
//!
//! Owns: the records the benchmark writes ([`Shape`]), the load run through the one load
//! generator (`sluice::client::load`) with every write call timed ([`load`]), the ingest
//! ceiling ([`socket_ceiling`]), and the scenarios in the submodules. Must not: be part of the
//! shipped binary, or judge a run by anything but verified counts (a run whose books do not
//! balance fails).
//!
//! Latencies are kept as one `u32` of nanoseconds per record and sorted at the end (exact
//! percentiles; 4 bytes a record is nothing next to the records themselves).

pub mod capacity;
pub mod connections;
pub mod host;
pub mod kafka;
pub mod otlp;
pub mod pod;
pub mod report;
pub mod run;
pub mod spool;
pub mod summary;
pub mod targets;

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use sluice::client::load::{Amount, Load, Writes};

/// What every benchmark agent starts from, in `config` (a fresh [`TestConfig`](crate::TestConfig)): quiet logs,
/// Kafka at `brokers` with `topic`, the admin server on port 0, its socket in its own folder, a
/// 64 MiB memory buffer, `drain_timeout` 5 s. Each scenario then sets what it measures.
pub fn agent_config(mut config: crate::TestConfig, brokers: &str, topic: &str) -> crate::TestConfig {
    let socket = config.dir.path().join("sluice.sock").display().to_string();
    config
        .set("log", "level", "warn")
        .set("kafka", "brokers", brokers)
        .set("kafka", "topic", topic)
        .set("agent", "admin_listen", "127.0.0.1:0")
        .set("agent", "drain_timeout", "5s")
        .listener("default", "socket", socket)
        .set("buffer", "type", "memory")
        .set("buffer", "max_bytes", "64 MiB");
    config
}

/// Errors of the benchmark's parts.
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

/// Writes the load to `socket` the way an app does: one blocking `write` per record, from one
/// thread per connection, each call timed. Records are made before the clock starts for each
/// call: the app's own formatting is not what is measured.
pub fn load(socket: &Path, options: &LoadOptions) -> Result<LoadResult, BenchError> {
    let generator = Load {
        socket: socket.to_path_buf(),
        connections: options.connections,
        amount: Amount::Records(options.records),
        rate: options.rate,
        writes: Writes::Timed,
    };
    let shape = options.shape.clone();
    let mut report = generator
        .run(Arc::new(move |connection, index| shape.line(connection, index)))
        .map_err(|source| BenchError::Socket { path: socket.to_path_buf(), source })?;
    let seconds = report.elapsed.as_secs_f64();
    Ok(LoadResult {
        records: options.records,
        bytes: report.bytes,
        seconds,
        records_per_second: options.records as f64 / seconds,
        mib_per_second: report.bytes as f64 / seconds / (1024.0 * 1024.0),
        write_latency: Latency::of(&mut report.write_nanos),
        write_latency_histogram: histogram(&report.write_nanos),
    })
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
        // Cargo's value at run time: a test binary another clone built names that clone.
        let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
        let path = Path::new(&root).join("../bench/sample.jsonl");
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
