//! Settling what Kafka stored, a batch at a time, on a thread of its own ("kafka-settle").
//!
//! Owns: when a record whose delivery report says Kafka has it is settled — the delivered
//! counters and latency here, then the buffer's books ([`Buffer::settle_delivered`]: its share of
//! the budget, its place in the spool, its writer) — for every record the reports brought since
//! the last batch. Must not: run on a runtime worker (the buffer may delete a spool file), or let
//! a delivered record wait unsettled for longer than the thread takes to wake.
//!
//! Why a thread, and not the polling thread itself: rdkafka's `poll` serves a report's records one
//! by one inside a loop that returns only at its deadline, so the thread that polls never learns
//! where a report ends. Settling each record on its own cost a lock and two semaphore returns per
//! record, a histogram sample with its wake-up, two shared counters and the ingest-time ages. The
//! polling thread now only queues the record; this thread takes everything queued when it wakes
//! and settles it together: the budget and ages once per batch, each run of equal latencies as one
//! histogram call. Measured (docs/PERFORMANCE.md): at the max rate the two threads take 0.29–0.34
//! µs per record where the polling thread alone took 0.45–0.53.
//!
//! A panic while settling is a bug, and the books cannot be trusted after it: it is caught
//! wherever settling runs (this thread, `retire`, a report after the thread stopped), and so is one
//! while the polling thread serves a delivery report (`ShipContext::delivery`: it would end that
//! thread, and no report would be served again); the agent fails (drains, exits non-zero:
//! [`Tasks::fail`], once) and this thread goes on settling the batches after it. The batch in hand
//! is counted delivered before anything else is done with it (Kafka has every record of it), so
//! none of it is lost uncounted; what the panic skipped is let go: its memory comes back as the
//! records are dropped, its writers hear nothing (their connections end with the drain), and its
//! places in the spool stay owed, so those records are sent again at the next start (at least
//! once: the persister keeps one row per id). The books of that batch may be off until the exit:
//! its ingest-time ages and shipping bytes may stay held (with a disk buffer the drain may then
//! wait until sending stops), and a record of it whose segment `drop_oldest` had deleted is also
//! counted `drain_timeout` at the exit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use metrics::Counter;

use crate::buffer::{Buffer, InFlight};
use crate::lifecycle::{Tasks, panic_message};
use crate::telemetry;

/// The queue between the polling thread and the settling thread, and the settling itself.
pub(super) struct Settler {
    buffer: Buffer,
    /// The agent's tasks: a panic while settling fails the agent.
    tasks: Tasks,
    delivered: Counter,
    delivered_bytes: Counter,
    latency: metrics::Histogram,
    queue: Mutex<Vec<InFlight>>,
    /// Signalled when the queue gains its first record, or on stop.
    ready: Condvar,
    /// Set by the first panic while settling (or serving a delivery report): later ones are
    /// logged, not reported to `tasks` again.
    failed: AtomicBool,
    stopping: AtomicBool,
    /// Held while a batch is settled: [`Settler::settle_now`] waits for the batch in hand.
    settling: Mutex<Vec<InFlight>>,
}

impl Settler {
    pub(super) fn new(buffer: Buffer, tasks: Tasks) -> Self {
        Self {
            buffer,
            tasks,
            delivered: metrics::counter!(telemetry::SHIP_DELIVERED),
            delivered_bytes: metrics::counter!(telemetry::SHIP_DELIVERED_BYTES),
            latency: metrics::histogram!(telemetry::SHIP_DELIVERY_LATENCY),
            queue: Mutex::new(Vec::new()),
            ready: Condvar::new(),
            failed: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            settling: Mutex::new(Vec::new()),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Vec<InFlight>> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a record Kafka stored (the polling thread). The settling thread wakes when the
    /// queue gains its first record; until then it is busy with the batch before.
    pub(super) fn delivered(&self, delivered: InFlight) {
        let mut queue = self.queue();
        queue.push(delivered);
        if queue.len() == 1 {
            self.ready.notify_one();
        }
        if self.stopping.load(Ordering::Relaxed) {
            // No thread settles it any more (a report after the producer was let go): here.
            drop(queue);
            self.settle_now();
        }
    }

    /// Settles everything queued, on the calling thread, once any batch in hand is settled: a
    /// producer being let go owes no report, and what it reported is settled before it is gone.
    pub(super) fn settle_now(&self) {
        let mut batch = self.settling.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        std::mem::swap(&mut *batch, &mut *self.queue());
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.settle(&mut batch))) {
            // What the panic skipped is let go (see the module doc); none of it is settled again.
            batch.clear();
            self.panicked("settling delivered records", panic.as_ref());
        }
        // Idle: a burst's room is let go (each of the two vectors keeps the largest batch it held).
        if batch.capacity() > KEEP_CAPACITY && self.queue().is_empty() {
            batch.shrink_to(KEEP_CAPACITY);
        }
    }

