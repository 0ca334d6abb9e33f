//! The spool writer task: moves accepted records from the buffer's intake into the spool, in
//! batches (one write and at most one fsync per batch: group commit), then hands them on to the
//! shipper.
//!
//! Owns: the [`SpoolWriter`] (it runs on the blocking pool, one batch at a time), the disk cap
//! and what `when_full` does when it (or a full disk) is reached, fsync timing for the interval
//! policy, deleting delivered segments, and settling `spooled` acknowledgements once their
//! records are as durable as the policy makes them. Must not: run file I/O on a runtime worker,
//! let a disk error end the task, acknowledge a record a failed write or fsync covered (it is
//! acknowledged when Kafka has it instead), or treat an I/O error other than a full disk as a
//! reason to drop (the records are held and the write retried; readers feel backpressure).

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::ack::AckPoint;
use super::spool::{Appended, Entry, Fsync, SpoolIoError, SpoolOp, SpoolPos, SpoolWriter};
use super::{Buffer, Record};
use crate::config::WhenFull;
use crate::telemetry;
use crate::telemetry::outcome::{Dropped, Failed, LetGo, Refused};

/// A record's frame as the spool writer takes it: ingest time, topic, key, envelope.
type Frame = (u64, Option<super::Topic>, Option<bytes::Bytes>, bytes::Bytes);

/// Most records written per batch.
const WRITE_BATCH: usize = 1024;
/// How often delivered segments are deleted and an interval fsync is checked while idle.
const HOUSEKEEPING: Duration = Duration::from_millis(50);
/// Wait before retrying after a disk error or while the spool is full under `block`.
const RETRY: Duration = Duration::from_millis(100);

/// Runs until `stop` is cancelled and the intake is empty, then seals the active segment. A
/// write waiting for disk room (or retrying a disk error) waits until `give_up` (the drain
/// deadline), not `stop`: after `stop` the readers' last records still deserve the rest of the
/// drain to be written; after `give_up` they are counted as `drain_timeout`.
pub async fn run(
    buffer: Buffer,
    writer: SpoolWriter,
    fsync: Fsync,
    stop: CancellationToken,
    give_up: CancellationToken,
) {
    let mut task = Spooler { buffer, writer: Some(writer), fsync, errors: ErrorLog::default(), sync: None };
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    let mut housekeeping = tokio::time::interval(match fsync {
        Fsync::Interval(every) => every.min(HOUSEKEEPING),
        _ => HOUSEKEEPING,
    });
    housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // A finished sync and the housekeeping tick come before the intake: under steady load the
        // intake is always ready, and they must still get their turn (or no later sync starts,
        // and no `spooled` ack is settled, until the load pauses).
        tokio::select! {
            biased;
            synced = sync_done(&mut task.sync) => task.sync_ended(synced),
            _ = housekeeping.tick() => task.housekeeping().await,
            _ = task.buffer.pop_intake(WRITE_BATCH, &mut batch) => {
                task.write(std::mem::take(&mut batch), &give_up).await;
            }
            _ = stop.cancelled() => break,
        }
    }
    // Readers have stopped: write what they accepted, then seal.
    loop {
        task.buffer.pop_intake_now(WRITE_BATCH, &mut batch);
        if batch.is_empty() {
            break;
        }
        task.write(std::mem::take(&mut batch), &give_up).await;
    }
    // A sync still running finishes first: its acks are settled (or parked) by its own result.
    if task.sync.is_some() {
        let synced = sync_done(&mut task.sync).await;
        task.sync_ended(synced);
    }
    if let Some(writer) = task.writer.take() {
        let closed = tokio::task::spawn_blocking(move || writer.close()).await;
        let spool = task.buffer.spool().expect("the spooler runs only with a spool");
        match closed {
            Ok(Ok(())) => spool.synced(true),
            Ok(Err(error)) => {
                metrics::counter!(telemetry::SPOOL_ERRORS, "op" => SpoolOp::Fsync.as_str()).increment(1);
                error!(%error, "cannot sync and seal the spool's last segment; records not yet synced are acknowledged only if kafka has them, and the next start recovers the segment");
                spool.synced(false);
            }
            Err(error) => {
                error!(%error, "spool close did not run");
                spool.synced(false);
            }
        }
    }
    info!("spool writer stopped");
}

/// Why the spool has no room for a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Full {
    /// The spool's cap (`buffer.max_bytes`): the free room is known, so what fits can go now.
    Cap,
    /// The disk itself (a write failed for want of space): nothing is known to fit.
    Disk,
}

