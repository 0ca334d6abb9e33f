//! Shared helpers for the integration tests: the services from `scripts/stack env`, unique
//! names, the real `sluice` binary started as a child process on a temp socket, metric scrapes
//! and waiting for rows. Every child is killed by pid when its handle drops.

use std::collections::HashMap;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod acks;
mod broker;
mod clients;
mod load;
mod postgres;
mod proxy;
mod scenario;

pub use acks::{AckReader, Settled, open_acknowledged};
pub use broker::{PrivateBroker, SASL_PASSWORD};
pub use clients::{fluent_logger, logger, python_syslog_handler};
pub use load::{AckedSender, Load, numbered, numbers_in};
pub use postgres::PrivatePostgres;
pub use proxy::Proxy;
pub use scenario::{
    Scenario, Setup, nonzero, until, until_caught_up, until_logged, until_metric, until_metric_at_least,
    until_nothing_left, until_rows, until_rows_within, until_scrape, until_settled,
};

/// Any single wait in a test is bounded by this unless it says otherwise.
pub const WAIT: Duration = Duration::from_secs(60);

/// The services the stack started (`scripts/stack env`).
#[derive(Clone, Debug)]
pub struct Services {
    pub kafka: String,
    pub pg: String,
}

pub fn services() -> Services {
    let read = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set. Integration tests run against real services: \
                 `scripts/stack up && export $(scripts/stack env)`, or run `scripts/test`."
            )
        })
    };
    Services { kafka: read("SLUICE_TEST_KAFKA"), pg: read("SLUICE_TEST_PG") }
}

/// A name no other test (or earlier run) uses: lower-case, valid as topic and schema name.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{prefix}_{}_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed), nanos % 1_000_000_000)
}