    /// A panic while settling, or while serving a delivery report: a bug, after which the books
    /// cannot be trusted: the agent fails (drains, exits non-zero); once, however often it
    /// recurs while the drain runs.
    pub(super) fn panicked(&self, doing: &str, panic: &(dyn std::any::Any + Send)) {
        let why = format!("{doing} panicked: {}", panic_message(panic));
        if self.failed.swap(true, Ordering::Relaxed) {
            tracing::debug!(why, "another panic while settling");
        } else {
            self.tasks.fail("kafka-settle", &why);
        }
    }

    /// The settling thread's loop, until [`Settler::stop`]: what is queued then is settled before
    /// it ends.
    pub(super) fn run(&self) {
        loop {
            {
                let mut queue = self.queue();
                if queue.is_empty() {
                    queue.shrink_to(KEEP_CAPACITY);
                }
                while queue.is_empty() && !self.stopping.load(Ordering::Relaxed) {
                    queue = self.ready.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                if queue.is_empty() {
                    return;
                }
            }
            self.settle_now();
        }
    }

    /// Ends [`Settler::run`] once the queue is empty.
    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        let _queue = self.queue();
        self.ready.notify_all();
    }

    /// Settles `batch` (emptied; its allocation kept for the next): counted delivered, its
    /// latency recorded, then handed to the buffer, whose books it leaves
    /// ([`Buffer::settle_delivered`]: budget, spool places, then the writers).
    fn settle(&self, batch: &mut Vec<InFlight>) {
        if batch.is_empty() {
            return;
        }
        // Counted first: Kafka has them whatever happens next (a panic below lets the batch go,
        // it is never settled again).
        let bytes: u64 = batch.iter().map(|record| record.payload_len() as u64).sum();
        self.delivered.increment(batch.len() as u64);
        self.delivered_bytes.increment(bytes);
        crate::lifecycle::fail_point("settle");
        let now_ms = chrono::Utc::now().timestamp_millis() as u64;
        let mut run: Option<(u64, usize)> = None;
        for record in batch.iter() {
            let latency_ms = now_ms.saturating_sub(record.ingest_ms());
            run = match run {
                Some((ms, count)) if ms == latency_ms => Some((ms, count + 1)),
                Some((ms, count)) => {
                    self.latency.record_many(ms as f64 / 1000.0, count);
                    Some((latency_ms, 1))
                }
                None => Some((latency_ms, 1)),
            };
        }
        if let Some((ms, count)) = run {
            self.latency.record_many(ms as f64 / 1000.0, count);
        }
        // A thread of its own, not a runtime worker: the buffer may delete a spool file here.
        self.buffer.settle_delivered(batch);
    }
}

/// Records' room each of the two batch vectors keeps between bursts (~110 KiB): a burst of
/// reports (up to librdkafka's queue, tens of thousands of records) is not held for ever.
const KEEP_CAPACITY: usize = 1024;

/// The settling thread of one producer; told to stop when dropped, it settles what is queued and
/// ends. Not joined: the last handle may be let go on a runtime worker (`send` replacing a fatal
/// producer), which must not wait for a batch in hand; a retired producer's reports are settled
/// by `retire` already.
pub(super) struct SettleThread {
    settler: Arc<Settler>,
}

impl SettleThread {
    /// Starts the thread for `settler`.
    pub(super) fn start(settler: Arc<Settler>) -> std::io::Result<Self> {
        let running = settler.clone();
        std::thread::Builder::new().name("kafka-settle".into()).spawn(move || running.run())?;
        Ok(Self { settler })
    }
}

impl Drop for SettleThread {
    fn drop(&mut self) {
        self.settler.stop();
    }
}
