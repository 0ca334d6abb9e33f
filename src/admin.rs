//! Admin HTTP server: `/metrics` (Prometheus text), `/healthz` (the process runs), `/readyz`
//! (it can do its job: 200, or 503 with the reason), `/healthz/<dependency>` (the state of what
//! it talks to — Kafka, PostgreSQL — which is never part of `/readyz`: see [`Checks`]),
//! `/config` (the running config, secrets redacted — served only where it is meant to be seen,
//! see [`ConfigEndpoint`]).
//!
//! Owns: the admin listener (and, when asked, the file saying what it bound: a port-0 listener's
//! address for tests and the benchmark), its routes, and the bounds on its connections ([`Limits`]): the
//! chart binds it on `0.0.0.0`, so whoever reaches the pod's network can open connections, and a
//! client that connects and then sends nothing, or a byte at a time (a slowloris), must not be
//! able to pile up descriptors and buffers. Must not: do work of the pipeline, block on Kafka or
//! PostgreSQL inside a request (readiness is computed from flags that other tasks keep current),
//! or open a second metrics listener (the exporter's `render()` is served here).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::config::Config;

/// Renders the running config (secrets redacted) for `/config`.
pub type ConfigView = Arc<dyn Fn() -> String + Send + Sync>;

/// `/config` for a process whose running config is `running`: secrets redacted.
pub fn config_view(running: &std::sync::Arc<std::sync::RwLock<crate::config::Config>>) -> ConfigView {
    let running = running.clone();
    std::sync::Arc::new(move || running.read().unwrap_or_else(|poisoned| poisoned.into_inner()).to_redacted_toml())
}

/// Says whether the process is ready (with a short status line) or why not. Must be cheap: it
/// runs per request.
pub type ReadinessCheck = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// What the health routes answer. `ready` is `/readyz`: whether the process does its job — for
/// the agent, whether its sockets accept records. A dependency's state is apart
/// (`/healthz/<name>`: 200 with a status line, 503 with what is wrong), so that a probe, a
/// dashboard or `curl` can see it without it taking a pod out of service: in a pod a sidecar's
/// readiness is its app's, and a consumer with no Service in front of it that turns unready for
/// PostgreSQL makes its PodDisruptionBudget block node drains.
#[derive(Clone)]
pub struct Checks {
    /// `/readyz`.
    pub ready: ReadinessCheck,
    /// `/healthz/<name>`, one per dependency.
    pub dependencies: Vec<(&'static str, ReadinessCheck)>,
}

/// Sets the gauges a role computes only when asked (the buffer's records, bytes and age,
/// readiness): run before each `/metrics` render, so an idle process needs no timer to keep
/// them current.
pub type Refresh = Arc<dyn Fn() + Send + Sync>;

pub mod client;

/// Why the admin server could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The address could not be bound (in use, not local, not an address).
    #[error("cannot bind the admin server to {address}: {source}")]
    Bind {
        /// The configured address.
        address: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The role's `admin_address_file` could not be written.
    #[error("cannot write the admin server's address to {}: {source}", file.display())]
    AddressFile {
        /// The file.
        file: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// Whether `/config` is served: as the role's config key says (`agent.admin_config_endpoint`,
/// `persist.admin_config_endpoint`) or, unset, only when the server listens on a loopback
/// address — then only processes in the pod's own network namespace can ask. Secrets are
/// redacted either way, but the rest (broker and database addresses, topic, group, user names)
/// is not for whoever can reach a `0.0.0.0` port.
#[derive(Debug, Clone, Copy)]
pub struct ConfigEndpoint {
    /// The config key that decides it, named when `/config` is refused.
    pub key: &'static str,
    /// Its value: `None` when unset.
    pub enabled: Option<bool>,
}

impl ConfigEndpoint {
    /// The agent's rule: `agent.admin_config_endpoint`.
    pub fn agent(config: &Config) -> Self {
        Self { key: "agent.admin_config_endpoint", enabled: config.agent.admin_config_endpoint }
    }

    /// The persister's rule: `persist.admin_config_endpoint`.
    pub fn persist(config: &Config) -> Self {
        Self { key: "persist.admin_config_endpoint", enabled: config.persist.admin_config_endpoint }
    }
}

/// Most admin connections open at once. Prometheus, the kubelet's probes and `sluice status`
/// need a handful; more are accepted and closed at once.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send a request's headers — and, since hyper starts the same
/// timer when a kept-alive connection waits for its next request, how long such a connection
/// may sit idle.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest life of one admin connection, however busy: also bounds a client that sends requests
/// and never reads the answers.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Largest read buffer of a connection (request line and headers; hyper's default is ~400 KiB):
/// 64 connections hold at most 1 MiB of it.
const MAX_BUF_BYTES: usize = 16 * 1024;
/// Pause after an accept error (EMFILE and friends), so the loop backs off instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Bounds on the admin server's connections (the constants above; tests use smaller ones).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Time to send a request's headers, and idle time between kept-alive requests.
    pub header_read_timeout: Duration,
    /// Longest life of a connection.
    pub lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            header_read_timeout: HEADER_READ_TIMEOUT,
            lifetime: CONNECTION_LIFETIME,
        }
    }
}

/// Where a role's admin server listens.
#[derive(Debug)]
pub enum AdminListener {
    /// The role's `admin_listen` from the config, bound while the role builds, so that a port
    /// conflict fails the start (what `sluice agent` and `sluice persist` do).
    Configured,
    /// A listener its caller bound already (port 0, say): a test that runs the role in its own
    /// runtime knows the address before the role starts, and nothing else can take the port.
    Bound(TcpListener),
}

