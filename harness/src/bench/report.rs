//! What a benchmark run writes as data: each scenario's figures (one JSON file each, then all of
//! them in `results.json`).
//!
//! Owns: the shape of those files (the keys `scripts/bench-plot.py`, `summary.md` and earlier
//! runs in `bench/results/` use) and how their numbers are written. Must not: measure anything.

use std::collections::BTreeMap;

use serde::Serialize;

use super::LoadResult;
use super::kafka::ProducerResult;
use super::pod::Phase;
use super::run::CopyCeiling;
use super::targets::{Target, targets};

/// Ingest → Kafka-ack (or socket → row) latency from a histogram: for p50, p99 and p99.9 the
/// bucket bound (seconds, as the exposition writes it) at or under which that share was.
#[derive(Debug, Clone, Serialize)]
pub struct BucketLatency {
    /// Median's bucket bound.
    pub p50_le_s: String,
    /// 99th percentile's.
    pub p99_le_s: String,
    /// 99.9th percentile's.
    pub p999_le_s: String,
}

/// A run's books: every record written is in Kafka (distinct ids) or counted.
#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    /// Records written to the socket.
    pub written: u64,
    /// Distinct record ids in the run's topic.
    pub in_kafka: u64,
    /// Messages beyond the distinct ids (sent again after an outage).
    pub duplicates: u64,
    /// `sluice_buffer_records_dropped_total`.
    pub dropped: u64,
    /// `sluice_ship_records_failed_total`.
    pub failed: u64,
    /// `sluice_ingest_records_rejected_total`.
    pub rejected: u64,
    /// Every non-zero drop, give-up and rejection series (as exposed, labels included).
    pub by_reason: BTreeMap<String, u64>,
    /// Rows in PostgreSQL, where a persister ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows_in_postgres: Option<u64>,
}

/// Agent RSS over a max-rate run, MiB.
#[derive(Debug, Clone, Serialize)]
pub struct RunRss {
    /// A second after start, before any load.
    pub idle: f64,
    /// The median of 0.2 s samples while the load runs.
    pub steady: f64,
    /// The high-water mark.
    pub peak: f64,
}

/// Sluice at max rate (`steady.json`, and each record shape).
#[derive(Debug, Clone, Serialize)]
pub struct MaxRate {
    /// The writers' view.
    pub load: LoadResult,
    /// The books.
    pub counts: Counts,
    /// The agent's histogram.
    pub ingest_to_kafka_ack: BucketLatency,
    /// Records settled per second, from the first write to the last record settled.
    pub delivered_records_per_second: f64,
    /// That span.
    pub delivered_seconds: f64,
    /// Envelope MiB delivered per second.
    pub delivered_mib_per_second: f64,
    /// Agent CPU over the span.
    pub agent_cpu_seconds: f64,
    /// Agent cores per 10k records/s.
    pub agent_cpu_cores_per_10k_records_per_second: f64,
    /// Agent memory.
    pub agent_rss_mib: RunRss,
}

/// One record shape at max rate, beside its own shipping ceiling.
#[derive(Debug, Clone, Serialize)]
pub struct ShapeRun {
    /// The max-rate run.
    #[serde(flatten)]
    pub run: MaxRate,
    /// "64 B", "1024 B", "sample".
    pub shape: String,
    /// The raw producer with the same records.
    pub shipping_ceiling: ProducerResult,
    /// Delivered over the ceiling.
    pub delivered_to_shipping_ceiling: f64,
    /// Bytes per record written.
    pub mean_record_bytes: f64,
}

/// Sluice at a fixed rate.
#[derive(Debug, Clone, Serialize)]
pub struct FixedRate {
    /// The writers' view.
    pub load: LoadResult,
    /// The books.
    pub counts: Counts,
    /// The agent's histogram.
    pub ingest_to_kafka_ack: BucketLatency,
    /// Records per second asked for.
    pub rate: u64,
    /// From the first write to the last record settled.
    pub seconds: f64,
    /// Agent CPU over that span.
    pub agent_cpu_seconds: f64,
    /// Agent cores per 10k records/s.
    pub agent_cpu_cores_per_10k_records_per_second: f64,
    /// Agent high-water mark, MiB.
    pub agent_peak_rss_mib: f64,
}

