//! The bounded buffer between the socket readers and the Kafka producer.
//!
//! Owns: every record from the moment a reader accepts it until Kafka acknowledges it, the byte
//! and record budget that bounds that span, and the full-buffer policy (`buffer.when_full`).
//! A record's budget is held by its [`Lease`], which travels with the record into librdkafka
//! and is released only when the delivery report says the record is stored (or it is counted as
//! given up). So "held" includes librdkafka's queue, and librdkafka's own queue limits are
//! derived from the same budget: there is no second, unbounded queue behind this one.
//!
//! Must not: grow without bound, lose a record without counting it, block a reader under a
//! `drop_*` policy, or hold its lock across an `.await` (the lock is a `std::sync::Mutex`
//! guarding a `VecDeque`; every critical section is a push or a pop).
//!
//! Written by hand rather than taken from a crate because it is the product's core: the
//! accounting (permits that outlive the queue entry) and the policies are what Sluice is for.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use metrics::Counter;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::config::{BufferConfig, WhenFull};
use crate::telemetry;

pub mod segment;
pub mod spool;

#[cfg(test)]
mod tests;

/// A record between socket and Kafka acknowledgement.
#[derive(Debug)]
pub struct Record {
    /// The envelope bytes sent as the Kafka message value.
    pub payload: Bytes,
    /// The Kafka message key, if any.
    pub key: Option<Bytes>,
    /// The record's share of the budget; dropping it gives the share back.
    pub lease: Lease,
    /// How often Kafka has refused it so far (drives the shipper's backoff).
    pub retries: u32,
}

/// A record's share of the buffer budget. Dropping it frees the room for new records, so it must
/// be dropped exactly when the record is no longer sluice's responsibility: acknowledged by Kafka,
/// or given up and counted.
#[derive(Debug)]
pub struct Lease {
    _bytes: OwnedSemaphorePermit,
    _records: OwnedSemaphorePermit,
}

/// Why a record was not accepted into the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Dropped {
    /// The buffer was full and `when_full` said to drop the new record.
    #[error("buffer full; record dropped by policy {}", .0.as_str())]
    Full(WhenFull),
}

/// Records waiting for the producer: those Kafka refused once (retry) go before new ones.
#[derive(Default)]
struct Queues {
    retry: VecDeque<Record>,
    fresh: VecDeque<Record>,
}

impl Queues {
    fn len(&self) -> usize {
        self.retry.len() + self.fresh.len()
    }
}

/// Cheap to clone; all clones share one buffer.
#[derive(Clone)]
pub struct Buffer {
    shared: Arc<Shared>,
}

struct Shared {
    /// Records waiting to be handed to the producer.
    queue: Mutex<Queues>,
    /// Signalled when the queue gains a record. One consumer (the shipper) waits on it.
    ready: Notify,
    bytes: Arc<Semaphore>,
    records: Arc<Semaphore>,
    max_bytes: usize,
    max_records: usize,
    when_full: WhenFull,
    dropped: Counter,
}

