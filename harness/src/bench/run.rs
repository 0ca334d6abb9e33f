//! `scripts/bench`: every scenario of the benchmark in one run, next to the machine's limits.
//!
//! 1. Ceilings: the ingest ceiling (the same writers into a Unix socket reader that discards,
//!    at max rate and at RATE records/s: the fixed-rate run's write-latency baseline)
//!    and the shipping ceiling (a raw librdkafka producer with the agent's settings sending the
//!    same envelopes to the same broker).
//! 2. Steady state at max rate: RECORDS records of SIZE bytes from CONNECTIONS connections into
//!    a release agent (memory buffer, `when_full = "block"`); ingest and Kafka-acked throughput,
//!    write latency, agent CPU and RSS (idle, steady, peak).
//!    Record shapes: the same at max rate (RECORDS/2 records) for 64 B and 1 KiB records and for
//!    lines of `bench/sample.jsonl`, each next to the shipping ceiling for the same records.
//! 3. Fixed rate (RATE records/s for SECONDS): agent CPU per 10k records/s and write latency.
//! 4. The peer: rsyslog (Debian's rsyslog + rsyslog-kafka; imptcp on a Unix stream socket,
//!    omkafka with the agent's acks/idempotence/compression/linger/batch settings) fed by the
//!    same generator at max rate; delivered = every record counted in its Kafka topic.
//! 5. Broker outage: a disk-buffered agent at RATE records/s; the stack's broker is stopped for
//!    OUTAGE seconds mid-run and started again; write latency during it, the spool's backlog
//!    and drain, RSS, sampled every 0.5 s. (Stops the stack's broker: not while tests use it.)
//! 6. The persister drains the max-rate topic into a fresh PostgreSQL schema; rows/s from its
//!    first row to its last, its CPU and RSS; rows counted in PostgreSQL; the bytes a row takes
//!    (heap, TOAST, indexes); then PostgreSQL's own `COPY` of the rows it stored (the same rows
//!    from COPY binary files into a fresh schema, two sessions: `run/copy_ceiling.rs`), the
//!    persister's rate over it. Then its peer: Kafka Connect standalone with Debezium's JDBC sink
//!    stores the same records (as JsonConverter rows on a topic of its own;
//!    `run/kafka_connect.rs`); rows/s side by side. Then the persister on the sample shape's topic.
//! 7. PostgreSQL stalled: agent + persister at RATE records/s; AROUND seconds in, every insert
//!    into `logs` waits (a statement-level trigger looping on `pg_sleep` while a flag row
//!    exists) for OUTAGE seconds. Write latency, socket → row latency (before the stall and
//!    overall), the persister's backlog and catch-up, sampled every 0.5 s.
//! 8. Cost per pod (`sluice-bench pod`'s phases): one agent idle for 60 s, then at 1k and 10k
//!    records/s: CPU, context switches, RSS.
//!
//! The summary then holds each of issue 15's targets (`targets.rs`) next to its figure: met, or
//! by how much missed.
//!
//! Every run verifies its counts: records written = messages in the run's Kafka topic + counted
//! drops (= rows in PostgreSQL where a persister ran), or it fails. Results: the scenarios'
//! JSON, `results.json`, `summary.md` and the plots (`scripts/bench-plot.py`) in
//! `bench/results/<UTC time>/` (with `--smoke`: tiny counts, a temp dir).
//!
//! Owns: the scenarios' order (each is in `run/scenarios.rs`), their agents' and persisters'
//! configs, sampling and the books.
//! Must not: install anything or start the stack (`scripts/bench` does), or leave a process, a
//! schema or (with `--smoke`) a file behind.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice::telemetry;
use sluice::telemetry::scrape::Scrape;

mod capacity;
mod copy_ceiling;
mod kafka_connect;
mod scenarios;

pub use copy_ceiling::{CopyCeiling, CopyLoad};

