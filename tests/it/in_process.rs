//! The pipeline with both roles in the test's own runtime: `sluice::agent::run` and
//! `sluice::persist::run`, started as the binary starts them but each on an admin listener the
//! test bound on port 0 (`AdminListener::Bound`) and with a cancellation token the test holds,
//! against the real Kafka and PostgreSQL. Cancelling the token is SIGTERM without a process: the
//! drain runs and `run` returns its report — what a child process can only write to its log.
//! The child-process tests stay for what only a process shows (signals, exit codes, log lines,
//! kills, memory).
//!
//! Metrics: the `metrics` crate has one recorder per process, and both roles record into it. It
//! is installed once, by the first in-process test (as `main` installs it), so every admin server
//! in this process serves the same registry: a scrape of the address a test bound shows the sum
//! of every in-process role so far. (A recorder per test cannot be had: `metrics` has no
//! task-local recorder, and the roles' tasks run on every worker thread.) So the in-process
//! tests run one at a time ([`ONE_AT_A_TIME`]) and assert on what changed between a scrape taken
//! once their roles are up and a later one, never on absolute values; gauges (last write wins)
//! are not asserted here. The child-process tests are not affected: each child has its own
//! recorder. No log subscriber is installed: these tests read what `run` returns and the metrics.

use std::collections::HashSet;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use sluice::admin::AdminListener;
use sluice::agent::{self, AgentError, DrainReport};
use sluice::config::Config;
use sluice::persist::{self, PersistError};
use sluice::telemetry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::support::*;

/// Held for the whole of each in-process test: they share the process's one metrics recorder.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The process's recorder, installed by the first in-process test inside its runtime, as `main`
/// does. (The histogram upkeep it spawns ends with that test's runtime; a scrape folds the
/// histograms itself.)
fn recorder() -> PrometheusHandle {
    static RECORDER: OnceLock<PrometheusHandle> = OnceLock::new();
    RECORDER.get_or_init(|| telemetry::install_recorder("agent").expect("the process's only recorder")).clone()
}

/// A role running in the test's runtime.
struct InProcess<T> {
    name: &'static str,
    /// Where its admin server listens: the listener the test bound.
    admin: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<T>,
}

impl<T: Debug> InProcess<T> {
    /// Starts `run` (given the admin listener) on a listener bound now on port 0, writing its
    /// address into `section.admin_listen` so the config agrees; waits until `/readyz` says ready.
    async fn start<F>(name: &'static str, config: &mut TestConfig, section: &str, run: F) -> Self
    where
        F: FnOnce(Config, AdminListener, CancellationToken) -> JoinHandle<T>,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind an admin port");
        let admin = listener.local_addr().expect("bound");
        config.set(section, "admin_listen", admin.to_string());
        match section {
            "agent" => config.started_agent(admin),
            _ => config.started_persister(admin),
        }
        let loaded = Config::load(&config.write()).expect("the test config is valid");
        let stop = CancellationToken::new();
        let task = run(loaded, AdminListener::Bound(listener), stop.clone());
        let role = Self { name, admin, stop, task };
        until(&format!("the {name} to be ready"), || async {
            assert!(!role.task.is_finished(), "the {name} returned before it was ready");
            match http_get(admin, "/readyz").await {
                Ok((200, body)) if body.trim() == "ready" => Ok(()),
                Ok((status, body)) => Err(format!("{status} {}", body.trim())),
                Err(error) => Err(error.to_string()),
            }
        })
        .await;
        role
    }

    /// Cancels its token (the drain begins, as on SIGTERM) and waits for `run` to return.
    async fn stop(self) -> T {
        self.stop.cancel();
        within(Duration::from_secs(60), &format!("the {} to drain and return", self.name), self.task)
            .await
            .unwrap_or_else(|error| panic!("the {}'s task: {error}", self.name))
    }
}

/// `sluice::agent::run` on `config`, without reload (no file is followed).
async fn agent(config: &mut TestConfig) -> InProcess<Result<DrainReport, AgentError>> {
    InProcess::start("agent", config, "agent", |config, admin, stop| {
        tokio::spawn(agent::run(config, admin, None, recorder(), stop))
    })
    .await
}

/// `sluice::persist::run` on `config`, without reload.
async fn persister(config: &mut TestConfig) -> InProcess<Result<(), PersistError>> {
    InProcess::start("persister", config, "persist", |config, admin, stop| {
        tokio::spawn(persist::run(config, admin, None, recorder(), stop))
    })
    .await
}

/// How much `name` grew from `before` to `after` (both scrapes of this process's registry).
fn grew(before: &Metrics, after: &Metrics, name: &str) -> f64 {
    after.count(name, &[]) - before.count(name, &[])
}

