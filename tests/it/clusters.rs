//! Past one PostgreSQL (issue 34): a persister deployment per database cluster — each its own
//! consumer group, topic pattern and PostgreSQL URL — and agents that route each record to its
//! namespace's topic with a topic template. Each record lives in one topic, so its key and its
//! idempotence stay inside one cluster, and a cluster that is down holds up only its own group.
//! docs/SCALING.md describes the layout these tests run.

use crate::support::*;
use sluice::telemetry;

/// The stack's PostgreSQL and a private cluster, one persister on each.
struct TwoClusters {
    /// Topics `<prefix>.<topic>` of each cluster, and the default `<prefix>.other`.
    prefix: String,
    /// Cluster a's persister config: the stack's PostgreSQL.
    a: TestConfig,
    /// Cluster b's persister config: `private`.
    b: TestConfig,
    private: PrivatePostgres,
}

impl TwoClusters {
    /// Topics `<prefix>.team-a`, `<prefix>.team-b` and `<prefix>.other`; cluster a reads team a's
    /// and the default topic, cluster b team b's.
    async fn by_team() -> Self {
        // The default topic needs a reader too (docs/SCALING.md): team a's cluster takes it.
        Self::start("clusters", [("team-a", "(team-a|other)$"), ("team-b", "team-b$")]).await
    }

    /// For each cluster, a (topic, pattern) pair: its persister reads `^<prefix>\.<pattern>`;
    /// the topic `<prefix>.<topic>` is created, and `<prefix>.other`.
    async fn start(kind: &str, clusters: [(&str, &str); 2]) -> Self {
        let services = services();
        let prefix = unique(kind);
        for topic in clusters.iter().map(|(topic, _)| *topic).chain(["other"]) {
            create_topic(&services.kafka, &format!("{prefix}.{topic}"), 2).await;
        }
        let private = PrivatePostgres::start().await;
        let a = Self::persister(&prefix, clusters[0], None);
        let b = Self::persister(&prefix, clusters[1], Some(&private.url()));
        Self { prefix, a, b, private }
    }

    /// A persister config reading `^<prefix>\.<pattern>` into the database at `url` (the
    /// stack's when `None`).
    fn persister(prefix: &str, (topic, pattern): (&str, &str), url: Option<&str>) -> TestConfig {
        let mut config = TestConfig::new(&services(), &format!("{prefix}.{topic}"));
        let pattern = format!("^{}\\.{pattern}", prefix.replace('.', "\\."));
        config.set("persist", "topics", toml::Value::Array(vec![pattern.into()]));
        if let Some(url) = url {
            config.set("postgres", "url", url);
            // A private cluster speaks no TLS.
            config.table["postgres"].as_table_mut().expect("postgres").remove("ca_file");
        }
        config
    }

    /// An agent of `namespace`, routing by `{pod.namespace}`.
    async fn agent(&self, namespace: &str) -> (TestConfig, Process) {
        let mut config = TestConfig::new(&services(), &format!("{}.other", self.prefix));
        config.set("kafka", "topic", format!("{}.{{pod.namespace}}", self.prefix)).set(
            "kafka",
            "default_topic",
            format!("{}.other", self.prefix),
        );
        config.env.push(("POD_NAMESPACE".into(), namespace.into()));
        let agent = start_agent(&config).await;
        (config, agent)
    }

    /// A persister on each cluster and an agent in each of team a's and team b's namespaces.
    async fn run(&self) -> Running {
        let persister_a = start_persister(&self.a).await;
        let persister_b = start_persister(&self.b).await;
        let (agent_a, process_a) = self.agent("team-a").await;
        let (agent_b, process_b) = self.agent("team-b").await;
        Running { _persister_a: persister_a, persister_b, agent_a, agent_b, _agents: [process_a, process_b] }
    }

    async fn db_b(&self) -> tokio_postgres::Client {
        connect_to_schema(&self.private.url(), &self.b.schema()).await
    }
}

