//! The spool writer task: moves accepted records from the buffer's intake into the spool, in
//! batches (one write and at most one fsync per batch: group commit), then hands them on to the
//! shipper.
//!
//! Owns: the [`SpoolWriter`] (it runs on the blocking pool, one batch at a time), the disk cap
//! and what `when_full` does when it is reached, fsync timing for the interval policy, deleting
//! delivered segments, and settling `spooled` acknowledgements once their records are as durable
//! as the policy makes them. Must not: run file I/O on a runtime worker, or let a disk error end
//! the task (it is counted, logged, and the policy decides what happens to the records).

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::ack::{Ack, AckPoint};
use super::spool::{Entry, Fsync, SpoolWriter};
use super::{Buffer, Record};
use crate::config::WhenFull;
use crate::telemetry;

/// Most records written per batch.
const WRITE_BATCH: usize = 1024;
/// How often delivered segments are deleted and an interval fsync is checked while idle.
const HOUSEKEEPING: Duration = Duration::from_millis(50);
/// Wait before retrying after a disk error or while the spool is full under `block`.
const RETRY: Duration = Duration::from_millis(100);

/// Runs until `stop` is cancelled and the intake is empty, then seals the active segment.
pub async fn run(buffer: Buffer, writer: SpoolWriter, fsync: Fsync, stop: CancellationToken) {
    let mut task = Spooler { buffer, writer: Some(writer), fsync, unsynced_acks: Vec::new() };
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    let mut housekeeping = tokio::time::interval(match fsync {
        Fsync::Interval(every) => every.min(HOUSEKEEPING),
        _ => HOUSEKEEPING,
    });
    housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = task.buffer.pop_intake(WRITE_BATCH, &mut batch) => {
                task.write(std::mem::take(&mut batch), &stop).await;
            }
            _ = housekeeping.tick() => task.housekeeping().await,
            _ = stop.cancelled() => break,
        }
    }
    // Readers have stopped: write what they accepted, then seal.
    loop {
        task.buffer.pop_intake_now(WRITE_BATCH, &mut batch);
        if batch.is_empty() {
            break;
        }
        task.write(std::mem::take(&mut batch), &stop).await;
    }
    if let Some(writer) = task.writer.take() {
        match tokio::task::spawn_blocking(move || writer.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => error!(%error, "cannot seal the spool's last segment; the next start recovers it"),
            Err(error) => error!(%error, "spool close did not run"),
        }
    }
    task.settle_unsynced();
    info!("spool writer stopped");
}

struct Spooler {
    buffer: Buffer,
    /// Taken while a blocking call uses it.
    writer: Option<SpoolWriter>,
    fsync: Fsync,
    /// `spooled` acks of records written but not yet synced (interval policy).
    unsynced_acks: Vec<Ack>,
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

    async fn write(&mut self, mut records: Vec<Record>, stop: &CancellationToken) {
        while !records.is_empty() {
            let need: u64 =
                records.iter().map(|r| super::segment::frame_len(r.key.as_deref(), &r.payload) as u64).sum();
            if !self.make_room(need, &mut records, stop).await {
                return;
            }
            let frames: Vec<(u64, Option<bytes::Bytes>, bytes::Bytes)> =
                records.iter().map(|r| (r.ingest_ms, r.key.clone(), r.payload.clone())).collect();
            let (positions, failure, end, synced) = self
                .blocking(move |writer| {
                    let borrowed: Vec<Entry<'_>> = frames
                        .iter()
                        .map(|(ingest_ms, key, payload)| Entry { ingest_ms: *ingest_ms, key: key.as_deref(), payload })
                        .collect();
                    let (positions, failure) = writer.append(&borrowed);
                    // Under steady load the housekeeping tick may not get a turn: check the
                    // interval here too.
                    let synced = writer.sync_if_due();
                    (positions, failure, writer.end(), synced)
                })
                .await;
            let written: Vec<Record> = records.drain(..positions.len()).collect();
            self.hand_on(written, positions, end);
            self.after_sync(synced);
            if let Some(error) = failure {
                metrics::counter!(telemetry::SPOOL_ERRORS, "op" => "write").increment(1);
                error!(%error, unwritten = records.len(), policy = self.buffer.policy().when_full.as_str(), "spool write failed");
                match self.buffer.policy().when_full {
                    // Keep the records and try again: readers feel it as backpressure.
                    WhenFull::Block => {
                        if !self.pause(stop).await {
                            return self.abandon(records, "drain_timeout");
                        }
                    }
                    WhenFull::DropOldest => {
                        if !self.drop_oldest_segment().await {
                            return self.abandon(records, "drop_oldest");
                        }
                    }
                    WhenFull::DropNewest => return self.abandon(records, "drop_newest"),
                }
            }
        }
    }

