//! The disk spool: an append-only sequence of segment files that holds every record of a
//! `buffer.type = "disk"` agent from the moment it is written until Kafka acknowledges it.
//!
//! Owns: segment files (naming, rolling, fsync), start-up recovery (every frame checked; damaged
//! regions counted and the original file kept in `quarantine/`; a segment recovery cannot
//! repair for lack of room is read around its damage), starting without an active segment on a
//! full disk, the per-segment
//! bookkeeping that decides when a segment may be deleted, the disk cap, and reading the backlog
//! back in order.
//!
//! The ledger: every record on disk is, at any moment, in exactly one of three states — held in
//! memory (queued or in flight), disk-only (the backlog: the reader must send it), or finished
//! (acknowledged by Kafka, or counted as dropped). Two bits per record (by its index in its
//! segment) say which; the backlog reader sends only disk-only records and marks them held as it
//! reads them, so no record is ever in memory twice (sent twice, counted delivered twice). A
//! segment is deleted only when it is sealed and every record in it is finished. After a crash
//! the whole of every remaining segment is sent again: duplicates in Kafka are possible, losses
//! are not, and the persister's unique key turns the duplicates into nothing.
//!
//! Must not: be called from a reader task (everything here does file I/O and runs on the
//! blocking pool or the delivery thread), delete a segment with an unacknowledged record, or
//! stop the agent because of a damaged file.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{error, info, warn};

use super::ack::Ack;
use super::segment::{self, HEADER};
use crate::telemetry::outcome::Dropped;

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;

/// Where a record sits in the spool. Ordered: segment, then byte offset (the index grows with
/// the offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpoolPos {
    /// Segment number (the file name).
    pub segment: u64,
    /// Byte offset of the record's frame in the segment.
    pub offset: u64,
    /// The record's number in its segment (0, 1, 2…): its place in the ledger.
    pub index: u32,
}

impl SpoolPos {
    /// The first record position of a segment.
    pub fn start_of(segment: u64) -> Self {
        Self { segment, offset: HEADER.len() as u64, index: 0 }
    }
}

/// One bit per record of a segment. Hand-written: two words of logic, and the ledger is the
/// product's core.
#[derive(Debug, Default, Clone)]
struct Bits(Vec<u64>);

impl Bits {
    fn get(&self, index: u32) -> bool {
        self.0.get(index as usize / 64).is_some_and(|word| word & (1 << (index % 64)) != 0)
    }

    fn set(&mut self, index: u32, on: bool) {
        let word = index as usize / 64;
        if word >= self.0.len() {
            if !on {
                return;
            }
            self.0.resize(word + 1, 0);
        }
        if on {
            self.0[word] |= 1 << (index % 64);
        } else {
            self.0[word] &= !(1 << (index % 64));
        }
    }
}

/// When written records are forced to stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// Never; the OS writes back when it likes. Survives a crash of sluice, not of the machine.
    Never,
    /// At most this long after a write (one fsync covers everything written meanwhile).
    Interval(Duration),
    /// Before a record counts as spooled (group commit: one fsync per batch of writes).
    Always,
}

/// Spool settings, derived from `[buffer]`.
#[derive(Debug, Clone)]
pub struct SpoolConfig {
    /// Directory of segment files (created).
    pub dir: PathBuf,
    /// Cap on the bytes of all segment files.
    pub max_bytes: u64,
    /// A segment is sealed and a new one started beyond this size.
    pub segment_bytes: u64,
    /// Sync policy.
    pub fsync: Fsync,
    /// Largest frame body accepted when reading (anything larger is damage).
    pub max_body: usize,
}

/// What start-up found on disk.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Intact records from an earlier run, to be sent first.
    pub records: u64,
    /// Damaged regions skipped (each lost at least one record).
    pub corrupt_regions: u64,
    /// Bytes of those regions: how many records they held cannot be known (their frames are
    /// what is damaged), so each region counts as one dropped record and its bytes are counted
    /// in `sluice_spool_corrupt_bytes_total`.
    pub corrupt_bytes: u64,
    /// Files moved to the quarantine directory.
    pub quarantined: Vec<PathBuf>,
}

#[derive(Debug, Default)]
struct SegmentState {
    /// Ingest time of the segment's first record (Unix ms): the age of its oldest record.
    first_ingest_ms: Option<u64>,
    /// Records written to the segment (or found intact at start-up).
    records: u64,
    /// Records finished: acknowledged by Kafka or counted as dropped.
    done: u64,
    /// Records held in memory (queued or in flight), not finished.
    outstanding: u64,
    /// File size.
    bytes: u64,
    /// No more records will be appended.
    sealed: bool,
    /// Per record: held in memory. Neither this nor `finished`: disk-only.
    in_memory: Bits,
    /// Per record: finished; never sent, read or counted again.
    finished: Bits,
    /// A damaged segment recovery could not repair (no room for the copy) is read as it is: its
    /// damaged regions, as (first damaged byte, next intact frame or end of file). The reader
    /// jumps over them. Empty for every other segment.
    skips: Vec<(u64, u64)>,
}

impl SegmentState {
    fn disk_only(&self, index: u32) -> bool {
        !self.in_memory.get(index) && !self.finished.get(index)
    }

    /// The record is in memory now (written, or read back). False if it already was, or is
    /// finished.
    fn hold(&mut self, index: u32) -> bool {
        if !self.disk_only(index) {
            return false;
        }
        self.in_memory.set(index, true);
        self.outstanding += 1;
        true
    }

    /// The record left memory unfinished: disk-only again. False if it was not in memory.
    fn release(&mut self, index: u32) -> bool {
        if !self.in_memory.get(index) {
            return false;
        }
        self.in_memory.set(index, false);
        self.outstanding = self.outstanding.saturating_sub(1);
        true
    }

    /// The record is finished. False if it already was (it must not count twice).
    fn finish(&mut self, index: u32) -> bool {
        if self.finished.get(index) {
            return false;
        }
        self.release(index);
        self.finished.set(index, true);
        self.done += 1;
        true
    }

    /// Where to read on when the frame at `offset` is damaged damage recovery already found.
    fn skip_from(&self, offset: u64) -> Option<u64> {
        self.skips.iter().find(|(start, _)| *start == offset).map(|(_, end)| *end)
    }

    /// Every record is finished and none will be added: the file may go.
    fn deletable(&self) -> bool {
        self.sealed && self.done >= self.records
    }
}

#[derive(Default)]
struct State {
    segments: BTreeMap<u64, SegmentState>,
    /// `delivered` acks of records evicted to the backlog, settled when they are delivered.
    parked_acks: HashMap<SpoolPos, Ack>,
    /// `spooled` acks of records written under the interval policy, settled by the next
    /// successful sync, or by the record's delivery if that comes first.
    awaiting_sync: HashMap<SpoolPos, Ack>,
    /// Those a sync now running covers ([`Spool::begin_sync`]).
    syncing: HashMap<SpoolPos, Ack>,
    disk_bytes: u64,
    /// Where the backlog reader looks next: no disk-only record lies before it. `None` when
    /// nothing has been evicted since the reader last caught up.
    backlog: Option<SpoolPos>,
    /// The lowest position evicted while a backlog read was under way: the reader's cursor must
    /// not move past it.
    lowered: Option<SpoolPos>,
    /// Records held in memory whose segment `drop_oldest` deleted: still delivered from
    /// memory, but no segment counts them any more. Each leaves this count when it is delivered
    /// or evicted (then counted as dropped); at shutdown the rest are lost and counted. At most
    /// the records the buffer holds.
    orphaned: std::collections::HashSet<(u64, u32)>,
}

