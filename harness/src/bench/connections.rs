//! `scripts/bench-connections` (issue 4): ingest under many connections; asserts nothing.
//!
//! One agent (release build, memory buffer, the stack's broker); for each of no other
//! connections, and IDLE idle connections plus SLOW slowloris connections (one byte a second,
//! never a newline), it reports the agent's RSS, the bytes held in read buffers, and the
//! throughput of one busy connection writing RECORDS records of 256 bytes as fast as it can
//! (best of 3 runs).
//!
//! Owns: that table's scenario and the connections it holds open. Must not: print anything but
//! the figures (stdout).

use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice::client::LoadSpec;
use sluice::telemetry;

use super::host::{now, rss_kib};
use super::run::RunError;
use crate::{Process, Services, TestConfig};

/// The command line: `[RECORDS] [IDLE] [SLOW]` (defaults 300000, 1000, 10).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Records the busy connection writes per run.
    pub records: u64,
    /// Idle connections.
    pub idle: u64,
    /// Slowloris connections.
    pub slow: u64,
}

#[expect(clippy::print_stdout, reason = "the figures are this command's output")]
fn say(line: &str) {
    println!("{line}");
}

/// A fresh agent (see [`super::agent_config`]) taking `max_connections`, once it is ready.
async fn start(services: &Services, max_connections: u64) -> (TestConfig, Process) {
    let mut config = super::agent_config(
        TestConfig::empty("sluice-bench."),
        &services.kafka,
        &format!("bench-connections-{}", now() as u64),
    );
    config.listener("default", "max_connections", i64::try_from(max_connections).unwrap_or(i64::MAX));
    let agent = crate::start_agent(&config).await;
    (config, agent)
}

async fn metric_sum(agent: &Process, name: &str) -> String {
    let value = match crate::http_get(agent.admin(), "/metrics").await {
        Ok((200, body)) => sluice::telemetry::scrape::Scrape::parse(&body).sum(name, &[]),
        _ => 0.0,
    };
    format!("{value:.0}")
}

fn rss_mib(agent: &Process) -> String {
    format!("{:.1}", rss_kib(agent.pid()) as f64 / 1024.0)
}

/// The best of three runs of one connection writing as fast as it can, records/s.
async fn busy(socket: &Path, records: u64) -> Result<u64, RunError> {
    let mut best = 0;
    for _ in 0..3 {
        let spec =
            LoadSpec { socket: socket.to_path_buf(), records, connections: 1, rate: 0, text_every: 0, size: 256 };
        let report = tokio::task::spawn_blocking(move || sluice::client::run(&spec))
            .await
            .map_err(|error| RunError::Failed(error.to_string()))?
            .map_err(|source| RunError::Io { what: "writing the load".into(), source })?;
        best = best.max(report.records_per_second().round() as u64);
    }
    Ok(best)
}

/// `idle` silent connections and `slow` slowloris ones (one byte a second, never a newline),
/// held until dropped.
struct Held {
    stop: Arc<AtomicBool>,
    holder: Option<std::thread::JoinHandle<()>>,
}

impl Held {
    fn open(socket: &Path, idle: u64, slow: u64) -> Result<Self, RunError> {
        let mut connections = Vec::new();
        for _ in 0..idle + slow {
            connections.push(
                UnixStream::connect(socket)
                    .map_err(|source| RunError::Io { what: "could not open the connections".into(), source })?,
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let holder = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let idle = usize::try_from(idle).unwrap_or(usize::MAX);
                while !stop.load(Ordering::Relaxed) {
                    for stream in &mut connections[idle..] {
                        let _ = stream.write_all(b"x");
                    }
                    for _ in 0..10 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        #[expect(clippy::disallowed_methods, reason = "a plain thread pacing the slowloris bytes")]
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        });
        Ok(Self { stop, holder: Some(holder) })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(holder) = self.holder.take() {
            let _ = holder.join();
        }
    }
}

/// Runs the table against the stack's broker at `services`, printing as it goes.
pub async fn run(settings: &Settings, services: &Services) -> Result<(), RunError> {
    let Settings { records, idle, slow } = settings.clone();
    say(&format!(
        "# one busy connection ({records} records of 256 bytes, best of 3) beside idle and slowloris connections"
    ));
    say(&format!("# (a fresh agent per row: memory buffer 64 MiB, Kafka at {})", services.kafka));
    say(
        "| other connections | agent RSS at start (MiB) | RSS with them open (MiB) | read buffers (bytes) | busy connection records/s | RSS after (MiB) |",
    );
    say("| --- | --- | --- | --- | --- | --- |");
    let (config, mut agent) = start(services, idle + slow + 100).await;
    let idle_rss = rss_mib(&agent);
    let rate = busy(&config.socket(), records).await?;
    say(&format!(
        "| none | {idle_rss} | {idle_rss} | {} | {rate} | {} |",
        metric_sum(&agent, telemetry::INGEST_READ_BUFFER_BYTES).await,
        rss_mib(&agent)
    ));
    agent.stop(Duration::from_secs(60)).await;

    let (config, mut agent) = start(services, idle + slow + 100).await;
    let idle_rss = rss_mib(&agent);
    let held = Held::open(&config.socket(), idle, slow)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let open = metric_sum(&agent, telemetry::INGEST_CONNECTIONS_OPEN).await;
    let with_rss = rss_mib(&agent);
    let buffers = metric_sum(&agent, telemetry::INGEST_READ_BUFFER_BYTES).await;
    let rate = busy(&config.socket(), records).await?;
    say(&format!(
        "| {idle} idle + {slow} slowloris ({open} open) | {idle_rss} | {with_rss} | {buffers} | {rate} | {} |",
        rss_mib(&agent)
    ));
    say("");
    say(&format!(
        "refused: {}, dropped: {}, delivered: {}",
        metric_sum(&agent, telemetry::INGEST_REFUSED).await,
        metric_sum(&agent, telemetry::BUFFER_DROPPED).await,
        metric_sum(&agent, telemetry::SHIP_DELIVERED).await
    ));
    drop(held);
    agent.stop(Duration::from_secs(60)).await;
    Ok(())
}
