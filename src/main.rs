//! The `sluice` binary: parses the command line, loads the config, installs logging and
//! metrics, runs one subcommand and maps its outcome to an exit code. Everything else lives in
//! the library so tests run the real thing.

// The binary's output (check-config, loadgen) is its product; library code never prints.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use sluice::config::{Config, Role};
use sluice::shutdown::Shutdown;
use sluice::{agent, client, persist, telemetry};

/// Exit code for bad usage or configuration (EX_USAGE).
const EXIT_USAGE: u8 = 64;
/// Exit code when a second signal cut the drain short (128 + SIGINT).
const EXIT_FORCED: u8 = 130;
/// How long `agent` and `persist` wait, once their role has returned, for blocking tasks still
/// running: only calls the role stopped waiting for are left (the persister's final commit and
/// consumer close are bounded by `persist::CLOSE_TIMEOUT`), so a short wait lets them finish when
/// they can and never holds the exit.
const RUNTIME_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Parser)]
#[command(name = "sluice", version, about = "Per-pod sidecar log shipper: socket -> Kafka -> PostgreSQL")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the sidecar: read records from the Unix socket and ship them to Kafka.
    Agent {
        /// Config file (TOML).
        #[arg(short, long, env = "SLUICE_CONFIG")]
        config: PathBuf,
    },
    /// Run a persister: consume the topic and write records to PostgreSQL.
    Persist {
        /// Config file (TOML).
        #[arg(short, long, env = "SLUICE_CONFIG")]
        config: PathBuf,
    },
    /// Validate a config file and print the effective config, secrets redacted.
    CheckConfig {
        /// Config file (TOML).
        file: PathBuf,
    },
    /// Send records to an agent's socket: each MESSAGE as one record, or stdin line by line.
    Send {
        /// The agent's socket.
        #[arg(long, env = "SLUICE_SOCKET", default_value = "/run/sluice/sluice.sock")]
        socket: PathBuf,
        /// Records to send; without any, stdin is sent (one record per line).
        messages: Vec<String>,
    },
    /// Show a compact live view of an agent or a persister, read from its admin port.
    Status {
        /// The admin address (the agent's `agent.admin_listen` or the persister's).
        #[arg(default_value = "127.0.0.1:9464")]
        admin: std::net::SocketAddr,
        /// Time between the two scrapes the rates come from.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: std::time::Duration,
    },
    /// Add the agent as a sidecar to Kubernetes workloads (YAML on stdin or from a file, to stdout),
    /// exactly as the Helm chart's named templates do: `kubectl get deploy x -o yaml | sluice inject`.
    Inject {
        /// The manifest; stdin when absent.
        file: Option<PathBuf>,
        /// The ConfigMap holding the agent's config (the chart creates `<release>-sluice-agent`).
        #[arg(long, default_value = "sluice-sluice-agent")]
        config_map: String,
        /// The sluice image.
        #[arg(long, default_value = concat!("ghcr.io/sluice-logs/sluice:", env!("CARGO_PKG_VERSION")))]
        image: String,
        /// A regular container with a preStop wait instead of a native sidecar (Kubernetes < 1.29).
        #[arg(long)]
        no_native: bool,
        /// The app container whose logs these are (default: the first container).
        #[arg(long)]
        app_container: Option<String>,
        /// `disk` (a spool on an emptyDir) or `memory`.
        #[arg(long, default_value = "disk", value_parser = ["disk", "memory"])]
        buffer: String,
        /// The spool emptyDir's size limit.
        #[arg(long, default_value = "512Mi")]
        spool_size_limit: String,
    },
    /// Wait, then exit: the preStop hook of a sidecar that is not native, so the app's last lines
    /// arrive while the agent still accepts (Kubernetes sends SIGTERM only after the hook).
    PreStop {
        /// How long to wait.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        wait: std::time::Duration,
    },
    /// Write sample records to an agent's socket (demo and smoke tests, not benchmarks).
    Loadgen {
        /// The agent's socket.
        #[arg(long)]
        socket: PathBuf,
        /// Records in total.
        #[arg(long, default_value_t = 5000)]
        records: u64,
        /// Concurrent connections.
        #[arg(long, default_value_t = 4)]
        connections: u32,
        /// Records per second over all connections; 0 means as fast as possible.
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Every n-th record is plain text, the others JSON; 0 means all JSON.
        #[arg(long, default_value_t = 5)]
        text_every: u64,
        /// Pad every record to this many bytes; 0 keeps their natural size (~110 bytes).
        #[arg(long, default_value_t = 0)]
        size: usize,
    },
    /// Benchmark parts driven by scripts/bench; each prints one JSON object.
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// What `sluice bench` runs.
#[derive(Subcommand)]
enum BenchCommand {
    /// Write records to a socket, one blocking write per record, timing every write call.
    Load {
        /// The socket.
        #[arg(long)]
        socket: PathBuf,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// The ingest ceiling: the same writers into a reader that discards.
    SocketCeiling {
        /// Directory for the socket.
        #[arg(long)]
        dir: PathBuf,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// The shipping ceiling: a raw librdkafka producer with the agent's settings.
    ProducerCeiling {
        /// Agent config whose [kafka] and [ship] settings the producer uses.
        #[arg(short, long)]
        config: PathBuf,
        /// Topic to send to.
        #[arg(long)]
        topic: String,
        /// Records in total.
        #[arg(long)]
        records: u64,
        /// Record size in bytes (the envelope around it is the agent's).
        #[arg(long, default_value_t = 256, conflicts_with = "sample")]
        size: usize,
        /// Draw records from this JSON-lines sample instead.
        #[arg(long)]
        sample: Option<PathBuf>,
    },
    /// Creates a topic (by a metadata request, as auto-creation does) and waits for its leaders.
    EnsureTopic {
        /// Bootstrap servers.
        #[arg(long)]
        brokers: String,
        /// The topic.
        #[arg(long)]
        topic: String,
    },
    /// Reads a topic to its end: messages and distinct record ids.
    TopicRecords {
        /// Bootstrap servers.
        #[arg(long)]
        brokers: String,
        /// The topic.
        #[arg(long)]
        topic: String,
    },
    /// Messages in a topic (sum of high minus low watermarks).
    TopicCount {
        /// Bootstrap servers.
        #[arg(long)]
        brokers: String,
        /// The topic.
        #[arg(long)]
        topic: String,
    },
}

#[derive(clap::Args)]
struct LoadArgs {
    /// Records in total.
    #[arg(long)]
    records: u64,
    /// Concurrent connections (one thread each).
    #[arg(long, default_value_t = 1)]
    connections: u32,
    /// Records per second over all connections; 0: as fast as possible.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Record size in bytes, newline included.
    #[arg(long, default_value_t = 256, conflicts_with = "sample")]
    size: usize,
    /// Draw records from this JSON-lines sample instead (e.g. bench/sample.jsonl).
    #[arg(long)]
    sample: Option<PathBuf>,
}

impl LoadArgs {
    fn options(&self) -> Result<sluice::bench::LoadOptions, sluice::bench::BenchError> {
        Ok(sluice::bench::LoadOptions {
            records: self.records,
            connections: self.connections,
            rate: self.rate,
            shape: shape(self.size, self.sample.as_deref())?,
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => check_config(&file),
        Command::Agent { config } => serve(&config, Role::Agent),
        Command::Persist { config } => serve(&config, Role::Persist),
        Command::Status { admin, interval } => report(runtime().and_then(|rt| {
            rt.block_on(async {
                print!("{}", sluice::status::status(admin, interval).await?);
                Ok(())
            })
        })),
        Command::Inject { file, config_map, image, no_native, app_container, buffer, spool_size_limit } => {
            let options = sluice::inject::Options {
                config_map,
                image,
                native: !no_native,
                app_container,
                buffer,
                spool_size_limit,
                ..sluice::inject::Options::default()
            };
            let input = match &file {
                Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display())),
                None => std::io::read_to_string(std::io::stdin()).context("reading stdin"),
            };
            match input.and_then(|text| sluice::inject::inject(&text, &options).map_err(anyhow::Error::from)) {
                Ok(out) => {
                    print!("{out}");
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("sluice inject: {error:#}");
                    ExitCode::from(EXIT_USAGE)
                }
            }
        }
        Command::PreStop { wait } => report(runtime().map(|rt| rt.block_on(tokio::time::sleep(wait)))),
        Command::Send { socket, messages } => report(runtime().and_then(|rt| {
            rt.block_on(async {
                client::send(&socket, &messages, tokio::io::stdin())
                    .await
                    .map(|_| ())
                    .with_context(|| format!("sending to {}", socket.display()))
            })
        })),
        Command::Bench(command) => report(bench(command)),
        Command::Loadgen { socket, records, connections, rate, text_every, size } => {
            let spec = client::LoadSpec { socket, records, connections, rate, text_every, size };
            report(runtime().and_then(|rt| rt.block_on(loadgen_main(spec))))
        }
    }
}

fn check_config(file: &std::path::Path) -> ExitCode {
    match Config::load(file) {
        Ok(config) => {
            // A TOML comment, so the output stays a config file.
            println!("# postgres TLS: {}", config.postgres.describe_tls());
            print!("{}", config.to_redacted_toml());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("sluice: config error: {error}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn serve(file: &std::path::Path, role: Role) -> ExitCode {
    let config = match Config::load(file) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("sluice: config error: {error}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let log = telemetry::init_logging(&config.log);
    let reloading = Some(sluice::config::reload::Reloading { path: file.to_path_buf(), log });
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sluice: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        let metrics = telemetry::install_recorder(role.as_str())?;
        let shutdown = Shutdown::install().context("cannot install signal handlers")?;
        let scrape = metrics.clone();
        let work = async {
            match role {
                Role::Agent => agent::run(config, reloading, metrics, shutdown.token())
                    .await
                    .map(|_| ())
                    .map_err(anyhow::Error::from),
                Role::Persist => {
                    persist::run(config, reloading, metrics, shutdown.token()).await.map_err(anyhow::Error::from)
                }
            }
        };
        tokio::select! {
            result = work => {
                // The last word: what this process counted, also after the last scrape.
                tracing::info!(
                    target: telemetry::FINAL_COUNTS_TARGET,
                    counters = telemetry::final_counts(&scrape.render()),
                    "final counts"
                );
                result.map(|()| ExitCode::SUCCESS)
            }
            _ = shutdown.forced() => Ok(ExitCode::from(EXIT_FORCED)),
        }
    });
    // Dropping the runtime would wait for every blocking task, without end; one still running
    // now is a call the role gave up on (a librdkafka commit or close to a broker that does not
    // answer), whose result nobody reads.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    match outcome {
        Ok(code) => code,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "sluice stopped on an error");
            eprintln!("sluice: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Padded records of `size` bytes, or the lines of `sample`.
fn shape(size: usize, sample: Option<&std::path::Path>) -> Result<sluice::bench::Shape, sluice::bench::BenchError> {
    match sample {
        Some(path) => sluice::bench::Shape::sample(path),
        None => Ok(sluice::bench::Shape::Padded(size)),
    }
}

fn bench(command: BenchCommand) -> anyhow::Result<()> {
    use sluice::bench;
    let json = match command {
        BenchCommand::Load { socket, load } => serde_json::to_string(&bench::load(&socket, &load.options()?)?)?,
        BenchCommand::SocketCeiling { dir, load } => {
            serde_json::to_string(&bench::socket_ceiling(&dir, &load.options()?)?)?
        }
        BenchCommand::ProducerCeiling { config, topic, records, size, sample } => {
            let config = Config::load(&config)?;
            serde_json::to_string(&bench::producer_ceiling(
                &config,
                &topic,
                records,
                &shape(size, sample.as_deref())?,
            )?)?
        }
        BenchCommand::EnsureTopic { brokers, topic } => {
            bench::ensure_topic(&brokers, &topic)?;
            serde_json::json!({ "topic": topic }).to_string()
        }
        BenchCommand::TopicRecords { brokers, topic } => {
            serde_json::to_string(&bench::topic_records(&brokers, &topic)?)?
        }
        BenchCommand::TopicCount { brokers, topic } => {
            serde_json::json!({ "messages": bench::topic_count(&brokers, &topic)? }).to_string()
        }
    };
    println!("{json}");
    Ok(())
}

async fn loadgen_main(spec: client::LoadSpec) -> anyhow::Result<()> {
    let report = client::run(&spec).await.with_context(|| format!("writing to {}", spec.socket.display()))?;
    println!(
        "sent {} records ({:.1} MiB) over {} connections in {:.2}s: {:.0} records/s",
        report.records,
        report.bytes as f64 / (1024.0 * 1024.0),
        spec.connections,
        report.elapsed.as_secs_f64(),
        report.records_per_second()
    );
    Ok(())
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sluice: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}
