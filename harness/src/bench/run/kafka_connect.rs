//! The persister's peer (scenario 6b): Kafka Connect standalone with Debezium's JDBC sink
//! connector storing the same records into PostgreSQL, rows/s side by side with the persister.
//!
//! The sink cannot read Sluice's topic as it is (a JDBC sink needs typed fields: a Connect
//! schema; Sluice's values are its envelopes, nested JSON without one), so it gets the same
//! records as flat rows in JsonConverter's JSON, the schema in every value (no schema registry
//! here), on a topic of its own, written before it starts. Its table has the persister's key (agent, seq,
//! ingest time) and indexes (BRIN on ingest time, (namespace, pod)) — not its day partitions,
//! lz4 or the Kafka and peer columns — and it upserts on that key (`ON CONFLICT DO UPDATE`):
//! the same guarantee as the persister's idempotent path (a binary COPY, and for a batch
//! holding a record already stored, staging + `INSERT … ON CONFLICT DO NOTHING`): a row per
//! record however often it comes. It runs as many tasks as the persister has writers,
//! with the sink's and the consumers' default batches (`BATCH`) and PostgreSQL's driver
//! rewriting batched inserts into multi-row ones (`reWriteBatchedInserts`). By hand on 1M of
//! these rows (2026-12-04, 2 tasks): batches of 500 39.8k rows/s, of 5,000 37.7–40.9k; plain
//! inserts instead of upserts (not idempotent) 44.6k; 4 tasks 30.5k (2 cores).
//!
//! Owns: the peer's input, its configuration, its process and its figures. Must not: run
//! without the jars `scripts/bench` fetches (`SLUICE_KAFKA_CONNECT_LIB`; without them the run
//! says "not measured" and why), or leave the JVM running.

use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::time::Duration;

use super::super::Shape;
use super::super::host::{cpu_ticks, hwm_kib, now};
use super::super::kafka;
use super::super::report::{KafkaConnect, KafkaConnectRun};
use super::{Bench, Drain, DrainWatch, RunError, blocking, failed, io, log, random};
use crate::Process;

/// Where `scripts/bench` put Kafka Connect's, the sink's and the driver's jars.
pub const LIB_ENV: &str = "SLUICE_KAFKA_CONNECT_LIB";

/// How often its table's rows are counted: a count is a scan of the table (~370 MB at 1M
/// rows) on the machine's two cores, so not as often as the persister's counter is read.
const PROBE: Duration = Duration::from_secs(1);

/// The sink's `batch.size` and the consumers' `max.poll.records`: both defaults (5,000 was no
/// faster).
const BATCH: u64 = 500;

/// The jar in `lib` whose name is `artifact-VERSION.jar`: its version.
fn jar_version(lib: &Path, artifact: &str) -> Option<String> {
    let prefix = format!("{artifact}-");
    std::fs::read_dir(lib).ok()?.flatten().find_map(|entry| {
        let name = entry.file_name().into_string().ok()?;
        let version = name.strip_prefix(&prefix)?.strip_suffix(".jar")?;
        version.starts_with(|c: char| c.is_ascii_digit()).then(|| version.to_string())
    })
}