impl State {
    /// The ack waiting in the spool for the record at `pos`, if any (parked for its delivery, or
    /// waiting for a sync).
    fn take_ack(&mut self, pos: SpoolPos) -> Option<Ack> {
        self.parked_acks.remove(&pos).or_else(|| self.awaiting_sync.remove(&pos)).or_else(|| self.syncing.remove(&pos))
    }
}

/// The spool's shared state. See the module documentation.
pub struct Spool {
    config: SpoolConfig,
    quarantine: PathBuf,
    state: Mutex<State>,
}

/// Test seam: a record's state in the ledger ([`Spool::ledger`]).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ledger {
    InMemory,
    DiskOnly,
    Finished,
}

/// Records dropped with their segment under `when_full = "drop_oldest"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DroppedSegment {
    /// The segment.
    pub segment: u64,
    /// Its records that existed only on disk and are now lost (counted by the caller).
    pub lost: u64,
}

fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("{segment:020}.seg"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A repair of a damaged segment ([`recover_segment`]) writes and syncs the intact copy as
/// `N.seg.tmp`, moves `N.seg` to the quarantine, then renames the copy to `N.seg`. A crash in
/// between leaves a copy: with `N.seg` still there it may be partial and is removed (the repair
/// runs again); without it, it is complete and takes its place, else its records would be
/// neither delivered nor counted.
fn remove_partial_copies(quarantine: &Path) {
    let Ok(entries) = std::fs::read_dir(quarantine) else { return };
    for path in entries.filter_map(Result::ok).map(|entry| entry.path()) {
        if path.extension().is_some_and(|extension| extension == PARTIAL) {
            warn!(copy = %path.display(), "removing a quarantine copy a crash left unfinished");
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn finish_interrupted_repairs(dir: &Path) -> io::Result<()> {
    let copies: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|path| path.to_str().is_some_and(|name| name.ends_with(".seg.tmp")))
        .collect();
    for copy in &copies {
        let segment = copy.with_extension("");
        if segment.exists() {
            warn!(copy = %copy.display(), "removing the partial copy of an interrupted segment repair");
            std::fs::remove_file(copy)?;
        } else {
            warn!(segment = %segment.display(), "completing an interrupted segment repair");
            std::fs::rename(copy, &segment)?;
        }
    }
    if !copies.is_empty() {
        sync_dir(dir)?;
    }
    Ok(())
}

impl Spool {
    /// Opens (or creates) the spool, recovering what an earlier run left. Blocking.
    pub fn open(config: SpoolConfig) -> io::Result<(Arc<Spool>, SpoolWriter, Recovered)> {
        std::fs::create_dir_all(&config.dir)?;
        let quarantine = config.dir.join("quarantine");
        // Made while there is room, so a damaged file can later be linked into it on a full disk.
        let made = std::fs::create_dir_all(&quarantine);
        remove_partial_copies(&quarantine);
        if let Err(error) = made {
            warn!(%error, quarantine = %quarantine.display(), "cannot make the spool's quarantine directory; trying again when damage is found");
        }
        let mut recovered = Recovered::default();
        let mut state = State::default();
        finish_interrupted_repairs(&config.dir)?;
        let mut ids: Vec<u64> = std::fs::read_dir(&config.dir)?
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| entry.file_name().to_str()?.strip_suffix(".seg")?.parse().ok())
            .collect();
        ids.sort_unstable();
        for id in &ids {
            let path = segment_path(&config.dir, *id);
            let Recovery { records, bytes, first_ingest_ms, skips } =
                recover_segment(&path, &quarantine, &mut recovered)?;
            if records == 0 {
                continue;
            }
            recovered.records += records;
            state.disk_bytes += bytes;
            state.segments.insert(
                *id,
                SegmentState { records, bytes, first_ingest_ms, sealed: true, skips, ..SegmentState::default() },
            );
        }
        state.backlog = state.segments.keys().next().map(|id| SpoolPos::start_of(*id));
        let next = ids.last().map_or(0, |id| id + 1);
        let spool = Arc::new(Spool { config, quarantine, state: Mutex::new(state) });
        let mut writer = SpoolWriter::pending(spool.clone(), next);
        if let Err(error) = writer.start_segment() {
            let error = SpoolIoError { op: SpoolOp::Write, error };
            if !error.disk_full() {
                return Err(error.error);
            }
            // A full disk is the spool's normal weather, not a reason to stay down (a crash loop
            // with the app's socket gone): the first write makes the segment once there is
            // room, and until then `when_full` decides.
            warn!(segment = next, %error, "the spool's disk is full: its next segment is made once there is room");
        }
        if recovered.records > 0 || recovered.corrupt_regions > 0 {
            info!(
                records = recovered.records,
                corrupt_regions = recovered.corrupt_regions,
                "spool recovered records from an earlier run; they are sent first"
            );
        }
        Ok((spool, writer, recovered))
    }

    /// The configured cap.
    pub fn max_bytes(&self) -> u64 {
        self.config.max_bytes
    }

    /// Disk that `frames` bytes of frames take at most when appended now: the frames, plus a
    /// header for each segment they may open (one per `segment_bytes` they span, and one more
    /// for a roll on the way).
    pub fn disk_for(&self, frames: u64) -> u64 {
        let rolls = frames / self.config.segment_bytes.max(1) + 2;
        frames + rolls * HEADER.len() as u64
    }

    /// Bytes of all segment files.
    pub fn disk_bytes(&self) -> u64 {
        self.lock().disk_bytes
    }

    /// The first disk-only record, if any.
    pub fn backlog(&self) -> Option<SpoolPos> {
        self.lock().backlog
    }

    /// Records left memory without being finished (evicted under memory pressure, or not
    /// handed to Kafka): they are disk-only again, and the backlog reader will send them. Acks
    /// waiting for their delivery are parked until then. Returns how many could not go back
    /// because `drop_oldest` deleted their segment meanwhile: they are lost, their acks refused,
    /// and the caller counts them as `drop_oldest`.
    #[must_use = "records whose segment was dropped are lost and must be counted"]
    pub fn evicted(&self, records: Vec<(SpoolPos, Option<Ack>)>) -> u64 {
        let mut state = self.lock();
        let mut first = None;
        let mut lost = 0;
        for (pos, ack) in records {
            let Some(segment) = state.segments.get_mut(&pos.segment) else {
                // Lost now, unless `drop_oldest` already counted it (it was disk-only then).
                if state.orphaned.remove(&(pos.segment, pos.index)) {
                    lost += 1;
                }
                let parked = state.take_ack(pos);
                for ack in [ack, parked].into_iter().flatten() {
                    ack.refused(Dropped::DropOldest);
                }
                continue;
            };
            if !segment.release(pos.index) {
                // Not in memory (never, or finished): nothing changes on disk.
                if let Some(ack) = ack {
                    state.parked_acks.insert(pos, ack);
                }
                continue;
            }
            if let Some(ack) = ack {
                state.parked_acks.insert(pos, ack);
            }
            first = Some(first.map_or(pos, |first: SpoolPos| first.min(pos)));
        }
        if let Some(first) = first {
            state.backlog = Some(state.backlog.map_or(first, |backlog| backlog.min(first)));
            state.lowered = Some(state.lowered.map_or(first, |lowered| lowered.min(first)));
        }
        lost
    }

    /// A record is acknowledged by Kafka or counted as dropped. Returns whether its segment
    /// became deletable (the caller then runs [`Spool::delete_done`] off the runtime) and the
    /// record's parked ack, if it had one. A record finished twice is not counted twice.
    pub fn done(&self, pos: SpoolPos) -> (bool, Option<Ack>) {
        let mut state = self.lock();
        let parked = match state.parked_acks.remove(&pos) {
            Some(ack) => Some(ack),
            None => state.awaiting_sync.remove(&pos).or_else(|| state.syncing.remove(&pos)),
        };
        let Some(segment) = state.segments.get_mut(&pos.segment) else {
            // Dropped with its segment meanwhile, delivered from memory.
            state.orphaned.remove(&(pos.segment, pos.index));
            return (false, parked);
        };
        if !segment.finish(pos.index) {
            warn!(segment = pos.segment, index = pos.index, "a spooled record was settled twice; counted once");
            return (false, parked);
        }
        (segment.deletable(), parked)
    }

    /// `spooled` acks of records just written under the interval policy: they wait for the next
    /// [`Spool::synced`] (or their record's delivery, if that comes first).
    pub fn await_sync(&self, acks: impl IntoIterator<Item = (SpoolPos, Ack)>) {
        self.lock().awaiting_sync.extend(acks);
    }

    /// A sync covering everything written so far ran. If it worked, every ack awaiting one is
    /// settled as durable; if it failed, none is — the data it covered may not be on disk (a
    /// later sync succeeding does not bring it back), so each waits for its record's delivery
    /// to Kafka instead. An I/O error is never an acknowledgement.
    pub fn synced(&self, ok: bool) {
        let mut state = self.lock();
        let mut acks: Vec<(SpoolPos, Ack)> = state.awaiting_sync.drain().collect();
        acks.extend(state.syncing.drain());
        Self::settle_synced(&mut state, acks, ok);
    }

    /// A sync that covers what was written so far starts off the write path (the interval
    /// policy): the acks waiting for a sync now wait for this one ([`Spool::end_sync`]); acks
    /// of records written later wait for the next.
    pub fn begin_sync(&self) {
        let mut state = self.lock();
        let acks: Vec<(SpoolPos, Ack)> = state.awaiting_sync.drain().collect();
        state.syncing.extend(acks);
    }

    /// The sync started by [`Spool::begin_sync`] ended: its acks are durable, or (failed) wait
    /// for their records' delivery.
    pub fn end_sync(&self, ok: bool) {
        let mut state = self.lock();
        let acks: Vec<(SpoolPos, Ack)> = state.syncing.drain().collect();
        Self::settle_synced(&mut state, acks, ok);
    }

    fn settle_synced(state: &mut State, acks: Vec<(SpoolPos, Ack)>, ok: bool) {
        for (pos, mut ack) in acks {
            if ok {
                ack.durable();
            } else {
                ack.hold_until_delivered();
                state.parked_acks.insert(pos, ack);
            }
        }
    }

    /// Ingest time (Unix ms) of the oldest record not yet done, to the resolution of a segment:
    /// the first record of the oldest segment that still owes one.
    pub fn oldest_undelivered_ms(&self) -> Option<u64> {
        let state = self.lock();
        state
            .segments
            .values()
            .filter(|segment| segment.records > segment.done)
            .find_map(|segment| segment.first_ingest_ms)
    }

    /// Records written and not yet done, in memory or only on disk.
    pub fn undelivered(&self) -> u64 {
        self.lock().segments.values().map(|segment| segment.records.saturating_sub(segment.done)).sum()
    }

    /// Records held in memory whose segment `drop_oldest` deleted, not yet delivered or
    /// evicted: no segment owes them, so at shutdown they are lost (see `State::orphaned`).
    pub fn orphaned(&self) -> u64 {
        self.lock().orphaned.len() as u64
    }

    /// Deletes every deletable segment file. Blocking. Returns bytes freed.
    pub fn delete_done(&self) -> u64 {
        let doomed: Vec<(u64, u64)> = {
            let state = self.lock();
            state
                .segments
                .iter()
                .filter(|(_, segment)| segment.deletable())
                .map(|(id, segment)| (*id, segment.bytes))
                .collect()
        };
        let mut freed = 0;
        for (id, bytes) in doomed {
            match std::fs::remove_file(segment_path(&self.config.dir, id)) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => {
                    warn!(%error, segment = id, "cannot delete a delivered spool segment; retrying later");
                    continue;
                }
            }
            // Two callers (the spool writer, the delivery thread) may pick the same segment;
            // only the one that removes it from the books subtracts its bytes.
            let mut state = self.lock();
            if state.segments.remove(&id).is_some() {
                state.disk_bytes = state.disk_bytes.saturating_sub(bytes);
                freed += bytes;
            }
        }
        freed
    }

    /// Deletes the oldest sealed segment to make room (`drop_oldest`). Its records that exist
    /// only on disk are lost and returned for counting; records of it held in memory are still
    /// delivered. Blocking.
    pub fn drop_oldest(&self) -> Option<DroppedSegment> {
        let (id, lost) = {
            let mut state = self.lock();
            let id = state.segments.iter().find(|(_, segment)| segment.sealed).map(|(id, _)| *id)?;
            let segment = state.segments.remove(&id)?;
            // Disk-only records are lost; those held in memory are still delivered.
            let lost = segment.records.saturating_sub(segment.done + segment.outstanding);
            let records = u32::try_from(segment.records).unwrap_or(u32::MAX);
            let held = (0..records).filter(|index| segment.in_memory.get(*index));
            let orphans: Vec<(u64, u32)> = held.map(|index| (id, index)).collect();
            state.orphaned.extend(orphans);
            state.disk_bytes = state.disk_bytes.saturating_sub(segment.bytes);
            // Disk-only records of this segment are gone: the cursor moves past it.
            if let Some(backlog) = state.backlog
                && backlog.segment <= id
            {
                let next = state.segments.range(id + 1..).next().map(|(next, _)| SpoolPos::start_of(*next));
                state.backlog = next;
            }
            // Acks of its disk-only records are refused; records held in memory still deliver
            // and settle theirs.
            let lost_positions: Vec<SpoolPos> = state
                .parked_acks
                .keys()
                .chain(state.awaiting_sync.keys())
                .chain(state.syncing.keys())
                .filter(|pos| pos.segment == id && segment.disk_only(pos.index))
                .copied()
                .collect();
            for pos in lost_positions {
                if let Some(ack) = state.take_ack(pos) {
                    ack.refused(Dropped::DropOldest);
                }
            }
            // The `spooled` acks of records held in memory no longer have a file a sync could
            // make durable: each waits for its record's delivery (or its refusal, if evicted).
            let unsyncable: Vec<SpoolPos> = state
                .awaiting_sync
                .keys()
                .chain(state.syncing.keys())
                .filter(|pos| pos.segment == id)
                .copied()
                .collect();
            for pos in unsyncable {
                if let Some(ack) = state.take_ack(pos) {
                    state.parked_acks.insert(pos, ack);
                }
            }
            (id, lost)
        };
        if let Err(error) = std::fs::remove_file(segment_path(&self.config.dir, id))
            && error.kind() != io::ErrorKind::NotFound
        {
            error!(%error, segment = id, "cannot delete a dropped spool segment");
        }
        Some(DroppedSegment { segment: id, lost })
    }

    /// Damage at `pos` hides the rest of its segment from the reader: its disk-only records
    /// from there on are finished as lost (records held in memory are still delivered). Returns
    /// how many, and the bytes skipped.
    fn lose_rest(&self, pos: SpoolPos) -> (u64, u64) {
        let mut state = self.lock();
        let Some(segment) = state.segments.get_mut(&pos.segment) else { return (0, 0) };
        let skipped_bytes = segment.bytes.saturating_sub(pos.offset);
        let records = u32::try_from(segment.records).unwrap_or(u32::MAX);
        let mut lost = 0;
        for index in pos.index..records {
            if segment.disk_only(index) && segment.finish(index) {
                lost += 1;
            }
        }
        // The acks of the records just lost (now finished; records held in memory still
        // deliver and settle theirs).
        let segment = state.segments.get(&pos.segment);
        let lost_positions: Vec<SpoolPos> = state
            .parked_acks
            .keys()
            .chain(state.awaiting_sync.keys())
            .chain(state.syncing.keys())
            .filter(|parked| {
                parked.segment == pos.segment
                    && parked.index >= pos.index
                    && segment.is_some_and(|segment| !segment.in_memory.get(parked.index))
            })
            .copied()
            .collect();
        for parked in lost_positions {
            if let Some(ack) = state.take_ack(parked) {
                ack.refused(Dropped::Corrupt);
            }
        }
        (lost, skipped_bytes)
    }

    /// Test seam: where the ledger has the record at `pos` (`None`: no segment on the books
    /// has it).
    #[cfg(test)]
    pub(crate) fn ledger(&self, pos: SpoolPos) -> Option<Ledger> {
        let state = self.lock();
        let segment = state.segments.get(&pos.segment)?;
        Some(if segment.finished.get(pos.index) {
            Ledger::Finished
        } else if segment.in_memory.get(pos.index) {
            Ledger::InMemory
        } else {
            Ledger::DiskOnly
        })
    }

    /// A reader of disk-only records.
    pub fn reader(self: &Arc<Self>) -> SpoolReader {
        SpoolReader { spool: self.clone(), file: None, body: Vec::new(), failures: None }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Copies a damaged segment into quarantine (the reader found damage after start-up).
    /// Moves an unreadable sealed segment's file to the quarantine directory (a copy would need
    /// to read it). Its records held in memory still deliver; the ledger forgets the file once
    /// they are finished.
    fn quarantine_move(&self, segment: u64) -> Option<PathBuf> {
        // The segment being written stays: the writer still appends to it.
        if !self.lock().segments.get(&segment).is_some_and(|state| state.sealed) {
            return None;
        }
        let source = segment_path(&self.config.dir, segment);
        let target = self.quarantine.join(format!("{segment:020}.seg.{}", quarantine_suffix()));
        std::fs::create_dir_all(&self.quarantine).ok()?;
        match std::fs::rename(&source, &target) {
            Ok(()) => Some(target),
            Err(error) => {
                warn!(%error, segment, "cannot move an unreadable spool segment to the quarantine");
                None
            }
        }
    }

    fn quarantine_copy(&self, segment: u64) -> Option<PathBuf> {
        let source = segment_path(&self.config.dir, segment);
        let target = self.quarantine.join(format!("{segment:020}.seg.{}", quarantine_suffix()));
        // A link of the active segment would follow the writer's later appends.
        let sealed = self.lock().segments.get(&segment).is_some_and(|s| s.sealed);
        quarantine_keep(&source, &target, sealed).ok()?;
        Some(target)
    }
}

fn quarantine_suffix() -> String {
    chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ").to_string()
}

/// What recovery found in one segment file.
struct Recovery {
    /// Intact records (0: the file is no longer the spool's).
    records: u64,
    /// File size.
    bytes: u64,
    first_ingest_ms: Option<u64>,
    /// See `SegmentState::skips`.
    skips: Vec<(u64, u64)>,
}

/// Most damaged regions an unrepaired segment's skips keep (16 bytes each); beyond it, the
/// reader gives up the rest of the segment at its first damage (counted `corrupt`).
const MAX_SKIPS: usize = 4096;

#[cfg(test)]
thread_local! {
    /// Test seam: copies of segments fail with ENOSPC on this thread (a full disk).
    pub(super) static NO_ROOM_FOR_COPIES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn no_room_for_copies() -> io::Result<()> {
    #[cfg(test)]
    if NO_ROOM_FOR_COPIES.with(std::cell::Cell::get) {
        return Err(io::Error::from_raw_os_error(28));
    }
    Ok(())
}

/// The extension of a quarantine copy being made; one left by a crash is deleted at start.
const PARTIAL: &str = "partial";

/// Keeps `source` in the quarantine as `target`: a hard link if `link` (a name, no data: it
/// works on a full disk and survives the segment's deletion; only for a file nobody writes to
/// any more), else a copy, made under a temporary name so a crash never leaves a partial one.
fn quarantine_keep(source: &Path, target: &Path, link: bool) -> io::Result<()> {
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if link {
        match std::fs::hard_link(source, target) {
            Ok(()) => return Ok(()),
            // Kept already (or a name taken): a copy onto it would truncate the file it names.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Err(error),
            Err(_) => {}
        }
    }
    // Under a temporary name, then linked to its own (which fails if that name exists):
    // neither a crash nor a clash leaves a partial or replaced file under a quarantine name.
    let partial = target.with_extension(PARTIAL);
    let copied = no_room_for_copies().and_then(|()| std::fs::copy(source, &partial)).and_then(|_| {
        match std::fs::hard_link(&partial, target) {
            Err(error) if error.kind() != io::ErrorKind::AlreadyExists => std::fs::rename(&partial, target),
            linked => linked,
        }
    });
    let _ = std::fs::remove_file(&partial);
    copied
}

/// The quarantined name of `path`'s file, if an earlier start linked it there (its damage was
/// counted then, and is not again).
fn quarantined_link(path: &Path, quarantine: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::metadata(path).ok()?;
    if file.nlink() < 2 {
        return None;
    }
    let name = path.file_name()?.to_str()?.to_owned();
    std::fs::read_dir(quarantine)
        .ok()?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_str().is_some_and(|n| n.starts_with(&name)))
        .map(|entry| entry.path())
        .find(|other| std::fs::metadata(other).is_ok_and(|m| m.ino() == file.ino() && m.dev() == file.dev()))
}

/// The damaged regions between `frames` in a file of `len` bytes.
fn damaged_regions(frames: &[std::ops::Range<usize>], len: usize) -> Vec<(u64, u64)> {
    let mut regions = Vec::new();
    let mut expected = HEADER.len();
    for frame in frames {
        if frame.start > expected {
            regions.push((expected as u64, frame.start as u64));
        }
        expected = frame.end;
    }
    if expected < len {
        regions.push((expected as u64, len as u64));
    }
    regions
}

/// Checks every frame of a segment left by an earlier run. A damaged file is moved to the
/// quarantine directory and replaced by a copy holding only its intact frames; one without
/// records is deleted. Its damage is counted in `recovered` by the start that finds it.
///
/// The copy needs room. On a disk too full for it the file is read as it is, around its damage
/// (`SegmentState::skips`; beyond [`MAX_SKIPS`] regions, up to its first damage, the rest
/// counted `corrupt` by the reader). Its original is hard-linked into the quarantine (a link
/// needs no room); a later start sees the link and neither counts it again nor keeps it twice,
/// and repairs it once there is room. Where not even a link can be made, every start counts it
/// again: over-counted rather than lost uncounted, since the file goes once its records are
/// delivered. A damaged file without one intact frame needs no copy: it is moved to the
/// quarantine whole, or, when not even that can be done, left where it is (nothing is lost
/// while it stays) and counted by the start that moves it.
fn recover_segment(path: &Path, quarantine: &Path, recovered: &mut Recovered) -> io::Result<Recovery> {
    let data = std::fs::read(path)?;
    let report = segment::scan(&data);
    let first_ingest_ms =
        report.frames.first().and_then(|range| segment::frame_at(&data, range.start)).map(|(frame, _)| frame.ingest_ms);
    let intact = report.frames.len() as u64;
    if report.corrupt_regions == 0 {
        if report.frames.is_empty() {
            // Nothing in it (a header, or a file a crash left empty).
            std::fs::remove_file(path)?;
        }
        return Ok(Recovery { records: intact, bytes: data.len() as u64, first_ingest_ms, skips: Vec::new() });
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let target = quarantine.join(format!("{name}.{}", quarantine_suffix()));
    let earlier = quarantined_link(path, quarantine);
    let count = |recovered: &mut Recovered, kept: Option<PathBuf>| {
        recovered.corrupt_regions += report.corrupt_regions;
        recovered.corrupt_bytes += report.corrupt_bytes;
        recovered.quarantined.extend(kept);
    };
    let sync_parent = || path.parent().map_or(Ok(()), sync_dir);
    if report.frames.is_empty() {
        if earlier.is_some() {
            std::fs::remove_file(path)?;
        } else {
            let moved = std::fs::create_dir_all(quarantine).and_then(|()| std::fs::rename(path, &target));
            if let Err(error) = moved {
                error!(
                    segment = %path.display(),
                    %error,
                    corrupt_bytes = report.corrupt_bytes,
                    "damaged spool segment without an intact record cannot be moved to quarantine: left in place, a later start moves it"
                );
                // Never deleted, and never read or numbered over (the next segment's number is
                // above every file's).
                return Ok(Recovery { records: 0, bytes: 0, first_ingest_ms: None, skips: Vec::new() });
            }
            error!(
                segment = %path.display(),
                quarantined = %target.display(),
                corrupt_bytes = report.corrupt_bytes,
                "damaged spool segment without an intact record: moved to quarantine"
            );
            count(recovered, Some(target));
        }
        sync_parent()?;
        return Ok(Recovery { records: 0, bytes: 0, first_ingest_ms: None, skips: Vec::new() });
    }
    let mut clean = HEADER.to_vec();
    for range in &report.frames {
        clean.extend_from_slice(&data[range.clone()]);
    }
    let temporary = path.with_extension("seg.tmp");
    let copied = no_room_for_copies()
        .and_then(|()| std::fs::write(&temporary, &clean))
        .and_then(|()| File::open(&temporary)?.sync_all())
        .and_then(|()| match earlier {
            // Already kept (and counted): the copy simply replaces the file.
            Some(_) => Ok(()),
            None => std::fs::create_dir_all(quarantine).and_then(|()| std::fs::rename(path, &target)),
        });
    if let Err(error) = copied {
        let _ = std::fs::remove_file(&temporary);
        let kept = match earlier {
            Some(_) => None,
            None => quarantine_keep(path, &target, true).ok().map(|()| target.clone()),
        };
        let mut skips = damaged_regions(&report.frames, data.len());
        if skips.len() > MAX_SKIPS {
            skips.clear();
        }
        error!(
            segment = %path.display(),
            %error,
            quarantined = ?kept,
            corrupt_regions = report.corrupt_regions,
            intact_records = intact,
            read_around_the_damage = !skips.is_empty(),
            "damaged spool segment cannot be repaired (no room for its intact copy?): it is read as it is"
        );
        // Counted once while the link lasts: a later start sees it and counts nothing. (Without
        // even a link — no quarantine directory could be made — every start counts it again.)
        if earlier.is_none() {
            count(recovered, kept);
        }
        return Ok(Recovery { records: intact, bytes: data.len() as u64, first_ingest_ms, skips });
    }
    std::fs::rename(&temporary, path)?;
    sync_parent()?;
    error!(
        segment = %path.display(),
        quarantined = %earlier.as_ref().unwrap_or(&target).display(),
        corrupt_regions = report.corrupt_regions,
        corrupt_bytes = report.corrupt_bytes,
        intact_records = intact,
        "damaged spool segment: intact records kept, original in quarantine"
    );
    if earlier.is_none() {
        count(recovered, Some(target));
    }
    Ok(Recovery { records: intact, bytes: clean.len() as u64, first_ingest_ms, skips: Vec::new() })
}

/// Appends records to the active segment. One writer per spool; it lives on the blocking pool.
pub struct SpoolWriter {
    spool: Arc<Spool>,
    /// The active segment's file; `None` until it could be made (a full disk at start).
    file: Option<File>,
    /// Ingest time of the active segment's first record.
    first_ingest_ms: Option<u64>,
    segment: u64,
    offset: u64,
    /// The index the next record gets in the active segment.
    index: u32,
    unsynced: bool,
    last_sync: Instant,
    scratch: Vec<u8>,
    /// See [`SpoolWriter::inject`].
    #[cfg(test)]
    faults: std::collections::VecDeque<(SpoolOp, u32, io::Error)>,
    /// Test seam: where the active segment was last synced, and the byte ranges (segment, from,
    /// to) an injected fsync failure left unsynced ([`SpoolWriter::take_failed_syncs`]).
    #[cfg(test)]
    synced_to: u64,
    #[cfg(test)]
    failed_syncs: Vec<(u64, u64, u64)>,
}

/// A sync of the active segment running off the write path ([`SpoolWriter::sync_due`]).
pub struct PendingSync {
    file: File,
    /// The test seam's injected failure, if any.
    fault: Option<io::Error>,
}

impl PendingSync {
    /// Forces what the writer had written when this was made to stable storage. Blocking.
    pub fn run(self) -> io::Result<()> {
        match self.fault {
            Some(error) => Err(error),
            None => self.file.sync_data(),
        }
    }
}

/// What [`SpoolWriter::append`] did.
#[derive(Debug, Default)]
pub struct Appended {
    /// Positions of the records written: a prefix of those given, all of them unless `error`.
    pub positions: Vec<SpoolPos>,
    /// How many of them, from the first, are as durable as `buffer.fsync` makes them (synced
    /// under `always`; written under `never` and the interval, whose sync comes later). The rest
    /// were written but a sync covering them failed: they must never be acknowledged as spooled.
    pub durable: usize,
    /// What failed, if anything; the records after `positions` were not written.
    pub error: Option<SpoolIoError>,
}

impl Appended {
    fn failed(mut self, op: SpoolOp, error: io::Error, synced: usize, fsync: Fsync) -> Self {
        self.durable = match (op, fsync) {
            (SpoolOp::Fsync | SpoolOp::Read, _) | (SpoolOp::Write, Fsync::Always) => synced,
            (SpoolOp::Write, Fsync::Never | Fsync::Interval(_)) => self.positions.len(),
        };
        self.error = Some(SpoolIoError { op, error });
        self
    }
}

/// A spool operation, the `op` label of `sluice_spool_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpoolOp {
    /// Writing frames (or creating a segment file).
    Write,
    /// Forcing written frames to stable storage.
    Fsync,
    /// Reading the backlog back.
    Read,
}

impl SpoolOp {
    /// Every op, for creating the series at zero.
    pub const ALL: [SpoolOp; 3] = [SpoolOp::Write, SpoolOp::Fsync, SpoolOp::Read];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SpoolOp::Write => "write",
            SpoolOp::Fsync => "fsync",
            SpoolOp::Read => "read",
        }
    }
}