    /// Frees disk for `need` bytes as `when_full` says. False when the records were dropped
    /// (counted) instead.
    async fn make_room(&mut self, need: u64, records: &mut Vec<Record>, stop: &CancellationToken) -> bool {
        loop {
            let spool = self.buffer.spool().expect("the spooler runs only with a spool").clone();
            let fits = self
                .blocking(move |writer| {
                    spool.delete_done();
                    writer.fits(need)
                })
                .await;
            if fits {
                return true;
            }
            match self.buffer.policy().when_full {
                WhenFull::DropNewest => {
                    // Keep the oldest records that fit; only the newest ones are dropped.
                    let spool = self.buffer.spool().expect("spool");
                    let mut room = spool.max_bytes().saturating_sub(spool.disk_bytes());
                    // A segment roll on the way adds a header.
                    room = room.saturating_sub(super::segment::HEADER.len() as u64 * 2);
                    let mut keep = 0;
                    for record in records.iter() {
                        let len = super::segment::frame_len(record.key.as_deref(), &record.payload) as u64;
                        if len > room {
                            break;
                        }
                        room -= len;
                        keep += 1;
                    }
                    let newest = records.split_off(keep);
                    self.abandon(newest, "drop_newest");
                    return !records.is_empty();
                }
                WhenFull::DropOldest => {
                    if !self.drop_oldest_segment().await {
                        self.abandon(std::mem::take(records), "drop_oldest");
                        return false;
                    }
                }
                WhenFull::Block => {
                    if !self.pause(stop).await {
                        self.abandon(std::mem::take(records), "drain_timeout");
                        return false;
                    }
                }
            }
        }
    }

    /// Deletes the oldest spool segment; counts its disk-only records as dropped.
    async fn drop_oldest_segment(&mut self) -> bool {
        let spool = self.buffer.spool().expect("spool").clone();
        let dropped = tokio::task::spawn_blocking(move || spool.drop_oldest()).await.ok().flatten();
        match dropped {
            Some(dropped) => {
                warn!(segment = dropped.segment, lost = dropped.lost, "spool full: oldest segment dropped");
                metrics::counter!(telemetry::BUFFER_DROPPED, telemetry::REASON => "drop_oldest")
                    .increment(dropped.lost);
                self.buffer.wake_shipper();
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

    fn abandon(&self, records: Vec<Record>, reason: &'static str) {
        if records.is_empty() {
            return;
        }
        let counter = if reason == "drain_timeout" { telemetry::SHIP_FAILED } else { telemetry::BUFFER_DROPPED };
        metrics::counter!(counter, telemetry::REASON => reason).increment(records.len() as u64);
        for mut record in records {
            record.refuse(reason);
        }
    }

    /// Written records join the fresh queue; `spooled` acks are settled now, or after the next
    /// sync under the interval policy.
    fn hand_on(
        &mut self,
        mut records: Vec<Record>,
        positions: Vec<super::spool::SpoolPos>,
        end: super::spool::SpoolPos,
    ) {
        if records.is_empty() {
            return;
        }
        for (record, pos) in records.iter_mut().zip(positions) {
            record.pos = Some(pos);
            if record.ack.as_ref().is_some_and(|ack| ack.point() == AckPoint::Spooled) {
                match self.fsync {
                    Fsync::Interval(_) => self.unsynced_acks.extend(record.ack.take()),
                    Fsync::Always | Fsync::Never => record.reached(AckPoint::Spooled),
                }
            }
        }
        self.buffer.spooled(records, end);
    }

    async fn housekeeping(&mut self) {
        let spool = self.buffer.spool().expect("spool").clone();
        let synced = self
            .blocking(move |writer| {
                spool.delete_done();
                writer.sync_if_due()
            })
            .await;
        self.after_sync(synced);
    }

    fn after_sync(&mut self, synced: std::io::Result<bool>) {
        match synced {
            Ok(true) => self.settle_unsynced(),
            Ok(false) => {}
            Err(error) => {
                metrics::counter!(telemetry::SPOOL_ERRORS, "op" => "fsync").increment(1);
                error!(%error, "spool fsync failed; records written since the last sync are not yet acknowledged");
            }
        }
    }

    fn settle_unsynced(&mut self) {
        for ack in self.unsynced_acks.drain(..) {
            ack.durable();
        }
    }
}