/// A free loopback port (bound, then released for the child to take). Taken below Linux's
/// ephemeral range (32768–60999), where the kernel never puts outgoing connections: a port the
/// kernel handed out (port 0) could be given to a client's connection before the child binds it
/// (seen: a persister's admin port taken in a full parallel run). Each call of this process
/// moves on from a random start, so two tests are not handed the same port.
pub fn free_port() -> u16 {
    static NEXT: std::sync::OnceLock<std::sync::atomic::AtomicU32> = std::sync::OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        std::sync::atomic::AtomicU32::new(nanos.wrapping_add(std::process::id()))
    });
    for _ in 0..2000 {
        let port = 20_000 + (next.fetch_add(1, Ordering::Relaxed) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between 20000 and 32000")
}

/// Fails the test if `future` takes longer than `limit`, naming what was awaited.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future).await.unwrap_or_else(|_| panic!("timed out after {limit:?}: {what}"))
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

/// The config both processes of a test read, as a TOML table tests may change.
pub struct TestConfig {
    pub table: toml::Table,
    pub dir: tempfile::TempDir,
    /// Environment for the processes started with this config (secrets, say).
    pub env: Vec<(String, String)>,
}

impl TestConfig {
    /// Agent and persister wired to the stack, on a fresh topic, schema, group, socket and ports.
    pub fn new(services: &Services, topic: &str) -> Self {
        let dir = tempfile::Builder::new().prefix("sluice-it").tempdir().expect("tempdir");
        let text = format!(
            r#"
            [log]
            level = "info,librdkafka=warn"
            [kafka]
            brokers = "{kafka}"
            topic = "{topic}"
            [agent]
            admin_listen = "127.0.0.1:{agent_port}"
            drain_timeout = "15s"
            [ingest.listeners.default]
            socket = "{socket}"
            [persist]
            admin_listen = "127.0.0.1:{persist_port}"
            group_id = "{group}"
            batch_max_wait = "100ms"
            [persist.properties]
            "session.timeout.ms" = "6000"
            "heartbeat.interval.ms" = "500"
            [postgres]
            url = "{pg}"
            schema = "{schema}"
            "#,
            kafka = services.kafka,
            pg = services.pg,
            agent_port = free_port(),
            persist_port = free_port(),
            socket = dir.path().join("sluice.sock").display(),
            group = unique("group"),
            schema = unique("t"),
        );
        let mut config = Self { table: text.parse().expect("test config parses"), dir, env: Vec::new() };
        // The stack's PostgreSQL offers TLS with its own CA: persisters use it, verified.
        if let Ok(ca) = std::env::var("SLUICE_TEST_PG_CA") {
            config.set("postgres", "ca_file", ca);
        }
        config
    }

    /// Sets `section.key` to `value`.
    pub fn set(&mut self, section: &str, key: &str, value: impl Into<toml::Value>) -> &mut Self {
        let entry = self.table.entry(section).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        entry.as_table_mut().expect("section is a table").insert(key.to_string(), value.into());
        self
    }

    fn get(&self, section: &str, key: &str) -> &str {
        self.table[section][key].as_str().expect("string key")
    }

    /// Sets `key` of listener `name` (`[ingest.listeners.NAME]`), creating the listener.
    pub fn listener(&mut self, name: &str, key: &str, value: impl Into<toml::Value>) -> &mut Self {
        let listeners = self.table["ingest"]["listeners"].as_table().cloned().unwrap_or_default();
        let mut listeners = listeners;
        let entry = listeners.entry(name).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        entry.as_table_mut().expect("listener is a table").insert(key.to_string(), value.into());
        self.table["ingest"].as_table_mut().expect("ingest is a table").insert("listeners".into(), listeners.into());
        self
    }

    /// Adds listener `name` speaking `protocol` on a new socket in the test's directory; returns
    /// the socket path.
    pub fn add_listener(&mut self, name: &str, protocol: &str) -> PathBuf {
        let socket = self.dir.path().join(format!("{name}.sock"));
        self.listener(name, "protocol", protocol).listener(name, "socket", socket.display().to_string());
        socket
    }

    /// The default listener's socket.
    pub fn socket(&self) -> PathBuf {
        self.listener_socket("default")
    }

    /// Listener `name`'s socket.
    pub fn listener_socket(&self, name: &str) -> PathBuf {
        PathBuf::from(self.table["ingest"]["listeners"][name]["socket"].as_str().expect("socket path"))
    }

    fn listener_sockets(&self) -> Vec<PathBuf> {
        let listeners = self.table["ingest"]["listeners"].as_table().expect("listeners");
        listeners.keys().map(|name| self.listener_socket(name)).collect()
    }

    pub fn agent_admin(&self) -> SocketAddr {
        self.get("agent", "admin_listen").parse().expect("address")
    }

    pub fn persist_admin(&self) -> SocketAddr {
        self.get("persist", "admin_listen").parse().expect("address")
    }

    pub fn schema(&self) -> String {
        self.get("postgres", "schema").to_string()
    }

    /// Writes the config to a new file in the test's directory.
    pub fn write(&self) -> PathBuf {
        let path = self.dir.path().join(format!("sluice-{}.toml", unique("cfg")));
        self.write_to(&path);
        path
    }

    /// Writes the config to `path` (replacing it).
    pub fn write_to(&self, path: &Path) {
        std::fs::write(path, toml::to_string(&self.table).expect("serialise config")).expect("write config");
    }

    /// Starts `sluice agent` on the config file at `path` (which a test may change later) and
    /// waits until it is listening.
    pub async fn spawn_agent_at(&self, path: &Path) -> Process {
        let agent =
            Process::spawn("agent", &["agent", "--config", path.to_str().expect("utf-8 path")], self.dir.path());
        for socket in self.listener_sockets() {
            eventually("socket", || async { socket.exists().then_some(()) }).await;
        }
        agent
    }
}

/// A running `sluice` child process; killed (by pid) when dropped.
pub struct Process {
    child: Option<Child>,
    pub log: PathBuf,
    pub name: &'static str,
}

impl Process {
    /// Starts the `sluice` binary with `args`, its output in a log file in `dir`.
    pub fn spawn(name: &'static str, args: &[&str], dir: &Path) -> Self {
        Self::spawn_with_env(name, args, dir, &[])
    }

    /// Like [`Process::spawn`], with extra environment variables.
    pub fn spawn_with_env(name: &'static str, args: &[&str], dir: &Path, env: &[(String, String)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command.args(args).envs(env.iter().map(|(k, v)| (k, v)));
        Self::start(name, command, dir)
    }

    /// Starts any command, its output in a log file in `dir`.
    pub fn start(name: &'static str, mut command: Command, dir: &Path) -> Self {
        let log = dir.join(format!("{name}-{}.log", unique("log")));
        let file = std::fs::File::create(&log).expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|error| panic!("start {name}: {error}"));
        Self { child: Some(child), log, name }
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| child.try_wait().ok().flatten().is_none())
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).expect("running")
    }

    pub fn signal(&self, signal: &str) {
        let status =
            Command::new("kill").args([&format!("-{signal}"), &self.pid().to_string()]).status().expect("kill");
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// Waits for the process to exit by itself.
    pub async fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {limit:?}; log:\n{}",
                self.name,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        // A failing test shows what its processes said: the harness prints this with the failure.
        if std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(25).collect();
            eprintln!("--- last lines of {} ({}):", self.name, self.log.display());
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// Starts `sluice agent` and waits until `/readyz` says ready.
pub async fn start_agent(config: &TestConfig) -> Process {
    let path = config.write();
    let mut process = Process::spawn_with_env(
        "agent",
        &["agent", "--config", path.to_str().expect("utf-8 path")],
        config.dir.path(),
        &config.env,
    );
    wait_ready(&mut process, config.agent_admin()).await;
    process
}

/// Starts `sluice persist` and waits until `/readyz` says ready (partitions assigned).
pub async fn start_persister(config: &TestConfig) -> Process {
    let path = config.write();
    let mut process = Process::spawn_with_env(
        "persist",
        &["persist", "--config", path.to_str().expect("utf-8 path")],
        config.dir.path(),
        &config.env,
    );
    wait_ready(&mut process, config.persist_admin()).await;
    process
}

pub async fn wait_ready(process: &mut Process, admin: SocketAddr) {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok((200, _)) = http_get(admin, "/readyz").await {
            return;
        }
        assert!(process.running(), "{} exited; log:\n{}", process.name, process.log_text());
        assert!(Instant::now() < deadline, "{} not ready within {WAIT:?}; log:\n{}", process.name, process.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A minimal HTTP/1.0 GET: status and body.
pub async fn http_get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let request = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        let status = response.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
        let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(10), request)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("http timeout")))
}

