//! `sluice-bench`: the benchmark tool behind `scripts/bench`, `scripts/bench-spool`,
//! `scripts/bench-capacity` and the other `scripts/bench-*` (which build it and run it with
//! their arguments). Parses the
//! command line, runs one benchmark, maps its outcome to an exit code; the benchmark itself is
//! `sluice_harness::bench`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sluice_harness::bench::{capacity, connections, otlp, pod, run, spool};

#[derive(Parser)]
#[command(name = "sluice-bench", about = "Sluice's benchmarks (scripts/bench, bench-spool, bench-connections)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// scripts/bench: every scenario, verified, into `bench/results/<time>/`.
    Run {
        /// Tiny counts, results in a temp dir (scripts/test runs this).
        #[arg(long)]
        smoke: bool,
        /// RECORDS SIZE CONNECTIONS RATE SECONDS OUTAGE (defaults 1000000 256 4 10000 30 30;
        /// with --smoke 20000 256 2 2000 2 3).
        #[arg(num_args = 0..=6)]
        values: Vec<u64>,
    },
    /// scripts/bench-spool: spool write throughput per fsync policy, drain after an outage.
    Spool {
        /// Records per fsync policy.
        #[arg(default_value_t = 300_000)]
        records: u64,
        /// Seconds without a broker.
        #[arg(default_value_t = 60)]
        outage: u64,
        /// Records per second meanwhile.
        #[arg(default_value_t = 5000)]
        rate: u64,
    },
    /// scripts/bench-connections: one busy connection beside idle and slowloris ones.
    Connections {
        /// Records the busy connection writes.
        #[arg(default_value_t = 300_000)]
        records: u64,
        /// Idle connections.
        #[arg(default_value_t = 1000)]
        idle: u64,
        /// Slowloris connections.
        #[arg(default_value_t = 10)]
        slow: u64,
    },
    /// The persister alone, for a before/after of one change: fills a topic (or reuses one),
    /// drains it REPEAT times into fresh schemas with `SLUICE_BENCH_BINARY`; rows/s, CPU,
    /// bytes per row.
    Persist {
        /// Records in the topic.
        #[arg(default_value_t = 500_000)]
        records: u64,
        /// Drain this topic (holding exactly RECORDS envelopes) instead of filling a new one.
        #[arg(long)]
        topic: Option<String>,
        /// Records of `bench/sample.jsonl` instead of 256 B ones.
        #[arg(long)]
        sample: bool,
        /// Runs.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// After each run, Kafka Connect with a JDBC sink on RECORDS records of the same shape
        /// (made afresh: with --topic, of the shape that topic was filled with); its jars in
        /// `SLUICE_KAFKA_CONNECT_LIB`, which `scripts/bench` fetches.
        #[arg(long)]
        kafka_connect: bool,
        /// After each run, the same drain with five typed columns (`[persist.columns]`), beside.
        #[arg(long)]
        columns: bool,
    },
    /// Sluice at max rate, then rsyslog, REPEAT times: the delivered / rsyslog target alone, for
    /// a before/after of one change (run it once per binary, `SLUICE_BENCH_BINARY`, alternating).
    MaxRate {
        /// RECORDS SIZE CONNECTIONS (defaults 1000000 256 4).
        #[arg(num_args = 0..=3)]
        values: Vec<u64>,
        /// Rounds.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
    },
    /// scripts/bench-otlp: records/s and agent CPU per record of OTLP (HTTP, gRPC) beside lines,
    /// on one agent.
    Otlp {
        /// Records per phase.
        #[arg(default_value_t = 500_000)]
        records: u64,
        /// Records per Export.
        #[arg(default_value_t = 512)]
        batch: u64,
    },
    /// scripts/bench-pod: one sidecar's cost — CPU, wake-ups, RSS — idle, at 1k and 10k records/s.
    Pod {
        /// Seconds per phase.
        #[arg(default_value_t = 60)]
        seconds: u64,
    },
    /// scripts/bench-capacity: the capacity model's inputs in one run on the same records —
    /// PostgreSQL's own COPY of the persister's rows, a persister's rows/s per replica and per
    /// partition, 1…N persisters against one primary, two clusters side by side, bytes per row,
    /// the agent's cost — into `bench/results/capacity-<time>/`.
    Capacity {
        /// Tiny counts, results in a temp dir (well under a minute).
        #[arg(long)]
        smoke: bool,
        /// Records in the topic (default 500000; with --smoke 4000).
        #[arg(long)]
        records: Option<u64>,
        /// The topic's partitions (default 4).
        #[arg(long)]
        partitions: Option<u32>,
        /// The most persisters against one primary (default 3).
        #[arg(long)]
        replicas: Option<u32>,
        /// Seconds per phase of the agent's cost (default 20; with --smoke 2).
        #[arg(long)]
        pod_seconds: Option<u64>,
    },
}