use super::host::{clock_ticks, machine, now};
use super::kafka;
use super::report::{BucketLatency, Ceilings, Counts, Results, Scenarios, ShapeRun};
use super::summary::summary;
use super::{BenchError, LoadOptions, LoadResult, Shape};
use crate::{Process, Services, TestConfig};

/// rsyslog's daemon, from Debian's package.
const RSYSLOGD: &str = "/usr/sbin/rsyslogd";
/// A scrape gives up after this.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopped agent or persister may take to drain and exit (`drain_timeout = "5s"`).
const STOP_LIMIT: Duration = Duration::from_secs(60);

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A check failed or a process misbehaved: the message says which.
    #[error("{0}")]
    Failed(String),
    /// A benchmark part failed.
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// PostgreSQL refused.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// A file could not be written or a program not run.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The agent config the shipping ceiling reads did not load.
    #[error(transparent)]
    Config(#[from] sluice::config::ConfigError),
}

fn failed(message: impl Into<String>) -> RunError {
    RunError::Failed(message.into())
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// The command line: `[--smoke] [RECORDS] [SIZE] [CONNECTIONS] [RATE] [SECONDS] [OUTAGE]`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Tiny counts, results in a temp dir (`scripts/test`).
    pub smoke: bool,
    /// Records per max-rate run (default 1,000,000; smoke 20,000).
    pub records: u64,
    /// Bytes per record, newline included (256).
    pub size: u64,
    /// Connections (4; smoke 2).
    pub connections: u32,
    /// Records per second of the fixed-rate, outage and stall runs (10,000; smoke 2,000).
    pub rate: u64,
    /// Seconds of the fixed-rate run (30; smoke 2).
    pub seconds: u64,
    /// Seconds of the broker outage and of the stall (30; smoke 3).
    pub outage: u64,
    /// Seconds of load before and after them (10; smoke 2).
    pub around: u64,
    /// The arguments as given, for `results.json`'s `command`.
    pub args: Vec<String>,
    /// Results into `bench/results/<prefix><time>/` (a full run); else into the temp dir, gone after.
    pub keep_results: bool,
    /// The results folder's name before its time: empty for `scripts/bench`, `capacity-` for
    /// `scripts/bench-capacity`.
    pub results_prefix: &'static str,
}

impl Settings {
    /// The defaults for `smoke`, overridden by the positional arguments given.
    pub fn new(smoke: bool, values: &[u64], args: Vec<String>) -> Self {
        let defaults: [u64; 6] = if smoke { [20_000, 256, 2, 2000, 2, 3] } else { [1_000_000, 256, 4, 10_000, 30, 30] };
        let value = |index: usize| values.get(index).copied().unwrap_or(defaults[index]);
        Self {
            smoke,
            records: value(0),
            size: value(1),
            connections: u32::try_from(value(2)).unwrap_or(u32::MAX),
            rate: value(3),
            seconds: value(4),
            outage: value(5),
            around: if smoke { 2 } else { 10 },
            args,
            keep_results: !smoke,
            results_prefix: "",
        }
    }

    /// These settings with results in `bench/results/<prefix><time>/` (when kept).
    pub fn results_prefix(mut self, prefix: &'static str) -> Self {
        self.results_prefix = prefix;
        self
    }

    /// These settings with results in the temp dir (a partial run: `sluice-bench max-rate`).
    pub fn temporary(mut self) -> Self {
        self.keep_results = false;
        self
    }
}

/// Logs a line the way the scripts do: `[bench] …` on stderr.
fn log(message: &str) {
    eprintln!("[bench] {message}");
}

/// A writer draining a topic into PostgreSQL (the persister, its Kafka Connect peer), as its
/// rows were counted: when the first showed, how many, the writer's CPU ticks then, and when
/// the last showed.
#[derive(Debug, Clone, Copy)]
struct Drain {
    first_at: f64,
    first_rows: u64,
    first_cpu: u64,
    last_at: f64,
}

/// Follows a writer's row count until it reaches what is expected.
#[derive(Default)]
struct DrainWatch {
    first: Option<(f64, u64, u64)>,
}