pub(crate) struct Spooler {
    buffer: Buffer,
    /// Taken while a blocking call uses it.
    writer: Option<SpoolWriter>,
    fsync: Fsync,
    errors: ErrorLog,
    /// The interval policy's sync, running on the blocking pool while writes go on: a slow
    /// fsync (seen: p99 0.66 s on this machine's disk under load) must not hold the writes, or
    /// the readers behind them.
    sync: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

/// Waits for the running sync, if any (pending forever if none).
async fn sync_done(sync: &mut Option<tokio::task::JoinHandle<std::io::Result<()>>>) -> std::io::Result<()> {
    match sync {
        Some(handle) => {
            let result = handle.await.unwrap_or_else(|error| Err(std::io::Error::other(error)));
            *sync = None;
            result
        }
        None => std::future::pending().await,
    }
}

/// Disk errors are logged at most every [`ERROR_LOG_EVERY`], with the count of those not logged:
/// a disk that stays broken would otherwise log one line per retry.
#[derive(Default)]
struct ErrorLog {
    last: Option<std::time::Instant>,
    suppressed: u64,
}

/// See [`ErrorLog`].
const ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

impl ErrorLog {
    /// Counts `error`; logs it unless one was logged within [`ERROR_LOG_EVERY`].
    fn report(&mut self, error: &SpoolIoError, unwritten: usize, action: &str) {
        metrics::counter!(telemetry::SPOOL_ERRORS, "op" => error.op.as_str()).increment(1);
        if self.last.is_some_and(|last| last.elapsed() < ERROR_LOG_EVERY) {
            self.suppressed += 1;
            return;
        }
        self.last = Some(std::time::Instant::now());
        let suppressed = std::mem::take(&mut self.suppressed);
        error!(%error, unwritten, action, similar_errors_not_logged = suppressed, "spool I/O failed");
    }
}

impl Spooler {
    /// Runs `work` with the writer on the blocking pool.
    async fn blocking<T: Send + 'static>(&mut self, work: impl FnOnce(&mut SpoolWriter) -> T + Send + 'static) -> T {
        let mut writer = self.writer.take().expect("the writer is put back after every call");
        let (writer, result) = tokio::task::spawn_blocking(move || {
            let result = work(&mut writer);
            (writer, result)
        })
        .await
        .expect("spool writer calls do not panic");
        self.writer = Some(writer);
        result
    }

    fn spool(&self) -> std::sync::Arc<super::spool::Spool> {
        self.buffer.spool().expect("the spooler runs only with a spool").clone()
    }

    async fn write(&mut self, mut records: Vec<Record>, stop: &CancellationToken) {
        crate::lifecycle::fail_point("spool");
        while !records.is_empty() {
            let frame_bytes: u64 = records
                .iter()
                .map(|r| super::spool::segment::frame_len(r.topic.as_deref(), r.key.as_deref(), &r.payload) as u64)
                .sum();
            let need = self.spool().disk_for(frame_bytes);
            let Some(fitting) = self.make_room(need, &mut records, stop).await else {
                return;
            };
            let frames: Vec<Frame> = records[..fitting]
                .iter()
                .map(|r| (r.ingest_ms, r.topic.clone(), r.key.clone(), r.payload.clone()))
                .collect();
            let running = self.sync.is_some();
            let (appended, end, due) = self
                .blocking(move |writer| {
                    let borrowed: Vec<Entry<'_>> = frames
                        .iter()
                        .map(|(ingest_ms, topic, key, payload)| Entry {
                            ingest_ms: *ingest_ms,
                            topic: topic.as_deref(),
                            key: key.as_deref(),
                            payload,
                        })
                        .collect();
                    let appended = writer.append(&borrowed);
                    // Under steady load the housekeeping tick may not get a turn: check the
                    // interval here too (one sync at a time).
                    let due = if running { Ok(None) } else { writer.sync_due() };
                    (appended, writer.end(), due)
                })
                .await;
            let Appended { positions, durable, error } = appended;
            let written: Vec<Record> = records.drain(..positions.len()).collect();
            if error.as_ref().is_some_and(|error| error.op == SpoolOp::Fsync) {
                // Earlier records waiting for a sync are not durable either.
                self.spool().synced(false);
            }
            self.hand_on(written, positions, durable, end);
            self.start_sync(due);
            let Some(error) = error else { continue };
            if records.is_empty() {
                // A sync failed after everything was written: the records go on (held until
                // Kafka has them); nothing is left to write.
                self.errors.report(&error, 0, "acknowledged when delivered");
                continue;
            }
            if !error.disk_full() {
                // Not a policy matter: hold the records and try again.
                self.errors.report(&error, records.len(), "retrying");
                if !self.pause(stop).await {
                    return self.abandon(records, Failed::DrainTimeout);
                }
                continue;
            }
            self.errors.report(&error, records.len(), self.buffer.policy().when_full.as_str());
            if self.on_full(Full::Disk, &mut records, stop).await.is_none() {
                return;
            }
        }
    }

