//! `[log]`: how the sluice process logs itself.
//!
//! Owns: the section's schema and its checks. Must not: install the subscriber (telemetry does).

use serde::{Deserialize, Serialize};

use super::{At, ConfigError};

/// `[log]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter directive, e.g. `"info"` or `"info,sluice::ship=debug"`. Default `"info"`.
    pub level: String,
    /// `"text"` for people, `"json"` for log collectors (one flat object per line: `timestamp`,
    /// `level`, `message`, `target`, `span`, then the fields; see `telemetry::log_format`),
    /// `"auto"`: JSON unless stderr is a terminal. Default `"auto"`.
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { level: "info".into(), format: LogFormat::Auto }
    }
}

/// How sluice's own log lines are written.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// JSON unless stderr is a terminal.
    Auto,
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The levels a directive may name (`tracing`'s, and `off`).
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

impl LogConfig {
    /// Checks what types alone cannot. `tracing`'s filter reads a bare word that is not a level
    /// as a target's name: `level = "verbose"` would enable one target nobody logs to and turn
    /// every other line off, errors included. So each directive must be a level, or
    /// `target=level` with a level (`sluice::ship=debug`), or a span filter (`target[span]=level`).
    pub(super) fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        let is_level = |word: &str| LEVELS.iter().any(|level| word.eq_ignore_ascii_case(level));
        for directive in self.level.split(',').map(str::trim).filter(|directive| !directive.is_empty()) {
            let level = match directive.rsplit_once('=') {
                Some((_, level)) => level,
                None if directive.contains('[') => continue,
                None => directive,
            };
            if !is_level(level) {
                return Err(at.invalid(
                    "level",
                    format!(
                        "`{directive}` is not a level ({}), nor `target=level`; a bare word would be read as a \
                         target's name and silence every other line, errors included",
                        LEVELS.join(", ")
                    ),
                ));
            }
        }
        if let Err(error) = tracing_subscriber::EnvFilter::try_new(&self.level) {
            return Err(at.invalid("level", format!("`{}` is not a tracing filter: {error}", self.level)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(level: &str) -> Result<(), String> {
        let config = LogConfig { level: level.into(), format: LogFormat::Auto };
        config
            .validate(&At { file: "sluice.toml", prefix: "log".into(), environment: crate::config::Environment::Read })
            .map_err(|error| error.to_string())
    }

    #[test]
    fn a_level_that_is_not_one_is_refused_naming_the_key_instead_of_silencing_everything() {
        let error = check("verbose").expect_err("verbose is not a level");
        assert!(error.contains("sluice.toml") && error.contains("log.level") && error.contains("`verbose`"), "{error}");
        let error = check("info,sluice::ship=verbose").expect_err("nor is it a target's");
        assert!(error.contains("`sluice::ship=verbose`"), "{error}");
    }

    #[test]
    fn levels_and_target_directives_pass() {
        for level in ["info", "WARN", "off", "info,sluice::ship=debug", "sluice=trace,librdkafka=off", "debug,"] {
            assert_eq!(check(level), Ok(()), "{level}");
        }
    }
}