/// A failed spool write or sync.
#[derive(Debug, thiserror::Error)]
#[error("spool {} failed: {error}", .op.as_str())]
pub struct SpoolIoError {
    /// What failed.
    pub op: SpoolOp,
    /// The OS error.
    pub error: io::Error,
}

impl SpoolIoError {
    /// The disk (or the spool's quota) is full: `when_full` decides, as for the spool's cap.
    /// Any other I/O error is never a policy drop: the records are held and the write retried.
    pub fn disk_full(&self) -> bool {
        // ENOSPC, EDQUOT.
        matches!(self.error.raw_os_error(), Some(28 | 122))
    }
}

impl SpoolWriter {
    /// A writer whose active segment `segment` is not made yet ([`SpoolWriter::start_segment`]).
    fn pending(spool: Arc<Spool>, segment: u64) -> Self {
        Self {
            spool,
            file: None,
            first_ingest_ms: None,
            segment,
            offset: HEADER.len() as u64,
            index: 0,
            unsynced: false,
            last_sync: Instant::now(),
            scratch: Vec::new(),
            #[cfg(test)]
            faults: std::collections::VecDeque::new(),
            #[cfg(test)]
            synced_to: HEADER.len() as u64,
            #[cfg(test)]
            failed_syncs: Vec::new(),
        }
    }

