//! The buffer between the socket readers and the Kafka producer: memory in front, and for
//! `buffer.type = "disk"` a spool on disk behind it.
//!
//! Owns: every record from the moment a reader accepts it until Kafka acknowledges it; the
//! memory budget (bytes and records) that bounds that span; the full-buffer policies
//! (`when_full`, `block_timeout`); and, for the disk type, which records are only on disk (the
//! backlog) and which are in memory too.
//!
//! A record's share of the memory budget is held by its [`Lease`], which travels with the record
//! into librdkafka and is released only when the delivery report says the record is stored (or
//! it is counted as given up). librdkafka's own queue limits are derived from the same budget,
//! so there is no second, unbounded queue behind this one.
//!
//! With the disk type a record is written to the spool before it is sent (by the spool writer
//! task, never by a reader), and stays there until Kafka acknowledges it. Under memory pressure
//! the oldest spooled records are evicted from memory — they stay on disk as the backlog and are
//! read back later. The shipper alternates between the backlog (oldest first) and the newest
//! records in memory, so after an outage old and new records both move: the backlog drains at
//! about half the producer's rate while fresh records keep arriving within seconds.
//!
//! Must not: grow without bound, lose a record without counting it, block a reader under a
//! `drop_*` policy, do file I/O on a reader task, or hold its lock across an `.await` (it is a
//! `std::sync::Mutex` guarding a few `VecDeque`s; every critical section is a push or a pop).
//!
//! Written by hand rather than taken from a crate because it is the product's core: the
//! accounting (permits that outlive the queue entry, segments deleted only when every record in
//! them is acknowledged) and the policies are what Sluice is for.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::{Notify, Semaphore};

use crate::config::{BufferConfig, WhenFull};
use crate::telemetry;
use crate::telemetry::outcome::{Dropped, Refused};

pub mod ack;
mod admission;
mod backlog;
mod ending;
mod lease;

pub mod spool;

pub mod spooler;

use ack::{Ack, AckPoint};
pub use admission::{Admission, BufferFull, Policy};
pub use ending::InFlight;
pub use lease::Lease;
use spool::{Spool, SpoolPos};

#[cfg(test)]
mod tests;

/// Most bytes one backlog read takes (with a large budget: a sixteenth of the leases, this at most).
const BACKLOG_CHUNK: usize = 4 * 1024 * 1024;

/// Most records one backlog read takes.
const BACKLOG_RECORDS: usize = 512;

/// What a record costs in memory beyond its bytes: its queue entry, `Bytes` header, lease and
/// librdkafka's message struct. Charged to the budget so that the budget bounds memory, not
/// just payload bytes (measured: see `docs/PERFORMANCE.md`).
pub const RECORD_OVERHEAD: usize = 320;

/// `buffer.max_bytes` is split: `1/LIBRDKAFKA_SHARE` for librdkafka's queue — or the largest
/// message a listener allows, if that is more (a message larger than librdkafka's queue limit
/// would wait for room forever) — and the rest for the leases. A record in flight holds a lease
/// for its first copy (the message librdkafka keeps) while librdkafka builds and compresses a
/// request from it — a second copy bounded by its queue limit. So leases + librdkafka's queue
/// stay within `buffer.max_bytes`, and peak RSS within `buffer.max_bytes` plus a constant
/// (docs/PERFORMANCE.md). Config validation keeps the leases able to hold the largest message.
pub const LIBRDKAFKA_SHARE: usize = 5;

/// How a buffer splits its budget, computed from its config alone: what [`Buffer::build`] makes,
/// and what the producer's settings are derived from ([`ProducerShare`]) when no buffer is built
/// (a config checked before it runs).
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Bytes of leases (the budget less librdkafka's share).
    leases: usize,
    /// `buffer.max_records`.
    records: usize,
    /// Bytes and records readers may lease (less the backlog's reserve).
    max_bytes: usize,
    max_records: usize,
    /// The backlog's reserve (disk type).
    backlog_bytes: usize,
    backlog_records: usize,
    /// What one backlog read takes from the shared budget (bytes, records).
    chunk: (usize, usize),
    /// Bytes kept for librdkafka's queue.
    librdkafka_bytes: usize,
}