impl Bench {
    /// Kafka Connect storing `records` records of `shape` with `tasks` tasks; "not measured"
    /// when its jars are not there.
    pub(super) async fn kafka_connect(
        &self,
        records: u64,
        shape: &Shape,
        tasks: u64,
    ) -> Result<KafkaConnectRun, RunError> {
        let Some(lib) = std::env::var_os(LIB_ENV).map(PathBuf::from).filter(|lib| lib.is_dir()) else {
            return Ok(KafkaConnectRun::NotMeasured(format!(
                "{LIB_ENV} is not set to its jars (scripts/bench fetches them)"
            )));
        };
        let (Some(connect), Some(sink)) =
            (jar_version(&lib, "connect-runtime"), jar_version(&lib, "debezium-connector-jdbc"))
        else {
            return Ok(KafkaConnectRun::NotMeasured(format!(
                "no connect-runtime or debezium-connector-jdbc jar in {}",
                lib.display()
            )));
        };
        let java = std::process::Command::new("java").arg("-version").output();
        if !java.as_ref().is_ok_and(|out| out.status.success()) {
            return Ok(KafkaConnectRun::NotMeasured("no `java` to run it (Java 17 or newer)".into()));
        }
        let version = format!("Kafka Connect {connect}, Debezium JDBC sink {sink}");
        let topic = format!("bench-kafka-connect-{}-{}", self.stamp, random());
        let measured = self.kafka_connect_on(&lib, version, &topic, (records, shape, tasks)).await;
        // Its input is ~1 KB a record: not left for the broker's retention.
        if let Err(error) = kafka::delete_topic(&self.services.kafka, &topic).await {
            log(&format!("could not delete {topic}: {error}"));
        }
        measured
    }