    /// Makes the active segment's file, if it is not made yet. On failure nothing is left
    /// behind and the next call tries again.
    fn start_segment(&mut self) -> io::Result<()> {
        if self.file.is_none() {
            let file = match self.fault(SpoolOp::Write) {
                Some(error) => Err(error),
                None => Self::create_segment(&self.spool, self.segment),
            }?;
            self.file = Some(file);
        }
        Ok(())
    }

    /// Creates segment `segment` with its header (synced unless `fsync = "never"`) and enters
    /// it in the ledger.
    fn create_segment(spool: &Spool, segment: u64) -> io::Result<File> {
        let path = segment_path(&spool.config.dir, segment);
        let mut file = OpenOptions::new().create_new(true).write(true).open(&path)?;
        let started = file.write_all(HEADER).and_then(|()| {
            if spool.config.fsync != Fsync::Never {
                file.sync_data()?;
                sync_dir(&spool.config.dir)?;
            }
            Ok(())
        });
        if let Err(error) = started {
            // A half-made file would make every later attempt fail (`create_new`).
            let _ = std::fs::remove_file(&path);
            return Err(error);
        }
        let mut state = spool.lock();
        state.segments.insert(segment, SegmentState { bytes: HEADER.len() as u64, ..SegmentState::default() });
        state.disk_bytes += HEADER.len() as u64;
        Ok(file)
    }

