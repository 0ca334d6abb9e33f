//! One test's setup, said once, and the waits every test shares.
//!
//! Owns: the preamble most integration tests began with — the stack's services, a fresh topic
//! created with its partitions (on the stack's broker or a private one), a [`TestConfig`] wired
//! to it, the settings the test changes — as the [`Scenario`] builder and the [`Setup`] it
//! builds; and every wait on a condition: rows, a metric reaching a value or settling, a scrape,
//! a log line, the consumer group caught up with its topic, nothing left to arrive. All waits poll through [`until_within`], which fails
//! the test naming what it waited for and what it last saw. Must not: sleep for a fixed time
//! (a wait ends when its condition holds, or fails), or handle processes itself beyond calling
//! support's `start_agent`, `start_persister` and `TestConfig::spawn_agent_at`.

use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use sluice::telemetry;
use tokio::time::Instant;

use super::{
    Metrics, Pipeline, PrivateBroker, Process, Services, TestConfig, WAIT, create_topic, pg, row_count, scrape,
    services, start_agent, start_persister, unique,
};

/// The spool's directory in the test's directory.
const SPOOL: &str = "spool";

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(100);

/// What a test is about to run against, described before anything starts: a topic named from
/// `prefix` (one partition on the stack's broker unless told otherwise) and the config both
/// processes read, with the test's settings. [`Scenario::build`] creates the topic.
#[must_use = "a scenario does nothing until it is built"]
pub struct Scenario {
    services: Services,
    topic: String,
    /// Partitions to create the topic with; `None`: no topic is created.
    partitions: Option<i32>,
    bootstrap: String,
    closed: ClosedPort,
    config: TestConfig,
}

impl Scenario {
    /// A fresh topic (`prefix_…`) with one partition on the stack's broker, and a config wired to
    /// it and to the stack's PostgreSQL (own schema, group, socket and admin ports).
    pub fn new(prefix: &str) -> Self {
        let services = services();
        let topic = unique(prefix);
        let config = TestConfig::new(&services, &topic);
        let bootstrap = services.kafka.clone();
        Self { services, topic, partitions: Some(1), bootstrap, closed: ClosedPort::new(), config }
    }

    /// The topic gets `partitions` partitions.
    pub fn partitions(mut self, partitions: i32) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// The topic lives on `broker`, a private broker the test may stop; both processes use it.
    pub fn on(mut self, broker: &PrivateBroker) -> Self {
        self.bootstrap = broker.bootstrap.clone();
        self.config.set("kafka", "brokers", broker.bootstrap.clone());
        self
    }

    /// The topic is not created (the test's processes never read or write it).
    pub fn without_topic(mut self) -> Self {
        self.partitions = None;
        self
    }

    /// Kafka never answers: the brokers' address is a port nothing listens on (see
    /// [`ClosedPort`]), and no topic is created.
    pub fn kafka_unreachable(mut self) -> Self {
        self.config.set("kafka", "brokers", self.closed.address());
        self.without_topic()
    }

    /// A disk buffer, its spool in the test's directory ([`Setup::spool`]).
    pub fn disk_buffer(self) -> Self {
        let spool = self.config.dir.path().join(SPOOL).display().to_string();
        self.set("buffer", "type", "disk").set("buffer", "path", spool)
    }

    /// Sets `section.key` (see [`TestConfig::set`]).
    pub fn set(mut self, section: &str, key: &str, value: impl Into<toml::Value>) -> Self {
        self.config.set(section, key, value);
        self
    }

    /// Sets `key` of listener `name` (see [`TestConfig::listener`]).
    pub fn listener(mut self, name: &str, key: &str, value: impl Into<toml::Value>) -> Self {
        self.config.listener(name, key, value);
        self
    }

    /// Lets `configure` change the config (several settings, a listener whose socket the test
    /// keeps).
    pub fn with(mut self, configure: impl FnOnce(&mut TestConfig)) -> Self {
        configure(&mut self.config);
        self
    }

