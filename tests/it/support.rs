//! Shared helpers for the integration tests: the services from `scripts/stack env`, unique
//! names, the real `sluice` binary started as a child process on a temp socket (all from
//! `sluice-harness`, which the benchmark shares), metric scrapes and waiting for rows. Every
//! child is killed by pid when its handle drops.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use sluice::telemetry::scrape::Scrape;
use tokio::io::AsyncWriteExt;

mod acks;
mod broker;
mod clients;
mod load;
mod postgres;
mod proxy;
mod scenario;

pub use acks::{AckReader, Acknowledged, Settled, open_acknowledged};
pub use broker::{PrivateBroker, SASL_PASSWORD};
pub use clients::{fluent_logger, logger, python, python_syslog_handler};
pub use load::{AckedSender, Load, assert_each_once, numbered, numbered_lines, numbers_in, stored_numbers};
pub use postgres::PrivatePostgres;
pub use proxy::Proxy;
pub use scenario::{
    Scenario, Setup, final_count, nonzero, until, until_caught_up, until_logged, until_metric, until_metric_at_least,
    until_nothing_left, until_rows, until_rows_within, until_scrape, until_settled, until_within,
};
pub use sluice_harness::{
    Process, Services, TestConfig, WAIT, free_port, http_get, services, start_agent, start_persister, unique,
    wait_ready, within,
};

/// A path in the source tree (`scripts/kafka/log4j2.yaml`). Read from `CARGO_MANIFEST_DIR` as
/// cargo sets it when it runs the test, not as it was at compile time: clones sharing one
/// `target/` share test binaries, and the compile-time value names whichever clone built it
/// last (a clean-clone CI run's, deleted since).
pub fn source_path(relative: &str) -> std::path::PathBuf {
    let root: std::path::PathBuf =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into);
    root.join(relative)
}

/// Creates a topic with `partitions` partitions on the broker at `bootstrap`.
pub async fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("kafka admin client");
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let results = within(WAIT, "create topic", admin.create_topics([&topic], &AdminOptions::new()))
        .await
        .expect("create_topics request");
    for result in results {
        result.unwrap_or_else(|(topic, error)| panic!("cannot create topic {topic}: {error}"));
    }
}

/// The Prometheus text of `/metrics`.
pub async fn scrape(admin: SocketAddr) -> Metrics {
    let (status, body) = http_get(admin, "/metrics").await.expect("scrape");
    assert_eq!(status, 200, "{body}");
    Metrics(body)
}

/// A scrape, queried by name and labels (`sluice::telemetry::scrape::Scrape`); its text is
/// kept for failure messages and line-level checks.
pub struct Metrics(pub String);

impl Metrics {
    /// The sum of the samples of `name` that carry `labels` (other labels, such as `listener`,
    /// are summed over), if any is present.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        Scrape::parse(&self.0).value(name, labels)
    }

    /// Like [`Metrics::value`], 0 when the series does not exist yet.
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        Scrape::parse(&self.0).sum(name, labels)
    }

    /// True if any sample of `name` (any labels) is present.
    pub fn has(&self, name: &str) -> bool {
        Scrape::parse(&self.0).has(name)
    }
}

/// A PostgreSQL client on the test database, `search_path` set to `schema`.
pub async fn pg(services: &Services, schema: &str) -> tokio_postgres::Client {
    let mut config: tokio_postgres::Config = services.pg.parse().expect("SLUICE_TEST_PG is a URL");
    config.options(format!("-c search_path={schema}"));
    let (client, connection) =
        within(WAIT, "connect to postgres", config.connect(tokio_postgres::NoTls)).await.expect("connect to postgres");
    tokio::spawn(connection);
    client
}

/// Rows in `logs` (0 while the table does not exist yet).
pub async fn row_count(client: &tokio_postgres::Client) -> i64 {
    match client.query_one("SELECT count(*) FROM logs", &[]).await {
        Ok(row) => row.get(0),
        Err(_) => 0,
    }
}

/// Writes `lines` (each followed by `\n`) on one connection and closes it.
pub async fn send_lines(socket: &Path, lines: &[Vec<u8>]) {
    let mut stream =
        within(WAIT, "connect to the agent", tokio::net::UnixStream::connect(socket)).await.expect("connect");
    let mut buffer = Vec::new();
    for line in lines {
        buffer.extend_from_slice(line);
        buffer.push(b'\n');
    }
    within(WAIT, "write lines", stream.write_all(&buffer)).await.expect("write");
    stream.shutdown().await.expect("shutdown");
}

/// A whole pipeline for one test: its own topic, config, persister, agent and database client.
pub struct Pipeline {
    pub topic: String,
    pub persister: Process,
    /// Held so the agent runs as long as the pipeline does.
    #[allow(dead_code)]
    pub agent: Process,
    pub db: tokio_postgres::Client,
    /// Last: fields drop in order, and its directory holds the processes' logs, which a failing
    /// test prints.
    pub config: TestConfig,
}

/// Produces `payloads` to `topic` (partition 0), in order, and waits until Kafka has each.
pub async fn produce(bootstrap: &str, topic: &str, payloads: &[Vec<u8>]) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for payload in payloads {
        let record = FutureRecord::<(), _>::to(topic).partition(0).payload(payload);
        within(WAIT, "produce", producer.send(record, WAIT)).await.expect("delivered");
    }
}