    /// The position the next record will get.
    pub fn end(&self) -> SpoolPos {
        SpoolPos { segment: self.segment, offset: self.offset, index: self.index }
    }

    /// True if `bytes` more fit under the cap.
    pub fn fits(&self, bytes: u64) -> bool {
        self.spool.disk_bytes() + bytes <= self.spool.config.max_bytes
    }

    /// Appends records in order (see [`Appended`]). Written records count as held in memory by
    /// the caller from here on. Under `Fsync::Always` they are synced before this returns.
    pub fn append(&mut self, records: &[Entry<'_>]) -> Appended {
        let mut out = Appended { positions: Vec::with_capacity(records.len()), ..Appended::default() };
        let mut pending = Vec::with_capacity(records.len());
        // Positions covered by a successful sync in this call.
        let mut synced = 0;
        self.scratch.clear();
        if !records.is_empty()
            && let Err(error) = self.start_segment()
        {
            return out.failed(SpoolOp::Write, error, synced, self.spool.config.fsync);
        }
        for Entry { ingest_ms, key, payload } in records {
            let len = segment::frame_len(*key, payload) as u64;
            if self.offset > HEADER.len() as u64 && self.offset + len > self.spool.config.segment_bytes {
                if let Err(error) = self.flush_scratch(pending.len() as u64) {
                    return out.failed(SpoolOp::Write, error, synced, self.spool.config.fsync);
                }
                out.positions.append(&mut pending);
                match self.roll() {
                    Ok(()) if self.spool.config.fsync != Fsync::Never => synced = out.positions.len(),
                    Ok(()) => {}
                    Err((op, error)) => return out.failed(op, error, synced, self.spool.config.fsync),
                }
            }
            pending.push(self.end());
            self.index += 1;
            if self.first_ingest_ms.is_none() {
                self.first_ingest_ms = Some(*ingest_ms);
            }
            segment::encode(*ingest_ms, *key, payload, &mut self.scratch);
            self.offset += len;
        }
        if let Err(error) = self.flush_scratch(pending.len() as u64) {
            return out.failed(SpoolOp::Write, error, synced, self.spool.config.fsync);
        }
        out.positions.append(&mut pending);
        if self.spool.config.fsync == Fsync::Always {
            if let Err(error) = self.sync() {
                return out.failed(SpoolOp::Fsync, error, synced, self.spool.config.fsync);
            }
            synced = out.positions.len();
        }
        out.durable = match self.spool.config.fsync {
            Fsync::Always => synced,
            Fsync::Never | Fsync::Interval(_) => out.positions.len(),
        };
        out
    }

    /// Writes the scratch buffer. On failure the file is cut back to its last good length, so a
    /// half-written frame never sits in front of later ones, and the offset is rewound.
    fn flush_scratch(&mut self, records: u64) -> io::Result<()> {
        if self.scratch.is_empty() {
            return Ok(());
        }
        let start = self.offset - self.scratch.len() as u64;
        let written = match (self.fault(SpoolOp::Write), self.file.as_mut()) {
            (Some(error), _) => Err(error),
            (None, Some(file)) => file.write_all(&self.scratch),
            (None, None) => Err(io::Error::other("the spool's active segment is not made")),
        };
        if let Err(error) = written {
            if let Some(file) = self.file.as_mut() {
                let _ = file.set_len(start);
                let _ = file.seek(SeekFrom::Start(start));
            }
            self.offset = start;
            self.index -= records as u32;
            self.scratch.clear();
            return Err(error);
        }
        self.unsynced = true;
        let mut state = self.spool.lock();
        state.disk_bytes += self.scratch.len() as u64;
        if let Some(segment) = state.segments.get_mut(&self.segment) {
            // The caller holds the written records in memory.
            let first = self.index - records as u32;
            for index in first..self.index {
                segment.hold(index);
            }
            segment.records += records;
            segment.bytes += self.scratch.len() as u64;
            segment.first_ingest_ms = segment.first_ingest_ms.or(self.first_ingest_ms);
        }
        drop(state);
        self.scratch.clear();
        Ok(())
    }

    fn roll(&mut self) -> Result<(), (SpoolOp, io::Error)> {
        if self.spool.config.fsync != Fsync::Never {
            self.sync().map_err(|error| (SpoolOp::Fsync, error))?;
        }
        // The next segment first: if it cannot be made, this one stays active (and unsealed:
        // a sealed segment whose records are all finished is deleted).
        let file = Self::create_segment(&self.spool, self.segment + 1).map_err(|error| (SpoolOp::Write, error))?;
        if let Some(segment) = self.spool.lock().segments.get_mut(&self.segment) {
            segment.sealed = true;
        }
        self.file = Some(file);
        self.segment += 1;
        self.first_ingest_ms = None;
        self.offset = HEADER.len() as u64;
        self.index = 0;
        self.unsynced = false;
        self.last_sync = Instant::now();
        #[cfg(test)]
        {
            self.synced_to = HEADER.len() as u64;
        }
        Ok(())
    }

    /// Forces written records to stable storage (if anything is unsynced).
    pub fn sync(&mut self) -> io::Result<()> {
        if self.unsynced {
            if let Some(error) = self.fault(SpoolOp::Fsync) {
                #[cfg(test)]
                self.failed_syncs.push((self.segment, self.synced_to, self.offset));
                return Err(error);
            }
            if let Some(file) = &self.file {
                file.sync_data()?;
            }
            #[cfg(test)]
            {
                self.synced_to = self.offset;
            }
            self.unsynced = false;
        }
        self.last_sync = Instant::now();
        Ok(())
    }

    /// If the interval policy says a sync is due, one to run off the write path (writes go on
    /// meanwhile; the sync covers what was written before this call). `Err` only if the file
    /// cannot be opened a second time.
    pub fn sync_due(&mut self) -> io::Result<Option<PendingSync>> {
        match self.spool.config.fsync {
            Fsync::Interval(every) if self.unsynced && self.last_sync.elapsed() >= every => {
                let Some(file) = &self.file else { return Ok(None) };
                let file = file.try_clone()?;
                self.unsynced = false;
                self.last_sync = Instant::now();
                Ok(Some(PendingSync { file, fault: self.fault(SpoolOp::Fsync) }))
            }
            _ => Ok(None),
        }
    }

    /// True if written records are not yet synced.
    pub fn unsynced(&self) -> bool {
        self.unsynced
    }

    /// Test seam: the next `op`s fail with these errors instead of running (unit and model
    /// tests put a real writer into the disk's failure modes this way).
    #[cfg(test)]
    pub fn inject(&mut self, op: SpoolOp, error: io::Error) {
        self.inject_after(op, 0, error);
    }

    /// Like [`SpoolWriter::inject`], after `passes` more `op`s have run.
    #[cfg(test)]
    pub fn inject_after(&mut self, op: SpoolOp, passes: u32, error: io::Error) {
        self.faults.push_back((op, passes, error));
    }

    /// Test seam: the byte ranges (segment, from, to) that injected fsync failures left
    /// unsynced since the last call: no record in them may be acknowledged as spooled.
    #[cfg(test)]
    pub fn take_failed_syncs(&mut self) -> Vec<(u64, u64, u64)> {
        std::mem::take(&mut self.failed_syncs)
    }

    #[cfg(test)]
    fn fault(&mut self, op: SpoolOp) -> Option<io::Error> {
        let at = self.faults.iter().position(|(faulty, _, _)| *faulty == op)?;
        if let Some((_, passes, _)) = self.faults.get_mut(at)
            && *passes > 0
        {
            *passes -= 1;
            return None;
        }
        self.faults.remove(at).map(|(_, _, error)| error)
    }

    #[cfg(not(test))]
    fn fault(&mut self, _: SpoolOp) -> Option<io::Error> {
        None
    }

    /// Seals the active segment (shutdown), so the next start treats it like any other.
    pub fn close(mut self) -> io::Result<()> {
        self.sync()?;
        if let Some(segment) = self.spool.lock().segments.get_mut(&self.segment) {
            segment.sealed = true;
        }
        Ok(())
    }
}

/// A record to append.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// When the agent read it (Unix ms).
    pub ingest_ms: u64,
    /// Its Kafka key.
    pub key: Option<&'a [u8]>,
    /// Its envelope.
    pub payload: &'a [u8],
}