/// The Prometheus text of `/metrics`.
/// Scrapes until counter `name{labels}` reads `value` (a count follows the commit that made a
/// row visible by a moment); the scrape that showed it.
pub async fn wait_for_count(admin: SocketAddr, name: &str, labels: &[(&str, &str)], value: f64) -> Metrics {
    eventually(&format!("{name}{labels:?} = {value}"), || async {
        let metrics = scrape(admin).await;
        (metrics.count(name, labels) == value).then_some(metrics)
    })
    .await
}

pub async fn scrape(admin: SocketAddr) -> Metrics {
    let (status, body) = http_get(admin, "/metrics").await.expect("scrape");
    assert_eq!(status, 200, "{body}");
    Metrics(body)
}

/// A scrape, queried by name and labels.
pub struct Metrics(pub String);

impl Metrics {
    /// The sum of the samples of `name` that carry `labels` (other labels, such as `listener`,
    /// are summed over), if any is present.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let values: Vec<f64> = self
            .0
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (series_name, series_labels) = match series.split_once('{') {
                    Some((n, rest)) => (n, parse_labels(rest.trim_end_matches('}'))),
                    None => (series, HashMap::new()),
                };
                let matches = series_name == name
                    && labels.iter().all(|(k, v)| series_labels.get(k).map(String::as_str) == Some(*v));
                matches.then(|| value.parse::<f64>().ok()).flatten()
            })
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    /// Like [`Metrics::value`], 0 when the series does not exist yet.
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or(0.0)
    }

    /// True if any sample of `name` (any labels) is present.
    pub fn has(&self, name: &str) -> bool {
        self.0.lines().any(|line| {
            !line.starts_with('#') && (line.starts_with(&format!("{name} ")) || line.starts_with(&format!("{name}{{")))
        })
    }
}