    /// Frees disk for `need` bytes as `when_full` says, and tells how many of `records` (from
    /// the oldest) to write now: all once they fit, else what [`Spooler::on_full`] decides.
    /// `None` when the records were dropped (counted) instead.
    async fn make_room(&mut self, need: u64, records: &mut Vec<Record>, stop: &CancellationToken) -> Option<usize> {
        loop {
            let spool = self.buffer.spool().expect("the spooler runs only with a spool").clone();
            let fits = self
                .blocking(move |writer| {
                    spool.delete_done();
                    writer.fits(need)
                })
                .await;
            if fits {
                return Some(records.len());
            }
            match self.on_full(Full::Cap, records, stop).await? {
                0 => continue,
                fitting => return Some(fitting),
            }
        }
    }

    /// What `when_full` does when the spool has no room for `records`: the one place the spool
    /// decides it (the socket's decision, for memory, is [`Buffer::push`]'s). Returns how many of
    /// `records` (the oldest) to write now, `Some(0)` to try again, `None` when none are left (all
    /// dropped or given up, and counted).
    /// - `block`: what fits goes now; with nothing fitting, wait for room (readers feel it as
    ///   backpressure) until the drain gives up.
    /// - `drop_newest`: what fits goes now; the newest rest is dropped.
    /// - `drop_oldest`: the oldest segment is deleted (its disk-only records counted) and the
    ///   write tried again. When the disk, not the cap, is full, the room a drop frees may come
    ///   only once the backlog reader lets go of the file: a pause first, or one full disk would
    ///   take every segment in a row.
    async fn on_full(&mut self, full: Full, records: &mut Vec<Record>, stop: &CancellationToken) -> Option<usize> {
        let fitting = match full {
            Full::Cap => self.fitting_prefix(records),
            Full::Disk => 0,
        };
        match self.buffer.policy().when_full {
            WhenFull::Block => {
                if fitting > 0 {
                    return Some(fitting);
                }
                if !self.pause(stop).await {
                    self.abandon(std::mem::take(records), Failed::DrainTimeout);
                    return None;
                }
                Some(0)
            }
            WhenFull::DropNewest => {
                let newest = records.split_off(fitting);
                self.abandon(newest, Dropped::DropNewest);
                (!records.is_empty()).then_some(records.len())
            }
            WhenFull::DropOldest => {
                if !self.drop_oldest_segment().await {
                    self.abandon(std::mem::take(records), Dropped::DropOldest);
                    return None;
                }
                if full == Full::Disk && !self.pause(stop).await {
                    self.abandon(std::mem::take(records), Failed::DrainTimeout);
                    return None;
                }
                Some(0)
            }
        }
    }

    /// How many of `records`, oldest first, fit in the spool's free room now.
    fn fitting_prefix(&self, records: &[Record]) -> usize {
        let spool = self.buffer.spool().expect("spool");
        let room = spool.max_bytes().saturating_sub(spool.disk_bytes());
        // Frames plus the headers of the segments they open (`disk_for`) must fit.
        let mut frames = 0;
        let mut keep = 0;
        for record in records {
            let len = super::spool::segment::frame_len(record.topic.as_deref(), record.key.as_deref(), &record.payload)
                as u64;
            if spool.disk_for(frames + len) > room {
                break;
            }
            frames += len;
            keep += 1;
        }
        keep
    }

    /// Deletes the oldest spool segment; counts its disk-only records as dropped.
    async fn drop_oldest_segment(&mut self) -> bool {
        let spool = self.buffer.spool().expect("spool").clone();
        let dropped = tokio::task::spawn_blocking(move || spool.drop_oldest()).await.ok().flatten();
        match dropped {
            Some(dropped) => {
                warn!(
                    segment = dropped.segment,
                    lost = dropped.lost,
                    of_which_kafka_may_hold = dropped.lost_maybe_stored,
                    "spool full: oldest segment dropped"
                );
                // A record Kafka may hold (sent, never answered) is not counted "not stored".
                Dropped::DropOldest.count(dropped.lost.saturating_sub(dropped.lost_maybe_stored));
                crate::telemetry::outcome::Failed::Unconfirmed.count(dropped.lost_maybe_stored);
                self.buffer.wake_shipper();
                self.buffer.notify_settled();
                true
            }
            None => false,
        }
    }