    /// Creates the topic (unless told not to); nothing runs yet.
    pub async fn build(self) -> Setup {
        let Self { services, topic, partitions, bootstrap, closed, config } = self;
        if let Some(partitions) = partitions {
            create_topic(&bootstrap, &topic, partitions).await;
        }
        Setup { services, topic, bootstrap, closed, config }
    }

    /// Builds, then starts a persister and an agent and waits until both are ready.
    pub async fn pipeline(self) -> Pipeline {
        let setup = self.build().await;
        let persister = setup.persister().await;
        let agent = setup.agent().await;
        let db = setup.db().await;
        let Setup { topic, config, .. } = setup;
        Pipeline { topic, persister, agent, db, config }
    }
}

/// A built [`Scenario`]: the topic exists; the test starts what it needs.
pub struct Setup {
    pub services: Services,
    pub topic: String,
    /// The broker the topic is on.
    pub bootstrap: String,
    closed: ClosedPort,
    /// Last: fields drop in order, and its directory holds the processes' logs, which a failing
    /// test prints.
    pub config: TestConfig,
}

impl Setup {
    /// Starts `sluice agent` on the config and waits until it is ready.
    pub async fn agent(&self) -> Process {
        start_agent(&self.config).await
    }

    /// Starts `sluice agent` and waits only until its sockets exist: with Kafka unreachable it
    /// never becomes ready. Its config file is returned too, for a test that changes it.
    pub async fn listening_agent(&self) -> (PathBuf, Process) {
        let path = self.config.write();
        let agent = self.config.spawn_agent_at(&path).await;
        (path, agent)
    }

    /// Starts `sluice persist` on the config and waits until it is ready (partitions assigned).
    pub async fn persister(&self) -> Process {
        start_persister(&self.config).await
    }

    /// The config of another persister in the same group (same topic, schema and settings) with
    /// an admin port and a directory of its own, so several can run at once.
    pub fn group_member(&self) -> TestConfig {
        let mut member = TestConfig::new(&self.services, &self.topic);
        let admin = member.table["persist"]["admin_listen"].clone();
        member.table = self.config.table.clone();
        member.set("persist", "admin_listen", admin);
        member.env = self.config.env.clone();
        member
    }

    /// A client on the test's schema.
    pub async fn db(&self) -> tokio_postgres::Client {
        pg(&self.services, &self.config.schema()).await
    }

    /// The spool's directory, with [`Scenario::disk_buffer`].
    pub fn spool(&self) -> PathBuf {
        self.config.dir.path().join(SPOOL)
    }

    /// An address where Kafka never answers, for a test that runs an agent offline first.
    pub fn unreachable_kafka(&self) -> String {
        self.closed.address()
    }
}

/// A loopback port that refuses every connection for as long as this lives: a TCP socket bound
/// to port 0 and never listening. Nothing else can bind the port meanwhile, and the kernel does
/// not hand it to an outgoing connection (which could otherwise connect to itself).
pub struct ClosedPort(tokio::net::TcpSocket);

impl ClosedPort {
    /// Binds a loopback port chosen by the kernel.
    pub fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket.bind(([127, 0, 0, 1], 0).into()).expect("bind a loopback port");
        Self(socket)
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        self.0.local_addr().expect("a bound socket has an address").to_string()
    }
}

/// Polls `probe` every 100 ms until it returns `Ok`. After `limit` (a probe that hangs counts
/// too) fails the test, naming `what` it waited for and the last `Err`: what it saw instead.
pub async fn until_within<T, E, F>(limit: Duration, what: &str, mut probe: impl FnMut() -> F) -> T
where
    E: Display,
    F: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + limit;
    let mut seen = String::from("nothing yet (the first look did not finish)");
    loop {
        match tokio::time::timeout_at(deadline, probe()).await {
            Ok(Ok(value)) => return value,
            Ok(Err(last)) => seen = last.to_string(),
            Err(_) => break,
        }
        if Instant::now() + POLL >= deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("timed out after {limit:?} waiting for {what}; last seen: {seen}")
}

