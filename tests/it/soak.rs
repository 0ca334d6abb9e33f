//! The soak (`scripts/soak [MINUTES]`, `scripts/soak --smoke` in `scripts/test`): the real
//! pipeline — three agents, three persisters in one group, a broker and a PostgreSQL of its own,
//! all release binaries — under a random fault schedule drawn from a seed, then an exact
//! account of every record.
//!
//! - `durable` (agent 0): disk spool, `fsync = "always"`, acknowledged writers that send again
//!   what was not settled when a connection broke (as new records: `try` 1, 2…), and a session
//!   writer (`SLUICE/2`, client record ids) that sends it again under the same numbers: each of
//!   its records ACKed is exactly one row, however often it was sent. SIGKILLed, SIGTERMed,
//!   its spool disk (a small tmpfs) filled. An ACKed record must be exactly one row.
//! - `memory` (agent 1): memory buffer, `drop_newest`, plain writers. SIGTERMed only (a SIGKILL
//!   of a memory buffer loses what it holds by design, uncountably).
//! - `limited` (agent 2): disk spool, `drop_oldest`, a rate limit with `action = "drop"`, plain
//!   writers. SIGTERMed only.
//!
//! For the plain agents every record the kernel took whole is a row, or one of the records the
//! agent counted as lost (rejected, dropped, failed: summed over every run of the agent, from
//! the "final counts" line each run logs as its last word). Nothing may be stored twice, nothing
//! stored that was never written, nothing may stay behind (buffers, spools, consumer lag) once
//! the faults are healed: "stuck" fails the soak after [`DRAIN_LIMIT`].
//!
//! Settings come from the environment (scripts/soak sets them): `SLUICE_SOAK_SECONDS`,
//! `SLUICE_SOAK_SEED`, `SLUICE_SOAK_SMOKE`, `SLUICE_SOAK_RESULTS` (a folder for `soak.json`).
//!
//! One file over the usual size (~1,000 lines), with `soak/` holding the fault schedule and the
//! writers: what stays here is the one experiment — the fleet, its supervision and the account
//! at the end — whose parts share the world's state and are read together to trust the account.

mod faults;
mod writers;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faults::{Fault, Kind};
use serde_json::json;
use tokio::sync::Mutex;
use writers::{AckedOutcome, AckedWriter, PlainOutcome, PlainWriter, Try};

use crate::support::{
    Metrics, PrivateBroker, PrivatePostgres, Process, Proxy, Services, TestConfig, create_topic, http_get, unique,
};
use sluice::telemetry;
use sluice::telemetry::outcome::Failed;

/// Once the last fault is healed and the writers stopped, everything must have drained within
/// this: buffers and spools empty, every partition committed to its end.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);
const PARTITIONS: i32 = 6;
const SCHEMA: &str = "soak";

struct Settings {
    seconds: u64,
    seed: u64,
    smoke: bool,
    results: Option<PathBuf>,
}

