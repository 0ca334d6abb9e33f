//! `scripts/bench-spool` (issue 3): the disk spool's figures; asserts nothing.
//!
//! 1. Spool write throughput for 256-byte records with `buffer.fsync` = `never`, `10ms`,
//!    `always`, and the agent's peak RSS at each (Kafka unreachable, so every record only goes
//!    to the spool).
//! 2. Drain after a broker outage: steady load, the stack's broker stopped for OUTAGE seconds,
//!    then the time until the spool is back to its steady level and the delivery rate meanwhile.
//!    Part 2 stops and starts the stack's broker: not while tests use the stack.
//!
//! Owns: those two tables' scenarios. Must not: print anything but the figures (stdout).

use std::path::Path;
use std::time::Duration;

use sluice::client::LoadSpec;
use sluice::telemetry;

use super::host::{hwm_kib, now};
use super::run::{RunError, stack};
use crate::{NO_BROKER, Process, Services, TestConfig};

/// The command line: `[RECORDS] [OUTAGE_SECONDS] [RATE]` (defaults 300000, 60, 5000).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Records per fsync policy.
    pub records: u64,
    /// Seconds without a broker.
    pub outage: u64,
    /// Records per second during the outage run.
    pub rate: u64,
}

#[expect(clippy::print_stdout, reason = "the figures are this command's output")]
fn say(line: &str) {
    println!("{line}");
}

/// An agent on a disk spool with `fsync`, Kafka at `brokers`; ready to write to once its
/// socket and `/healthz` answer (not `/readyz`: Kafka may be unreachable on purpose).
async fn start(brokers: &str, fsync: &str, topic: &str) -> Result<(TestConfig, Process), RunError> {
    let mut config = super::agent_config(TestConfig::empty("sluice-bench."), brokers, topic);
    let spool = config.dir.path().join("spool").display().to_string();
    config
        .set("buffer", "type", "disk")
        .set("buffer", "path", spool)
        .set("buffer", "max_disk_bytes", "4 GiB")
        .set("buffer", "fsync", fsync)
        .set("buffer", "block_timeout", "forever");
    let agent = config.spawn_agent_at(&config.write()).await;
    for _ in 0..100 {
        if let Ok((200, _)) = crate::http_get(agent.admin(), "/healthz").await {
            return Ok((config, agent));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(RunError::Failed(format!("agent did not start\n{}", agent.log_text())))
}

/// One metric of the agent (summed over its series). A failed scrape is an error, never a 0
/// that would look like an empty spool.
async fn metric(agent: &Process, name: &str) -> Result<f64, RunError> {
    match crate::http_get(agent.admin(), "/metrics").await {
        Ok((200, body)) => Ok(sluice::telemetry::scrape::Scrape::parse(&body).sum(name, &[])),
        Ok((status, _)) => {
            Err(RunError::Failed(format!("the agent's /metrics answered {status}\n{}", agent.log_text())))
        }
        Err(error) => Err(RunError::Failed(format!("cannot scrape the agent: {error}\n{}", agent.log_text()))),
    }
}

/// How long the spool may take to take in the load, or to drain after the outage.
const SPOOL_WAIT: Duration = Duration::from_secs(600);

/// Waits until `name` satisfies `done`, at most [`SPOOL_WAIT`]; the error says what it last saw.
async fn until(agent: &Process, name: &str, what: &str, done: impl Fn(f64) -> bool) -> Result<(), RunError> {
    let deadline = std::time::Instant::now() + SPOOL_WAIT;
    loop {
        let value = metric(agent, name).await?;
        if done(value) {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(RunError::Failed(format!("{what}: {name} is still {value} after {SPOOL_WAIT:?}")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn spec(socket: &Path, records: u64, connections: u32, rate: u64) -> LoadSpec {
    LoadSpec { socket: socket.to_path_buf(), records, connections, rate, text_every: 0, size: 256 }
}

/// Runs both parts against the stack's broker at `services`, printing as it goes.
pub async fn run(settings: &Settings, root: &Path, services: &Services) -> Result<(), RunError> {
    let records = settings.records;
    say(&format!("# spool write throughput: {records} records of 256 bytes, 4 connections, Kafka unreachable"));
    say("| fsync | records/s | MiB/s | agent peak RSS (MiB) |");
    say("| --- | --- | --- | --- |");
    for fsync in ["never", "10ms", "always"] {
        let (config, mut agent) = start(NO_BROKER, fsync, "bench").await?;
        let started = now();
        let load = spec(&config.socket(), records, 4, 0);
        tokio::task::spawn_blocking(move || sluice::client::run(&load))
            .await
            .map_err(|error| RunError::Failed(error.to_string()))?
            .map_err(|source| RunError::Io { what: "writing the load".into(), source })?;
        until(&agent, telemetry::SPOOL_RECORDS, "every record spooled", |spooled| spooled == records as f64).await?;
        let seconds = ((now() - started) * 100.0).round() / 100.0;
        say(&format!(
            "| {fsync} | {:.0} | {:.1} | {:.1} |",
            records as f64 / seconds,
            records as f64 * 256.0 / seconds / 1_048_576.0,
            hwm_kib(agent.pid()) as f64 / 1024.0
        ));
        agent.stop(Duration::from_secs(60)).await;
    }

    let (outage, rate) = (settings.outage, settings.rate);
    say("");
    say(&format!("# drain after a {outage}s broker outage under {rate} records/s (256 bytes, fsync 10ms)"));
    let topic = format!("bench-drain-{}", now() as u64);
    let (config, mut agent) = start(&services.kafka, "10ms", &topic).await?;
    let (load, records) = spec(&config.socket(), rate * (outage + 300), 2, rate).generator();
    let running = load.start(records).map_err(|source| RunError::Io { what: "connecting the load".into(), source })?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let steady = metric(&agent, telemetry::SPOOL_RECORDS).await?;
    stack(root, "kafka-stop")?;
    let outage_started = now();
    tokio::time::sleep(Duration::from_secs(outage)).await;
    let backlog = metric(&agent, telemetry::SPOOL_RECORDS).await?;
    let delivered_before = metric(&agent, telemetry::SHIP_DELIVERED).await?;
    stack(root, "kafka-start")?;
    let back = now();
    // Empty again: the spool is back to what it held in steady state (records waiting for linger).
    let limit = steady.trunc() + rate as f64;
    until(&agent, telemetry::SPOOL_RECORDS, "the backlog drained", |spooled| spooled.trunc() <= limit).await?;
    let drained = now();
    let delivered = metric(&agent, telemetry::SHIP_DELIVERED).await?.trunc() - delivered_before.trunc();
    let seconds = ((drained - back) * 100.0).round() / 100.0;
    say(&format!(
        "backlog after the outage: {backlog} records ({:.2} s without a broker, broker restart included)",
        back - outage_started
    ));
    say(&format!("time to empty after the broker answered again: {seconds:.2} s"));
    say(&format!(
        "delivery rate while draining: {:.0} records/s (backlog drain {:.0} records/s net of the {rate}/s still arriving)",
        delivered / seconds,
        delivered / seconds - rate as f64
    ));
    say(&format!("agent peak RSS: {:.1} MiB", hwm_kib(agent.pid()) as f64 / 1024.0));
    say(&format!("dropped: {:.0}", metric(&agent, telemetry::BUFFER_DROPPED).await?));
    tokio::task::spawn_blocking(move || running.stop()).await.ok();
    agent.stop(Duration::from_secs(60)).await;
    Ok(())
}