impl Sizes {
    fn plan(config: &BufferConfig, largest_message: usize, disk: bool) -> Self {
        let budget = usize::try_from(config.max_bytes.as_u64()).unwrap_or(usize::MAX).min(Semaphore::MAX_PERMITS);
        // librdkafka's share (see `LIBRDKAFKA_SHARE`); leases cover the rest. Validation keeps
        // the rest at least the largest message; `max(1)` only guards a budget nobody allows.
        let librdkafka_bytes = (budget / LIBRDKAFKA_SHARE).max(largest_message).min(budget.saturating_sub(1));
        let leases = (budget - librdkafka_bytes).max(1);
        let records = config.max_records as usize;
        // A backlog read takes a chunk of the budget (a sixteenth of the leases within bounds,
        // never less than the largest record costs).
        let largest_cost = if largest_message > 0 { largest_message + RECORD_OVERHEAD } else { 0 };
        let chunk = (
            (leases / 16).clamp(16 * 1024, BACKLOG_CHUNK).max(largest_cost).min(leases),
            (records / 16).clamp(1, BACKLOG_RECORDS),
        );
        // Disk type: a reserve of the budget readers never get (see `Shared::backlog_bytes`):
        // enough for the largest record, so the backlog always moves.
        // (Not known without the listeners' limits — buffers built for tests — then none.)
        let (backlog_bytes, backlog_records) = if disk && largest_cost > 0 {
            ((leases / 16).max(largest_cost).min(leases / 2), (records / 16).clamp(1, BACKLOG_RECORDS).min(records / 2))
        } else {
            (0, 0)
        };
        Self {
            leases,
            records,
            max_bytes: leases - backlog_bytes,
            max_records: records - backlog_records,
            backlog_bytes,
            backlog_records,
            chunk,
            librdkafka_bytes,
        }
    }
}

/// What the producer's settings are derived from (librdkafka's queue limits and
/// `message.max.bytes`): a buffer's, or those a config would give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerShare {
    /// Bytes of the budget kept for librdkafka's queue.
    pub librdkafka_bytes: usize,
    /// Records readers may lease.
    pub max_records: usize,
    /// The largest message (envelope and key) a listener can produce; 0 when not known.
    pub largest_message: usize,
}

impl ProducerShare {
    /// What the agent's buffer would be for `config`, without building it.
    pub fn for_config(config: &crate::config::Config) -> Self {
        let largest_message = usize::try_from(config.largest_message()).unwrap_or(usize::MAX);
        let sizes = Sizes::plan(&config.buffer, largest_message, config.buffer.kind == crate::config::BufferKind::Disk);
        Self { librdkafka_bytes: sizes.librdkafka_bytes, max_records: sizes.max_records, largest_message }
    }
}

impl From<&Buffer> for ProducerShare {
    fn from(buffer: &Buffer) -> Self {
        Self {
            librdkafka_bytes: buffer.librdkafka_bytes(),
            max_records: buffer.max_records(),
            largest_message: buffer.largest_message(),
        }
    }
}

/// A Kafka topic's name, shared by every record routed to it.
pub type Topic = std::sync::Arc<str>;