fn parse_labels(text: &str) -> HashMap<&str, String> {
    text.split("\",")
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key.trim(), value.trim_matches('"').to_string()))
        })
        .collect()
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

/// Waits until `logs` holds at least `n` rows; returns the count seen.
pub async fn wait_for_rows(client: &tokio_postgres::Client, n: i64, limit: Duration) -> i64 {
    let deadline = Instant::now() + limit;
    loop {
        let count = row_count(client).await;
        if count >= n {
            return count;
        }
        assert!(Instant::now() < deadline, "only {count} of {n} rows after {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
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

/// Creates a topic with `partitions` partitions, lets `configure` adjust the config, then starts
/// a persister and an agent and waits until both are ready.
pub async fn start_pipeline(prefix: &str, partitions: i32, configure: impl FnOnce(&mut TestConfig)) -> Pipeline {
    let services = services();
    let topic = unique(prefix);
    create_topic(&services.kafka, &topic, partitions).await;
    let mut config = TestConfig::new(&services, &topic);
    configure(&mut config);
    let persister = start_persister(&config).await;
    let agent = start_agent(&config).await;
    let db = pg(&services, &config.schema()).await;
    Pipeline { topic, config, persister, agent, db }
}

/// Polls `probe` every 100 ms until it returns `Some`, failing the test after `WAIT`.
pub async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, mut probe: impl FnMut() -> F) -> T {
    within(WAIT, what, async {
        loop {
            if let Some(value) = probe().await {
                break value;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
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

/// An envelope as the agent writes it: record id `id`, ingested at `ingest_time` (RFC 3339), a
/// JSON record.
pub fn envelope(id: &str, ingest_time: &str, record: &str) -> Vec<u8> {
    format!(r#"{{"v":1,"id":"{id}","ingest_time":"{ingest_time}","format":"json","record":{record}}}"#).into_bytes()
}

/// Now, as an envelope's `ingest_time`.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// The offset consumer group `group` has committed for `topic`/`partition`, if any (asked of
/// the group coordinator without joining the group).
pub async fn committed_offset(bootstrap: &str, group: &str, topic: &str, partition: i32) -> Option<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", bootstrap).set("group.id", group).create().expect("consumer");
    let mut wanted = rdkafka::TopicPartitionList::new();
    wanted.add_partition(topic, partition);
    let committed = tokio::task::block_in_place(|| consumer.committed_offsets(wanted, Duration::from_secs(10))).ok()?;
    committed.find_partition(topic, partition)?.offset().to_raw().filter(|offset| *offset >= 0)
}

/// What a topic holds, read from offset 0 to its end: how many messages, and the record id and
/// app payload of each (envelopes; a message that is not one is kept with an empty id).
pub struct TopicContents {
    pub messages: u64,
    pub ids: Vec<String>,
    pub payloads: Vec<String>,
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
        let mut contents = TopicContents { messages: 0, ids: Vec::new(), payloads: Vec::new() };
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
            match sluice::envelope::Envelope::parse(value) {
                Ok(envelope) => {
                    contents.payloads.push(envelope.payload().map(|p| p.into_owned()).unwrap_or_default());
                    contents.ids.push(envelope.id.into_owned());
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
