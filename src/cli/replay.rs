//! `sluice replay`: the command line around [`sluice::persist::replay`] — the persister's config,
//! the choice of dead letters, one line per dead letter and a summary, and the exit code.
//!
//! Owns: parsing times (`--since 2h` or RFC 3339) and the output. Must not: decide which dead
//! letters are sent or marked (the library does).

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use sluice::config::Config;
use sluice::persist::replay::{self, Options, ReplayError};

use super::super::{EXIT_CONFIG, runtime};

/// `--since`/`--until`: an RFC 3339 time, or a duration before now (`90m`, `2d`).
pub fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc));
    }
    let ago = humantime::parse_duration(text)
        .map_err(|_| format!("`{text}` is neither an RFC 3339 time nor a duration before now (90m, 2d)"))?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|ago| Utc::now().checked_sub_signed(ago))
        .ok_or_else(|| format!("`{text}` is too long ago"))
}

/// Runs a replay with the persister's config in `file`: exit 0 when every chosen dead letter was
/// sent (or listed), 1 when some were not (they stay unmarked), 78 for a config error.
pub fn run(file: &std::path::Path, options: &Options) -> ExitCode {
    let config = match Config::load(file) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("sluice: config error: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sluice: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut output = Ok(());
    let result = runtime.block_on(replay::replay(&config, options, |line| {
        if output.is_ok() {
            output = super::print(&format!("{line}\n"));
        }
    }));
    match result {
        Ok(replayed) => {
            let by_reason: Vec<String> =
                replayed.sent.iter().map(|(reason, count)| format!("{reason}: {count}")).collect();
            let verb = if options.dry_run { "would replay" } else { "replayed" };
            eprintln!(
                "sluice replay: {verb} {} dead letters ({}){}",
                replayed.total(),
                if by_reason.is_empty() { "none chosen".to_string() } else { by_reason.join(", ") },
                if replayed.failed > 0 {
                    format!("; {} not acknowledged by Kafka, left unmarked: run it again", replayed.failed)
                } else {
                    String::new()
                }
            );
            if replayed.failed > 0 || output.is_err() { ExitCode::FAILURE } else { ExitCode::SUCCESS }
        }
        Err(error @ ReplayError::UnknownReason(..)) => {
            eprintln!("sluice replay: {error}");
            ExitCode::from(2)
        }
        Err(error) => {
            eprintln!("sluice replay: {error}");
            ExitCode::FAILURE
        }
    }
}