/// rsyslog's books: it counts no drops, so every record must be in Kafka.
#[derive(Debug, Clone, Serialize)]
pub struct RsyslogCounts {
    /// Records written.
    pub written: u64,
    /// Messages in its topic.
    pub in_kafka: u64,
}

/// rsyslog's memory, MiB.
#[derive(Debug, Clone, Serialize)]
pub struct RsyslogRss {
    /// A second after start.
    pub idle: f64,
    /// High-water mark.
    pub peak: f64,
}

/// The peer: rsyslog at max rate.
#[derive(Debug, Clone, Serialize)]
pub struct Rsyslog {
    /// "rsyslog 8.2302.0".
    pub version: String,
    /// The writers' view.
    pub load: LoadResult,
    /// Its books.
    pub counts: RsyslogCounts,
    /// Records in Kafka per second, from the first write to the last message counted.
    pub delivered_records_per_second: f64,
    /// That span.
    pub delivered_seconds: f64,
    /// rsyslog's CPU over the span.
    pub cpu_seconds: f64,
    /// Its cores per 10k records/s.
    pub cpu_cores_per_10k_records_per_second: f64,
    /// Its memory.
    pub rss_mib: RsyslogRss,
}

/// A span of a run, seconds from its start.
#[derive(Debug, Clone, Serialize)]
pub struct Span {
    /// From.
    pub from_s: f64,
    /// To.
    pub to_s: f64,
}

/// The broker stopped under a disk-buffered agent.
#[derive(Debug, Clone, Serialize)]
pub struct Outage {
    /// The writers' view.
    pub load: LoadResult,
    /// The books.
    pub counts: Counts,
    /// Records per second written.
    pub rate: u64,
    /// When the broker was down.
    pub outage: Span,
    /// When every record was settled.
    pub settled_s: f64,
    /// Agent high-water mark, MiB.
    pub agent_peak_rss_mib: f64,
}

/// The persister draining the max-rate topic.
#[derive(Debug, Clone, Serialize)]
pub struct Persist {
    /// Records in the topic.
    pub records: u64,
    /// Rows counted in PostgreSQL.
    pub rows_in_postgres: u64,
    /// `persist.writers` as its `/config` says.
    pub writers: u64,
    /// Rows per second from its first rows to its last.
    pub rows_per_second: f64,
    /// That span.
    pub seconds: f64,
    /// Persister CPU from its first rows to its last (over its life until 2026-12-04; the
    /// Kafka Connect peer's is measured over the same span).
    pub persister_cpu_seconds: f64,
    /// Its cores per 10k rows/s.
    pub persister_cpu_cores_per_10k_rows_per_second: f64,
    /// Its high-water mark, MiB.
    pub persister_peak_rss_mib: f64,
    /// Which records: `256 B` (the max-rate run's) or `sample` (`bench/sample.jsonl`).
    pub shape: String,
    /// The records' mean size as the app wrote them, newline not counted.
    pub record_bytes: f64,
    /// `pg_total_relation_size` (heap, TOAST, indexes) summed over the partitions of `log_rows`.
    pub relation_bytes: u64,
    /// `relation_bytes` per row.
    pub bytes_per_row: f64,
    /// PostgreSQL's own `COPY` of the rows the persister stored (the max-rate topic's drain only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres_copy_ceiling: Option<CopyCeiling>,
}