fn settings() -> Settings {
    let smoke = std::env::var("SLUICE_SOAK_SMOKE").is_ok_and(|v| v == "1");
    let seconds = std::env::var("SLUICE_SOAK_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(90);
    let seed = std::env::var("SLUICE_SOAK_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let results = std::env::var("SLUICE_SOAK_RESULTS").ok().map(PathBuf::from);
    Settings { seconds, seed, smoke, results }
}

/// One agent or persister: its config (rewritten by reloads), the running process, and what
/// each run of it said at the end.
struct Slot {
    name: String,
    config: TestConfig,
    path: PathBuf,
    process: Option<Process>,
    /// A fault took it down on purpose: the supervisor leaves it alone.
    down: bool,
    /// The "final counts" of every run that ended on a SIGTERM.
    finals: Vec<Metrics>,
    /// Runs that ended without final counts (SIGKILL, a crash): their last scrape.
    unknown: Vec<Metrics>,
    last_scrape: Option<Metrics>,
    logs: Vec<PathBuf>,
    /// Exits nobody asked for (the supervisor started it again, as a kubelet would).
    unexpected_exits: Vec<String>,
    agent: bool,
}

impl Slot {
    /// The admin address the running process bound (port 0 in its config); while it has none
    /// (down, or not yet bound) an address where nothing listens, so a scrape fails as it would.
    fn admin(&self) -> std::net::SocketAddr {
        self.process.as_ref().and_then(Process::bound_admin).unwrap_or_else(|| ([127, 0, 0, 1], 1).into())
    }

    async fn start(&mut self) {
        let path = self.path.to_str().expect("utf-8 path").to_string();
        let role = if self.agent { "agent" } else { "persist" };
        let process = Process::spawn(
            if self.agent { "agent" } else { "persist" },
            &[role, "--config", &path],
            self.config.dir.path(),
        );
        self.logs.push(process.log.clone());
        self.process = Some(process);
        self.last_scrape = None;
        // Until its admin server answers, a signal may come before the process installed its
        // handlers (a SIGTERM would kill it without a drain or final counts): the next fault on
        // it waits for that, a bounded while (a process that cannot start is the supervisor's).
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline && self.process.as_mut().is_some_and(Process::running) {
            if http_get(self.admin(), "/healthz").await.is_ok_and(|(status, _)| status == 200) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, wait for the exit, keep the run's final counts.
    async fn terminate(&mut self, limit: Duration) -> Result<(), String> {
        let Some(mut process) = self.process.take() else { return Ok(()) };
        process.signal("TERM");
        let deadline = Instant::now() + limit;
        while process.running() {
            if Instant::now() > deadline {
                let tail = tail(&process.log_text(), 30);
                process.kill();
                return Err(format!("{} did not stop within {limit:?} of SIGTERM; log tail:\n{tail}", self.name));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match final_counts(&process.log_text()) {
            Some(counts) => self.finals.push(counts),
            None => self.unknown.push(self.last_scrape.take().unwrap_or(Metrics(String::new()))),
        }
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
            self.unknown.push(self.last_scrape.take().unwrap_or(Metrics(String::new())));
        }
    }
}

/// The "final counts" line a run logged as its last word.
fn final_counts(log: &str) -> Option<Metrics> {
    log.lines().rev().find_map(|line| {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        if value.get("message")?.as_str()? != "final counts" {
            return None;
        }
        let counts = sluice::telemetry::scrape::Scrape::from_counts(value.get("counts")?);
        Some(Metrics(
            counts
                .samples()
                .iter()
                .map(|sample| format!("{} {}", sample.series(), sample.value))
                .collect::<Vec<_>>()
                .join("\n"),
        ))
    })
}

fn tail(text: &str, lines: usize) -> String {
    let mut last: Vec<&str> = text.lines().rev().take(lines).collect();
    last.reverse();
    last.join("\n")
}

/// Records an agent counted as lost in one run's counters.
fn counted_lost(metrics: &Metrics) -> u64 {
    [telemetry::INGEST_REJECTED, telemetry::BUFFER_DROPPED, telemetry::SHIP_FAILED]
        .iter()
        .map(|name| metrics.count(name, &[]) as u64)
        .sum()
}

/// Every sample of `name` by its `reason` label, summed over `runs`.
fn by_reason(runs: &[Metrics], name: &str) -> BTreeMap<String, u64> {
    let mut reasons = BTreeMap::new();
    for run in runs {
        for line in run.0.lines().filter(|l| l.starts_with(&format!("{name}{{"))) {
            let reason = line.split("reason=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("");
            let value: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            *reasons.entry(reason.to_string()).or_insert(0) += value as u64;
        }
    }
    reasons
}

struct World {
    agents: Vec<Arc<Mutex<Slot>>>,
    persisters: Vec<Arc<Mutex<Slot>>>,
    broker: Mutex<PrivateBroker>,
    postgres: Mutex<PrivatePostgres>,
    proxy: Proxy,
    /// The durable agent's spool disk: a tmpfs (when we may mount one).
    disk: Option<PathBuf>,
    disk_lock: Mutex<()>,
    proxy_lock: Mutex<()>,
    topic: String,
    group: String,
    bootstrap: String,
}

/// Unmounts the soak's tmpfs (by its path) when the soak ends, however it ends.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        // Lazy: a process still holding a file there (a failed soak) does not keep it mounted.
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn mount_tmpfs(path: &Path, size: &str) -> Option<Mount> {
    std::fs::create_dir_all(path).ok()?;
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(path)
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?;
    status.success().then(|| Mount(path.to_path_buf()))
}

fn agent_config(services: &Services, topic: &str, index: usize, disk: Option<&Path>) -> TestConfig {
    let mut config = TestConfig::new(services, topic);
    config.table.get_mut("postgres").and_then(|p| p.as_table_mut()).map(|p| p.remove("ca_file"));
    config.set("agent", "drain_timeout", "10s").listener("default", "max_record_size", "64 KiB");
    config.set("ship", "delivery_timeout", "30s");
    match index {
        0 => {
            let spool = disk.map_or_else(|| config.dir.path().join("spool"), |d| d.join("spool"));
            config
                .set("buffer", "type", "disk")
                .set("buffer", "path", spool.display().to_string())
                .set("buffer", "max_disk_bytes", "6 MiB")
                .set("buffer", "fsync", "always")
                .set("buffer", "when_full", "block")
                .set("buffer", "block_timeout", "2s")
                .set("buffer", "max_bytes", "4 MiB");
        }
        1 => {
            config.set("buffer", "type", "memory").set("buffer", "when_full", "drop_newest").set(
                "buffer",
                "max_bytes",
                "2 MiB",
            );
        }
        _ => {
            let spool = config.dir.path().join("spool");
            config
                .set("buffer", "type", "disk")
                .set("buffer", "path", spool.display().to_string())
                .set("buffer", "max_disk_bytes", "4 MiB")
                .set("buffer", "fsync", "100ms")
                .set("buffer", "when_full", "drop_oldest")
                .set("buffer", "max_bytes", "2 MiB");
            let mut limit = toml::Table::new();
            limit.insert("records_per_second".into(), 120.into());
            limit.insert("burst".into(), "1s".into());
            limit.insert("action".into(), "drop".into());
            config.listener("default", "rate_limit", limit);
        }
    }
    config
}

/// A config change a running agent applies live, chosen by `variant`; keeps the durable agent's
/// promise (an ACKed record is delivered), so its policy stays `block`.
fn reload_agent(config: &mut TestConfig, index: usize, variant: u64) -> String {
    let linger = ["1ms", "5ms", "20ms"][(variant % 3) as usize];
    config.set("ship", "linger", linger);
    let policy = match index {
        0 => {
            let timeout = ["1s", "2s", "5s"][(variant / 3 % 3) as usize];
            config.set("buffer", "block_timeout", timeout);
            format!("block_timeout={timeout}")
        }
        1 => {
            let policy = ["drop_newest", "drop_oldest", "block"][(variant / 3 % 3) as usize];
            config.set("buffer", "when_full", policy);
            format!("when_full={policy}")
        }
        _ => {
            let policy = ["drop_oldest", "drop_newest"][(variant / 3 % 2) as usize];
            config.set("buffer", "when_full", policy);
            format!("when_full={policy}")
        }
    };
    format!("linger={linger} {policy}")
}

impl World {
    async fn start(dir: &Path) -> (Self, Option<Mount>) {
        let broker = PrivateBroker::start().await;
        let postgres = PrivatePostgres::start().await;
        let proxy = Proxy::start(postgres.address()).await;
        let topic = unique("soak");
        create_topic(&broker.bootstrap, &topic, PARTITIONS).await;
        let services =
            Services { kafka: broker.bootstrap.clone(), pg: format!("postgres://postgres@{}/sluice", proxy.address) };
        let mount = mount_tmpfs(&dir.join("disk"), "12m");
        let disk = mount.as_ref().map(|m| m.0.clone());
        let group = unique("soak_group");
        let mut persisters = Vec::new();
        for index in 0..3 {
            let mut config = TestConfig::new(&services, &topic);
            config.table.get_mut("postgres").and_then(|p| p.as_table_mut()).map(|p| p.remove("ca_file"));
            config.set("persist", "group_id", group.clone()).set("postgres", "schema", SCHEMA);
            let path = config.write();
            let mut slot = slot(format!("persister{index}"), config, path, false);
            slot.start().await;
            persisters.push(Arc::new(Mutex::new(slot)));
            // The first creates the schema; the others join once it is there.
            if index == 0 {
                wait_ready(&persisters[0]).await;
            }
        }
        let mut agents = Vec::new();
        for index in 0..3 {
            let config = agent_config(&services, &topic, index, disk.as_deref());
            let path = config.write();
            let mut slot = slot(["durable", "memory", "limited"][index].to_string(), config, path, true);
            slot.start().await;
            agents.push(Arc::new(Mutex::new(slot)));
        }
        for slot in agents.iter().chain(&persisters) {
            wait_ready(slot).await;
        }
        let bootstrap = broker.bootstrap.clone();
        let world = Self {
            agents,
            persisters,
            broker: Mutex::new(broker),
            postgres: Mutex::new(postgres),
            proxy,
            disk,
            disk_lock: Mutex::new(()),
            proxy_lock: Mutex::new(()),
            topic,
            group,
            bootstrap,
        };
        (world, mount)
    }

    fn slot(&self, target: &str) -> Option<&Arc<Mutex<Slot>>> {
        let index = |prefix: &str| target.strip_prefix(prefix)?.parse::<usize>().ok();
        if let Some(i) = index("agent") {
            return self.agents.get(i);
        }
        index("persister").and_then(|i| self.persisters.get(i))
    }

    async fn socket(&self, agent: usize) -> PathBuf {
        self.agents[agent].lock().await.config.socket()
    }
}

fn slot(name: String, config: TestConfig, path: PathBuf, agent: bool) -> Slot {
    Slot {
        name,
        config,
        path,
        process: None,
        down: false,
        finals: Vec::new(),
        unknown: Vec::new(),
        last_scrape: None,
        logs: Vec::new(),
        unexpected_exits: Vec::new(),
        agent,
    }
}

async fn wait_ready(slot: &Arc<Mutex<Slot>>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let admin = slot.lock().await.admin();
        if let Ok((200, _)) = http_get(admin, "/readyz").await {
            return;
        }
        let mut slot = slot.lock().await;
        let running = slot.process.as_mut().is_some_and(Process::running);
        let log = slot.process.as_ref().map(Process::log_text).unwrap_or_default();
        assert!(running, "{} exited at start; log:\n{}", slot.name, tail(&log, 40));
        assert!(Instant::now() < deadline, "{} not ready; log:\n{}", slot.name, tail(&log, 40));
        drop(slot);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What happened to one fault.
struct Injected {
    kind: Kind,
    started: Duration,
    lasted: Duration,
    note: String,
}

/// Runs one fault: waits for its time and its target, injects it, waits, heals it.
async fn inject(world: Arc<World>, fault: Fault, start: Instant) -> Result<Injected, String> {
    tokio::time::sleep_until((start + fault.at).into()).await;
    let target = fault.kind.target();
    let began = Instant::now();
    let mut note = String::new();
    match fault.kind {
        Kind::KillAgent | Kind::TermAgent(_) | Kind::KillPersister(_) | Kind::PausePersister(_) => {
            let slot = world.slot(target).expect("target");
            let mut slot = slot.lock().await;
            match fault.kind {
                Kind::KillAgent | Kind::KillPersister(_) => slot.kill(),
                Kind::TermAgent(_) => slot.terminate(Duration::from_secs(40)).await?,
                _ => {
                    if let Some(process) = slot.process.as_ref() {
                        process.signal("STOP");
                    }
                }
            }
            slot.down = true;
            tokio::time::sleep(fault.lasts).await;
            if let Kind::PausePersister(_) = fault.kind {
                if let Some(process) = slot.process.as_ref() {
                    process.signal("CONT");
                }
            } else {
                slot.start().await;
            }
            slot.down = false;
        }
        Kind::KillBroker => {
            let mut broker = world.broker.lock().await;
            broker.crash();
            tokio::time::sleep(fault.lasts).await;
            broker.resume().await;
        }
        Kind::CrashPostgres => {
            let postgres = world.postgres.lock().await;
            postgres.crash();
            tokio::time::sleep(fault.lasts).await;
            postgres.resume().await;
        }
        Kind::StallPostgres => {
            let postgres = world.postgres.lock().await;
            match tokio_postgres::connect(&postgres.url(), tokio_postgres::NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    let locked = client
                        .batch_execute(&format!("BEGIN; LOCK TABLE {SCHEMA}.log_rows IN ACCESS EXCLUSIVE MODE"))
                        .await;
                    match locked {
                        Ok(()) => {
                            tokio::time::sleep(fault.lasts).await;
                            let _ = client.batch_execute("ROLLBACK").await;
                        }
                        Err(error) => note = format!("not locked: {error}"),
                    }
                }
                Err(error) => note = format!("not connected: {error}"),
            }
        }
        Kind::CutPostgres => {
            let _held = world.proxy_lock.lock().await;
            world.proxy.cut();
            tokio::time::sleep(fault.lasts).await;
            world.proxy.restore();
        }
        Kind::FillDisk => {
            let _held = world.disk_lock.lock().await;
            match &world.disk {
                Some(disk) => {
                    let filler = disk.join("filler");
                    let filled = fill(&filler);
                    note = format!("{} MiB filled", filled >> 20);
                    tokio::time::sleep(fault.lasts).await;
                    let _ = std::fs::remove_file(&filler);
                }
                None => note = "skipped: no tmpfs (not root?)".into(),
            }
        }
        Kind::ReloadAgent(index) => {
            let mut slot = world.agents[index].lock().await;
            note = reload_agent(&mut slot.config, index, fault.variant);
            let path = slot.path.clone();
            slot.config.write_to(&path);
        }
        Kind::ReloadPersisters => {
            let records = [100i64, 1000, 5000][(fault.variant % 3) as usize];
            note = format!("batch_max_records={records}");
            for slot in &world.persisters {
                let mut slot = slot.lock().await;
                slot.config.set("persist", "batch_max_records", records);
                let path = slot.path.clone();
                slot.config.write_to(&path);
            }
        }
    }
    let done = Injected { kind: fault.kind, started: began - start, lasted: began.elapsed(), note };
    eprintln!(
        "soak: {:>7.1}s {} ({}) for {:.1}s {}",
        done.started.as_secs_f64(),
        done.kind.name(),
        target,
        done.lasted.as_secs_f64(),
        done.note
    );
    Ok(done)
}

/// Fills the disk holding `path` with one file until it is full; the bytes written.
fn fill(path: &Path) -> u64 {
    use std::io::Write as _;
    let Ok(mut file) = std::fs::File::create(path) else { return 0 };
    let chunk = vec![0u8; 256 << 10];
    let mut written = 0;
    while let Ok(n) = file.write(&chunk) {
        if n == 0 {
            break;
        }
        written += n as u64;
    }
    let _ = file.sync_all();
    written
}

/// Every second: restarts what exited without a fault asking (as a kubelet would), and keeps
/// each agent's last scrape (the counts of a run that dies without its final line).
async fn supervise(world: Arc<World>, stop: tokio_util::sync::CancellationToken) {
    while !stop.is_cancelled() {
        for shared in world.agents.iter().chain(&world.persisters) {
            let Ok(mut slot) = shared.try_lock() else { continue };
            if slot.down {
                continue;
            }
            let exited = slot.process.as_mut().is_some_and(|p| !p.running());
            if exited {
                let process = slot.process.take().expect("process");
                let log = process.log_text();
                match final_counts(&log) {
                    Some(counts) => slot.finals.push(counts),
                    None => {
                        let counts = slot.last_scrape.take().unwrap_or(Metrics(String::new()));
                        slot.unknown.push(counts);
                    }
                }
                let line = tail(&log, 3);
                slot.unexpected_exits.push(line);
                drop(process);
                slot.start().await;
                continue;
            }
            let admin = slot.admin();
            drop(slot);
            if let Ok((200, body)) = http_get(admin, "/metrics").await
                && let Ok(mut slot) = shared.try_lock()
            {
                slot.last_scrape = Some(Metrics(body));
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The rows of the soak's records: (writer, seq, try) → rows, and the longest time a record
/// waited from its write to the commit that stored it.
async fn rows(url: &str) -> (HashMap<(String, u64, u32), u64>, u64, Option<f64>) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    let query = format!(
        "SELECT record->>'w', (record->>'seq')::bigint, (record->>'try')::int, count(*)::bigint,
                max(extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000 - (record->>'t')::float8)
         FROM {SCHEMA}.log_rows GROUP BY 1, 2, 3" // the table: the view logs has no xmin
    );
    let mut counts = HashMap::new();
    let mut unparsed = 0;
    let mut waited: Option<f64> = None;
    for row in client.query(&query, &[]).await.expect("rows") {
        let (writer, seq, attempt, n): (Option<String>, Option<i64>, Option<i32>, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let wait: Option<f64> = row.get(4);
        match (writer, seq, attempt) {
            (Some(w), Some(s), Some(t)) => {
                counts.insert((w, s as u64, t as u32), n as u64);
                if let Some(wait) = wait {
                    waited = Some(waited.map_or(wait, |m: f64| m.max(wait)));
                }
            }
            _ => unparsed += n as u64,
        }
    }
    (counts, unparsed, waited)
}

/// Rows in `dead_letters` (every soak record is a valid envelope: there must be none).
async fn dead_letter_rows(url: &str) -> i64 {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    let row = client.query_one(&format!("SELECT count(*) FROM {SCHEMA}.dead_letters"), &[]).await.expect("count");
    row.get(0)
}

/// Committed offset and end of every partition.
async fn lag(bootstrap: &str, group: &str, topic: &str) -> Option<Vec<i64>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let (bootstrap, group, topic) = (bootstrap.to_string(), group.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer =
            rdkafka::ClientConfig::new().set("bootstrap.servers", &bootstrap).set("group.id", &group).create().ok()?;
        let mut wanted = rdkafka::TopicPartitionList::new();
        for partition in 0..PARTITIONS {
            wanted.add_partition(&topic, partition);
        }
        let committed = consumer.committed_offsets(wanted, Duration::from_secs(10)).ok()?;
        // Per partition: one committed past its end (a truncated log) must not hide another's lag.
        let mut lag = Vec::new();
        for partition in 0..PARTITIONS {
            let (_, high) = consumer.fetch_watermarks(&topic, partition, Duration::from_secs(10)).ok()?;
            let at = committed.find_partition(&topic, partition)?.offset().to_raw().filter(|o| *o >= 0).unwrap_or(0);
            lag.push(high - at);
        }
        Some(lag)
    })
    .await
    .ok()
    .flatten()
}

/// Waits for `what` (polled every second) until `deadline`; the error says what was left.
async fn drained<F, Fut>(what: &str, deadline: Instant, mut probe: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    loop {
        match probe().await {
            Ok(()) => return Ok(()),
            Err(left) if Instant::now() > deadline => return Err(format!("stuck: {what}: {left}")),
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// Each process's counters and log tail, for a failed soak.
async fn evidence(world: &World) -> String {
    let mut text = String::new();
    for slot in world.agents.iter().chain(&world.persisters) {
        let slot = slot.lock().await;
        let metrics = match http_get(slot.admin(), "/metrics").await {
            Ok((200, body)) => body,
            _ => "(no scrape)".into(),
        };
        let sluice: Vec<&str> =
            metrics.lines().filter(|l| l.starts_with(telemetry::PREFIX) && !l.contains("_bucket")).collect();
        let log = slot.logs.last().and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
        text.push_str(&format!(
            "\n=== {} metrics:\n{}\n=== {} log tail:\n{}\n",
            slot.name,
            sluice.join("\n"),
            slot.name,
            tail(&log, 25)
        ));
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the soak: scripts/soak [MINUTES], scripts/soak --smoke"]
async fn random_faults_lose_nothing_count_every_drop_store_nothing_twice_and_leave_nothing_stuck() {
    let settings = settings();
    let dir = tempfile::Builder::new().prefix("sluice-soak").tempdir().expect("tempdir");
    let run = Duration::from_secs(settings.seconds);
    let (first, gap) = if settings.smoke {
        (Duration::from_secs(5), (Duration::from_secs(1), Duration::from_secs(3)))
    } else {
        (Duration::from_secs(10), (Duration::from_secs(4), Duration::from_secs(15)))
    };
    let window = run.saturating_sub(if settings.smoke { Duration::from_secs(10) } else { Duration::from_secs(30) });
    let schedule = faults::schedule(settings.seed, first, window, gap, settings.smoke);
    eprintln!(
        "soak: seed {} (replay: scripts/soak {}--seed {}), {} s, {} faults",
        settings.seed,
        if settings.smoke { "--smoke ".to_string() } else { format!("{} ", settings.seconds / 60) },
        settings.seed,
        settings.seconds,
        schedule.len()
    );

    let (world, _mount) = World::start(dir.path()).await;
    let world = Arc::new(world);
    let (acked_rate, plain_rate) = (250, 250);
    let acked: Vec<(String, AckedWriter)> = {
        let socket = world.socket(0).await;
        ["d1", "d2"].iter().map(|w| (w.to_string(), AckedWriter::start(w, socket.clone(), acked_rate))).collect()
    };
    let session = ("c1".to_string(), AckedWriter::start_session("c1", world.socket(0).await, acked_rate));
    let mut plain: Vec<(String, usize, PlainWriter)> = Vec::new();
    for (agent, names, rate) in [(1, ["m1", "m2"], plain_rate), (2, ["l1", "l2"], 200)] {
        let socket = world.socket(agent).await;
        for name in names {
            plain.push((name.to_string(), agent, PlainWriter::start(name, socket.clone(), rate)));
        }
    }
    let supervisor_stop = tokio_util::sync::CancellationToken::new();
    let supervisor = tokio::spawn(supervise(world.clone(), supervisor_stop.clone()));
    let start = Instant::now();
    let tasks: Vec<_> = schedule.iter().map(|f| tokio::spawn(inject(world.clone(), f.clone(), start))).collect();
    let mut injected = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    for task in tasks {
        match task.await.expect("fault task") {
            Ok(done) => injected.push(done),
            Err(error) => failures.push(error),
        }
    }
    tokio::time::sleep_until((start + run).into()).await;
    let healed = start.elapsed();
    eprintln!("soak: every fault healed at {healed:?}; stopping the writers");

    // ---- The writers stop; what is left must drain.
    let mut acked_outcomes: Vec<(String, AckedOutcome)> = Vec::new();
    for (name, writer) in acked {
        acked_outcomes.push((name, writer.finish(Duration::from_secs(90)).await));
    }
    let session_outcome = (session.0, session.1.finish(Duration::from_secs(90)).await);
    let mut plain_outcomes: Vec<(String, usize, PlainOutcome)> = Vec::new();
    for (name, agent, writer) in plain {
        plain_outcomes.push((name, agent, writer.finish().await));
    }
    supervisor_stop.cancel();
    supervisor.await.expect("supervisor");
    let drain_started = Instant::now();
    let deadline = drain_started + DRAIN_LIMIT;
    for slot in &world.agents {
        let name = slot.lock().await.name.clone();
        let waited = drained(&format!("{name}'s buffer and spool"), deadline, || async move {
            // Asked at every look: an agent still starting has no address yet, and one that
            // restarted has a new one (port 0).
            let admin = slot.lock().await.admin();
            let metrics = match http_get(admin, "/metrics").await {
                Ok((200, body)) => Metrics(body),
                _ => return Err("no scrape".to_string()),
            };
            let (held, spooled) =
                (metrics.count(telemetry::BUFFER_RECORDS, &[]), metrics.count(telemetry::SPOOL_RECORDS, &[]));
            if held == 0.0 && spooled == 0.0 { Ok(()) } else { Err(format!("{held} held, {spooled} in the spool")) }
        })
        .await;
        if let Err(stuck) = waited {
            failures.push(stuck);
        }
    }
    for slot in &world.agents {
        let mut slot = slot.lock().await;
        if let Err(error) = slot.terminate(Duration::from_secs(40)).await {
            failures.push(error);
        }
    }
    let (bootstrap, group, topic) = (world.bootstrap.clone(), world.group.clone(), world.topic.clone());
    let committed = drained("consumer lag", deadline, || {
        let (bootstrap, group, topic) = (bootstrap.clone(), group.clone(), topic.clone());
        async move {
            match lag(&bootstrap, &group, &topic).await {
                Some(lags) if lags.iter().all(|lag| *lag == 0) => Ok(()),
                other => Err(format!("lag per partition {other:?}")),
            }
        }
    })
    .await;
    if let Err(stuck) = committed {
        failures.push(stuck);
    }
    let drain_took = drain_started.elapsed();
    if !failures.is_empty() {
        let evidence = evidence(&world).await;
        panic!("soak failed (seed {}):\n{}\n{evidence}", settings.seed, failures.join("\n"));
    }
    for slot in &world.persisters {
        let mut slot = slot.lock().await;
        if let Err(error) = slot.terminate(Duration::from_secs(40)).await {
            failures.push(error);
        }
    }

    // ---- The account.
    let url = world.postgres.lock().await.url();
    let (rows, unparsed, max_wait_ms) = rows(&url).await;
    let mut table = Account::default();
    for (writer, outcome) in &acked_outcomes {
        table.acked_writer(writer, outcome, &rows);
    }
    table.session_writer(&session_outcome.0, &session_outcome.1, &rows);
    let mut by_agent: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for (writer, agent, outcome) in &plain_outcomes {
        let (missing, uncertain_missing) = table.plain_writer(writer, outcome, &rows);
        let entry = by_agent.entry(*agent).or_default();
        entry.0 += missing;
        entry.1 += uncertain_missing;
    }
    let mut agents_json = Vec::new();
    for (index, slot) in world.agents.iter().enumerate() {
        let slot = slot.lock().await;
        let runs: Vec<Metrics> = slot.finals.iter().chain(&slot.unknown).map(|m| Metrics(m.0.clone())).collect();
        let counted: u64 = runs.iter().map(counted_lost).sum();
        let dropped = by_reason(&runs, telemetry::BUFFER_DROPPED);
        let rejected = by_reason(&runs, telemetry::INGEST_REJECTED);
        let failed = by_reason(&runs, telemetry::SHIP_FAILED);
        // Counted `unconfirmed`: sent, never answered before a drain ended; Kafka may hold them,
        // so each is missing or stored.
        let unconfirmed = failed.get(Failed::Unconfirmed.as_str()).copied().unwrap_or(0);
        if let Some(&(missing, uncertain)) = by_agent.get(&index) {
            let agrees = missing <= counted && counted - unconfirmed <= missing + uncertain;
            if missing > counted + uncertain {
                table.unaccounted += missing - counted - uncertain;
            }
            if counted - unconfirmed > missing + uncertain {
                table.overcounted += counted - unconfirmed - missing - uncertain;
            }
            if !agrees {
                table.failures.push(format!(
                    "{}: {missing} records missing (+{uncertain} uncertain), {counted} counted lost",
                    slot.name
                ));
            }
        }
        for exit in &slot.unexpected_exits {
            table.failures.push(format!("{} exited when no fault asked it to: {exit}", slot.name));
        }
        // A plain agent's records are accounted for by its counts: a run that ended without its
        // final counts (it was never killed on purpose) leaves a hole no check could close.
        if index > 0 && !slot.unknown.is_empty() {
            table.failures.push(format!("{}: {} runs ended without their final counts", slot.name, slot.unknown.len()));
        }
        agents_json.push(json!({
            "agent": slot.name, "runs": slot.logs.len(), "runs_without_final_counts": slot.unknown.len(),
            "unexpected_exits": slot.unexpected_exits.len(), "counted_lost": counted,
            "missing": by_agent.get(&index).map(|m| m.0), "dropped": dropped, "rejected": rejected, "failed": failed,
        }));
    }
    for slot in world.agents.iter().chain(&world.persisters) {
        let slot = slot.lock().await;
        for log in &slot.logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.contains("panicked")) {
                table.failures.push(format!("{} panicked: {line}", slot.name));
            }
        }
    }
    // Every run of every persister (a killed run: its last scrape), and the table itself.
    let mut persister_runs = Vec::new();
    for slot in &world.persisters {
        let slot = slot.lock().await;
        persister_runs.extend(slot.finals.iter().chain(&slot.unknown).map(|m| Metrics(m.0.clone())));
    }
    let sum = |name: &str| -> f64 { persister_runs.iter().map(|m| m.count(name, &[])).sum() };
    let persister_lost = sum(telemetry::PERSIST_LOST);
    let dead_letters = sum(telemetry::PERSIST_DEAD_LETTERS);
    let rebalances = sum(telemetry::PERSIST_REBALANCES);
    let stored_letters = dead_letter_rows(&url).await;
    if persister_lost > 0.0 || dead_letters > 0.0 || stored_letters > 0 {
        table.failures.push(format!(
            "persisters: {persister_lost} lost, {dead_letters} dead letters counted, {stored_letters} in dead_letters"
        ));
    }
    let writers: Vec<&str> = acked_outcomes
        .iter()
        .map(|(w, _)| w.as_str())
        .chain([session_outcome.0.as_str()])
        .chain(plain_outcomes.iter().map(|(w, _, _)| w.as_str()))
        .collect();
    let strangers: u64 = rows.iter().filter(|((w, _, _), _)| !writers.contains(&w.as_str())).map(|(_, n)| n).sum();
    if strangers > 0 {
        table.phantom += strangers;
        table.failures.push(format!("{strangers} rows of writers that do not exist"));
    }
    let unparsed_allowed: u64 = plain_outcomes.iter().map(|(_, _, o)| o.uncertain.len() as u64).sum();
    if unparsed > unparsed_allowed {
        table.failures.push(format!("{unparsed} rows that are not soak records"));
    }
    failures.extend(table.failures.iter().cloned());

    // ---- The table.
    let mut kinds: BTreeMap<&str, (u64, Duration)> = BTreeMap::new();
    for fault in &injected {
        let entry = kinds.entry(fault.kind.name()).or_default();
        entry.0 += 1;
        entry.1 += fault.lasted;
    }
    eprintln!(
        "\nsoak: seed {}, {} s of faults, drained {drain_took:.1?} after the writers stopped",
        settings.seed,
        healed.as_secs()
    );
    eprintln!("{:<26} {:>6} {:>12}", "fault", "count", "total time");
    for (kind, (count, total)) in &kinds {
        eprintln!("{kind:<26} {count:>6} {:>11.1}s", total.as_secs_f64());
    }
    eprintln!(
        "\nrecords written {} (acked and session writers: sent {}, resent {}, acked {}, naked {}), rows {}",
        table.written, table.sent, table.resent, table.acked, table.naked, table.rows
    );
    eprintln!(
        "session writer {} (client record ids): sent {}, resent {}, records acked {}, duplicated {}",
        session_outcome.0, table.session.sent, table.session.resent, table.session.acked, table.session.duplicated
    );
    eprintln!(
        "lost acked {}, lost unaccounted {}, counted beyond missing {}, duplicated {}, phantom {}, unsettled {}",
        table.lost_acked, table.unaccounted, table.overcounted, table.duplicated, table.phantom, table.unsettled
    );
    for agent in &agents_json {
        eprintln!("{agent}");
    }
    eprintln!(
        "persisters: rebalances {rebalances}, dead letters {dead_letters}, lost {persister_lost}; \
         max ack wait {:?}; max write-to-row {:.1} s",
        acked_outcomes.iter().map(|(_, o)| o.max_ack_wait).max().unwrap_or_default(),
        max_wait_ms.unwrap_or(0.0) / 1000.0
    );
    let result = json!({
        "seed": settings.seed, "seconds": settings.seconds, "smoke": settings.smoke,
        "faults": kinds.iter().map(|(k, (n, t))| (k.to_string(), json!({"count": n, "seconds": t.as_secs_f64()}))).collect::<serde_json::Map<_, _>>(),
        "fault_log": injected.iter().map(|f| json!({"kind": f.kind.name(), "target": f.kind.target(), "at": f.started.as_secs_f64(), "seconds": f.lasted.as_secs_f64(), "note": f.note})).collect::<Vec<_>>(),
        "records_written": table.written, "acked_sent": table.sent, "acked_resent": table.resent,
        "acked": table.acked, "naked": table.naked, "naked_reasons": table.nak_reasons,
        "rows": table.rows, "lost_acked": table.lost_acked, "lost_unaccounted": table.unaccounted, "counted_beyond_missing": table.overcounted,
        "session_writer": {"sent": table.session.sent, "resent": table.session.resent, "acked": table.session.acked, "duplicated": table.session.duplicated},
        "duplicated": table.duplicated, "phantom": table.phantom, "unsettled": table.unsettled,
        "agents": agents_json, "persister_rebalances": rebalances, "dead_letters": dead_letters,
        "persister_lost": persister_lost, "drain_seconds": drain_took.as_secs_f64(),
        "max_ack_wait_seconds": acked_outcomes.iter().map(|(_, o)| o.max_ack_wait).max().unwrap_or_default().as_secs_f64(),
        "max_write_to_row_seconds": max_wait_ms.map(|m| m / 1000.0),
        "failures": failures,
    });
    if let Some(results) = &settings.results {
        std::fs::create_dir_all(results).expect("results folder");
        let path = results.join("soak.json");
        std::fs::write(&path, serde_json::to_string_pretty(&result).expect("json")).expect("write results");
        eprintln!("written to {}", path.display());
    }
    if !failures.is_empty() {
        let evidence = evidence(&world).await;
        panic!("soak failed (seed {}):\n{}\n{evidence}", settings.seed, failures.join("\n"));
    }
}

/// The per-record account, over every writer.
#[derive(Default)]
struct Account {
    written: u64,
    sent: u64,
    resent: u64,
    acked: u64,
    naked: u64,
    nak_reasons: BTreeMap<String, u64>,
    rows: u64,
    lost_acked: u64,
    unaccounted: u64,
    overcounted: u64,
    duplicated: u64,
    phantom: u64,
    unsettled: u64,
    session: SessionAccount,
    failures: Vec<String>,
}

/// The session writer's own figures (its records are in the totals too).
#[derive(Default)]
struct SessionAccount {
    sent: u64,
    resent: u64,
    acked: u64,
    duplicated: u64,
}

impl Account {
    fn acked_writer(&mut self, writer: &str, outcome: &AckedOutcome, rows: &HashMap<(String, u64, u32), u64>) {
        self.sent += outcome.sent;
        self.resent += outcome.resent;
        self.written += outcome.tries.len() as u64;
        let mut examples = Vec::new();
        for (&seq, tries) in &outcome.tries {
            for (attempt, state) in tries.iter().enumerate() {
                let n = rows.get(&(writer.to_string(), seq, attempt as u32)).copied().unwrap_or(0);
                self.rows += n;
                if n > 1 {
                    self.duplicated += n - 1;
                    examples.push(format!("{writer} {seq} try {attempt}: {n} rows"));
                }
                match state {
                    Try::Acked => {
                        self.acked += 1;
                        if n == 0 {
                            self.lost_acked += 1;
                            examples.push(format!("{writer} {seq} try {attempt}: ACKed, no row"));
                        }
                    }
                    Try::Naked(reason) => {
                        self.naked += 1;
                        *self.nak_reasons.entry(reason.clone()).or_default() += 1;
                        if n > 0 {
                            self.phantom += n;
                            examples.push(format!("{writer} {seq} try {attempt}: NAKed ({reason}), stored"));
                        }
                    }
                    Try::Unknown => {}
                    Try::Unsettled => {
                        self.unsettled += 1;
                        examples.push(format!("{writer} {seq} try {attempt}: never settled"));
                    }
                }
            }
        }
        for violation in &outcome.violations {
            examples.push(format!("{writer}: {violation}"));
        }
        let known = |seq: u64, attempt: u32| outcome.tries.get(&seq).is_some_and(|t| (attempt as usize) < t.len());
        for ((w, seq, attempt), n) in rows {
            if w == writer && !known(*seq, *attempt) {
                self.phantom += n;
                examples.push(format!("{writer} {seq} try {attempt}: stored, never written"));
            }
        }
        if !examples.is_empty() {
            examples.truncate(10);
            self.failures.push(format!("acked writer {writer}: {}", examples.join("; ")));
        }
    }

    /// A session writer's records, each under one number however often it was sent: one ever
    /// ACKed is exactly one row; one only NAKed is none; one whose connection broke before its
    /// try was heard settled, and never ACKed after, is at most one.
    fn session_writer(&mut self, writer: &str, outcome: &AckedOutcome, rows: &HashMap<(String, u64, u32), u64>) {
        self.sent += outcome.sent;
        self.resent += outcome.resent;
        self.written += outcome.tries.len() as u64;
        self.session.sent += outcome.sent;
        self.session.resent += outcome.resent;
        let mut examples = Vec::new();
        for (&seq, tries) in &outcome.tries {
            let n = rows.get(&(writer.to_string(), seq, 0)).copied().unwrap_or(0);
            self.rows += n;
            if n > 1 {
                self.duplicated += n - 1;
                self.session.duplicated += n - 1;
                examples.push(format!("{writer} {seq} ({} sends): {n} rows", tries.len()));
            }
            if tries.contains(&Try::Unsettled) {
                self.unsettled += 1;
                examples.push(format!("{writer} {seq}: never settled"));
            }
            if tries.contains(&Try::Acked) {
                self.acked += 1;
                self.session.acked += 1;
                if n == 0 {
                    self.lost_acked += 1;
                    examples.push(format!("{writer} {seq}: ACKed, no row"));
                }
            } else if let Some(Try::Naked(reason)) = tries.last() {
                self.naked += 1;
                *self.nak_reasons.entry(reason.clone()).or_default() += 1;
                if n > 0 && !tries.contains(&Try::Unknown) {
                    self.phantom += n;
                    examples.push(format!("{writer} {seq}: only NAKed ({reason}), stored"));
                }
            }
        }
        for violation in &outcome.violations {
            examples.push(format!("{writer}: {violation}"));
        }
        for ((w, seq, attempt), n) in rows {
            if w == writer && (*attempt != 0 || !outcome.tries.contains_key(seq)) {
                self.phantom += n;
                examples.push(format!("{writer} {seq} try {attempt}: stored, never written"));
            }
        }
        if !examples.is_empty() {
            examples.truncate(10);
            self.failures.push(format!("session writer {writer}: {}", examples.join("; ")));
        }
    }

    /// Returns (records missing, uncertain records missing).
    fn plain_writer(
        &mut self,
        writer: &str,
        outcome: &PlainOutcome,
        rows: &HashMap<(String, u64, u32), u64>,
    ) -> (u64, u64) {
        self.written += outcome.written.len() as u64;
        let stored = |seq: u64| rows.get(&(writer.to_string(), seq, 0)).copied().unwrap_or(0);
        let mut missing = 0;
        let mut examples = Vec::new();
        for &seq in &outcome.written {
            let n = stored(seq);
            self.rows += n;
            match n {
                0 => missing += 1,
                1 => {}
                _ => {
                    self.duplicated += n - 1;
                    examples.push(format!("{writer} {seq}: {n} rows"));
                }
            }
        }
        let uncertain_missing = outcome.uncertain.iter().filter(|&&seq| stored(seq) == 0).count() as u64;
        for &seq in &outcome.uncertain {
            let n = stored(seq);
            self.rows += n;
            if n > 1 {
                self.duplicated += n - 1;
                examples.push(format!("{writer} {seq} (uncertain): {n} rows"));
            }
        }
        for ((w, seq, attempt), n) in rows {
            if w == writer && (*attempt != 0 || !(outcome.written.contains(seq) || outcome.uncertain.contains(seq))) {
                self.phantom += n;
                examples.push(format!("{writer} {seq}: stored, never written"));
            }
        }
        if !examples.is_empty() {
            examples.truncate(10);
            self.failures.push(format!("plain writer {writer}: {}", examples.join("; ")));
        }
        (missing, uncertain_missing)
    }
}
