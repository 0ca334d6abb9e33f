//! `[agent]`: the agent process's own settings (admin server, drain).
//!
//! Owns: the section's schema and checks. Must not: start anything.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{At, ConfigError, valid_address};

/// `[agent]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Address of the admin HTTP server (`/metrics`, `/healthz`, `/readyz`, `/config`). Default `"127.0.0.1:9464"`.
    pub admin_listen: String,
    /// Serve `/config` (the running config, secrets redacted) on the admin server: `true` or
    /// `false`. Unset (the default): only when `admin_listen` is a loopback address; elsewhere
    /// `/config` answers 403 saying how to enable it.
    pub admin_config_endpoint: Option<bool>,
    /// Write the admin server's bound address (`127.0.0.1:40123`) to this file once it
    /// listens: with `admin_listen` on port 0 the kernel picks a free port, and this file says
    /// which (the tests and the benchmark start every agent so). Unset (the default): no file.
    pub admin_address_file: Option<PathBuf>,
    /// On SIGTERM, how long the drain may take: records are sent for three quarters of it, the
    /// last quarter waits for Kafka's answers to what was sent; then the rest is given up.
    /// Keep it below the pod's `terminationGracePeriodSeconds`. Default `20s`.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            admin_listen: "127.0.0.1:9464".into(),
            admin_config_endpoint: None,
            admin_address_file: None,
            drain_timeout: Duration::from_secs(20),
        }
    }
}

impl AgentConfig {
    /// Checks what types alone cannot.
    pub(super) fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        valid_address(at, "admin_listen", &self.admin_listen)
    }
}
