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
    /// The pod's labels and annotations, from a Downward API volume.
    pub pod_info: PodInfoConfig,
}

/// `[agent.pod_info]`: the pod's labels and annotations, read from a Downward API volume (the
/// chart and `sluice inject` mount one at `/etc/podinfo`), carried by every record's envelope
/// (stored in `pod_labels` and `pod_annotations`) and usable in templates
/// (`{pod.labels.app}`, `{pod.annotations.NAME}`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PodInfoConfig {
    /// The folder holding the `labels` and `annotations` files. Unset (the default): none read.
    pub path: Option<PathBuf>,
    /// Labels kept: names, or prefixes ending in `*`. Default `["*"]`: all.
    pub labels: Vec<String>,
    /// Annotations kept, the same way. Default `[]`: none (annotations often hold large blobs,
    /// such as `kubectl.kubernetes.io/last-applied-configuration`).
    pub annotations: Vec<String>,
    /// Labels and annotations never kept, even when listed above. Default
    /// `["pod-template-hash", "controller-revision-hash", "kubectl.kubernetes.io/*"]`.
    pub exclude: Vec<String>,
    /// Most bytes of labels and annotations (as JSON) a record carries; an entry past it is
    /// skipped, counted in `sluice_pod_info_skipped{reason="max_bytes"}`. At most 32 KiB.
    /// Default `4 KiB`.
    pub max_bytes: bytesize::ByteSize,
    /// How often the files are read again (the kubelet updates them within about a minute of a
    /// change); records read after a change carry the new values. At least 1s. Default `10s`.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
}

impl Default for PodInfoConfig {
    fn default() -> Self {
        Self {
            path: None,
            labels: vec!["*".into()],
            annotations: Vec::new(),
            exclude: vec![
                "pod-template-hash".into(),
                "controller-revision-hash".into(),
                "kubectl.kubernetes.io/*".into(),
            ],
            max_bytes: bytesize::ByteSize::kib(4),
            interval: Duration::from_secs(10),
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            admin_listen: "127.0.0.1:9464".into(),
            admin_config_endpoint: None,
            admin_address_file: None,
            drain_timeout: Duration::from_secs(20),
            pod_info: PodInfoConfig::default(),
        }
    }
}

impl AgentConfig {
    /// Checks what types alone cannot.
    pub(super) fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        valid_address(at, "admin_listen", &self.admin_listen)?;
        let pod_info = &self.pod_info;
        for (key, patterns) in
            [("labels", &pod_info.labels), ("annotations", &pod_info.annotations), ("exclude", &pod_info.exclude)]
        {
            for (i, pattern) in patterns.iter().enumerate() {
                if pattern.is_empty() || pattern.trim_end_matches('*').contains('*') {
                    return Err(at.invalid(
                        &format!("pod_info.{key}[{i}]"),
                        format!("`{pattern}`: a name, or a prefix ending in `*`"),
                    ));
                }
            }
        }
        if pod_info.max_bytes.as_u64() < 64 || pod_info.max_bytes.as_u64() > 32 * 1024 {
            return Err(at.invalid("pod_info.max_bytes", "must be between 64 B and 32 KiB"));
        }
        if pod_info.interval < crate::podinfo::MIN_INTERVAL {
            return Err(at.invalid("pod_info.interval", "must be at least 1s"));
        }
        Ok(())
    }
}