/// A record between socket and Kafka acknowledgement.
#[derive(Debug)]
pub struct Record {
    /// The envelope bytes sent as the Kafka message value.
    pub payload: Bytes,
    /// The Kafka topic it was routed to when it was read (`kafka.topic`; a reload leaves it);
    /// `None` only for a record an earlier release spooled: the default topic
    /// (`kafka.default_topic`, or the plain `kafka.topic`).
    pub topic: Option<Topic>,
    /// The Kafka message key, if any.
    pub key: Option<Bytes>,
    /// The record's share of the budget; dropping it gives the share back.
    pub lease: Lease,
    /// How often Kafka has refused it so far (drives the shipper's backoff).
    pub retries: u32,
    /// Where it is in the spool (disk type, once written).
    pub pos: Option<SpoolPos>,
    /// When the agent read it (Unix ms): for the oldest-record age and delivery latency.
    pub ingest_ms: u64,
    /// Its writer's claim to hear when it is safe (acknowledged mode).
    pub ack: Option<Ack>,
    /// Kafka may hold it already: an earlier attempt failed after the broker may have written it
    /// (librdkafka's "possibly persisted"). At the drain such a record is counted `unconfirmed`,
    /// never `drain_timeout` (which says "not stored").
    pub maybe_stored: bool,
}

impl Record {
    /// Settles the record's acknowledgement as refused, if it has one.
    pub fn refuse(&mut self, reason: impl Into<Refused>) {
        if let Some(ack) = self.ack.take() {
            ack.refused(reason);
        }
    }

    /// Settles the record's acknowledgement as durable if its writer asked for `point`.
    pub fn reached(&mut self, point: AckPoint) {
        if self.ack.as_ref().is_some_and(|ack| ack.point() == point)
            && let Some(ack) = self.ack.take()
        {
            ack.durable();
        }
    }
}

/// Cheap to clone; all clones share one buffer.
#[derive(Clone)]
pub struct Buffer {
    shared: Arc<Shared>,
}

/// Records waiting in memory.
#[derive(Default)]
struct Queues {
    /// Disk type: accepted, waiting for the spool writer.
    intake: VecDeque<Record>,
    /// Refused by Kafka once; sent before fresh records, in the order the failures came.
    retry: VecDeque<Record>,
    /// Waiting for the producer, oldest first. Disk type: already spooled (`pos` set).
    fresh: VecDeque<Record>,
    /// Disk type: the position after the last record moved into `fresh`. With `fresh` empty,
    /// the backlog ends here.
    written_end: Option<SpoolPos>,
}

struct Shared {
    queues: Mutex<Queues>,
    /// Signalled when the shipper has work (a record, or a backlog to read).
    ready: Notify,
    /// Signalled when the intake gains a record (disk type). One consumer: the spool writer.
    intake_ready: Notify,
    /// Signalled when records are settled, while the drain waits for the last of them
    /// (`drain_waiting`): the drain waits on this, not on a timer.
    settled: Notify,
    drain_waiting: std::sync::atomic::AtomicBool,
    bytes: Arc<Semaphore>,
    records: Arc<Semaphore>,
    max_bytes: usize,
    max_records: usize,
    /// Disk type: one backlog chunk of the budget that readers never get. Without it, readers
    /// waiting for room (a full spool under `block`) took every lease Kafka's acknowledgements
    /// freed, the backlog lane never got a chunk, no segment was finished, and the spool writer
    /// never got disk room for the intake holding that memory: nothing moved, for ever.
    backlog_bytes: Arc<Semaphore>,
    backlog_records: Arc<Semaphore>,
    /// The reserve's size (bytes with overhead, records).
    backlog_reserve: (usize, usize),
    /// What one backlog read takes from the shared budget when it has room.
    backlog_chunk: (usize, usize),
    /// Bytes of `buffer.max_bytes` kept for librdkafka's queue.
    librdkafka_bytes: usize,
    /// The largest message (envelope and key) a listener can produce; 0 when unknown (tests).
    largest_message: usize,
    /// `when_full` and `block_timeout`; a config reload may change them.
    policy: std::sync::RwLock<Policy>,
    /// Bytes librdkafka holds beside each record for its Kafka headers (`ship.headers`,
    /// `ship.metadata_headers`): part of each record's cost, so headers stay within the budget.
    header_bytes: std::sync::atomic::AtomicUsize,
    spool: Option<Arc<Spool>>,
    /// Bytes (with overhead) of records handed to the shipper and not yet settled: in flight at
    /// librdkafka or waiting in `retry`. Neither can be evicted, so with a spool they may use at
    /// most half the budget; the other half is always free for new records to pass through on
    /// their way to disk.
    shipping: AtomicUsize,
    /// Memory type: ingest times of held records, for the oldest-record age (the disk type asks
    /// its spool).
    ages: Ages,
    /// Records only in memory the drain left unsent, counted already (`drain_timeout`,
    /// `unconfirmed`): for the drain's report.
    unsent: (std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64),
}