impl DrainWatch {
    /// `rows` counted at `at` with the writer's CPU at `cpu` ticks: the drain once `expected`.
    fn observe(&mut self, at: f64, rows: u64, cpu: u64, expected: u64) -> Option<Drain> {
        if self.first.is_none() && rows > 0 {
            self.first = Some((at, rows, cpu));
        }
        (rows >= expected).then(|| {
            let (first_at, first_rows, first_cpu) = self.first.unwrap_or((at, rows, cpu));
            Drain { first_at, first_rows, first_cpu, last_at: at }
        })
    }
}

/// A drain's figures: its span, rows/s, the writer's CPU seconds and cores per 10k rows/s.
#[derive(Debug, Clone, Copy)]
struct DrainFigures {
    seconds: f64,
    rows_per_second: f64,
    cpu_seconds: f64,
    cores_per_10k_rows_per_second: f64,
}

impl Drain {
    /// The figures for `records` rows, the writer at `cpu_at_last` ticks when the last showed
    /// (`ticks` a second). Rows/s and CPU from the first rows to the last; when every row was
    /// in the first count (a smoke run's few records), rows/s over the span from `started`
    /// (the writer's start), which understates it, rather than none.
    fn figures(&self, records: u64, started: f64, cpu_at_last: u64, ticks: u64) -> DrainFigures {
        let (seconds, rows_per_second) = if self.first_rows < records && self.last_at > self.first_at {
            (self.last_at - self.first_at, (records - self.first_rows) as f64 / (self.last_at - self.first_at))
        } else {
            (self.last_at - started, records as f64 / (self.last_at - started))
        };
        let cpu_seconds = cpu_at_last.saturating_sub(self.first_cpu) as f64 / ticks as f64;
        DrainFigures {
            seconds,
            rows_per_second,
            cpu_seconds,
            cores_per_10k_rows_per_second: (cpu_seconds / seconds) / (rows_per_second / 10_000.0),
        }
    }
}

/// A short random number, as bash's `$RANDOM` made topic names unique.
fn random() -> u32 {
    use std::sync::atomic::AtomicU32;
    static STATE: AtomicU32 = AtomicU32::new(0);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.subsec_nanos());
    let mut x = STATE.fetch_add(0x9e37_79b9, Ordering::Relaxed) ^ seed ^ std::process::id();
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    x % 32768
}

/// A scrape of the admin server at `admin`.
async fn scrape(admin: SocketAddr) -> Result<Scrape, RunError> {
    let response = sluice::admin::client::get(admin, "/metrics", SCRAPE_TIMEOUT)
        .await
        .map_err(io(format!("scraping http://{admin}/metrics")))?;
    if response.status != 200 {
        return Err(failed(format!("http://{admin}/metrics answered {}", response.status)));
    }
    Ok(Scrape::parse(&response.body))
}

/// One counter or gauge summed over its series (0 when the scrape fails, as `metric_sum` was).
async fn metric_sum(admin: SocketAddr, names: &[&str]) -> u64 {
    match scrape(admin).await {
        Ok(scrape) => names.iter().map(|name| scrape.sum(name, &[])).sum::<f64>().round() as u64,
        Err(_) => 0,
    }
}

/// p50, p99 and p99.9 of histogram `name` as bucket bounds.
async fn bucket_latency(admin: SocketAddr, name: &str) -> Result<BucketLatency, RunError> {
    let scrape = scrape(admin).await?;
    Ok(BucketLatency {
        p50_le_s: scrape.bucket_bound(name, 0.5),
        p99_le_s: scrape.bucket_bound(name, 0.99),
        p999_le_s: scrape.bucket_bound(name, 0.999),
    })
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, BenchError> + Send + 'static,
) -> Result<T, RunError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| failed(format!("a benchmark part panicked: {error}")))?
        .map_err(RunError::from)
}

/// A background sampler: runs `sample` every `every` until stopped; what it gathered.
struct Sampler<T> {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<T>>,
}