/// A bound admin server.
pub struct AdminServer {
    listener: TcpListener,
    limits: Limits,
    /// `None`: `/config` is served; otherwise the text it answers 403 with.
    config_refusal: Option<String>,
}

impl AdminServer {
    /// Binds `address` now, so a port conflict fails start-up instead of a later task.
    pub async fn bind(address: &str, config: ConfigEndpoint) -> Result<Self, AdminError> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| AdminError::Bind { address: address.to_string(), source })?;
        Self::serving_on(listener, address, config)
    }

    /// The admin server where `listen` says: for [`AdminListener::Configured`], `address` (the
    /// role's `admin_listen`) is bound now.
    pub async fn open(listen: AdminListener, address: &str, config: ConfigEndpoint) -> Result<Self, AdminError> {
        match listen {
            AdminListener::Configured => Self::bind(address, config).await,
            AdminListener::Bound(listener) => Self::serving_on(listener, "a listener bound by the caller", config),
        }
    }

    /// The server on `listener`; `address` names it in an error.
    fn serving_on(listener: TcpListener, address: &str, config: ConfigEndpoint) -> Result<Self, AdminError> {
        let error = |source| AdminError::Bind { address: address.to_string(), source };
        let local = listener.local_addr().map_err(error)?;
        let served = config.enabled.unwrap_or_else(|| local.ip().to_canonical().is_loopback());
        let config_refusal = (!served).then(|| match config.enabled {
            Some(_) => format!("/config is disabled ({} = false)\n", config.key),
            None => format!(
                "/config is served only on a loopback address, and this server listens on {local}; \
                 set {} = true to serve it here\n",
                config.key
            ),
        });
        Ok(Self { listener, limits: Limits::default(), config_refusal })
    }

    /// The bound address (useful when binding port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Writes the bound address (`127.0.0.1:40123` and a newline) to `file`, the role's
    /// `admin_address_file`, if it has one: with `admin_listen` on port 0 the kernel picks the
    /// port, and this says which. Written beside it and renamed into place, so a reader never
    /// sees half an address; replaced at each start, left behind at exit.
    pub fn announce(&self, file: Option<&Path>) -> Result<(), AdminError> {
        let Some(file) = file else { return Ok(()) };
        let error = |source| AdminError::AddressFile { file: file.to_path_buf(), source };
        let address = self.listener.local_addr().map_err(error)?;
        let mut partial = file.as_os_str().to_owned();
        partial.push(".partial");
        std::fs::write(&partial, format!("{address}\n")).map_err(error)?;
        std::fs::rename(&partial, file).map_err(error)
    }

    /// Serves until `stop` is cancelled. The server is stopped last during shutdown so that
    /// `/readyz` can say "draining" and `/metrics` shows the drain.
    pub async fn serve(
        self,
        metrics: PrometheusHandle,
        refresh: Refresh,
        checks: Checks,
        config: ConfigView,
        stop: CancellationToken,
    ) {
        let AdminServer { listener, limits, config_refusal } = self;
        if let Ok(address) = listener.local_addr() {
            info!(%address, config_endpoint = config_refusal.is_none(), "admin server listening");
        }
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).max_buf_size(MAX_BUF_BYTES);
        let slots = Arc::new(Semaphore::new(limits.max_connections));
        let routes = Arc::new(Routes { metrics, refresh, checks, config, config_refusal });
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    debug!(%error, "admin accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                // Accepted, then closed at once: the client sees the connection end instead of
                // waiting in the kernel's backlog.
                debug!(%peer, limit = limits.max_connections, "admin connection refused: too many open");
                drop(stream);
                continue;
            };
            let routes = routes.clone();
            let service = service_fn(move |request| {
                let response = routes.route(&request);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http.serve_connection(TokioIo::new(stream), service);
            // Admin connections are not tracked: they hold no records and end with the process.
            tokio::spawn(async move {
                match tokio::time::timeout(limits.lifetime, connection).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => debug!(%error, "admin connection ended with an error"),
                    Err(_) => debug!(%peer, "admin connection closed at its lifetime limit"),
                }
                drop(slot);
            });
        }
    }
}

/// What the routes read.
struct Routes {
    metrics: PrometheusHandle,
    refresh: Refresh,
    checks: Checks,
    config: ConfigView,
    config_refusal: Option<String>,
}

impl Routes {
    fn route(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
        }
        match request.uri().path() {
            "/metrics" => {
                (self.refresh)();
                crate::telemetry::collect_process_metrics();
                let mut response = text(StatusCode::OK, self.metrics.render());
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                response
            }
            "/healthz" => text(StatusCode::OK, "ok\n".into()),
            "/config" => match &self.config_refusal {
                None => text(StatusCode::OK, (self.config)()),
                Some(refusal) => text(StatusCode::FORBIDDEN, refusal.clone()),
            },
            "/readyz" => match (self.checks.ready)() {
                Ok(status) => text(StatusCode::OK, format!("{status}\n")),
                Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")),
            },
            path => {
                let dependency = path.strip_prefix("/healthz/").and_then(|name| {
                    self.checks.dependencies.iter().find(|(known, _)| *known == name).map(|(_, check)| check)
                });
                match dependency.map(|check| check()) {
                    Some(Ok(status)) => text(StatusCode::OK, format!("{status}\n")),
                    Some(Err(reason)) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
                    None => {
                        let mut routes = String::from("not found; try /metrics, /healthz, /readyz, /config");
                        for (name, _) in &self.checks.dependencies {
                            routes.push_str(&format!(", /healthz/{name}"));
                        }
                        text(StatusCode::NOT_FOUND, routes + "\n")
                    }
                }
            }
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests;