    async fn pause(&self, stop: &CancellationToken) -> bool {
        tokio::select! {
            _ = stop.cancelled() => false,
            _ = tokio::time::sleep(RETRY) => true,
        }
    }

    fn abandon(&self, records: Vec<Record>, reason: impl Into<LetGo>) {
        let reason = reason.into();
        if records.is_empty() {
            return;
        }
        reason.count(records.len() as u64);
        for mut record in records {
            record.refuse(Refused::from(reason));
        }
    }

    /// Written records join the fresh queue. `spooled` acks of the first `durable` are settled
    /// now (`always`, `never`) or wait for the next sync (interval: [`super::spool::Spool::await_sync`], before
    /// the records can reach Kafka, so a delivery never finds its ack missing); those of the rest
    /// — written, but a sync covering them failed — are held until Kafka has the record.
    fn hand_on(&mut self, mut records: Vec<Record>, positions: Vec<SpoolPos>, durable: usize, end: SpoolPos) {
        if records.is_empty() {
            return;
        }
        let mut awaiting = Vec::new();
        for (i, (record, pos)) in records.iter_mut().zip(positions).enumerate() {
            record.pos = Some(pos);
            if !record.ack.as_ref().is_some_and(|ack| ack.point() == AckPoint::Spooled) {
                continue;
            }
            if i >= durable {
                if let Some(ack) = record.ack.as_mut() {
                    ack.hold_until_delivered();
                }
                continue;
            }
            match self.fsync {
                Fsync::Interval(_) => awaiting.extend(record.ack.take().map(|ack| (pos, ack))),
                Fsync::Always | Fsync::Never => record.reached(AckPoint::Spooled),
            }
        }
        if !awaiting.is_empty() {
            self.spool().await_sync(awaiting);
        }
        self.buffer.spooled(records, end);
    }

    async fn housekeeping(&mut self) {
        let spool = self.spool();
        let running = self.sync.is_some();
        let due = self
            .blocking(move |writer| {
                spool.delete_done();
                if running { Ok(None) } else { writer.sync_due() }
            })
            .await;
        self.start_sync(due);
    }

    /// Starts a due sync off the write path; the acks waiting for a sync now wait for it
    /// (registered by `hand_on` before, so they are exactly those of records it covers).
    fn start_sync(&mut self, due: std::io::Result<Option<super::spool::PendingSync>>) {
        match due {
            Ok(Some(pending)) => {
                self.spool().begin_sync();
                self.sync = Some(tokio::task::spawn_blocking(move || pending.run()));
            }
            Ok(None) => {}
            Err(error) => self.sync_ended(Err(error)),
        }
    }

    fn sync_ended(&mut self, synced: std::io::Result<()>) {
        match synced {
            Ok(()) => self.spool().end_sync(true),
            Err(error) => {
                // Everything it might have covered waits for Kafka instead.
                self.spool().synced(false);
                let error = SpoolIoError { op: SpoolOp::Fsync, error };
                self.errors.report(&error, 0, "records written since the last sync are acknowledged when delivered");
            }
        }
    }
}

/// Test seam: the spool writer task's steps, one at a time (the model-based test drives them
/// between its other operations; [`run`] is what runs them in production).
#[cfg(test)]
impl Spooler {
    pub(crate) fn new(buffer: Buffer, writer: SpoolWriter, fsync: Fsync) -> Self {
        Self { buffer, writer: Some(writer), fsync, errors: ErrorLog::default(), sync: None }
    }

    /// One turn of the loop's intake branch: up to a batch from the intake, written.
    pub(crate) async fn write_intake(&mut self, give_up: &CancellationToken) {
        let mut batch = Vec::new();
        self.buffer.pop_intake_now(WRITE_BATCH, &mut batch);
        if !batch.is_empty() {
            self.write(batch, give_up).await;
        }
    }

    /// One housekeeping tick, and the end of a sync it (or a write) started, if any.
    pub(crate) async fn tick(&mut self) {
        self.housekeeping().await;
        if self.sync.is_some() {
            let synced = sync_done(&mut self.sync).await;
            self.sync_ended(synced);
        }
    }

    pub(crate) fn writer(&mut self) -> &mut SpoolWriter {
        self.writer.as_mut().expect("the writer is put back after every call")
    }

    /// The writer, for [`run`] (the drain), once no sync runs.
    pub(crate) async fn into_writer(mut self) -> SpoolWriter {
        if self.sync.is_some() {
            let synced = sync_done(&mut self.sync).await;
            self.sync_ended(synced);
        }
        self.writer.take().expect("the writer is put back after every call")
    }
}

#[cfg(test)]
mod tests;