impl Buffer {
    /// An empty buffer sized from `config`.
    pub fn new(config: &BufferConfig) -> Self {
        let max_bytes = usize::try_from(config.max_bytes.as_u64()).unwrap_or(usize::MAX).min(Semaphore::MAX_PERMITS);
        let max_records = config.max_records as usize;
        metrics::gauge!(telemetry::BUFFER_CAPACITY_BYTES).set(max_bytes as f64);
        metrics::gauge!(telemetry::BUFFER_CAPACITY_RECORDS).set(max_records as f64);
        Self {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queues::default()),
                ready: Notify::new(),
                bytes: Arc::new(Semaphore::new(max_bytes)),
                records: Arc::new(Semaphore::new(max_records)),
                max_bytes,
                max_records,
                when_full: config.when_full,
                dropped: metrics::counter!(telemetry::BUFFER_DROPPED, telemetry::REASON => config.when_full.as_str()),
            }),
        }
    }

    /// What one record costs in the byte budget.
    fn cost(&self, payload: &Bytes, key: &Option<Bytes>) -> u32 {
        let bytes = payload.len() + key.as_ref().map_or(0, Bytes::len);
        // Config validation keeps records far below the budget; clamp so an oversized record
        // can still be admitted alone instead of waiting forever.
        bytes.clamp(1, self.shared.max_bytes) as u32
    }

    /// Accepts a record, applying `when_full` if there is no room. Under `block` this waits
    /// for room (the caller's socket is not read meanwhile: backpressure); under `drop_newest`
    /// it never waits.
    pub async fn push(&self, payload: Bytes, key: Option<Bytes>) -> Result<(), Dropped> {
        let cost = self.cost(&payload, &key);
        let lease = match self.shared.when_full {
            WhenFull::Block => {
                // The semaphores are never closed, so acquire cannot fail.
                let records =
                    self.shared.records.clone().acquire_owned().await.expect("buffer semaphore is never closed");
                let bytes =
                    self.shared.bytes.clone().acquire_many_owned(cost).await.expect("buffer semaphore is never closed");
                Lease { _bytes: bytes, _records: records }
            }
            WhenFull::DropNewest => match self.try_lease(cost) {
                Some(lease) => lease,
                None => {
                    self.shared.dropped.increment(1);
                    return Err(Dropped::Full(WhenFull::DropNewest));
                }
            },
        };
        self.lock().fresh.push_back(Record { payload, key, lease, retries: 0 });
        self.shared.ready.notify_one();
        Ok(())
    }

    fn try_lease(&self, cost: u32) -> Option<Lease> {
        let records = self.shared.records.clone().try_acquire_owned().ok()?;
        let bytes = self.shared.bytes.clone().try_acquire_many_owned(cost).ok()?;
        Some(Lease { _bytes: bytes, _records: records })
    }

    /// Moves up to `max` waiting records into `out`, waiting until there is at least one.
    /// Cancel-safe: records are moved only once the wait is over.
    pub async fn pop_batch(&self, max: usize, out: &mut Vec<Record>) {
        loop {
            let notified = self.shared.ready.notified();
            {
                let mut queues = self.lock();
                if queues.len() > 0 {
                    let from_retry = queues.retry.len().min(max);
                    out.extend(queues.retry.drain(..from_retry));
                    let from_fresh = queues.fresh.len().min(max - from_retry);
                    out.extend(queues.fresh.drain(..from_fresh));
                    return;
                }
            }
            notified.await;
        }
    }

    /// Puts a record back (a retryable delivery failure), keeping its lease: the record never
    /// left the budget, so this never waits and never drops. Retried records are sent before
    /// fresh ones, in the order their failures were reported.
    pub fn requeue(&self, record: Record) {
        self.lock().retry.push_back(record);
        self.shared.ready.notify_one();
    }

    /// Records held: queued here or in flight to Kafka.
    pub fn held_records(&self) -> usize {
        self.shared.max_records - self.shared.records.available_permits()
    }

    /// Bytes held: queued here or in flight to Kafka.
    pub fn held_bytes(&self) -> usize {
        self.shared.max_bytes - self.shared.bytes.available_permits()
    }

    /// Records waiting to be handed to the producer.
    pub fn queued_records(&self) -> usize {
        self.lock().len()
    }

    /// Byte capacity.
    pub fn max_bytes(&self) -> usize {
        self.shared.max_bytes
    }

    /// Record capacity.
    pub fn max_records(&self) -> usize {
        self.shared.max_records
    }

    /// Publishes depth gauges. Called on a timer, not per record.
    pub fn report(&self) {
        metrics::gauge!(telemetry::BUFFER_RECORDS).set(self.held_records() as f64);
        metrics::gauge!(telemetry::BUFFER_BYTES).set(self.held_bytes() as f64);
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        // A panic while holding this lock can only come from VecDeque itself (allocation
        // failure aborts); recover the data rather than poison every later caller.
        self.shared.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