/// A record read back from disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskRecord {
    /// Where it is.
    pub pos: SpoolPos,
    /// When the agent read it (Unix ms).
    pub ingest_ms: u64,
    /// Its Kafka key.
    pub key: Option<Bytes>,
    /// Its envelope.
    pub payload: Bytes,
}

/// What one read of the backlog returned.
#[derive(Debug, Default)]
pub struct ReadBatch {
    /// Disk-only records, in order; the ledger holds them in memory from now on (a record the
    /// caller cannot send goes back with [`Spool::evicted`]).
    pub records: Vec<DiskRecord>,
    /// Damaged regions met on the way (already quarantined).
    pub corrupt_regions: u64,
    /// Disk-only records lost behind damage (each region met skips the rest of its segment;
    /// damage recovery found and kept is read around, and not reported here); counted by the
    /// caller as `reason="corrupt"`. Exact: the ledger knows what each segment
    /// holds.
    pub corrupt_records: u64,
    /// Bytes of the segments skipped behind damage.
    pub corrupt_bytes: u64,
    /// The position after the last record read or skipped.
    pub next: Option<SpoolPos>,
}

/// Reads disk-only records in order. Lives on the blocking pool with the shipper's backlog lane.
pub struct SpoolReader {
    spool: Arc<Spool>,
    file: Option<(u64, BufReader<File>, u64)>,
    body: Vec<u8>,
    /// Reads in a row that failed with an I/O error at one position, and when the first did.
    failures: Option<(SpoolPos, u32, std::time::Instant)>,
}