/// `count` lines over `connections` connections at once, each line `tag c-i`.
async fn send_over(socket: &std::path::Path, tag: &str, connections: usize, count: usize) -> HashSet<String> {
    let per_connection = count / connections;
    let lines = |c: usize| (0..per_connection).map(move |i| format!("{tag} {c}-{i}"));
    let senders: Vec<_> = (0..connections)
        .map(|c| {
            let (socket, lines) = (socket.to_path_buf(), lines(c).map(String::into_bytes).collect::<Vec<_>>());
            tokio::spawn(async move { send_lines(&socket, &lines).await })
        })
        .collect();
    for sender in senders {
        sender.await.expect("sender");
    }
    (0..connections).flat_map(lines).collect()
}

/// The `payload` of every row.
async fn payloads(db: &tokio_postgres::Client) -> Vec<String> {
    column(db, "SELECT coalesce(record::text, message) FROM logs").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_process_agent_and_persister_deliver_every_record_once_and_count_each_at_the_bound_admin_port() {
    const RECORDS: usize = 8000;
    let _one = ONE_AT_A_TIME.lock().await;
    let mut setup = Scenario::new("inproc").partitions(2).build().await;
    let persister = persister(&mut setup.config).await;
    let agent = agent(&mut setup.config).await;
    let db = setup.db().await;
    let before = scrape(agent.admin).await;

    let sent = send_over(&setup.config.socket(), "in process", 4, RECORDS).await;
    until_rows(&db, RECORDS as i64).await;
    until_nothing_left(&setup.config).await;
    let stored = payloads(&db).await;
    assert_eq!(stored.len(), RECORDS, "one row per record");
    assert_eq!(stored.into_iter().collect::<HashSet<_>>(), sent, "each record's payload, unchanged");
    let ids: i64 = db.query_one("SELECT count(DISTINCT (agent, seq)) FROM logs", &[]).await.expect("ids").get(0);
    assert_eq!(ids, RECORDS as i64, "distinct record ids");

    // Each counted once, read at the admin addresses the test bound (one registry: see the
    // module doc); a count follows what it counts by a moment.
    let n = RECORDS as f64;
    let counted = until_scrape(persister.admin, "every record counted", |after| {
        grew(&before, after, telemetry::SHIP_DELIVERED) == n && grew(&before, after, telemetry::PERSIST_ROWS) == n
    })
    .await;
    assert_eq!(grew(&before, &counted, telemetry::INGEST_RECORDS), n, "read");
    assert_eq!(grew(&before, &counted, telemetry::PERSIST_CONSUMED), n, "consumed");
    assert_eq!(grew(&before, &counted, telemetry::PERSIST_DUPLICATES), 0.0, "duplicates");

    let report = agent.stop().await.expect("the agent drains without a failed task");
    assert_eq!(report, DrainReport { undelivered: 0, lost: 0, unconfirmed: 0, abandoned: 0 });
    persister.stop().await.expect("the persister drains without a failed task");
}

/// The drain of `agent::run`, in process: cancelling its token while every record still waits in
/// the buffer (an 8 s linger holds them in the producer, on a busy machine too) returns only once Kafka has acknowledged
/// each, and the report `run` returns says none was lost or given up; the persister then stores
/// each once. (The child-process test beside it, `agent_drains_its_buffer_to_kafka_on_sigterm…`,
/// covers the signal, the exit code and the log line.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_an_in_process_agent_with_records_in_its_buffer_delivers_each_before_run_returns() {
    const RECORDS: usize = 5000;
    let _one = ONE_AT_A_TIME.lock().await;
    let mut setup = Scenario::new("inproc_drain").partitions(2).set("ship", "linger", "8s").build().await;
    let persister = persister(&mut setup.config).await;
    let agent = agent(&mut setup.config).await;
    let before = scrape(agent.admin).await;

    send_over(&setup.config.socket(), "drain", 1, RECORDS).await;
    let n = RECORDS as f64;
    let accepted = until_scrape(agent.admin, "every record accepted", |after| {
        grew(&before, after, telemetry::INGEST_RECORDS) == n
    })
    .await;
    assert!(grew(&before, &accepted, telemetry::SHIP_DELIVERED) < n, "records wait in the buffer as the drain begins");

    let report = agent.stop().await.expect("the agent drains without a failed task");
    assert_eq!(
        report,
        DrainReport { undelivered: 0, lost: 0, unconfirmed: 0, abandoned: 0 },
        "none lost, none given up"
    );
    let drained = scrape(persister.admin).await;
    assert_eq!(grew(&before, &drained, telemetry::SHIP_DELIVERED), n, "Kafka acknowledged each before run returned");
    assert_eq!(grew(&before, &drained, telemetry::SHIP_FAILED), 0.0, "none given up");
    assert!(!setup.config.socket().exists(), "the socket file is removed");

    let db = setup.db().await;
    assert_eq!(until_rows(&db, RECORDS as i64).await, RECORDS as i64);
    until_caught_up(&setup.config).await;
    let ids: i64 = db.query_one("SELECT count(DISTINCT (agent, seq)) FROM logs", &[]).await.expect("ids").get(0);
    assert_eq!((row_count(&db).await, ids), (RECORDS as i64, RECORDS as i64), "each record once");
    persister.stop().await.expect("the persister drains without a failed task");
}