/// The persister's peer: Kafka Connect standalone with a JDBC sink storing the same records.
#[derive(Debug, Clone, Serialize)]
pub struct KafkaConnect {
    /// "Kafka Connect 4.4.0, Debezium JDBC sink 3.5.0.Final".
    pub version: String,
    /// Records on its topic.
    pub records: u64,
    /// Rows counted in its table.
    pub rows_in_postgres: u64,
    /// `tasks.max` (the persister's writers).
    pub tasks: u64,
    /// The sink's `batch.size` and the consumers' `max.poll.records`.
    pub batch_size: u64,
    /// Its input's mean value size (JsonConverter JSON, the schema in every value).
    pub message_bytes: f64,
    /// Rows per second from its first rows to its last.
    pub rows_per_second: f64,
    /// That span.
    pub seconds: f64,
    /// The JVM's CPU from its first rows to its last.
    pub cpu_seconds: f64,
    /// Its cores per 10k rows/s.
    pub cpu_cores_per_10k_rows_per_second: f64,
    /// Its high-water mark, MiB.
    pub peak_rss_mib: f64,
}

/// The Kafka Connect peer, or why the run has none.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaConnectRun {
    /// It ran.
    Measured(KafkaConnect),
    /// It did not: why.
    NotMeasured(String),
}

/// Socket → row latency before the stall and over the whole run.
#[derive(Debug, Clone, Serialize)]
pub struct RowLatency {
    /// Before the stall.
    pub before_stall: BucketLatency,
    /// The whole run.
    pub overall: BucketLatency,
}

/// PostgreSQL stalled under agent + persister at a fixed rate.
#[derive(Debug, Clone, Serialize)]
pub struct PgStall {
    /// The writers' view.
    pub load: LoadResult,
    /// The books, with the rows.
    pub counts: Counts,
    /// Records per second written.
    pub rate: u64,
    /// When inserts waited.
    pub stall: Span,
    /// When every row was there.
    pub caught_up_s: f64,
    /// Most records delivered and not yet stored.
    pub max_persister_backlog_records: u64,
    /// The agent's histogram.
    pub ingest_to_kafka_ack: BucketLatency,
    /// The persister's histogram.
    pub socket_to_postgres_row: RowLatency,
}

/// The two ceilings.
#[derive(Debug, Clone, Serialize)]
pub struct Ceilings {
    /// The socket reader that discards.
    pub ingest: LoadResult,
    /// The raw producer.
    pub shipping: ProducerResult,
    /// The socket reader that discards, written at the fixed-rate run's rate by the same
    /// writers: the baseline for that run's write-call latency.
    pub ingest_at_rate: LoadResult,
}

/// Sluice over its peers and ceilings.
#[derive(Debug, Clone, Serialize)]
pub struct Ratios {
    /// Ingest rate over the ingest ceiling's.
    pub ingest_to_ingest_ceiling: f64,
    /// Delivered rate over the shipping ceiling's.
    pub delivered_to_shipping_ceiling: f64,
    /// Delivered over rsyslog's delivered.
    pub delivered_to_rsyslog: f64,
    /// CPU per record over rsyslog's.
    pub cpu_per_record_to_rsyslog: f64,
    /// The persister's rows/s over Kafka Connect's (none when the peer did not run).
    pub persister_to_kafka_connect: Option<f64>,
    /// The persister's rows/s over PostgreSQL's own `COPY` of the same rows, two sessions.
    pub persister_to_copy_ceiling: Option<f64>,
}

/// Every scenario's figures, as the run measured them.
#[derive(Debug, Clone, Serialize)]
pub struct Scenarios {
    /// The ceilings.
    pub ceilings: Ceilings,
    /// Max rate.
    pub steady: MaxRate,
    /// Fixed rate.
    pub fixed_rate: FixedRate,
    /// rsyslog.
    pub rsyslog: Rsyslog,
    /// Broker outage.
    pub outage: Outage,
    /// The persister, draining the max-rate topic.
    pub persist: Persist,
    /// The persister, draining the sample shape's topic (`bench/sample.jsonl` records).
    pub persist_sample: Persist,
    /// The persister's peer, draining the same records as `persist`.
    pub kafka_connect: KafkaConnectRun,
    /// PostgreSQL stalled.
    pub pg_stall: PgStall,
    /// Record shapes.
    pub shapes: Vec<ShapeRun>,
    /// One sidecar's cost: idle, at 1k and at 10k records/s (`sluice-bench pod`'s phases).
    pub pod: Vec<Phase>,
}