/// A read that keeps failing at one position — at least this many times, over at least
/// [`READ_FAILURE_GRACE`] — gives up the rest of its segment (its file moved to `quarantine/`,
/// its disk-only records counted `corrupt`): a disk that keeps failing there would otherwise stop
/// the backlog, and once the spool is full the writers, for ever. Errors about the process's
/// resources (`EMFILE`, `ENFILE`, `ENOMEM`) say nothing about the data and never count.
pub const MAX_READ_FAILURES: u32 = 3;

/// See [`MAX_READ_FAILURES`]: a disk hiccup (a network volume reconnecting) outlasts a few
/// retries a second apart, and must not cost intact records.
pub const READ_FAILURE_GRACE: Duration = if cfg!(test) { Duration::ZERO } else { Duration::from_secs(60) };

impl SpoolReader {
    /// Reads the disk-only records from `from` while their position is below `upto`, stopping
    /// after `max_records` records or `max_bytes` bytes looked at (records skipped because they
    /// are in memory or finished count too, so one read is bounded). Marks each record returned
    /// as held in memory, and moves the backlog cursor to where it stopped (or to a lower record
    /// evicted meanwhile). Blocking.
    pub fn read(
        &mut self,
        from: SpoolPos,
        upto: SpoolPos,
        max_records: usize,
        max_bytes: usize,
    ) -> io::Result<ReadBatch> {
        // Start at the cursor as it is now: a record evicted since `from` was read from the
        // cursor lies at or after the cursor, and one evicted from now on is in `lowered`.
        let from = {
            let mut state = self.spool.lock();
            state.lowered = None;
            state.backlog.map_or(from, |backlog| backlog.min(from))
        };
        let result = self.scan(from, upto, max_records, max_bytes);
        // Never held between reads: a segment `drop_oldest` deletes meanwhile must free its room
        // at once (on a full disk nothing else would), and a read is a batch, so the open is
        // one per batch.
        self.file = None;
        let mut state = self.spool.lock();
        let next = match &result {
            Ok(batch) => batch.next,
            Err(_) => None,
        };
        if let Some(next) = next {
            // An eviction during the read may have put a record behind where it stopped.
            let cursor = state.lowered.map_or(next, |lowered| lowered.min(next));
            state.backlog = Some(cursor);
        }
        result
    }