impl<T: Send + 'static> Sampler<T> {
    /// Samples while `sample` returns `Some`, and until [`Sampler::finish`].
    fn start<F, Fut>(every: Duration, mut sample: F) -> Self
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Option<T>> + Send,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut samples = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let Some(value) = sample().await else { break };
                    samples.push(value);
                    tokio::time::sleep(every).await;
                }
                samples
            }
        });
        Self { stop, task }
    }

    async fn finish(self) -> Vec<T> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// A plain connection to PostgreSQL at `url` (the stack offers TLS, and does not require it),
/// with `search_path` set to `schema` if given (as the persister's connections are).
async fn connect(url: &str, schema: Option<&str>) -> Result<tokio_postgres::Client, RunError> {
    let mut config = url.parse::<tokio_postgres::Config>()?;
    if let Some(schema) = schema {
        config.options(format!("-c search_path={schema}"));
    }
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// `persist.writers` as the persister at `admin` shows it in `/config` (2, its default, if it
/// does not say).
async fn writers(admin: SocketAddr) -> Result<u64, RunError> {
    let shown = sluice::admin::client::get(admin, "/config", SCRAPE_TIMEOUT)
        .await
        .map_err(io("reading the persister's /config"))?;
    Ok(shown
        .body
        .parse::<toml::Table>()
        .ok()
        .and_then(|table| table.get("persist")?.get("writers")?.as_integer())
        .and_then(|writers| u64::try_from(writers).ok())
        .unwrap_or(2))
}

/// `scripts/stack kafka-stop` / `kafka-start` (the stack's broker, by its pid file).
pub(super) fn stack(root: &Path, command: &str) -> Result<(), RunError> {
    let status = std::process::Command::new(root.join("scripts/stack"))
        .arg(command)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(io(format!("scripts/stack {command}")))?;
    if !status.success() {
        return Err(failed(format!("scripts/stack {command} failed: {status}")));
    }
    Ok(())
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// One benchmark run and what it must clean up.
pub struct Bench {
    settings: Settings,
    root: PathBuf,
    out: PathBuf,
    work: tempfile::TempDir,
    services: Services,
    stamp: String,
    ticks: u64,
    db: tokio_postgres::Client,
    /// Schemas made by this run: dropped at the end, whatever happened.
    schemas: Arc<Mutex<Vec<String>>>,
    /// Schemas made in another PostgreSQL cluster (its URL, the schema): dropped likewise.
    other_schemas: Arc<Mutex<Vec<(String, String)>>>,
    /// Topics made by a run that deletes its own (`capacity`): deleted likewise.
    topics: Arc<Mutex<Vec<String>>>,
}

impl Bench {
    /// Prepares a run from the repository at `root` against `services`.
    pub async fn new(settings: Settings, root: &Path, services: Services) -> Result<Self, RunError> {
        let stamp = chrono::Utc::now().format("%Y-%m-%dT%H-%M-%SZ").to_string();
        let work = tempfile::Builder::new().prefix("sluice-bench.").tempdir().map_err(io("making the work dir"))?;
        let out = if !settings.keep_results {
            work.path().join("results")
        } else {
            root.join("bench/results").join(format!("{}{stamp}", settings.results_prefix))
        };
        std::fs::create_dir_all(&out).map_err(io(format!("making {}", out.display())))?;
        let db = connect(&services.pg, None).await?;
        Ok(Self {
            settings,
            root: root.to_path_buf(),
            out,
            work,
            services,
            stamp,
            ticks: clock_ticks(),
            db,
            schemas: Arc::default(),
            other_schemas: Arc::default(),
            topics: Arc::default(),
        })
    }

    /// The results folder.
    pub fn out(&self) -> &Path {
        &self.out
    }

    fn write(&self, name: &str, text: &str) -> Result<(), RunError> {
        let path = self.out.join(name);
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))
    }

    fn write_json(&self, name: &str, value: &impl serde::Serialize) -> Result<(), RunError> {
        self.write(name, &(super::report::to_json(value) + "\n"))
    }

    /// The benchmark's agent: `buffer` (`memory` or `disk`) of 64 MiB that blocks when full.
    fn agent_config(&self, topic: &str, buffer: &str) -> TestConfig {
        let mut config =
            super::agent_config(TestConfig::empty_in(self.work.path(), "agent."), &self.services.kafka, topic);
        let spool = config.dir.path().join("spool").display().to_string();
        config.set("buffer", "type", buffer).set("buffer", "path", spool).set("buffer", "when_full", "block").set(
            "buffer",
            "block_timeout",
            "forever",
        );
        config
    }

    /// The benchmark's persister: `topic` into `schema` (also its group).
    /// The persister's config; with `columns`, five typed columns over the benchmark's records
    /// (`log_level` text from `level`, `conn` and `n` bigint, `n` again as double precision, a `ts` timestamptz
    /// that no record has: NULL).
    fn persister_config(&self, topic: &str, schema: &str, columns: bool) -> TestConfig {
        let mut config = TestConfig::empty_in(self.work.path(), "persist.");
        config
            .set("log", "level", "warn")
            .set("kafka", "brokers", self.services.kafka.as_str())
            .set("kafka", "topic", topic)
            .set("persist", "admin_listen", "127.0.0.1:0")
            .set("persist", "group_id", schema)
            .set("persist", "drain_timeout", "5s")
            .set("postgres", "url", self.services.pg.as_str())
            .set("postgres", "ca_file", std::env::var("SLUICE_TEST_PG_CA").unwrap_or_default())
            .set("postgres", "schema", schema);
        if columns {
            let typed: toml::Table = toml::from_str(
                r#"
                log_level = { pointer = "/level", type = "text" }
                conn = { pointer = "/conn", type = "bigint" }
                n = { pointer = "/n", type = "bigint" }
                n_double = { pointer = "/n", type = "double precision" }
                ts = { pointer = "/ts", type = "timestamptz" }
                "#,
            )
            .expect("typed columns");
            config.set("persist", "columns", toml::Value::Table(typed));
        }
        config
    }

    fn load_options(&self, records: u64, rate: u64, shape: &Shape) -> LoadOptions {
        LoadOptions { records, connections: self.settings.connections, rate, shape: shape.clone() }
    }

    async fn load(socket: PathBuf, options: LoadOptions) -> Result<LoadResult, RunError> {
        blocking(move || super::load(&socket, &options)).await
    }

    async fn sql(&self, statement: &str) -> Result<(), RunError> {
        Ok(self.db.batch_execute(statement).await?)
    }

    async fn rows(&self, schema: &str) -> Result<u64, RunError> {
        let row = self.db.query_one(&format!("SELECT count(*) FROM {schema}.logs"), &[]).await?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }

    fn new_schema(&self) -> String {
        let schema = format!("bench_{}_{}", chrono::Utc::now().format("%Y%m%d%H%M%S"), random());
        self.schemas.lock().expect("schemas").push(schema.clone());
        schema
    }

    /// A fresh schema name in the cluster at `url` (not the stack's first), dropped at the end.
    fn new_schema_in(&self, url: &str) -> String {
        let schema = format!("bench_{}_{}", chrono::Utc::now().format("%Y%m%d%H%M%S"), random());
        self.other_schemas.lock().expect("schemas").push((url.to_string(), schema.clone()));
        schema
    }

    /// A topic of this run's, deleted at the end.
    fn own_topic(&self, topic: &str) {
        self.topics.lock().expect("topics").push(topic.to_string());
    }

    /// Drops the run's schemas and deletes the topics it said were its own (also after a failure).
    pub async fn cleanup(&self) {
        let schemas = std::mem::take(&mut *self.schemas.lock().expect("schemas"));
        for schema in schemas {
            let _ = self.db.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
        }
        let others = std::mem::take(&mut *self.other_schemas.lock().expect("schemas"));
        for (url, schema) in others {
            let dropped = match connect(&url, None).await {
                Ok(db) => {
                    db.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await.map_err(RunError::from)
                }
                Err(error) => Err(error),
            };
            if let Err(error) = dropped {
                log(&format!("could not drop {schema} at {url}: {error}"));
            }
        }
        let topics = std::mem::take(&mut *self.topics.lock().expect("topics"));
        for topic in topics {
            if let Err(error) = kafka::delete_topic(&self.services.kafka, &topic).await {
                log(&format!("could not delete {topic}: {error}"));
            }
        }
    }

    fn stack(&self, command: &str) -> Result<(), RunError> {
        stack(&self.root, command)
    }

    /// Waits until the agent has settled `expected` records (delivered + failed + dropped);
    /// when it did.
    async fn wait_settled(admin: SocketAddr, expected: u64, limit: Duration) -> Result<f64, RunError> {
        let deadline = now() + limit.as_secs_f64();
        loop {
            let settled =
                metric_sum(admin, &[telemetry::SHIP_DELIVERED, telemetry::SHIP_FAILED, telemetry::BUFFER_DROPPED])
                    .await;
            if settled >= expected {
                return Ok(now());
            }
            if now() > deadline {
                return Err(failed(format!(
                    "only {settled} of {expected} records settled within {} s",
                    limit.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the persister has written `expected` rows (its own counter, read every
    /// 50 ms).
    async fn wait_rows(persister: &mut Process, expected: u64, limit: Duration) -> Result<Drain, RunError> {
        let admin = persister.admin();
        let deadline = now() + limit.as_secs_f64();
        let mut watch = DrainWatch::default();
        loop {
            let (at, cpu) = (now(), super::host::cpu_ticks(persister.pid()));
            let rows = metric_sum(admin, &[telemetry::PERSIST_ROWS]).await;
            if let Some(drain) = watch.observe(at, rows, cpu, expected) {
                return Ok(drain);
            }
            if now() > deadline {
                return Err(failed(format!(
                    "only {rows} of {expected} rows written within {} s\n{}",
                    limit.as_secs(),
                    persister.log_tail(5)
                )));
            }
            if !persister.running() {
                return Err(failed(format!("the persister exited\n{}", persister.log_tail(5))));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The run's books: every record written is in Kafka (distinct record ids) or counted as
    /// dropped, failed or rejected. Duplicates (a record sent again after an outage: at least
    /// once into Kafka, one row per id in PostgreSQL) are reported, not hidden.
    async fn verify(&self, admin: SocketAddr, topic: &str, written: u64) -> Result<Counts, RunError> {
        let (brokers, name) = (self.services.kafka.clone(), topic.to_string());
        let records = blocking(move || kafka::topic_records(&brokers, &name)).await?;
        let scrape = scrape(admin).await?;
        let sum = |name| scrape.sum(name, &[]).round() as u64;
        let (dropped, failed_, rejected) =
            (sum(telemetry::BUFFER_DROPPED), sum(telemetry::SHIP_FAILED), sum(telemetry::INGEST_REJECTED));
        if records.distinct + dropped + failed_ + rejected != written {
            return Err(failed(format!(
                "counts disagree on {topic}: written {written}, distinct in Kafka {} ({} messages), dropped {dropped}, failed {failed_}, rejected {rejected}",
                records.distinct, records.messages
            )));
        }
        // Every non-zero drop, give-up and rejection series with its labels, e.g.
        // {"sluice_buffer_records_dropped_total{reason=\"drop_newest\"}": 12}.
        let by_reason: BTreeMap<String, u64> = scrape
            .samples()
            .iter()
            .filter(|sample| {
                [telemetry::BUFFER_DROPPED, telemetry::SHIP_FAILED, telemetry::INGEST_REJECTED]
                    .contains(&sample.name.as_str())
                    && !sample.labels.is_empty()
                    && sample.value > 0.0
            })
            .map(|sample| (sample.series().to_string(), sample.value.round() as u64))
            .collect();
        Ok(Counts {
            written,
            in_kafka: records.distinct,
            duplicates: records.messages - records.distinct,
            dropped,
            failed: failed_,
            rejected,
            by_reason,
            rows_in_postgres: None,
        })
    }

    /// Runs every scenario and writes the results; returns the summary.
    pub async fn run(&self) -> Result<String, RunError> {
        let s = &self.settings;
        let padded = Shape::Padded(usize::try_from(s.size).unwrap_or(usize::MAX));
        log(&format!("results in {}", self.out.display()));

        // ---- 1. ceilings
        log(&format!(
            "ingest ceiling: {} records of {} B, {} connections, reader discards",
            s.records, s.size, s.connections
        ));
        let (dir, options) = (self.work.path().to_path_buf(), self.load_options(s.records, 0, &padded));
        let ingest = blocking(move || super::socket_ceiling(&dir, &options)).await?;
        self.write_json("socket_ceiling.json", &ingest)?;
        log(&format!(
            "ingest ceiling at the fixed rate: {} records/s for {} s, the same writers, reader discards",
            s.rate, s.seconds
        ));
        let (dir, options) = (self.work.path().to_path_buf(), self.load_options(s.rate * s.seconds, s.rate, &padded));
        let ingest_at_rate = blocking(move || super::socket_ceiling(&dir, &options)).await?;
        self.write_json("socket_at_rate.json", &ingest_at_rate)?;
        log(&format!("shipping ceiling: raw librdkafka producer, {} envelopes", s.records));
        let shipping = self.shipping_ceiling(s.records, &padded).await?;
        self.write_json("producer_ceiling.json", &shipping)?;

        // ---- 2. steady state at max rate
        let steady_topic = format!("bench-steady-{}-{}", self.stamp, random());
        log(&format!("sluice, max rate: {} records into {steady_topic}", s.records));
        let steady = self.max_rate_run(&steady_topic, s.records, &padded).await?;
        self.write_json("steady.json", &steady)?;

        // ---- 2b. record shapes at max rate, each next to its own shipping ceiling
        let shape_records = s.records / 2;
        let mut shapes = Vec::new();
        let sample = self.root.join("bench/sample.jsonl");
        let mut sample_topic = None;
        for (shape, label) in [
            (Shape::Padded(64), "64 B".to_string()),
            (Shape::Padded(1024), "1024 B".to_string()),
            (Shape::sample(&sample)?, "sample".to_string()),
        ] {
            log(&format!("records of {label}: shipping ceiling, then sluice at max rate ({shape_records} records)"));
            let ceiling = self.shipping_ceiling(shape_records, &shape).await?;
            let topic = format!("bench-shape-{}-{}", self.stamp, random());
            let run = self.max_rate_run(&topic, shape_records, &shape).await?;
            if label == "sample" {
                sample_topic = Some((topic, run.load.bytes as f64 / run.load.records as f64 - 1.0));
            }
            shapes.push(ShapeRun {
                delivered_to_shipping_ceiling: run.delivered_records_per_second / ceiling.records_per_second,
                mean_record_bytes: run.load.bytes as f64 / run.load.records as f64,
                shape: label,
                shipping_ceiling: ceiling,
                run,
            });
            self.write_json("shapes.json", &shapes)?;
        }

        let fixed_rate = self.fixed_rate(&padded).await?;
        self.write_json("fixed_rate.json", &fixed_rate)?;
        let rsyslog = self.rsyslog(&padded).await?;
        self.write_json("rsyslog.json", &rsyslog)?;
        let outage = self.outage(&padded).await?;
        self.write_json("outage.json", &outage)?;
        let persist = self
            .persist(&steady_topic, s.records, &format!("{} B", s.size), s.size as f64 - 1.0, (false, true))
            .await?;
        self.write_json("persist.json", &persist)?;
        // A failed peer fails a smoke run (the harness must not rot) but not a full one, whose
        // other figures stand: its target then says why it has none.
        let kafka_connect = match self.kafka_connect(s.records, &padded, persist.writers).await {
            Err(error) if !s.smoke => {
                log(&format!("Kafka Connect failed: {error}"));
                super::report::KafkaConnectRun::NotMeasured(format!("failed: {error}"))
            }
            outcome => outcome?,
        };
        self.write_json("kafka_connect.json", &kafka_connect)?;
        let (sample_topic, sample_bytes) = sample_topic.ok_or_else(|| failed("the sample shape did not run"))?;
        let persist_sample = self.persist(&sample_topic, shape_records, "sample", sample_bytes, (false, false)).await?;
        self.write_json("persist_sample.json", &persist_sample)?;
        let pg_stall = self.pg_stall(&padded).await?;
        self.write_json("pg_stall.json", &pg_stall)?;
        let (seconds, warm_up) = if s.smoke { (2, Duration::from_secs(1)) } else { (60, super::pod::WARM_UP) };
        log(&format!("cost per pod: one agent idle, then at 1k and 10k records/s, {seconds} s each"));
        let pod = super::pod::measure(&self.services, seconds, warm_up).await?;
        self.write_json("pod.json", &pod)?;

        // ---- report
        let command = std::iter::once("scripts/bench".to_string()).chain(s.args.iter().cloned()).collect::<Vec<_>>();
        let results = Results::new(
            (self.stamp.clone(), machine(), command.join(" "), s.records, s.size, s.connections),
            Scenarios {
                ceilings: Ceilings { ingest, shipping, ingest_at_rate },
                steady,
                fixed_rate,
                rsyslog,
                outage,
                persist,
                persist_sample,
                kafka_connect,
                pg_stall,
                shapes,
                pod,
            },
        );
        self.write_json("results.json", &results)?;
        let mut summary = summary(&results);
        self.write("summary.md", &summary)?;
        self.plot()?;
        summary.push_str(
            "\n![throughput](outage_throughput.png)\n![postgres stall](pg_stall.png)\n![write latency](write_latency.png)\n![rss](outage_rss.png)\n",
        );
        self.write("summary.md", &summary)?;
        Ok(summary)
    }

    /// `scripts/bench-plot.py` on the results (matplotlib from the tools' virtualenv:
    /// `SLUICE_PYTHON`, which `scripts/bench` sets).
    fn plot(&self) -> Result<(), RunError> {
        let python = std::env::var("SLUICE_PYTHON").unwrap_or_else(|_| "python3".into());
        let status = std::process::Command::new(&python)
            .arg(self.root.join("scripts/bench-plot.py"))
            .arg(&self.out)
            .status()
            .map_err(io(format!("running {python} scripts/bench-plot.py")))?;
        if !status.success() {
            return Err(failed(format!("scripts/bench-plot.py failed: {status}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_is_timed_from_its_first_rows_to_its_last_and_its_cpu_over_that_span() {
        let mut watch = DrainWatch::default();
        assert!(watch.observe(1.0, 0, 5, 1000).is_none(), "no rows yet");
        assert!(watch.observe(2.0, 100, 10, 1000).is_none());
        let drain = watch.observe(11.0, 1000, 0, 1000).expect("every row");
        let figures = drain.figures(1000, 0.0, 100, 100);
        assert_eq!((figures.seconds, figures.rows_per_second, figures.cpu_seconds), (9.0, 100.0, 0.9));
        assert!((figures.cores_per_10k_rows_per_second - 10.0).abs() < 1e-9);
    }

    #[test]
    fn a_drain_whose_every_row_was_in_the_first_count_is_timed_from_the_writers_start() {
        let mut watch = DrainWatch::default();
        let drain = watch.observe(4.0, 500, 7, 500).expect("every row at once");
        let figures = drain.figures(500, 2.0, 7, 100);
        assert_eq!((figures.seconds, figures.rows_per_second), (2.0, 250.0));
    }
}