/// [`until_within`] the usual limit, [`WAIT`].
pub async fn until<T, E, F>(what: &str, probe: impl FnMut() -> F) -> T
where
    E: Display,
    F: Future<Output = Result<T, E>>,
{
    until_within(WAIT, what, probe).await
}

/// Waits until `logs` holds at least `n` rows; the count seen.
pub async fn until_rows(db: &tokio_postgres::Client, n: i64) -> i64 {
    until_rows_within(db, n, WAIT).await
}

/// [`until_rows`] with a limit of its own (a long load).
pub async fn until_rows_within(db: &tokio_postgres::Client, n: i64, limit: Duration) -> i64 {
    until_within(limit, &format!("{n} rows in logs"), || async {
        let count = row_count(db).await;
        if count >= n { Ok(count) } else { Err(format!("{count} rows")) }
    })
    .await
}

/// Scrapes `admin` until `holds` says yes; the scrape that showed it.
pub async fn until_scrape(admin: SocketAddr, what: &str, holds: impl Fn(&Metrics) -> bool) -> Metrics {
    until(what, || async {
        let metrics = scrape(admin).await;
        if holds(&metrics) {
            Ok(metrics)
        } else {
            Err(format!("a scrape with these non-zero series:\n{}", nonzero(&metrics)))
        }
    })
    .await
}

/// Scrapes `admin` until `name{labels}` (summed over other labels) is exactly `value`.
pub async fn until_metric(admin: SocketAddr, name: &str, labels: &[(&str, &str)], value: f64) -> Metrics {
    until_series(admin, name, labels, &format!("= {value}"), |seen| seen == value).await
}

/// Scrapes `admin` until `name{labels}` is at least `value` (a counter on its way up).
pub async fn until_metric_at_least(admin: SocketAddr, name: &str, labels: &[(&str, &str)], value: f64) -> Metrics {
    until_series(admin, name, labels, &format!(">= {value}"), |seen| seen >= value).await
}

async fn until_series(
    admin: SocketAddr,
    name: &str,
    labels: &[(&str, &str)],
    wanted: &str,
    holds: impl Fn(f64) -> bool,
) -> Metrics {
    until(&format!("{name}{labels:?} {wanted}"), || async {
        let metrics = scrape(admin).await;
        let seen = metrics.count(name, labels);
        if holds(seen) { Ok(metrics) } else { Err(seen) }
    })
    .await
}

/// Scrapes `admin` until `name{labels}` has stopped changing: above zero and the same for a
/// second. For "the process has taken in all it will" when no count says how much that is (a
/// peer held half way, a budget that decides); the value it settled at.
pub async fn until_settled(admin: SocketAddr, name: &str, labels: &[(&str, &str)]) -> f64 {
    const QUIET: Duration = Duration::from_secs(1);
    let last = std::cell::Cell::new(None::<(f64, Instant)>);
    until(&format!("{name}{labels:?} to settle"), || async {
        let seen = scrape(admin).await.count(name, labels);
        match last.get() {
            Some((value, since)) if value == seen && seen > 0.0 => {
                if since.elapsed() >= QUIET {
                    Ok(seen)
                } else {
                    Err(format!("{seen} for {:?}", since.elapsed()))
                }
            }
            _ => {
                last.set(Some((seen, Instant::now())));
                Err(format!("{seen}, changing"))
            }
        }
    })
    .await
}

/// Waits until `process` has logged `text`.
pub async fn until_logged(process: &Process, text: &str) {
    until(&format!("{} to log {text:?}", process.name), || async {
        if process.log_text().contains(text) { Ok(()) } else { Err(format!("not in {}", process.log.display())) }
    })
    .await
}

