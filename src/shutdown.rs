//! Shutdown: the one path from a signal to a drained, reported exit.
//!
//! Owns: turning the first SIGTERM or SIGINT into the cancellation of one
//! [`CancellationToken`] that every long-running task receives, and a second signal into an
//! immediate exit request that `main` acts on. Must not: exit the process itself, or be
//! bypassed by a task that stops on its own signal handling.
//!
//! The order of a drain is the caller's (see `agent::run` and `persist::run`): readiness goes
//! false, intake stops, in-flight work finishes inside its deadline, then the admin server stops.

use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The process's shutdown state.
#[derive(Clone)]
pub struct Shutdown {
    token: CancellationToken,
    forced: Arc<Notify>,
}

impl Shutdown {
    /// Installs SIGTERM and SIGINT handlers (call inside the runtime).
    pub fn install() -> std::io::Result<Self> {
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let shutdown = Self { token: CancellationToken::new(), forced: Arc::new(Notify::new()) };
        let state = shutdown.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            };
            info!(signal = name, "shutting down: draining (a second signal exits at once)");
            state.token.cancel();
            let name = tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            };
            warn!(signal = name, "second signal: exiting without finishing the drain");
            state.forced.notify_one();
        });
        Ok(shutdown)
    }

    /// Cancelled when shutdown begins; hand a clone to every task.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Resolves when a second signal asks to exit without draining.
    pub async fn forced(&self) {
        self.forced.notified().await;
    }
}