    /// [`Bench::kafka_connect`] with its jars in `lib`, its input in `topic`.
    async fn kafka_connect_on(
        &self,
        lib: &Path,
        version: String,
        topic: &str,
        (records, shape, tasks): (u64, &Shape, u64),
    ) -> Result<KafkaConnectRun, RunError> {
        let schema = self.new_schema();
        let table = format!("{schema}.kafka_connect_rows");
        log(&format!("{version}: {records} records from {topic} into {table}"));
        let (brokers, name, input) = (self.services.kafka.clone(), topic.to_string(), shape.clone());
        let message_bytes = blocking(move || kafka::kafka_connect_input(&brokers, &name, records, &input)).await?;
        self.sql(&format!(
            "CREATE SCHEMA {schema};
             CREATE TABLE {table} (
                 agent uuid NOT NULL, seq bigint NOT NULL, ingest_time timestamptz NOT NULL, level text,
                 format text NOT NULL, pod_namespace text, pod_name text, record json NOT NULL,
                 PRIMARY KEY (agent, seq, ingest_time));
             CREATE INDEX ON {table} USING brin (ingest_time);
             CREATE INDEX ON {table} (pod_namespace, pod_name);"
        ))
        .await?;

        let dir = self.work.path().join(format!("kafka-connect-{}", random()));
        std::fs::create_dir_all(&dir).map_err(io("making Kafka Connect's work dir"))?;
        let worker = dir.join("worker.properties");
        let connector = dir.join("sink.properties");
        std::fs::write(&worker, self.worker_properties(&dir)).map_err(io("writing worker.properties"))?;
        std::fs::write(&connector, self.sink_properties(topic, &table, tasks)?)
            .map_err(io("writing sink.properties"))?;
        let mut command = std::process::Command::new("java");
        command
            .arg("-Xmx1g")
            .arg("-cp")
            .arg(format!("{}/*", lib.display()))
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                self.root.join("scripts/kafka-connect/log4j2.properties").display()
            ))
            .arg("org.apache.kafka.connect.cli.ConnectStandalone")
            .arg(&worker)
            .arg(&connector);
        let started = now();
        let mut peer = Process::start("kafka-connect", command, &dir);
        let measured = self.wait_table_rows(&mut peer, &table, records, Duration::from_secs(600)).await;
        let pid = peer.pid();
        let (cpu_at_last, peak_rss) = (cpu_ticks(pid), hwm_kib(pid));
        // Killed, not stopped: it has stored every row it will be asked for, and Connect's
        // graceful stop can wait on a task's consumer for minutes (seen with 4 tasks).
        peer.kill();
        let drain = measured?;
        let row = self.db.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await?;
        let rows = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
        self.sql(&format!("DROP SCHEMA {schema} CASCADE")).await?;
        if rows != records {
            return Err(failed(format!("Kafka Connect stored {rows} rows for {records} records")));
        }
        let figures = drain.figures(records, started, cpu_at_last, self.ticks);
        Ok(KafkaConnectRun::Measured(KafkaConnect {
            version,
            records,
            rows_in_postgres: rows,
            tasks,
            batch_size: BATCH,
            message_bytes,
            rows_per_second: figures.rows_per_second,
            seconds: figures.seconds,
            cpu_seconds: figures.cpu_seconds,
            cpu_cores_per_10k_rows_per_second: figures.cores_per_10k_rows_per_second,
            peak_rss_mib: peak_rss as f64 / 1024.0,
        }))
    }

    fn worker_properties(&self, dir: &Path) -> String {
        format!(
            "bootstrap.servers={kafka}
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
value.converter.schemas.enable=true
offset.storage.file.filename={offsets}
listeners=http://127.0.0.1:0
plugin.discovery=only_scan
consumer.auto.offset.reset=earliest
consumer.max.poll.records={BATCH}
",
            kafka = self.services.kafka,
            offsets = dir.join("offsets").display(),
        )
    }

    fn sink_properties(&self, topic: &str, table: &str, tasks: u64) -> Result<String, RunError> {
        let pg = tokio_postgres::Config::from_str(&self.services.pg)?;
        let host = pg.get_hosts().iter().find_map(|host| match host {
            tokio_postgres::config::Host::Tcp(host) => Some(host.clone()),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(_) => None,
        });
        let host = host.ok_or_else(|| failed("SLUICE_TEST_PG names no TCP host for Kafka Connect's JDBC URL"))?;
        let port = pg.get_ports().first().copied().unwrap_or(5432);
        let database = pg.get_dbname().unwrap_or("postgres");
        let user = pg.get_user().unwrap_or("postgres");
        let password = pg.get_password().map(String::from_utf8_lossy).unwrap_or_default();
        // Its own consumer group each run: a killed run's members would hold the next one in a
        // rebalance until their session timed out.
        let name = random();
        Ok(format!(
            "name=sluice-bench-sink-{name}
connector.class=io.debezium.connector.jdbc.JdbcSinkConnector
tasks.max={tasks}
topics={topic}
connection.url=jdbc:postgresql://{host}:{port}/{database}?stringtype=unspecified&reWriteBatchedInserts=true
connection.username={user}
connection.password={password}
insert.mode=upsert
primary.key.mode=record_value
primary.key.fields=agent,seq,ingest_time
schema.evolution=none
collection.name.format={table}
batch.size={BATCH}
"
        ))
    }

    /// Waits until `table` holds `expected` rows (counted every [`PROBE`]); fails at once
    /// when the peer exits or logs an error (a failed task would leave it idling).
    async fn wait_table_rows(
        &self,
        peer: &mut Process,
        table: &str,
        expected: u64,
        limit: Duration,
    ) -> Result<Drain, RunError> {
        let deadline = now() + limit.as_secs_f64();
        let count = format!("SELECT count(*) FROM {table}");
        let mut watch = DrainWatch::default();
        loop {
            // The count sees the rows committed when it started.
            let (at, cpu) = (now(), cpu_ticks(peer.pid()));
            let row = self.db.query_one(&count, &[]).await?;
            let rows = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
            if let Some(drain) = watch.observe(at, rows, cpu, expected) {
                return Ok(drain);
            }
            let log = peer.log_text();
            let errors: Vec<&str> = log.lines().filter(|line| line.contains("] ERROR ")).take(5).collect();
            if !errors.is_empty() {
                return Err(failed(format!("Kafka Connect logged errors:\n{}", errors.join("\n"))));
            }
            if now() > deadline {
                return Err(failed(format!(
                    "Kafka Connect stored {rows} of {expected} rows within {} s\n{}",
                    limit.as_secs(),
                    peer.log_tail(10)
                )));
            }
            if !peer.running() {
                return Err(failed(format!("Kafka Connect exited\n{}", peer.log_tail(10))));
            }
            tokio::time::sleep(PROBE).await;
        }
    }
}