/// Waits until the persisters of `config` (its `persist.group_id`) have committed every message
/// the topic (its `kafka.topic`, on its `kafka.brokers`) holds now: each is a row, a dead letter
/// or counted, and no more can come from what is in Kafka.
pub async fn until_caught_up(config: &TestConfig) {
    let table = &config.table;
    let text = |section: &str, key: &str| table[section][key].as_str().expect("a string key").to_string();
    let (bootstrap, group, topic) = (text("kafka", "brokers"), text("persist", "group_id"), text("kafka", "topic"));
    // One client for every look (it asks the group's coordinator; it never joins the group).
    let client: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", &bootstrap).set("group.id", &group).create().expect("consumer");
    let client = std::sync::Arc::new(client);
    until(&format!("group {group} to commit all of {topic}"), || {
        let (client, topic) = (client.clone(), topic.clone());
        async move {
            let progress = tokio::task::spawn_blocking(move || group_progress(&client, &topic));
            let (ends, committed) = progress.await.map_err(|error| error.to_string())??;
            let behind = ends.iter().zip(&committed).any(|(end, committed)| committed < end);
            if behind { Err(format!("committed {committed:?} of {ends:?}")) } else { Ok(()) }
        }
    })
    .await;
}

/// Per partition of `topic`: its high watermark, and the offset the client's group committed
/// (0 if none).
fn group_progress(client: &BaseConsumer, topic: &str) -> Result<(Vec<i64>, Vec<i64>), String> {
    let timeout = Duration::from_secs(10);
    let metadata = client.fetch_metadata(Some(topic), timeout).map_err(|error| format!("metadata: {error}"))?;
    let partitions: Vec<i32> = metadata.topics().iter().flat_map(|t| t.partitions()).map(|p| p.id()).collect();
    if partitions.is_empty() {
        return Err(format!("no partitions of {topic} yet"));
    }
    let mut wanted = rdkafka::TopicPartitionList::new();
    for partition in &partitions {
        wanted.add_partition(topic, *partition);
    }
    let committed = client.committed_offsets(wanted, timeout).map_err(|error| format!("committed offsets: {error}"))?;
    let mut progress = (Vec::new(), Vec::new());
    for partition in &partitions {
        let (_, end) =
            client.fetch_watermarks(topic, *partition, timeout).map_err(|error| format!("watermarks: {error}"))?;
        let at = committed.find_partition(topic, *partition).and_then(|p| p.offset().to_raw()).unwrap_or(0);
        progress.0.push(end);
        progress.1.push(at.max(0));
    }
    Ok(progress)
}

/// Waits until nothing more can arrive in `logs`: the agent holds no record (none waits to be
/// sent, or sent again) and the persisters have committed every message in the topic. Then a
/// duplicate or a record that should not be stored would already show.
pub async fn until_nothing_left(config: &TestConfig) {
    until_scrape(config.agent_admin(), "the agent to hold no record", |metrics| {
        metrics.count(telemetry::BUFFER_RECORDS, &[]) == 0.0 && metrics.count(telemetry::SPOOL_RECORDS, &[]) == 0.0
    })
    .await;
    until_caught_up(config).await;
}

/// The non-zero `sluice_*` series of a scrape, for a failure message.
pub fn nonzero(metrics: &Metrics) -> String {
    metrics.0.lines().filter(|l| l.starts_with(telemetry::PREFIX) && !l.ends_with(" 0")).collect::<Vec<_>>().join("\n")
}

/// What a stopped process counted, from its `final counts` log line (summed over the labels not
/// given, like [`Metrics::count`]).
pub fn final_count(log: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let line = log.lines().rev().find(|line| line.contains("\"final counts\"")).expect("a final counts line");
    let value: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
    sluice::telemetry::scrape::Scrape::from_counts(&value["counts"]).sum(name, labels)
}