/// Counts of held records per second of ingest time: the oldest non-empty second is the age of
/// the oldest held record. Two map operations per record, under a lock of its own.
#[derive(Default)]
struct Ages {
    seconds: Mutex<std::collections::BTreeMap<u64, u64>>,
}

impl Ages {
    fn held(&self, ingest_ms: u64) {
        self.held_many(std::iter::once(ingest_ms));
    }

    /// Records read at `ingest_ms` each are held (one lock for all of them).
    fn held_many(&self, ingest_ms: impl IntoIterator<Item = u64>) {
        let mut seconds = self.lock();
        let mut run: Option<(u64, u64)> = None;
        for second in ingest_ms.into_iter().map(|ms| ms / 1000) {
            run = match run {
                Some((at, count)) if at == second => Some((at, count + 1)),
                Some((at, count)) => {
                    *seconds.entry(at).or_default() += count;
                    Some((second, 1))
                }
                None => Some((second, 1)),
            };
        }
        if let Some((at, count)) = run {
            *seconds.entry(at).or_default() += count;
        }
    }

    fn released(&self, ingest_ms: u64) {
        self.released_many(std::iter::once(ingest_ms));
    }

    /// Records held since `ingest_ms` each are let go (one lock for all of them).
    fn released_many(&self, ingest_ms: impl IntoIterator<Item = u64>) {
        let mut seconds = self.lock();
        let mut release = |second: u64, released: u64| {
            if let Some(count) = seconds.get_mut(&second) {
                *count = count.saturating_sub(released);
                if *count == 0 {
                    seconds.remove(&second);
                }
            }
        };
        // Consecutive records mostly share their second: one map step per run.
        let mut run: Option<(u64, u64)> = None;
        for second in ingest_ms.into_iter().map(|ms| ms / 1000) {
            run = match run {
                Some((at, count)) if at == second => Some((at, count + 1)),
                Some((at, count)) => {
                    release(at, count);
                    Some((second, 1))
                }
                None => Some((second, 1)),
            };
        }
        if let Some((at, count)) = run {
            release(at, count);
        }
    }

    fn oldest_ms(&self) -> Option<u64> {
        self.lock().keys().next().map(|second| second * 1000)
    }

