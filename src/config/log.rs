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
    /// `"text"` for people, `"json"` for log collectors, `"auto"`: JSON unless stderr is a
    /// terminal. Default `"auto"`.
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

impl LogConfig {
    /// Checks what types alone cannot.
    pub(super) fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        if tracing_subscriber::EnvFilter::try_new(&self.level).is_err() {
            return Err(at.invalid("level", format!("`{}` is not a tracing filter", self.level)));
        }
        Ok(())
    }
}