/// What [`TwoClusters::run`] started: stopped when dropped.
struct Running {
    _persister_a: Process,
    persister_b: Process,
    /// Team a's agent config (its socket).
    agent_a: TestConfig,
    agent_b: TestConfig,
    _agents: [Process; 2],
}

/// A session on the server at `url` with `search_path` set to `schema`.
async fn connect_to_schema(url: &str, schema: &str) -> tokio_postgres::Client {
    let mut config: tokio_postgres::Config = url.parse().expect("a URL");
    config.options(format!("-c search_path={schema}"));
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// Issue 34: records of two namespaces land each in its own cluster, exactly once; with one
/// cluster stopped, the other's rows keep flowing and only the stopped one's group lags; once it
/// is back, every record is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_namespace_lands_in_its_own_cluster_once_and_a_stopped_cluster_holds_up_only_its_own() {
    let clusters = TwoClusters::by_team().await;
    let Running { agent_a, agent_b, .. } = &clusters.run().await;
    let db_a = pg(&services(), &clusters.a.schema()).await;
    let db_b = clusters.db_b().await;

    send_lines(&agent_a.socket(), &numbered_lines("a", 0..200)).await;
    send_lines(&agent_b.socket(), &numbered_lines("b", 0..200)).await;
    until_rows(&db_a, 200).await;
    until_rows(&db_b, 200).await;
    assert_each_once(&stored_numbers(&db_a, "a").await, 0..200);
    assert_each_once(&stored_numbers(&db_b, "b").await, 0..200);
    assert!(stored_numbers(&db_a, "b").await.is_empty() && stored_numbers(&db_b, "a").await.is_empty());

    // Team b's cluster goes away: team a's records keep arriving; team b's wait in its topic.
    clusters.private.crash();
    send_lines(&agent_a.socket(), &numbered_lines("a", 200..300)).await;
    send_lines(&agent_b.socket(), &numbered_lines("b", 200..300)).await;
    until_rows(&db_a, 300).await;
    until("team b's group to lag", || async {
        let lag = scrape(clusters.b.persist_admin()).await.count(telemetry::PERSIST_LAG_RECORDS, &[]);
        if lag > 0.0 { Ok(()) } else { Err(format!("lag {lag}")) }
    })
    .await;
    // The lag is measured every few seconds: team a's gauge comes down to nothing while team b's,
    // with its cluster away, stays up.
    until_metric(clusters.a.persist_admin(), telemetry::PERSIST_LAG_RECORDS, &[], 0.0).await;
    let lag_b = scrape(clusters.b.persist_admin()).await.count(telemetry::PERSIST_LAG_RECORDS, &[]);
    assert!(lag_b > 0.0, "team b's group still lags while team a's has caught up: {lag_b}");

    clusters.private.resume().await;
    // The crash ended the test's own session too.
    let db_b = clusters.db_b().await;
    until_rows(&db_b, 300).await;
    assert_each_once(&stored_numbers(&db_a, "a").await, 0..300);
    assert_each_once(&stored_numbers(&db_b, "b").await, 0..300);
}