    fn lock(&self) -> MutexGuard<'_, std::collections::BTreeMap<u64, u64>> {
        self.seconds.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Buffer {
    /// A memory-only buffer sized from `config`, for records of any size the budget allows.
    pub fn new(config: &BufferConfig) -> Self {
        Self::build(config, 0, None)
    }

    /// The agent's memory-only buffer: sized from `[buffer]` and from the largest message the
    /// listeners allow (see [`LIBRDKAFKA_SHARE`]).
    pub fn for_config(config: &crate::config::Config) -> Self {
        Self::build(&config.buffer, Self::largest(config), None)
    }

    /// A buffer in front of `spool` (disk type). The spool's backlog is sent first.
    pub fn with_spool(config: &BufferConfig, spool: Arc<Spool>, written_end: SpoolPos) -> Self {
        Self::spooled_buffer(config, 0, spool, written_end)
    }

    /// The agent's buffer in front of `spool` (see [`Buffer::for_config`]).
    pub fn for_config_with_spool(config: &crate::config::Config, spool: Arc<Spool>, written_end: SpoolPos) -> Self {
        Self::spooled_buffer(&config.buffer, Self::largest(config), spool, written_end)
    }

    fn largest(config: &crate::config::Config) -> usize {
        usize::try_from(config.largest_message()).unwrap_or(usize::MAX)
    }

    fn spooled_buffer(config: &BufferConfig, largest_message: usize, spool: Arc<Spool>, end: SpoolPos) -> Self {
        let buffer = Self::build(config, largest_message, Some(spool));
        buffer.lock().written_end = Some(end);
        buffer
    }

    fn build(config: &BufferConfig, largest_message: usize, spool: Option<Arc<Spool>>) -> Self {
        let Sizes { leases, records, max_bytes, max_records, backlog_bytes, backlog_records, chunk, librdkafka_bytes } =
            Sizes::plan(config, largest_message, spool.is_some());
        metrics::gauge!(telemetry::BUFFER_CAPACITY_BYTES).set(leases as f64);
        metrics::gauge!(telemetry::BUFFER_CAPACITY_RECORDS).set(records as f64);
        for reason in Dropped::ALL {
            reason.count(0);
        }
        Self {
            shared: Arc::new(Shared {
                queues: Mutex::new(Queues::default()),
                ready: Notify::new(),
                intake_ready: Notify::new(),
                settled: Notify::new(),
                drain_waiting: std::sync::atomic::AtomicBool::new(false),
                bytes: Arc::new(Semaphore::new(max_bytes)),
                records: Arc::new(Semaphore::new(max_records)),
                max_bytes,
                max_records,
                backlog_bytes: Arc::new(Semaphore::new(backlog_bytes)),
                backlog_records: Arc::new(Semaphore::new(backlog_records)),
                backlog_reserve: (backlog_bytes, backlog_records),
                backlog_chunk: chunk,
                librdkafka_bytes,
                largest_message,
                policy: std::sync::RwLock::new(Policy {
                    when_full: config.when_full,
                    block_timeout: config.block_timeout,
                }),
                header_bytes: AtomicUsize::new(0),
                spool,
                shipping: AtomicUsize::new(0),
                ages: Ages::default(),
                unsent: Default::default(),
            }),
        }
    }

    /// The full-buffer policy in force.
    pub fn policy(&self) -> Policy {
        *self.shared.policy.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Changes the full-buffer policy (config reload). Writers already waiting keep waiting
    /// under the old rules; every later record follows the new ones.
    pub fn set_policy(&self, policy: Policy) {
        *self.shared.policy.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = policy;
    }

    /// The spool, for the disk type.
    pub fn spool(&self) -> Option<&Arc<Spool>> {
        self.shared.spool.as_ref()
    }

    /// What one record costs in the byte budget.
    pub fn cost(&self, payload_len: usize, key_len: usize) -> usize {
        // Config validation keeps records far below the budget; clamp so an oversized record
        // can still be admitted alone instead of waiting forever.
        let headers = self.shared.header_bytes.load(std::sync::atomic::Ordering::Relaxed);
        (payload_len + key_len + RECORD_OVERHEAD + headers).clamp(1, self.shared.max_bytes)
    }

    /// What each record's Kafka headers cost beside it (a reload may change them; records
    /// already admitted keep the cost they were admitted with).
    pub fn set_header_bytes(&self, bytes: usize) {
        self.shared.header_bytes.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// The spool writer's side: waits for accepted records and moves up to `max` into `out`.
    pub async fn pop_intake(&self, max: usize, out: &mut Vec<Record>) {
        loop {
            let notified = self.shared.intake_ready.notified();
            {
                let mut queues = self.lock();
                if !queues.intake.is_empty() {
                    let take = queues.intake.len().min(max);
                    out.extend(queues.intake.drain(..take));
                    return;
                }
            }
            notified.await;
        }
    }

    /// Like [`Buffer::pop_intake`] without waiting (draining at shutdown).
    pub fn pop_intake_now(&self, max: usize, out: &mut Vec<Record>) {
        let mut queues = self.lock();
        let take = queues.intake.len().min(max);
        out.extend(queues.intake.drain(..take));
    }

    /// Records just written to the spool, with their positions set, join the fresh queue;
    /// `end` is the spool position after them.
    ///
    /// Spooled records in memory are only a shortcut (they can be read back from disk), so here
    /// the oldest of them leave memory until a quarter of the budget is free: readers waiting for
    /// room — which may have found nothing to evict a moment ago — get it without waiting for
    /// Kafka.
    pub fn spooled(&self, records: impl IntoIterator<Item = Record>, end: SpoolPos) {
        let mut queues = self.lock();
        queues.fresh.extend(records);
        queues.written_end = Some(end);
        drop(queues);
        let reserve = (self.shared.max_bytes / 4 + 64 * 1024).min(self.shared.max_bytes / 2);
        if self.shared.bytes.available_permits() < reserve {
            self.evict(reserve);
        }
        self.shared.ready.notify_one();
    }

    /// Where the backlog (disk-only records) ends right now: at the first record still queued
    /// fresh, or at the end of what was written. Every disk-only record lies before it (records
    /// leave `fresh` only from its front); records in flight may lie before it too, and the
    /// spool's ledger makes the reader skip them.
    fn backlog_end(queues: &Queues) -> Option<SpoolPos> {
        queues.fresh.front().and_then(|record| record.pos).or(queues.written_end)
    }

    /// What the shipper should do next. Waits until there is something.
    pub async fn next_work(&self, prefer_backlog: bool) -> Work {
        loop {
            let notified = self.shared.ready.notified();
            if let Some(work) = self.poll_work(prefer_backlog) {
                return work;
            }
            notified.await;
        }
    }

    fn poll_work(&self, prefer_backlog: bool) -> Option<Work> {
        let queues = self.lock();
        let room = !self.shipping_full();
        let memory = !queues.retry.is_empty() || (room && !queues.fresh.is_empty());
        let backlog = match (&self.shared.spool, Self::backlog_end(&queues)) {
            (Some(spool), Some(end)) if room => spool.backlog().filter(|from| *from < end).map(|from| (from, end)),
            _ => None,
        };
        match (memory, backlog) {
            (true, Some((from, upto))) if prefer_backlog => Some(Work::Backlog { from, upto }),
            (true, _) => Some(Work::Memory),
            (false, Some((from, upto))) => Some(Work::Backlog { from, upto }),
            (false, None) => None,
        }
    }

    /// Moves up to `max` records waiting in memory into `out`: retried ones first, then fresh
    /// ones while the shipping share allows.
    pub fn pop_batch(&self, max: usize, out: &mut Vec<Record>) {
        let mut queues = self.lock();
        let from_retry = queues.retry.len().min(max);
        out.extend(queues.retry.drain(..from_retry));
        while out.len() < max && !self.shipping_full() {
            let Some(record) = queues.fresh.pop_front() else { break };
            self.shipping(record.lease.bytes.num_permits());
            out.push(record);
        }
    }

    /// Puts a record back (a retryable delivery failure), keeping its lease: the record never
    /// left the budget, so this never waits and never drops. Retried records are sent before
    /// fresh ones, in the order their failures were reported.
    pub fn requeue(&self, record: Record) {
        self.lock().retry.push_back(record);
        self.shared.ready.notify_one();
    }

    /// Wakes the shipper (the backlog changed outside the buffer's knowledge).
    pub fn wake_shipper(&self) {
        self.shared.ready.notify_one();
    }

    /// Records accepted and not yet acknowledged by Kafka (or counted): for a memory buffer,
    /// those held; for a disk buffer, those the spool owes, those held in memory whose segment
    /// `drop_oldest` deleted, and those not written to it yet.
    pub fn undelivered(&self) -> u64 {
        match &self.shared.spool {
            Some(spool) => spool.undelivered() + spool.orphaned() + self.queued_intake() as u64,
            None => self.held_records() as u64,
        }
    }

    /// Records were settled (delivered, given up, or dropped with their segment): wakes the
    /// drain if it waits for the last of them.
    pub fn notify_settled(&self) {
        if self.shared.drain_waiting.load(Ordering::Relaxed) {
            self.shared.settled.notify_waiters();
        }
    }

    /// Waits until every accepted record is acknowledged by Kafka (true) or `deadline` passes
    /// (false). Woken by [`Buffer::notify_settled`], not by a timer.
    pub async fn wait_until_delivered(&self, deadline: tokio::time::Instant) -> bool {
        self.shared.drain_waiting.store(true, Ordering::Relaxed);
        loop {
            // Created before the check, so a settlement between the two is not missed.
            let settled = self.shared.settled.notified();
            if self.undelivered() == 0 {
                return true;
            }
            tokio::select! {
                _ = settled => {}
                _ = tokio::time::sleep_until(deadline) => return self.undelivered() == 0,
            }
        }
    }

    /// Records held in memory: queued here or in flight to Kafka.
    pub fn held_records(&self) -> usize {
        let (_, reserve) = self.shared.backlog_reserve;
        self.shared.max_records - self.shared.records.available_permits() + reserve
            - self.shared.backlog_records.available_permits()
    }

    /// Bytes held in memory (with per-record overhead): queued here or in flight to Kafka.
    pub fn held_bytes(&self) -> usize {
        let (reserve, _) = self.shared.backlog_reserve;
        self.shared.max_bytes - self.shared.bytes.available_permits() + reserve
            - self.shared.backlog_bytes.available_permits()
    }

    /// Records accepted but not yet written to the spool (disk type).
    pub fn queued_intake(&self) -> usize {
        self.lock().intake.len()
    }

    /// A one-line picture of what the buffer holds, for logs.
    pub fn describe(&self) -> String {
        let queues = self.lock();
        format!(
            "held={} held_bytes={} intake={} retry={} fresh={} shipping_bytes={} backlog={:?}",
            self.held_records(),
            self.held_bytes(),
            queues.intake.len(),
            queues.retry.len(),
            queues.fresh.len(),
            self.shared.shipping.load(Ordering::Relaxed),
            self.shared.spool.as_ref().and_then(|spool| spool.backlog()),
        )
    }

    /// Records waiting in memory and owed by no spool (memory type, or spooled in a segment
    /// `drop_oldest` deleted: orphaned) that Kafka may hold already (sent and never answered, or
    /// an attempt failed after the broker may have written them): at the drain's final count
    /// they are `unconfirmed`, not lost.
    pub fn queued_maybe_stored(&self) -> usize {
        let queues = self.lock();
        let maybe = [&queues.intake, &queues.retry, &queues.fresh]
            .into_iter()
            .flat_map(|queue| queue.iter())
            .filter(|record| record.maybe_stored);
        match &self.shared.spool {
            None => maybe.count(),
            Some(spool) => spool.orphans_among(maybe.filter_map(|record| record.pos)) as usize,
        }
    }

    /// At the end of a drain (disk type): records still in memory that Kafka may hold and whose
    /// segment still owes them are marked so in the spool — those queued that carry the mark, and
    /// those in no queue (still with librdkafka: a close that missed the deadline) — and the
    /// marks written for the next start ([`Spool::save_maybe_stored`]). Blocking.
    pub fn remember_maybe_stored(&self) {
        let Some(spool) = &self.shared.spool else { return };
        let (positions, queued): (Vec<SpoolPos>, std::collections::HashSet<(u64, u32)>) = {
            let queues = self.lock();
            let queued = || [&queues.intake, &queues.retry, &queues.fresh].into_iter().flat_map(|queue| queue.iter());
            (
                queued().filter(|record| record.maybe_stored).filter_map(|record| record.pos).collect(),
                queued().filter_map(|record| record.pos).map(|pos| (pos.segment, pos.index)).collect(),
            )
        };
        spool.mark_held_elsewhere(&queued);
        spool.may_be_stored(positions);
        match spool.save_maybe_stored() {
            Ok(0) => {}
            Ok(marked) => tracing::info!(records = marked, "marked for the next start: kafka may hold them"),
            Err(error) => tracing::warn!(
                %error,
                "cannot keep the marks of records kafka may hold for the next start; lost later, they would be counted as never stored"
            ),
        }
    }

    /// Records only in memory the drain left unsent: counted `drain_timeout` and `unconfirmed`.
    pub fn unsent_counts(&self) -> (u64, u64) {
        (self.shared.unsent.0.load(Ordering::Relaxed), self.shared.unsent.1.load(Ordering::Relaxed))
    }

    /// Records waiting in memory for the spool or the producer.
    pub fn queued_records(&self) -> usize {
        let queues = self.lock();
        queues.intake.len() + queues.retry.len() + queues.fresh.len()
    }

    /// Byte capacity.
    pub fn max_bytes(&self) -> usize {
        self.shared.max_bytes
    }

    /// Bytes of the budget kept for librdkafka's queue (its `queue.buffering.max.kbytes`).
    pub fn librdkafka_bytes(&self) -> usize {
        self.shared.librdkafka_bytes
    }

    /// The largest message (envelope and key) a listener can produce; 0 when not known.
    pub fn largest_message(&self) -> usize {
        self.shared.largest_message
    }

    /// Record capacity.
    pub fn max_records(&self) -> usize {
        self.shared.max_records
    }

    /// Ingest time (Unix ms) of the oldest record not yet acknowledged by Kafka.
    pub fn oldest_undelivered_ms(&self) -> Option<u64> {
        match &self.shared.spool {
            Some(spool) => spool.oldest_undelivered_ms(),
            None => self.shared.ages.oldest_ms(),
        }
    }

    /// Publishes depth gauges. Called on a timer, not per record.
    pub fn report(&self) {
        metrics::gauge!(telemetry::BUFFER_RECORDS).set(self.held_records() as f64);
        metrics::gauge!(telemetry::BUFFER_BYTES).set(self.held_bytes() as f64);
        let age = self.oldest_undelivered_ms().map_or(0.0, |oldest| {
            (chrono::Utc::now().timestamp_millis() as u64).saturating_sub(oldest) as f64 / 1000.0
        });
        metrics::gauge!(telemetry::BUFFER_OLDEST_AGE).set(age);
        if let Some(spool) = &self.shared.spool {
            metrics::gauge!(telemetry::SPOOL_BYTES).set(spool.disk_bytes() as f64);
            metrics::gauge!(telemetry::SPOOL_CAPACITY_BYTES).set(spool.max_bytes() as f64);
            metrics::gauge!(telemetry::SPOOL_RECORDS).set(spool.undelivered() as f64);
        }
    }

    /// Test seam: every record waiting in memory, with the queue it waits in (`"intake"`,
    /// `"retry"`, `"fresh"`).
    #[cfg(test)]
    pub(crate) fn peek(&self, mut each: impl FnMut(&'static str, &Record)) {
        let queues = self.lock();
        for (name, queue) in [("intake", &queues.intake), ("retry", &queues.retry), ("fresh", &queues.fresh)] {
            queue.iter().for_each(|record| each(name, record));
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        // A panic while holding this lock can only come from VecDeque itself (allocation
        // failure aborts); recover the data rather than poison every later caller.
        self.shared.queues.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The shipper's next job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Records are waiting in memory: [`Buffer::pop_batch`].
    Memory,
    /// Disk-only records wait in the spool from `from` up to (not including) `upto`.
    Backlog {
        /// The first disk-only record.
        from: SpoolPos,
        /// Where the backlog ends.
        upto: SpoolPos,
    },
}
