//! The lifecycle every long-running task of a role runs under: build → spawn → run → drain →
//! report. Tasks are spawned through [`Tasks`] and awaited through it, never with
//! `let _ = task.await`, so a task that fails cannot pass for one that drained.
//!
//! Owns: telling a task that ended as planned from one that failed — it panicked, or a task
//! meant to run until its stop token was cancelled ended before that — logging the failure at
//! ERROR, starting the drain (the role's shutdown token is cancelled, as a signal would), and
//! remembering it, so that the role returns an error after its drain and the process exits
//! non-zero (Kubernetes restarts it). Must not: exit the process, or abort the other tasks (a
//! failure drains like a SIGTERM, so what the other tasks hold is delivered or counted).
//!
//! The model is linkerd2-proxy's `linkerd/app` (build, then spawn, then drain) and Vector's
//! `src/app.rs` (a component that fails stops the process with an error code); a failure is
//! caught inside the task (`catch_unwind`), so the drain starts when it happens, not when
//! someone gets round to joining the task.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::error;

/// The tasks of one role, and the failures among them.
#[derive(Clone)]
pub struct Tasks {
    shutdown: CancellationToken,
    failures: Arc<Mutex<Vec<String>>>,
}

/// A task spawned through [`Tasks`]; await it with [`Tasks::join`].
pub struct Task<T> {
    name: &'static str,
    handle: JoinHandle<Option<T>>,
}

impl Tasks {
    /// Tasks whose failure cancels `shutdown` (the role's drain starts).
    pub fn new(shutdown: CancellationToken) -> Self {
        Self { shutdown, failures: Arc::default() }
    }

    /// Spawns a task that runs until `until` is cancelled: a panic, or ending before `until`
    /// is cancelled, is a failure.
    pub fn service<F>(&self, name: &'static str, until: CancellationToken, future: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn_checked(name, Some(until), future)
    }

    /// Spawns a task that ends by itself; only a panic is a failure.
    pub fn spawn<F>(&self, name: &'static str, future: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn_checked(name, None, future)
    }

    fn spawn_checked<F>(&self, name: &'static str, until: Option<CancellationToken>, future: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let tasks = self.clone();
        let handle = tokio::spawn(async move {
            match tasks.watch(name, future).await {
                Some(output) => {
                    if until.as_ref().is_some_and(|until| !until.is_cancelled()) {
                        tasks.fail(name, "ended before it was asked to stop");
                    }
                    Some(output)
                }
                None => None,
            }
        });
        Task { name, handle }
    }

    /// Runs `future` in the caller's task; a panic is a failure (and `None`). For work that
    /// borrows from the caller and so cannot be spawned (the persister's consume loop).
    pub async fn watch<F: Future>(&self, name: &'static str, future: F) -> Option<F::Output> {
        match AssertUnwindSafe(future).catch_unwind().await {
            Ok(output) => Some(output),
            Err(panic) => {
                self.fail(name, &panic_message(panic.as_ref()));
                None
            }
        }
    }

    /// Waits for `task`. Its output, or `None` if it failed (already logged and recorded).
    pub async fn join<T>(&self, task: Task<T>) -> Option<T> {
        match task.handle.await {
            Ok(output) => output,
            Err(error) => {
                // Not a panic (those are caught inside): the runtime cancelled it.
                self.fail(task.name, &error.to_string());
                None
            }
        }
    }

    /// Records a failure of `task`, logs it and starts the drain.
    pub fn fail(&self, task: &'static str, why: &str) {
        error!(task, why, "a task failed; draining, and the process will exit with an error");
        self.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(format!("{task}: {why}"));
        self.shutdown.cancel();
    }

    /// The failures so far, as `task: why`.
    pub fn failures(&self) -> Vec<String> {
        self.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

/// Runs one connection's task: a panic there is a bug (input never panics by design), logged
/// at ERROR; it ends that connection only, like any other error of one connection.
pub async fn contain<F: Future<Output = ()>>(what: &'static str, future: F) {
    if let Err(panic) = AssertUnwindSafe(future).catch_unwind().await {
        error!(task = what, why = panic_message(panic.as_ref()), "a connection's task panicked; it is closed");
    }
}

/// The text of a panic payload.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        format!("panicked: {text}")
    } else if let Some(text) = panic.downcast_ref::<String>() {
        format!("panicked: {text}")
    } else {
        "panicked".into()
    }
}