/// Day partitions of `logs` as a database before migration V3 had them (then `logs` was the
/// table; `schema::ensure_partitions` makes them for the current layout's `log_rows`).
pub async fn partitions_before_v3(db: &tokio_postgres::Client, days: &[chrono::NaiveDate]) {
    for day in days {
        let next = *day + chrono::Days::new(1);
        db.batch_execute(&format!(
            "CREATE TABLE {} PARTITION OF logs FOR VALUES FROM ('{day} 00:00:00+00') TO ('{next} 00:00:00+00')",
            sluice::persist::schema::partition_name(*day)
        ))
        .await
        .expect("a partition of the old layout");
    }
}

/// The first column of every row `sql` returns.
pub async fn column<T>(db: &tokio_postgres::Client, sql: &str) -> Vec<T>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    db.query(sql, &[]).await.expect(sql).iter().map(|row| row.get(0)).collect()
}

/// The rows `sql` returns, as (first column, second column) pairs.
pub async fn pairs<A, B>(db: &tokio_postgres::Client, sql: &str) -> Vec<(A, B)>
where
    A: for<'a> tokio_postgres::types::FromSql<'a>,
    B: for<'a> tokio_postgres::types::FromSql<'a>,
{
    db.query(sql, &[]).await.expect(sql).iter().map(|row| (row.get(0), row.get(1))).collect()
}

/// An envelope as the agent writes it: record id `id`, ingested at `ingest_time` (RFC 3339), a
/// JSON record.
pub fn envelope(id: &str, ingest_time: &str, record: &str) -> Vec<u8> {
    format!(r#"{{"v":1,"id":"{id}","ingest_time":"{ingest_time}","format":"json","record":{record}}}"#).into_bytes()
}

/// Now, as an envelope's `ingest_time`.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// What a topic holds, read from offset 0 to its end: how many messages, and the record id and
/// app payload of each (envelopes; a message that is not one is kept with an empty id).
pub struct TopicContents {
    pub messages: u64,
    pub ids: Vec<String>,
    pub payloads: Vec<String>,
    /// Each message's first byte: its envelope's encoding (`{` JSON, 2 binary).
    pub first_bytes: Vec<u8>,
    /// Each message's key (lossy text), if it has one.
    pub keys: Vec<Option<String>>,
    /// Each message's headers, name and (lossy text) value, in order.
    pub headers: Vec<Vec<(String, String)>>,
}

impl TopicContents {
    pub fn distinct_ids(&self) -> usize {
        self.ids.iter().collect::<std::collections::HashSet<_>>().len()
    }
}

/// Reads all of `topic` on the broker at `bootstrap` (every partition, from its low watermark to
/// its high watermark as they are now).
pub async fn read_topic(bootstrap: &str, topic: &str) -> TopicContents {
    use rdkafka::Message as _;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let (bootstrap, topic) = (bootstrap.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", unique("reader"))
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let metadata = consumer.fetch_metadata(Some(&topic), Duration::from_secs(10)).expect("metadata");
        let mut assignment = rdkafka::TopicPartitionList::new();
        let mut remaining = 0u64;
        for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
            let (low, high) =
                consumer.fetch_watermarks(&topic, partition.id(), Duration::from_secs(10)).expect("watermarks");
            if high > low {
                assignment.add_partition_offset(&topic, partition.id(), rdkafka::Offset::Offset(low)).expect("offset");
                remaining += (high - low) as u64;
            }
        }
        let mut contents = TopicContents {
            messages: 0,
            ids: Vec::new(),
            payloads: Vec::new(),
            first_bytes: Vec::new(),
            keys: Vec::new(),
            headers: Vec::new(),
        };
        if remaining > 0 {
            consumer.assign(&assignment).expect("assign");
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while contents.messages < remaining {
            assert!(Instant::now() < deadline, "read {} of {remaining} messages of {topic}", contents.messages);
            let Some(message) = consumer.poll(Duration::from_secs(1)) else { continue };
            let message = message.expect("message");
            contents.messages += 1;
            let value = message.payload().unwrap_or_default();
            contents.first_bytes.push(value.first().copied().unwrap_or_default());
            contents.keys.push(message.key().map(|key| String::from_utf8_lossy(key).into_owned()));
            contents.headers.push(
                message
                    .headers()
                    .map(|headers| {
                        use rdkafka::message::Headers as _;
                        headers
                            .iter()
                            .map(|header| {
                                (
                                    header.key.to_string(),
                                    String::from_utf8_lossy(header.value.unwrap_or_default()).into_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            );
            match sluice::envelope::Envelope::parse(value) {
                Ok(envelope) => {
                    contents.payloads.push(envelope.body.written().to_owned());
                    contents.ids.push(envelope.id.text().into_owned());
                }
                Err(_) => {
                    contents.payloads.push(String::from_utf8_lossy(value).into_owned());
                    contents.ids.push(String::new());
                }
            }
        }
        contents
    })
    .await
    .expect("reader task")
}
