//! Bounded waits: every wait of a test or of the benchmark ends, and a wait that runs out names
//! what it waited for.
//!
//! Owns: the default bound ([`WAIT`]), [`within`] and [`eventually`]. Must not: sleep a fixed
//! time where a condition can be polled.

use std::future::Future;
use std::time::Duration;

/// Any single wait is bounded by this unless it says otherwise.
pub const WAIT: Duration = Duration::from_secs(60);

/// Fails (panics) if `future` takes longer than `limit`, naming what was awaited.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future).await.unwrap_or_else(|_| panic!("timed out after {limit:?}: {what}"))
}

/// Polls `probe` every 100 ms until it returns `Some`, failing after [`WAIT`].
pub async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, mut probe: impl FnMut() -> F) -> T {
    within(WAIT, what, async {
        loop {
            if let Some(value) = probe().await {
                break value;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}
