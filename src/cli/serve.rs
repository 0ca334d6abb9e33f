//! `sluice agent`, `sluice persist` and `sluice check-config`: load the config, install logging
//! and metrics, run the role until its shutdown, and log its final counts.
//!
//! Owns: the process around a role (runtime, signals, exit codes). Must not: decide anything
//! the role decides.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use sluice::admin::AdminListener;
use sluice::config::{Config, Environment, Role};
use sluice::shutdown::Shutdown;
use sluice::{agent, persist, telemetry};

use super::super::{EXIT_CONFIG, runtime};

/// Exit code when a second signal cut the drain short (128 + SIGINT).
const EXIT_FORCED: u8 = 130;
/// How long `agent` and `persist` wait, once their role has returned, for blocking tasks still
/// running: only calls the role stopped waiting for are left (the persister's final commit and
/// consumer close are bounded by `persist::CLOSE_TIMEOUT`), so a short wait lets them finish when
/// they can and never holds the exit.
const RUNTIME_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

/// `Config::load`, and for a config an agent runs, the producer it makes
/// (`sluice::ship::check_producer`: librdkafka's checks across properties).
fn load(
    file: &std::path::Path,
    role: Option<Role>,
    environment: Environment,
) -> Result<Config, sluice::config::ConfigError> {
    let config = Config::load_with(file, environment)?;
    let mut producer = config.clone();
    if environment == Environment::Ignored {
        // The secrets are not here: librdkafka checks the settings with stand-ins.
        for (property, _) in std::mem::take(&mut producer.kafka.properties_from_env) {
            producer.kafka.properties.insert(property, "stand-in (check-config --no-env)".into());
        }
    }
    if role != Some(Role::Persist)
        && let Err(refused) = sluice::ship::check_producer(&producer)
    {
        return Err(sluice::config::ConfigError::Invalid {
            file: file.display().to_string(),
            key: "kafka.properties, ship.properties".into(),
            message: refused.to_string(),
        });
    }
    Ok(config)
}

/// Validates a config file and prints the effective config, secrets redacted; with `no_env`,
/// the file alone ([`Environment::Ignored`]).
pub fn check_config(file: &std::path::Path, no_env: bool) -> ExitCode {
    let environment = if no_env { Environment::Ignored } else { Environment::Read };
    match load(file, None, environment) {
        Ok(config) => {
            // TOML comments, so the output stays a config file.
            let environment = match environment {
                Environment::Read => "",
                Environment::Ignored => {
                    "# environment: not read (--no-env): no SLUICE_*__* overrides; the variables of \
                     kafka.properties_from_env are not checked\n"
                }
            };
            let text = format!(
                "{environment}# postgres TLS: {}\n# persister subscribes to: {}\n{}",
                config.postgres.describe_tls(),
                config.subscriptions().join(", "),
                config.to_redacted_toml()
            );
            match super::print(&text) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("sluice: writing to stdout: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(error) => {
            eprintln!("sluice: config error: {error}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// Runs `role` with the config in `file` until it has shut down; `dry_run` (the agent's
/// `--dry-run`) makes it a dry run ([`Config::dry_run`]: printed, in memory).
pub fn serve(file: &std::path::Path, role: Role, dry_run: bool) -> ExitCode {
    let config = match load(file, Some(role), Environment::Read) {
        Ok(mut config) => {
            if dry_run {
                config.dry_run();
            }
            config
        }
        Err(error) => {
            eprintln!("sluice: config error: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let log = telemetry::init_logging(&config.log);
    let reloading = Some(sluice::config::reload::Reloading { path: file.to_path_buf(), log, dry_run });
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
                Role::Agent => agent::run(config, AdminListener::Configured, reloading, metrics, shutdown.token())
                    .await
                    .map(|_| ())
                    .map_err(anyhow::Error::from),
                Role::Persist => persist::run(config, AdminListener::Configured, reloading, metrics, shutdown.token())
                    .await
                    .map_err(anyhow::Error::from),
            }
        };
        tokio::select! {
            result = work => {
                // The last word: what this process counted, also after the last scrape.
                tracing::info!(
                    target: telemetry::FINAL_COUNTS_TARGET,
                    counts = %telemetry::final_counts(&scrape.render()),
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