/// Issue 34: moving a namespace to another cluster at a cut-over. The agents' template moves the
/// namespace's records to a topic the new cluster's persisters read (`<prefix>.b.…` instead of
/// `<prefix>.a.…`), by a config reload while records keep coming; records already held keep the
/// topic they had. Every record is then in exactly one of the two clusters: none lost, none in
/// both (docs/SCALING.md, "Moving a namespace").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_namespace_to_another_cluster_under_load_loses_and_duplicates_nothing() {
    let services = services();
    let clusters = TwoClusters::start("cutover", [("a.team-x", "a\\..*"), ("b.team-x", "b\\..*")]).await;
    let prefix = &clusters.prefix;
    let _persister_a = start_persister(&clusters.a).await;
    let _persister_b = start_persister(&clusters.b).await;

    let mut agent_config = TestConfig::new(&services, &format!("{prefix}.other"));
    let route = |cluster: &str| format!("{prefix}.{cluster}.{{pod.namespace}}");
    agent_config.set("kafka", "topic", route("a")).set("kafka", "default_topic", format!("{prefix}.other"));
    agent_config.env.push(("POD_NAMESPACE".into(), "team-x".into()));
    let path = agent_config.write();
    let mut agent = Process::spawn_with_env(
        "agent",
        &["agent", "--config", path.to_str().expect("path")],
        agent_config.dir.path(),
        &agent_config.env,
    );
    let admin = agent.wait_admin().await;
    let socket = agent_config.socket();
    sluice_harness::eventually("the socket", || std::future::ready(socket.exists().then_some(()))).await;

    // Records keep coming while the agent moves the namespace to cluster b; the first batch is
    // stored in cluster a before the reload, however the tasks are scheduled.
    let db_a = pg(&services, &clusters.a.schema()).await;
    let db_b = clusters.db_b().await;
    send_lines(&socket, &numbered_lines("x", 0..10)).await;
    until_rows(&db_a, 10).await;
    let sender = {
        let socket = socket.clone();
        tokio::spawn(async move {
            for batch in 1..40u64 {
                send_lines(&socket, &numbered_lines("x", batch * 10..batch * 10 + 10)).await;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    agent_config.set("kafka", "topic", route("b"));
    agent_config.write_to(&path);
    agent.signal("HUP");
    until_metric_at_least(admin, telemetry::CONFIG_RELOADS, &[("result", "applied")], 1.0).await;
    sender.await.expect("the sender");
    send_lines(&socket, &numbered_lines("x", 400..410)).await;

    until("every record in one cluster or the other", || async {
        let stored = row_count(&db_a).await + row_count(&db_b).await;
        if stored >= 410 { Ok(()) } else { Err(format!("{stored} rows")) }
    })
    .await;
    let (in_a, in_b) = (stored_numbers(&db_a, "x").await, stored_numbers(&db_b, "x").await);
    assert!(!in_a.is_empty() && in_b.contains(&400), "both clusters took part: {} and {}", in_a.len(), in_b.len());
    let mut all = in_a.clone();
    all.extend(&in_b);
    assert_each_once(&all, 0..410);
}

/// `postgres://user@host:port/` of `url`, and the user.
fn server_of(url: &str) -> (String, String) {
    let config: tokio_postgres::Config = url.parse().expect("a URL");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        other => panic!("a TCP host, not {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().expect("a user").to_string();
    (format!("postgres://{user}@{host}:{port}/"), user)
}

/// Issue 34: a reader database over both clusters with what PostgreSQL ships (postgres_fdw, set
/// up by `scripts/reader`): one view returns every row of both, each once, with its cluster; a
/// filter on it is pushed down to each cluster, and the clusters are scanned at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_database_reads_both_clusters_each_row_once_with_filters_pushed_down() {
    let clusters = TwoClusters::by_team().await;
    let Running { agent_a, agent_b, .. } = &clusters.run().await;
    send_lines(&agent_a.socket(), &numbered_lines("a", 0..100)).await;
    send_lines(&agent_b.socket(), &numbered_lines("b", 0..100)).await;
    until_rows(&pg(&services(), &clusters.a.schema()).await, 100).await;
    until_rows(&clusters.db_b().await, 100).await;

    // The reader: a server of its own, so nothing of it outlives the test, passed or failed.
    let (stack, _) = server_of(&services().pg);
    let reader_server = PrivatePostgres::start().await;
    let output = std::process::Command::new(source_path("scripts/reader"))
        .arg(reader_server.url())
        .arg(format!("team_a={stack}sluice?schema={}", clusters.a.schema()))
        .arg(format!(
            "team_b=postgres://postgres@127.0.0.1:{}/sluice?schema={}",
            clusters.private.port,
            clusters.b.schema()
        ))
        .output()
        .expect("scripts/reader");
    let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
    assert!(said.contains("added team_a") && said.contains("added team_b"), "{said}");

    let (reader, connection) =
        tokio_postgres::connect(&reader_server.url(), tokio_postgres::NoTls).await.expect("connect to the reader");
    tokio::spawn(connection);
    let by_cluster: Vec<(String, i64)> =
        pairs(&reader, "SELECT cluster, count(*) FROM sluice_reader.logs GROUP BY cluster ORDER BY cluster").await;
    assert_eq!(by_cluster, [("team_a".to_string(), 100), ("team_b".to_string(), 100)]);
    let payloads: Vec<String> = column(&reader, "SELECT coalesce(record::text, message) FROM sluice_reader.logs").await;
    assert_each_once(&numbers_in("a", &payloads), 0..100);
    assert_each_once(&numbers_in("b", &payloads), 0..100);

    // A time given as a value is shipped to each cluster; `now() - …` would not be (postgres_fdw
    // ships no stable function), and every cluster would send all of the namespace's rows.
    let since = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let plan: Vec<String> = column(
        &reader,
        &format!(
            "EXPLAIN (VERBOSE, COSTS OFF) SELECT cluster, message FROM sluice_reader.logs \
             WHERE pod_namespace = 'team-a' AND ingest_time > '{since}'"
        ),
    )
    .await;
    let plan = plan.join("\n");
    assert_eq!(plan.matches("Async Foreign Scan").count(), 2, "both clusters at once:\n{plan}");
    let remote: Vec<&str> = plan.lines().filter(|line| line.contains("Remote SQL")).collect();
    assert_eq!(remote.len(), 2, "{plan}");
    assert!(
        remote.iter().all(|sql| sql.contains("(pod_namespace = 'team-a')") && sql.contains("(ingest_time > '")),
        "both filters pushed down to each cluster:\n{plan}"
    );

    // A cluster that is away fails the query in seconds (the server's connect_timeout), instead
    // of hanging it; removed from the reader, the view reads the others again.
    clusters.private.crash();
    let away = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        reader.query("SELECT count(*) FROM sluice_reader.logs", &[]),
    )
    .await
    .expect("an answer within 30 s");
    assert!(away.is_err(), "a cluster away is an error, not a partial answer");
    reader.batch_execute("SELECT sluice_reader.remove_cluster('team_b')").await.expect("remove team b");
    let left: Vec<(String, i64)> =
        pairs(&reader, "SELECT cluster, count(*) FROM sluice_reader.logs GROUP BY cluster ORDER BY cluster").await;
    assert_eq!(left, [("team_a".to_string(), 100)]);
}

/// Sends `numbers` of run `tag` in batches of ten, one batch every 20 ms: records keep coming
/// while a test breaks something.
fn trickle(
    socket: std::path::PathBuf,
    tag: &'static str,
    numbers: std::ops::Range<u64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut start = numbers.start;
        while start < numbers.end {
            let end = (start + 10).min(numbers.end);
            send_lines(&socket, &numbered_lines(tag, start..end)).await;
            start = end;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
}

/// Issue 34: one cluster's persister SIGKILLed while records flow to both clusters. Its
/// uncommitted batch is written again by the persister that replaces it (the same group), with no
/// second row; the other cluster's persister never notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persister_killed_mid_stream_leaves_its_cluster_every_row_once_and_the_other_untouched() {
    let clusters = TwoClusters::by_team().await;
    let mut running = clusters.run().await;
    let (socket_a, socket_b) = (running.agent_a.socket(), running.agent_b.socket());
    let db_a = pg(&services(), &clusters.a.schema()).await;
    let db_b = clusters.db_b().await;

    // Each team's first half trickles in; team b's persister is killed once its cluster has some
    // of it, and the second halves are sent only after the kill, so they land in the kill's
    // shadow however fast or slow the machine is. Team b's persister is first seen storing (50
    // records), so the kill usually comes while the trickle still runs (its uncommitted batch is
    // then written again by the replacement); every assertion holds either way.
    send_lines(&socket_b, &numbered_lines("b", 0..50)).await;
    until_rows(&db_b, 50).await;
    let first_a = trickle(socket_a.clone(), "a", 0..300);
    let first_b = trickle(socket_b.clone(), "b", 50..300);
    until_rows(&db_b, 100).await;
    running.persister_b.kill();
    first_a.await.expect("team a's sender");
    first_b.await.expect("team b's sender");
    // Team a's rows keep arriving, all of them, while team b's cluster has no persister.
    trickle(socket_a, "a", 300..600).await.expect("team a's sender");
    trickle(socket_b, "b", 300..600).await.expect("team b's sender");
    until_rows(&db_a, 600).await;
    assert_each_once(&stored_numbers(&db_a, "a").await, 0..600);
    let rows_b_without_persister = row_count(&db_b).await;
    assert!(rows_b_without_persister <= 300, "team b's second half waits for a persister: {rows_b_without_persister}");

    let _replacement = start_persister(&clusters.b).await;
    until_rows(&db_b, 600).await;
    until_caught_up(&clusters.b).await;
    assert_each_once(&stored_numbers(&db_a, "a").await, 0..600);
    assert_each_once(&stored_numbers(&db_b, "b").await, 0..600);
    assert!(stored_numbers(&db_a, "b").await.is_empty() && stored_numbers(&db_b, "a").await.is_empty());
}

/// Issue 34: failover within a cluster is PostgreSQL's business; the persister only has to follow
/// it. Its URL names a synchronous streaming standby, then the primary, with
/// `target_session_attrs=read-write` (libpq's multi-host form): the read-only standby, first, is
/// passed over until it is promoted. The primary crashes under load
/// and the standby is promoted, as Patroni or pg_auto_failover would: the persister reconnects
/// to the new primary, writes again what was not acknowledged, and every record is stored there
/// exactly once (docs/SCALING.md, "Failover within a cluster").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persister_follows_a_promoted_standby_and_stores_every_record_once() {
    let services = services();
    let primary = PrivatePostgres::start().await;
    let standby = PrivatePostgres::standby_of(&primary).await;
    let prefix = unique("failover");
    create_topic(&services.kafka, &format!("{prefix}.logs"), 2).await;
    let both = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/sluice?target_session_attrs=read-write",
        standby.port, primary.port
    );
    let mut persister = TwoClusters::persister(&prefix, ("logs", "logs$"), Some(&both));
    // Quick retries, so the switch shows in seconds.
    persister.set("postgres", "connect_timeout", "2s");
    let _persister = start_persister(&persister).await;
    let agent = TestConfig::new(&services, &format!("{prefix}.logs"));
    let _agent = start_agent(&agent).await;

    // The first half trickles in and the primary crashes once it has some of it; the second
    // half is sent after the crash, so it meets the switch however fast the machine is.
    let first = trickle(agent.socket(), "f", 0..300);
    let db = connect_to_schema(&primary.url(), &persister.schema()).await;
    until_rows(&db, 100).await;
    primary.crash();
    standby.promote();
    first.await.expect("the sender");
    trickle(agent.socket(), "f", 300..600).await.expect("the sender");

    let db = connect_to_schema(&standby.url(), &persister.schema()).await;
    until_rows(&db, 600).await;
    until_caught_up(&persister).await;
    assert_each_once(&stored_numbers(&db, "f").await, 0..600);
    let metrics = scrape(persister.persist_admin()).await;
    let stored = metrics.count(telemetry::PERSIST_ROWS, &[]) + metrics.count(telemetry::PERSIST_DUPLICATES, &[]);
    assert!(stored >= 600.0, "every record counted as written or found stored: {}", nonzero(&metrics));
    assert_eq!(metrics.count(telemetry::PERSIST_LOST, &[]), 0.0, "{}", nonzero(&metrics));
    assert_eq!(metrics.count(telemetry::PERSIST_POSTGRES_REACHABLE, &[]), 1.0, "{}", nonzero(&metrics));
}
