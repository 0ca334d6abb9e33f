//! Admin HTTP server: `/metrics` (Prometheus text), `/healthz` (the process runs), `/readyz`
//! (it can do its job: 200, or 503 with the reason), `/config` (the running config, secrets
//! redacted).
//!
//! Owns: the admin listener and its three routes. Must not: do work of the pipeline, block on
//! Kafka or PostgreSQL inside a request (readiness is computed from flags that other tasks keep
//! current), or open a second metrics listener (the exporter's `render()` is served here).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

/// Renders the running config (secrets redacted) for `/config`.
pub type ConfigView = Arc<dyn Fn() -> String + Send + Sync>;

/// Says whether the process is ready (with a short status line) or why not. Must be cheap: it
/// runs per request.
pub type ReadinessCheck = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Why the admin server could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot bind the admin server to {address}: {source}")]
pub struct AdminError {
    address: String,
    source: std::io::Error,
}

/// A bound admin server.
pub struct AdminServer {
    listener: TcpListener,
}

impl AdminServer {
    /// Binds `address` now, so a port conflict fails start-up instead of a later task.
    pub async fn bind(address: &str) -> Result<Self, AdminError> {
        let listener =
            TcpListener::bind(address).await.map_err(|source| AdminError { address: address.to_string(), source })?;
        Ok(Self { listener })
    }

    /// The bound address (useful when binding port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `stop` is cancelled. The server is stopped last during shutdown so that
    /// `/readyz` can say "draining" and `/metrics` shows the drain.
    pub async fn serve(
        self,
        metrics: PrometheusHandle,
        ready: ReadinessCheck,
        config: ConfigView,
        stop: CancellationToken,
    ) {
        if let Some(address) = self.local_addr() {
            info!(%address, "admin server listening");
        }
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = self.listener.accept() => accepted,
            };
            let (stream, _) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    debug!(%error, "admin accept failed");
                    continue;
                }
            };
            let metrics = metrics.clone();
            let ready = ready.clone();
            let config = config.clone();
            let service = service_fn(move |request| {
                let response = route(&request, &metrics, &ready, &config);
                async move { Ok::<_, Infallible>(response) }
            });
            // Admin connections are not tracked: they hold no records and end with the process.
            tokio::spawn(async move {
                if let Err(error) =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await
                {
                    debug!(%error, "admin connection ended with an error");
                }
            });
        }
    }
}

fn route(
    request: &Request<Incoming>,
    metrics: &PrometheusHandle,
    ready: &ReadinessCheck,
    config: &ConfigView,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match request.uri().path() {
        "/metrics" => {
            let mut response = text(StatusCode::OK, metrics.render());
            response.headers_mut().insert(
                CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/config" => text(StatusCode::OK, config()),
        "/readyz" => match ready() {
            Ok(status) => text(StatusCode::OK, format!("{status}\n")),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")),
        },
        _ => text(StatusCode::NOT_FOUND, "not found; try /metrics, /healthz, /readyz, /config\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}
