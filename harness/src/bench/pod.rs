//! `sluice-bench pod` (issue 15): what one sidecar costs its pod — an agent idle (no records at
//! all), then at 1,000 and at 10,000 records/s — in CPU, wake-ups and memory; asserts nothing.
//!
//! One agent (release build, memory buffer, the stack's broker), one connection writing 256-byte
//! records one `write` call each (as an app logs). For each phase of `seconds`: CPU (user +
//! system clock ticks, and cores), context switches of all its threads (voluntary and not: each
//! is a wake-up or a preemption), RSS at its end, threads. Platform teams multiply these by
//! their pod count.
//!
//! Owns: that table's scenario. Must not: print anything but the figures (stdout).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice::client::load::{Amount, Load, Records, Writes};
use sluice::telemetry;

use super::host::{clock_ticks, cpu_ticks, now, rss_kib};
use super::run::RunError;
use crate::{Services, TestConfig};

/// How long a fresh agent runs before its idle phase is measured: start-up is not idling.
pub const WARM_UP: Duration = Duration::from_secs(10);

/// The command line: `[SECONDS]` (default 60) per phase.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Seconds each phase is measured.
    pub seconds: u64,
}

/// One phase's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    /// Records per second written (0: idle).
    pub rate: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// CPU clock ticks (user + system) the agent used.
    pub cpu_ticks: u64,
    /// Cores: CPU seconds per second.
    pub cpu_cores: f64,
    /// Context switches of all the agent's threads.
    pub context_switches: u64,
    /// Resident memory at the end of the phase, MiB.
    pub rss_mib: f64,
    /// The agent's threads at the end of the phase.
    pub threads: u64,
}

impl Phase {
    /// Context switches per 1,000 records (with records).
    pub fn switches_per_1000_records(&self) -> Option<f64> {
        (self.rate > 0).then(|| self.context_switches as f64 / (self.rate as f64 * self.seconds) * 1000.0)
    }
}

#[expect(clippy::print_stdout, reason = "the figures are this command's output")]
fn say(line: &str) {
    println!("{line}");
}

/// Voluntary + involuntary context switches of every thread of `pid` (`/proc/PID/task/*/status`).
pub fn context_switches(pid: i32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|line| {
                    line.starts_with("voluntary_ctxt_switches") || line.starts_with("nonvoluntary_ctxt_switches")
                })
                .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// The threads of `pid`.
fn threads(pid: i32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |tasks| tasks.count() as u64)
}

/// Measures `pid` over `seconds` while `rate` records/s (0: none) of 256 bytes go to `socket`.
async fn phase(pid: i32, socket: &Path, rate: u64, seconds: u64) -> Result<Phase, RunError> {
    let ticks_per_second = clock_ticks() as f64;
    let running = if rate > 0 {
        let load = Load {
            socket: socket.to_path_buf(),
            connections: 1,
            amount: Amount::UntilStopped,
            rate,
            writes: Writes::Timed,
        };
        let records: Records = Arc::new(|_, index| {
            let mut line = format!("{{\"level\":\"info\",\"msg\":\"pod cost record {index}\",\"pad\":\"");
            line.extend(std::iter::repeat_n('x', 255usize.saturating_sub(line.len() + 2)));
            line.push_str("\"}\n");
            line.into_bytes()
        });
        let running = load.start(records).map_err(|error| RunError::Failed(format!("load: {error}")))?;
        // Settle into the rate before measuring.
        tokio::time::sleep(Duration::from_secs(3)).await;
        Some(running)
    } else {
        None
    };
    let (ticks, switches, started) = (cpu_ticks(pid), context_switches(pid), now());
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (ticks_after, switches_after, ended) = (cpu_ticks(pid), context_switches(pid), now());
    let (rss, threads) = (rss_kib(pid), threads(pid));
    if let Some(running) = running {
        running.stop().map_err(|error| RunError::Failed(format!("load: {error}")))?;
    }
    let seconds = ended - started;
    let cpu_ticks = ticks_after - ticks;
    Ok(Phase {
        rate,
        seconds,
        cpu_ticks,
        cpu_cores: cpu_ticks as f64 / ticks_per_second / seconds,
        context_switches: switches_after - switches,
        rss_mib: rss as f64 / 1024.0,
        threads,
    })
}

/// Measures the phases: idle first (a fresh agent, `warm_up` after it became ready), then 1k
/// and 10k records/s.
pub async fn measure(services: &Services, seconds: u64, warm_up: Duration) -> Result<Vec<Phase>, RunError> {
    measure_on(services, &format!("bench-pod-{}", now() as u64), seconds, warm_up).await
}

/// [`measure`], the agent shipping to `topic` (a caller that deletes its topics names it).
pub async fn measure_on(
    services: &Services,
    topic: &str,
    seconds: u64,
    warm_up: Duration,
) -> Result<Vec<Phase>, RunError> {
    let config = super::agent_config(TestConfig::empty("sluice-bench."), &services.kafka, topic);
    let mut agent = crate::start_agent(&config).await;
    tokio::time::sleep(warm_up).await;
    let mut phases = Vec::new();
    for rate in [0, 1_000, 10_000] {
        phases.push(phase(agent.pid(), &config.socket(), rate, seconds).await?);
    }
    let delivered = match crate::http_get(agent.admin(), "/metrics").await {
        Ok((200, body)) => sluice::telemetry::scrape::Scrape::parse(&body).sum(telemetry::SHIP_DELIVERED, &[]),
        _ => 0.0,
    };
    if delivered <= 0.0 {
        return Err(RunError::Failed("the agent delivered nothing".into()));
    }
    agent.stop(Duration::from_secs(30)).await;
    Ok(phases)
}

/// Runs the table against the stack's broker at `services`, printing it.
pub async fn run(settings: &Settings, services: &Services) -> Result<(), RunError> {
    say(&format!(
        "# sidecar cost per pod: one agent (memory buffer 64 MiB, Kafka at {}), {} s per phase, 256-byte records, one write call each",
        services.kafka, settings.seconds
    ));
    say("| load | CPU ticks | cores | context switches | per 1,000 records | RSS (MiB) | threads |");
    say("| --- | --- | --- | --- | --- | --- | --- |");
    for phase in measure(services, settings.seconds, WARM_UP).await? {
        let load = if phase.rate == 0 { "idle".to_string() } else { format!("{} records/s", phase.rate) };
        let per_1000 = phase.switches_per_1000_records().map_or("—".into(), |n| format!("{n:.0}"));
        say(&format!(
            "| {load} | {} | {:.4} | {} | {per_1000} | {:.1} | {} |",
            phase.cpu_ticks, phase.cpu_cores, phase.context_switches, phase.rss_mib, phase.threads
        ));
    }
    Ok(())
}