/// `results.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// The run's UTC time stamp (its folder's name).
    pub when: String,
    /// Cores, memory, kernel.
    pub machine: String,
    /// The command line.
    pub command: String,
    /// Records per max-rate run.
    pub records: u64,
    /// Record size.
    pub size: u64,
    /// Connections.
    pub connections: u32,
    /// The scenarios (flattened: `results.json` keeps its keys).
    #[serde(flatten)]
    pub scenarios: Scenarios,
    /// Ratios.
    pub ratios: Ratios,
    /// Each target of issue 15, met or missed by how much.
    pub targets: Vec<Target>,
}

impl Results {
    /// Puts the run together and works out the ratios and the targets.
    pub fn new(header: (String, String, String, u64, u64, u32), scenarios: Scenarios) -> Self {
        let (when, machine, command, records, size, connections) = header;
        let x = &scenarios;
        let ratios = Ratios {
            ingest_to_ingest_ceiling: x.steady.load.records_per_second / x.ceilings.ingest.records_per_second,
            delivered_to_shipping_ceiling: x.steady.delivered_records_per_second
                / x.ceilings.shipping.records_per_second,
            delivered_to_rsyslog: x.steady.delivered_records_per_second / x.rsyslog.delivered_records_per_second,
            cpu_per_record_to_rsyslog: x.steady.agent_cpu_cores_per_10k_records_per_second
                / x.rsyslog.cpu_cores_per_10k_records_per_second,
            persister_to_kafka_connect: match &x.kafka_connect {
                KafkaConnectRun::Measured(peer) => Some(x.persist.rows_per_second / peer.rows_per_second),
                KafkaConnectRun::NotMeasured(_) => None,
            },
            persister_to_copy_ceiling: x
                .persist
                .postgres_copy_ceiling
                .as_ref()
                .map(|ceiling| x.persist.rows_per_second / ceiling.two_sessions.rows_per_second),
        };
        let targets = targets(&scenarios, &ratios);
        Self { when, machine, command, records, size, connections, scenarios, ratios, targets }
    }
}

/// Pretty JSON whose whole numbers are written as integers (`1`, not `1.0`), as `jq` wrote the
/// results before the benchmark was a Rust tool: earlier runs in `bench/results/` read the same.
pub fn to_json(value: &impl Serialize) -> String {
    let mut out = Vec::new();
    let mut serializer =
        serde_json::Serializer::with_formatter(&mut out, WholeNumbers(serde_json::ser::PrettyFormatter::new()));
    // Serializing plain data into memory cannot fail.
    let _ = value.serialize(&mut serializer);
    String::from_utf8(out).unwrap_or_default()
}

/// serde_json's pretty layout, whole `f64`s without a fraction.
struct WholeNumbers<'a>(serde_json::ser::PrettyFormatter<'a>);

impl serde_json::ser::Formatter for WholeNumbers<'_> {
    fn write_f64<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, value: f64) -> std::io::Result<()> {
        if value.fract() == 0.0 && value.abs() < 1e15 {
            write!(writer, "{}", value as i64)
        } else {
            self.0.write_f64(writer, value)
        }
    }
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.begin_array(writer)
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_array(writer)
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        self.0.begin_array_value(writer, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_array_value(writer)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.begin_object(writer)
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_object(writer)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        self.0.begin_object_key(writer, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.begin_object_value(writer)
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_object_value(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_are_written_as_integers_and_the_rest_as_they_are() {
        #[derive(Serialize)]
        struct Figures {
            le_us: f64,
            ratio: f64,
            counts: Vec<u64>,
        }
        let text = to_json(&Figures { le_us: 1.0, ratio: 0.25, counts: vec![3] });
        assert_eq!(text, "{\n  \"le_us\": 1,\n  \"ratio\": 0.25,\n  \"counts\": [\n    3\n  ]\n}");
    }
}