/// The repository: `SLUICE_ROOT` (the scripts set it), else the current directory.
fn root() -> PathBuf {
    std::env::var_os("SLUICE_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let services = sluice_harness::services();
    let root = root();
    let result = match cli.command {
        Command::Run { smoke, values } => {
            let args: Vec<String> = std::env::args().skip(2).collect();
            let settings = run::Settings::new(smoke, &values, args);
            bench(settings, &root, services).await
        }
        Command::Spool { records, outage, rate } => {
            spool::run(&spool::Settings { records, outage, rate }, &root, &services).await.map_err(anyhow::Error::from)
        }
        Command::Persist { records, topic, sample, repeat, kafka_connect, columns } => {
            persist_alone(records, topic, (sample, kafka_connect, columns), repeat, &root, services).await
        }
        Command::MaxRate { values, repeat } => max_rate(&values, repeat, &root, services).await,
        Command::Otlp { records, batch } => {
            otlp::run(&otlp::Settings { records, batch }, &services).await.map_err(anyhow::Error::from)
        }
        Command::Capacity { smoke, records, partitions, replicas, pod_seconds } => {
            let args: Vec<String> = std::env::args().skip(2).collect();
            let settings = capacity::Settings::new(smoke, (records, partitions, replicas, pod_seconds), args);
            capacity_run(settings, &root, services).await
        }
        Command::Pod { seconds } => pod::run(&pod::Settings { seconds }, &services).await.map_err(anyhow::Error::from),
        Command::Connections { records, idle, slow } => {
            connections::run(&connections::Settings { records, idle, slow }, &services)
                .await
                .map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("[bench] error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The whole benchmark; its schemas are dropped whatever happened (a panicking helper too).
async fn bench(
    settings: run::Settings,
    root: &std::path::Path,
    services: sluice_harness::Services,
) -> anyhow::Result<()> {
    let bench = std::sync::Arc::new(run::Bench::new(settings, root, services).await?);
    let outcome = tokio::spawn({
        let bench = bench.clone();
        async move { bench.run().await }
    })
    .await;
    bench.cleanup().await;
    let summary = outcome.map_err(|error| anyhow::anyhow!("the benchmark panicked: {error}"))??;
    #[expect(clippy::print_stdout, reason = "the summary is the command's output")]
    {
        print!("{summary}");
    }
    Ok(())
}

/// `sluice-bench capacity`: see [`Command::Capacity`]. Its schemas and topics are dropped and
/// deleted whatever happened.
async fn capacity_run(
    settings: capacity::Settings,
    root: &std::path::Path,
    services: sluice_harness::Services,
) -> anyhow::Result<()> {
    let run_settings = run::Settings::new(settings.smoke, &[], Vec::new()).results_prefix("capacity-");
    let bench = std::sync::Arc::new(run::Bench::new(run_settings, root, services).await?);
    let outcome = tokio::spawn({
        let bench = bench.clone();
        async move { bench.capacity(&settings).await }
    })
    .await;
    bench.cleanup().await;
    let summary = outcome.map_err(|error| anyhow::anyhow!("the benchmark panicked: {error}"))??;
    #[expect(clippy::print_stdout, reason = "the summary is the command's output")]
    {
        print!("{summary}");
    }
    Ok(())
}

/// `sluice-bench max-rate`: see [`Command::MaxRate`].
async fn max_rate(
    values: &[u64],
    repeat: u32,
    root: &std::path::Path,
    services: sluice_harness::Services,
) -> anyhow::Result<()> {
    let settings = run::Settings::new(false, values, Vec::new());
    let bench = std::sync::Arc::new(run::Bench::new(settings.temporary(), root, services).await?);
    let outcome = tokio::spawn({
        let bench = bench.clone();
        async move { bench.max_rate_against_rsyslog(repeat).await }
    })
    .await;
    bench.cleanup().await;
    let figures = outcome.map_err(|error| anyhow::anyhow!("the benchmark panicked: {error}"))??;
    #[expect(clippy::print_stdout, reason = "the figures are the command's output")]
    {
        print!("{figures}");
    }
    Ok(())
}

/// `sluice-bench persist`: see [`Command::Persist`].
async fn persist_alone(
    records: u64,
    topic: Option<String>,
    (sample, kafka_connect, columns): (bool, bool, bool),
    repeat: u32,
    root: &std::path::Path,
    services: sluice_harness::Services,
) -> anyhow::Result<()> {
    let (shape, label) = if sample {
        (sluice_harness::bench::Shape::sample(&root.join("bench/sample.jsonl"))?, "sample")
    } else {
        (sluice_harness::bench::Shape::Padded(256), "256 B")
    };
    let bench = std::sync::Arc::new(run::Bench::new(run::Settings::new(true, &[], Vec::new()), root, services).await?);
    // In a task of its own, as the whole run is: its schemas are dropped even if it panics.
    let outcome = tokio::spawn({
        let bench = bench.clone();
        async move { bench.persister_alone(records, topic, &shape, label, repeat, (kafka_connect, columns)).await }
    })
    .await;
    bench.cleanup().await;
    let figures = outcome.map_err(|error| anyhow::anyhow!("the benchmark panicked: {error}"))??;
    #[expect(clippy::print_stdout, reason = "the figures are the command's output")]
    {
        print!("{figures}");
    }
    Ok(())
}
