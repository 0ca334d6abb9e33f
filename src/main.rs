//! The `sluice` binary: parses the command line, loads the config, installs logging and
//! metrics, runs one subcommand and maps its outcome to an exit code. Everything else lives in
//! the library so tests run the real thing.

// The binary's output (check-config, loadgen) is its product; library code never prints.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use sluice::client;
use sluice::config::Role;

/// Exit code for input `inject` refuses (EX_USAGE).
const EXIT_USAGE: u8 = 64;
/// Exit code for a config error: the file, a key or an environment override (EX_CONFIG).
const EXIT_CONFIG: u8 = 78;

/// The exit codes, for `--help` (sysexits.h's where one fits).
const EXIT_CODES: &str = "Exit codes:
  0    done; for agent and persist: drained and stopped on SIGTERM or SIGINT
  1    a failure at run time (the message says which)
  2    the command line is wrong (an unknown option, a missing argument)
  64   inject refused its input (EX_USAGE)
  78   the config is wrong: file, key or environment override, named on stderr (EX_CONFIG)
  130  a second signal cut the drain short";

mod cli;
#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Per-pod sidecar log shipper: socket -> Kafka -> PostgreSQL",
    after_help = EXIT_CODES
)]
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
        /// Print each record as one JSON line on stdout instead of sending it to Kafka
        /// (`ship.sink = "stdout"`): see what a config ships before touching Kafka.
        #[arg(long)]
        dry_run: bool,
    },
    /// Run a persister: consume the topic and write records to PostgreSQL.
    Persist {
        /// Config file (TOML).
        #[arg(short, long, env = "SLUICE_CONFIG")]
        config: PathBuf,
    },
    /// Send dead letters back to Kafka once their cause is fixed, and mark them
    /// (docs/DEAD_LETTERS.md). Idempotent: a record is stored once however often it is replayed.
    Replay {
        /// The persister's config file (TOML): its Kafka and PostgreSQL.
        #[arg(short, long, env = "SLUICE_CONFIG")]
        config: PathBuf,
        /// Only dead letters with this reason (`malformed_envelope`, `ingest_time_in_future`…).
        #[arg(long)]
        reason: Option<String>,
        /// Only those received at or after: an RFC 3339 time, or a duration before now (`2h`).
        #[arg(long, value_parser = cli::replay::parse_time)]
        since: Option<chrono::DateTime<chrono::Utc>>,
        /// Only those received before: an RFC 3339 time, or a duration before now.
        #[arg(long, value_parser = cli::replay::parse_time)]
        until: Option<chrono::DateTime<chrono::Utc>>,
        /// Only this one, `TOPIC/PARTITION/OFFSET` (repeatable).
        #[arg(long = "id")]
        ids: Vec<sluice::persist::replay::DeadLetterId>,
        /// Send them to this topic instead of the one each was read from.
        #[arg(long)]
        topic: Option<String>,
        /// At most this many.
        #[arg(long)]
        limit: Option<u64>,
        /// Also those replayed before (each is marked when it is).
        #[arg(long)]
        again: bool,
        /// List them; send and mark nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Validate a config file and print the effective config, secrets redacted.
    CheckConfig {
        /// Config file (TOML).
        file: PathBuf,
        /// Check the file alone: no `SLUICE_*__*` overrides, and the variables
        /// `kafka.properties_from_env` names need not be set (CI, away from the secrets).
        #[arg(long)]
        no_env: bool,
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
    ///
    /// Besides the container and its volumes it sets two pod settings a first run trips on, and
    /// says so on stderr: `securityContext.fsGroup` when the pod has none (the socket is mode 0660:
    /// the app may write to it only in that group; an existing fsGroup is kept, any works), and
    /// `terminationGracePeriodSeconds` when the pod's is shorter than the app's shutdown plus the
    /// agent's drain plus 5 s. Flags that describe the agent's ConfigMap (`--drain-timeout`) must
    /// match it; the chart's defaults are the flags' defaults.
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
        /// The agent's admin port (/metrics, /healthz, /readyz), set on the container and passed to
        /// the agent (SLUICE_AGENT__ADMIN_LISTEN). 9464 is also OpenTelemetry's Prometheus
        /// exporter's default: pick another if the app serves that (the chart's sidecar.adminPort).
        #[arg(long, default_value_t = 9464, value_parser = clap::value_parser!(u16).range(1..))]
        admin_port: u16,
        /// The pod's securityContext.fsGroup when it has none, or `none` to leave it unset (where
        /// the platform assigns one, as OpenShift's restricted SCC does).
        #[arg(long, default_value = "65532", value_parser = parse_fs_group)]
        fs_group: FsGroup,
        /// The agent's agent.drain_timeout, as its ConfigMap sets it (the chart's default: 25s).
        #[arg(long, default_value = "25s", value_parser = humantime::parse_duration)]
        drain_timeout: std::time::Duration,
        /// How long the app takes to stop on SIGTERM (counted into terminationGracePeriodSeconds).
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        app_shutdown: std::time::Duration,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Replay { config, reason, since, until, ids, topic, limit, again, dry_run } => {
            let selection = sluice::persist::replay::Selection { reason, since, until, ids, again, limit };
            cli::replay::run(&config, &sluice::persist::replay::Options { selection, topic, dry_run })
        }
        Command::CheckConfig { file, no_env } => cli::serve::check_config(&file, no_env),
        Command::Agent { config, dry_run } => cli::serve::serve(&config, Role::Agent, dry_run),
        Command::Persist { config } => cli::serve::serve(&config, Role::Persist, false),
        Command::Status { admin, interval } => report(runtime().and_then(|rt| {
            rt.block_on(async {
                cli::print(&sluice::status::status(admin, interval).await?).context("writing to stdout")
            })
        })),
        Command::Inject {
            file,
            config_map,
            image,
            no_native,
            app_container,
            buffer,
            spool_size_limit,
            admin_port,
            fs_group,
            drain_timeout,
            app_shutdown,
        } => {
            let options = sluice::inject::Options {
                config_map,
                image,
                native: !no_native,
                app_container,
                buffer,
                spool_size_limit,
                admin_port,
                fs_group: fs_group.0,
                drain_timeout,
                app_shutdown,
                ..sluice::inject::Options::default()
            };
            let input = match &file {
                Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display())),
                None => std::io::read_to_string(std::io::stdin()).context("reading stdin"),
            };
            match input.and_then(|text| sluice::inject::inject(&text, &options).map_err(anyhow::Error::from)) {
                Ok(out) => {
                    for note in &out.notes {
                        eprintln!("sluice inject: {note}");
                    }
                    report(cli::print(&out.manifest).context("writing to stdout"))
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
        Command::Loadgen { socket, records, connections, rate, text_every, size } => {
            let spec = client::LoadSpec { socket, records, connections, rate, text_every, size };
            report(loadgen(&spec))
        }
    }
}

/// `inject --fs-group`: a gid, or `none`.
#[derive(Clone, Copy, Debug)]
struct FsGroup(Option<u32>);

fn parse_fs_group(text: &str) -> Result<FsGroup, String> {
    if text == "none" {
        return Ok(FsGroup(None));
    }
    text.parse().map(|gid| FsGroup(Some(gid))).map_err(|_| format!("{text:?} is neither a group id nor `none`"))
}

fn loadgen(spec: &client::LoadSpec) -> anyhow::Result<()> {
    let report = client::run(spec).with_context(|| format!("writing to {}", spec.socket.display()))?;
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