/// A fault the tests can inject into a debug build: panics when the `SLUICE_FAIL_POINT`
/// environment variable names `point`. Compiled out of release builds (the shipped binary has
/// no such switch).
#[cfg(debug_assertions)]
pub fn fail_point(point: &str) {
    if std::env::var("SLUICE_FAIL_POINT").is_ok_and(|named| named == point) {
        panic!("fail point {point} (SLUICE_FAIL_POINT)");
    }
}

/// See the debug build's `fail_point`: nothing in a release build.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn fail_point(_point: &str) {}

/// Whether `SLUICE_FAIL_POINT` names `hold:<point>`: a test's way to make a task hold back where
/// a real one can fall behind (a listener that has not yet accepted what waits in its backlog).
/// Always false in release builds.
#[cfg(debug_assertions)]
pub fn fail_point_holds(point: &str) -> bool {
    std::env::var("SLUICE_FAIL_POINT").is_ok_and(|named| named.strip_prefix("hold:") == Some(point))
}

/// See the debug build's `fail_point_holds`: never in a release build.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn fail_point_holds(_point: &str) -> bool {
    false
}

/// A test's way to make the calling thread stop for good where a real one can (a librdkafka call
/// whose broker thread is stuck in DNS or a connect): in debug builds, when `SLUICE_FAIL_POINT`
/// names `stall:<point>`, the thread sleeps for ever. Compiled out of release builds.
#[cfg(debug_assertions)]
pub fn fail_point_stall(point: &str) {
    if std::env::var("SLUICE_FAIL_POINT").is_ok_and(|named| named.strip_prefix("stall:") == Some(point)) {
        loop {
            // Called only on threads that may block (librdkafka's, the blocking pool's).
            #[expect(clippy::disallowed_methods, reason = "a stalled blocking call is the point")]
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// See the debug build's `fail_point_stall`: nothing in a release build.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn fail_point_stall(_point: &str) {}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_service_that_panics_is_a_failure_and_starts_the_drain() {
        let shutdown = CancellationToken::new();
        let tasks = Tasks::new(shutdown.clone());
        let until = CancellationToken::new();
        let task = tasks.service("shipper", until.clone(), async { panic!("boom") });
        tokio::time::timeout(Duration::from_secs(5), shutdown.cancelled()).await.expect("the drain starts");
        assert_eq!(tasks.join(task).await, None::<()>);
        assert_eq!(tasks.failures(), vec!["shipper: panicked: boom".to_string()]);
    }

    #[tokio::test]
    async fn a_service_that_ends_before_its_stop_is_a_failure() {
        let shutdown = CancellationToken::new();
        let tasks = Tasks::new(shutdown.clone());
        let task = tasks.service("spooler", CancellationToken::new(), async { 7 });
        assert_eq!(tasks.join(task).await, Some(7), "its output is still returned");
        assert!(shutdown.is_cancelled());
        assert_eq!(tasks.failures(), vec!["spooler: ended before it was asked to stop".to_string()]);
    }

    #[tokio::test]
    async fn a_service_stopped_by_its_token_and_a_task_that_ends_are_no_failure() {
        let shutdown = CancellationToken::new();
        let tasks = Tasks::new(shutdown.clone());
        let until = CancellationToken::new();
        let service = tasks.service("admin", until.clone(), {
            let until = until.clone();
            async move { until.cancelled().await }
        });
        let work = tasks.spawn("work", async { "done" });
        until.cancel();
        assert_eq!(tasks.join(service).await, Some(()));
        assert_eq!(tasks.join(work).await, Some("done"));
        assert!(tasks.failures().is_empty());
        assert!(!shutdown.is_cancelled());
    }
}