    fn scan(&mut self, from: SpoolPos, upto: SpoolPos, max_records: usize, max_bytes: usize) -> io::Result<ReadBatch> {
        let mut batch = ReadBatch::default();
        let mut pos = from;
        let mut bytes = 0;
        while pos < upto && batch.records.len() < max_records && bytes < max_bytes {
            let known = self.spool.lock().segments.contains_key(&pos.segment);
            if !known {
                // Dropped meanwhile: continue with the next segment that exists.
                match self.next_segment(pos.segment) {
                    Some(next) if next <= upto => {
                        pos = next;
                        continue;
                    }
                    _ => {
                        pos = upto;
                        break;
                    }
                }
            }
            let max_body = self.spool.config.max_body;
            let read = match self.open_at(pos) {
                Ok(()) => {
                    let Some((_, reader, _)) = self.file.as_mut() else { break };
                    segment::read_frame(reader, &mut self.body, max_body)
                }
                Err(error) => Err(segment::ReadError::Io(error)),
            };
            match read {
                Ok(true) => {
                    let Some(frame) = segment::body_frame(&self.body) else { break };
                    let len = (segment::FRAME_OVERHEAD + self.body.len()) as u64;
                    bytes += len as usize;
                    let taken = self.spool.lock().segments.get_mut(&pos.segment).is_some_and(|s| s.hold(pos.index));
                    if taken {
                        batch.records.push(DiskRecord {
                            pos,
                            ingest_ms: frame.ingest_ms,
                            key: frame.key.map(Bytes::copy_from_slice),
                            payload: Bytes::copy_from_slice(frame.payload),
                        });
                    }
                    pos.offset += len;
                    pos.index += 1;
                    if let Some((_, _, offset)) = self.file.as_mut() {
                        *offset += len;
                    }
                }
                Ok(false) => {
                    // End of this segment; the writer only moves on after sealing it.
                    let sealed = self.spool.lock().segments.get(&pos.segment).is_some_and(|s| s.sealed);
                    match self.next_segment(pos.segment) {
                        Some(next) if next <= upto => pos = next,
                        // Sealed, and nothing after it yet: the writer's segment is not made
                        // (a full disk). All there is was read.
                        None if sealed => {
                            pos = upto;
                            break;
                        }
                        _ => break,
                    }
                }
                Err(segment::ReadError::Io(error)) => {
                    self.file = None;
                    if !batch.records.is_empty() || batch.corrupt_regions > 0 {
                        // What was read goes on (its records are held now); the error comes
                        // back on the next read, which starts here.
                        break;
                    }
                    // ENFILE, EMFILE, ENOMEM: the process's resources, not the data.
                    if matches!(error.raw_os_error(), Some(23 | 24 | 12)) {
                        return Err(error);
                    }
                    let (failures, since) = match self.failures {
                        Some((at, failures, since)) if at == pos => (failures + 1, since),
                        _ => (1, std::time::Instant::now()),
                    };
                    if failures < MAX_READ_FAILURES || since.elapsed() < READ_FAILURE_GRACE {
                        self.failures = Some((pos, failures, since));
                        return Err(error);
                    }
                    self.failures = None;
                    let quarantined = self.spool.quarantine_move(pos.segment);
                    let (lost, next) = self.skip_rest(pos, upto, &mut batch);
                    error!(
                        %error,
                        segment = pos.segment,
                        offset = pos.offset,
                        failures,
                        lost,
                        quarantined = ?quarantined,
                        "the spool cannot read this segment; the rest of it is given up and its disk-only records counted as lost"
                    );
                    match next {
                        Some(next) => pos = next,
                        None => {
                            pos = upto;
                            break;
                        }
                    }
                }
                Err(segment::ReadError::Corrupt)
                    if let Some(to) =
                        self.spool.lock().segments.get(&pos.segment).and_then(|s| s.skip_from(pos.offset)) =>
                {
                    // Damage recovery found, kept and counted: read on behind it.
                    self.file = None;
                    pos.offset = to;
                }
                Err(segment::ReadError::Corrupt) => {
                    let quarantined = self.spool.quarantine_copy(pos.segment);
                    let (lost, next) = self.skip_rest(pos, upto, &mut batch);
                    error!(
                        segment = pos.segment,
                        offset = pos.offset,
                        lost,
                        quarantined = ?quarantined,
                        "damaged spool record; the rest of the segment is skipped and its disk-only records counted as lost"
                    );
                    match next {
                        Some(next) => pos = next,
                        None => {
                            pos = upto;
                            break;
                        }
                    }
                }
            }
        }
        batch.next = Some(pos);
        Ok(batch)
    }

    /// Gives up the rest of `pos`'s segment (damaged, or unreadable): its disk-only records are
    /// finished as lost and counted in `batch`. Returns how many, and where to read on (`None`:
    /// nothing before `upto`).
    fn skip_rest(&mut self, pos: SpoolPos, upto: SpoolPos, batch: &mut ReadBatch) -> (u64, Option<SpoolPos>) {
        let (lost, skipped_bytes) = self.spool.lose_rest(pos);
        batch.corrupt_regions += 1;
        batch.corrupt_records += lost;
        batch.corrupt_bytes += skipped_bytes;
        (lost, self.next_segment(pos.segment).filter(|next| *next <= upto))
    }

    fn next_segment(&mut self, after: u64) -> Option<SpoolPos> {
        self.file = None;
        self.spool.lock().segments.range(after + 1..).next().map(|(id, _)| SpoolPos::start_of(*id))
    }

    fn open_at(&mut self, pos: SpoolPos) -> io::Result<()> {
        let reopen =
            !matches!(&self.file, Some((segment, _, offset)) if *segment == pos.segment && *offset == pos.offset);
        if reopen {
            let mut file = File::open(segment_path(&self.spool.config.dir, pos.segment))?;
            file.seek(SeekFrom::Start(pos.offset))?;
            self.file = Some((pos.segment, BufReader::with_capacity(64 * 1024, file), pos.offset));
        }
        Ok(())
    }
}
