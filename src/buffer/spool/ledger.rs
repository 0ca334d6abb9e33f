//! The spool's ledger: for every record on disk, whether it is held in memory, disk-only (the
//! backlog) or finished, and per segment what it holds and owes; acks parked until delivery or a
//! sync; deleting what is finished and `drop_oldest`.
//!
//! Owns: the three states and every move between them (a record is finished once). Must not:
//! delete a segment that owes a record, or run on a runtime worker (it deletes files).

use std::collections::{BTreeMap, HashMap};
use std::io::{self};

use tracing::{error, warn};

use super::*;
use crate::buffer::ack::Ack;
use crate::telemetry::outcome::{Dropped, Failed, Refused};

/// The file in the spool's folder that carries the `maybe_stored` marks of records still owed
/// from one run to the next: a line `segment index` per record. Written at the end of a drain,
/// read (and removed) when the spool opens.
pub(super) const MAYBE_STORED_FILE: &str = "maybe-stored";

/// One bit per record of a segment. Hand-written: two words of logic, and the ledger is the
/// product's core.
#[derive(Debug, Default, Clone)]
pub(super) struct Bits(pub(super) Vec<u64>);

impl Bits {
    pub(super) fn get(&self, index: u32) -> bool {
        self.0.get(index as usize / 64).is_some_and(|word| word & (1 << (index % 64)) != 0)
    }

    pub(super) fn set(&mut self, index: u32, on: bool) {
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

#[derive(Debug, Default)]
pub(super) struct SegmentState {
    /// Ingest time of the segment's first record (Unix ms): the age of its oldest record.
    pub(super) first_ingest_ms: Option<u64>,
    /// Records written to the segment (or found intact at start-up).
    pub(super) records: u64,
    /// Records finished: acknowledged by Kafka or counted as dropped.
    pub(super) done: u64,
    /// Records held in memory (queued or in flight), not finished.
    pub(super) outstanding: u64,
    /// File size.
    pub(super) bytes: u64,
    /// No more records will be appended.
    pub(super) sealed: bool,
    /// Per record: held in memory. Neither this nor `finished`: disk-only.
    pub(super) in_memory: Bits,
    /// Per record: finished; never sent, read or counted again.
    pub(super) finished: Bits,
    /// Per record: Kafka may hold it already — an attempt (of this run, or of an earlier one:
    /// `MAYBE_STORED_FILE`) was sent and never answered, or failed after the broker may have
    /// written it. Lost later, it is counted `unconfirmed`, never as "not stored".
    pub(super) maybe_stored: Bits,
    /// A damaged segment recovery could not repair (no room for the copy) is read as it is: its
    /// damaged regions, as (first damaged byte, next intact frame or end of file). The reader
    /// jumps over them. Empty for every other segment.
    pub(super) skips: Vec<(u64, u64)>,
}

/// What names a segment's records across a restart: its id, its first record's ingest time
/// and its record count (`segment first_ingest_ms records` in the `maybe-stored` file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SegmentFingerprint {
    segment: u64,
    first_ingest_ms: u64,
    records: u64,
}

impl std::fmt::Display for SegmentFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.segment, self.first_ingest_ms, self.records)
    }
}

impl SegmentState {
    pub(super) fn fingerprint(&self, segment: u64) -> SegmentFingerprint {
        SegmentFingerprint { segment, first_ingest_ms: self.first_ingest_ms.unwrap_or(0), records: self.records }
    }

    pub(super) fn disk_only(&self, index: u32) -> bool {
        !self.in_memory.get(index) && !self.finished.get(index)
    }

    /// The record is in memory now (written, or read back). False if it already was, or is
    /// finished.
    pub(super) fn hold(&mut self, index: u32) -> bool {
        if !self.disk_only(index) {
            return false;
        }
        self.in_memory.set(index, true);
        self.outstanding += 1;
        true
    }

    /// The record left memory unfinished: disk-only again. False if it was not in memory.
    pub(super) fn release(&mut self, index: u32) -> bool {
        if !self.in_memory.get(index) {
            return false;
        }
        self.in_memory.set(index, false);
        self.outstanding = self.outstanding.saturating_sub(1);
        true
    }

    /// The record is finished. False if it already was (it must not count twice).
    pub(super) fn finish(&mut self, index: u32) -> bool {
        if self.finished.get(index) {
            return false;
        }
        self.release(index);
        self.finished.set(index, true);
        self.done += 1;
        true
    }

    /// Where to read on when the frame at `offset` is damaged damage recovery already found.
    pub(super) fn skip_from(&self, offset: u64) -> Option<u64> {
        self.skips.iter().find(|(start, _)| *start == offset).map(|(_, end)| *end)
    }

    /// Every record is finished and none will be added: the file may go.
    pub(super) fn deletable(&self) -> bool {
        self.sealed && self.done >= self.records
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) segments: BTreeMap<u64, SegmentState>,
    /// `delivered` acks of records evicted to the backlog, settled when they are delivered.
    pub(super) parked_acks: HashMap<SpoolPos, Ack>,
    /// `spooled` acks of records written under the interval policy, settled by the next
    /// successful sync, or by the record's delivery if that comes first.
    pub(super) awaiting_sync: HashMap<SpoolPos, Ack>,
    /// Those a sync now running covers ([`Spool::begin_sync`]).
    pub(super) syncing: HashMap<SpoolPos, Ack>,
    pub(super) disk_bytes: u64,
    /// Where the backlog reader looks next: no disk-only record lies before it. `None` when
    /// nothing has been evicted since the reader last caught up.
    pub(super) backlog: Option<SpoolPos>,
    /// The lowest position evicted while a backlog read was under way: the reader's cursor must
    /// not move past it.
    pub(super) lowered: Option<SpoolPos>,
    /// Records held in memory whose segment `drop_oldest` deleted: still delivered from
    /// memory, but no segment counts them any more. Each leaves this count when it is delivered
    /// or evicted (then counted as dropped); at shutdown the rest are lost and counted. At most
    /// the records the buffer holds.
    pub(super) orphaned: std::collections::HashSet<(u64, u32)>,
}

impl State {
    /// The ack waiting in the spool for the record at `pos`, if any (parked for its delivery, or
    /// waiting for a sync).
    pub(super) fn take_ack(&mut self, pos: SpoolPos) -> Option<Ack> {
        self.parked_acks.remove(&pos).or_else(|| self.awaiting_sync.remove(&pos)).or_else(|| self.syncing.remove(&pos))
    }
}

impl Spool {
    /// Bytes of all segment files.
    pub fn disk_bytes(&self) -> u64 {
        self.lock().disk_bytes
    }

    /// The first disk-only record, if any.
    pub fn backlog(&self) -> Option<SpoolPos> {
        self.lock().backlog
    }

    /// Records left memory without being finished (evicted under memory pressure, or not
    /// handed to Kafka), each with whether Kafka may hold it already: they are disk-only again
    /// (remembering that), and the backlog reader will send them. Acks waiting for their
    /// delivery are parked until then. Returns how many could not go back because `drop_oldest`
    /// deleted their segment meanwhile — they are lost, their acks refused, and the caller counts
    /// them: as `drop_oldest`, and (the second number, among them) those Kafka may hold as
    /// `unconfirmed`.
    #[must_use = "records whose segment was dropped are lost and must be counted"]
    pub fn evicted_marked(&self, records: Vec<(SpoolPos, Option<Ack>, bool)>) -> (u64, u64) {
        let mut state = self.lock();
        let mut first = None;
        let (mut lost, mut lost_maybe) = (0, 0);
        for (pos, ack, maybe_stored) in records {
            let Some(segment) = state.segments.get_mut(&pos.segment) else {
                // Lost now, unless `drop_oldest` already counted it (it was disk-only then).
                if state.orphaned.remove(&(pos.segment, pos.index)) {
                    lost += 1;
                    lost_maybe += u64::from(maybe_stored);
                }
                let parked = state.take_ack(pos);
                for ack in [ack, parked].into_iter().flatten() {
                    ack.refused(if maybe_stored {
                        Refused::from(Failed::Unconfirmed)
                    } else {
                        Dropped::DropOldest.into()
                    });
                }
                continue;
            };
            if maybe_stored {
                segment.maybe_stored.set(pos.index, true);
            }
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
        (lost, lost_maybe)
    }

    /// [`Spool::evicted_marked`] for records none of which Kafka may hold: how many are lost.
    #[must_use = "records whose segment was dropped are lost and must be counted"]
    pub fn evicted(&self, records: Vec<(SpoolPos, Option<Ack>)>) -> u64 {
        self.evicted_marked(records.into_iter().map(|(pos, ack)| (pos, ack, false)).collect()).0
    }

    /// Kafka may hold the records at `positions` (held in memory, sent with no answer): should
    /// they end on disk, they stay marked so (`maybe_stored`), also across a restart.
    pub fn may_be_stored(&self, positions: impl IntoIterator<Item = SpoolPos>) {
        let mut state = self.lock();
        for pos in positions {
            if let Some(segment) = state.segments.get_mut(&pos.segment) {
                segment.maybe_stored.set(pos.index, true);
            }
        }
    }

    /// Whether Kafka may hold the record at `pos` already.
    pub fn maybe_stored(&self, pos: SpoolPos) -> bool {
        self.lock().segments.get(&pos.segment).is_some_and(|segment| segment.maybe_stored.get(pos.index))
    }

    /// Writes which records on disk Kafka holds or may hold (the `maybe-stored` file) for the next
    /// start, at the end of a drain (written beside it and renamed into place): those still owed
    /// that were sent without an answer, and those finished in a segment still on disk (read
    /// again at the next start). Returns how many.
    /// Blocking. A run that ends without it (SIGKILL, a full disk) leaves the next one the marks
    /// of the run before (still true of the records they name, which are checked) or none: a
    /// record among them lost later is counted as never stored — over-counted as lost, never
    /// lost uncounted.
    ///
    /// Each line names a record by its segment's fingerprint (id, first ingest time, records)
    /// and its index: a mark never lands on a record it was not written for (segment ids start
    /// again at 0 when the spool is empty; a repaired segment may have shifted its records).
    pub fn save_maybe_stored(&self) -> io::Result<usize> {
        let positions = self.maybe_stored_positions();
        let path = self.config.dir.join(MAYBE_STORED_FILE);
        if positions.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
                _ => Ok(0),
            };
        }
        let mut text = String::with_capacity(positions.len() * 40);
        for (fingerprint, index) in &positions {
            text.push_str(&format!("{fingerprint} {index}\n"));
        }
        let partial = self.config.dir.join(format!("{MAYBE_STORED_FILE}.partial"));
        std::fs::write(&partial, text)?;
        std::fs::rename(&partial, &path)?;
        Ok(positions.len())
    }

    /// Reads the marks an earlier run left (the `maybe-stored` file) onto the records the spool
    /// recovered whose segment still has the fingerprint the mark was written with. The file
    /// stays (a start that fails after this loses nothing); the next drain replaces it.
    /// Returns how many were set. Blocking.
    pub(super) fn load_maybe_stored(&self) -> usize {
        let path = self.config.dir.join(MAYBE_STORED_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else { return 0 };
        let mut state = self.lock();
        let mut set = 0;
        for line in text.lines() {
            let numbers: Vec<u64> = line.split(' ').map_while(|part| part.parse().ok()).collect();
            let &[segment, first_ingest_ms, records, index] = numbers.as_slice() else { continue };
            let Ok(index) = u32::try_from(index) else { continue };
            if let Some(state) = state.segments.get_mut(&segment)
                && state.fingerprint(segment) == (SegmentFingerprint { segment, first_ingest_ms, records })
                && u64::from(index) < records
                && !state.maybe_stored.get(index)
            {
                state.maybe_stored.set(index, true);
                set += 1;
            }
        }
        set
    }

    /// The records on disk that Kafka holds or may hold, for the `maybe-stored` file: those not
    /// finished that may have been stored, and those finished — acknowledged or counted — in a
    /// segment still on disk. The ledger's `finished` bits live in memory only, so the next
    /// start reads such a segment whole again: without the mark, a record Kafka acknowledged and
    /// then dropped with its segment (`drop_oldest`) would be counted as never stored.
    pub(super) fn maybe_stored_positions(&self) -> Vec<(SegmentFingerprint, u32)> {
        let state = self.lock();
        let mut positions = Vec::new();
        for (id, segment) in &state.segments {
            let words = segment.maybe_stored.0.len().max(segment.finished.0.len());
            for word_at in 0..words {
                let marked = segment.maybe_stored.0.get(word_at).copied().unwrap_or(0)
                    | segment.finished.0.get(word_at).copied().unwrap_or(0);
                for bit in 0..64u32 {
                    if marked & (1 << bit) != 0 {
                        positions.push((segment.fingerprint(*id), word_at as u32 * 64 + bit));
                    }
                }
            }
        }
        positions
    }

    /// Records held in memory and not finished that are at none of `queued`: with librdkafka
    /// still (a close that did not end by the drain deadline), so Kafka may hold them. Marked.
    pub fn mark_held_elsewhere(&self, queued: &std::collections::HashSet<(u64, u32)>) {
        let mut state = self.lock();
        for (id, segment) in state.segments.iter_mut() {
            for index in 0..u32::try_from(segment.records).unwrap_or(u32::MAX) {
                if segment.in_memory.get(index) && !segment.finished.get(index) && !queued.contains(&(*id, index)) {
                    segment.maybe_stored.set(index, true);
                }
            }
        }
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

    pub(super) fn settle_synced(state: &mut State, acks: Vec<(SpoolPos, Ack)>, ok: bool) {
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

    /// How many of `positions` are orphaned (held in memory, their segment deleted by
    /// `drop_oldest`).
    pub fn orphans_among(&self, positions: impl IntoIterator<Item = SpoolPos>) -> u64 {
        let state = self.lock();
        positions.into_iter().filter(|pos| state.orphaned.contains(&(pos.segment, pos.index))).count() as u64
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
    /// only on disk are lost and returned for counting (those Kafka may hold apart); records of
    /// it held in memory are still delivered. Blocking.
    pub fn drop_oldest(&self) -> Option<DroppedSegment> {
        let (id, lost, lost_maybe) = {
            let mut state = self.lock();
            let id = state.segments.iter().find(|(_, segment)| segment.sealed).map(|(id, _)| *id)?;
            let segment = state.segments.remove(&id)?;
            // Disk-only records are lost; those held in memory are still delivered.
            let lost = segment.records.saturating_sub(segment.done + segment.outstanding);
            let records = u32::try_from(segment.records).unwrap_or(u32::MAX);
            let lost_maybe = (0..records)
                .filter(|index| segment.disk_only(*index) && segment.maybe_stored.get(*index))
                .count() as u64;
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
                    if segment.maybe_stored.get(pos.index) {
                        ack.refused(Failed::Unconfirmed);
                    } else {
                        ack.refused(Dropped::DropOldest);
                    }
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
            (id, lost, lost_maybe)
        };
        if let Err(error) = std::fs::remove_file(segment_path(&self.config.dir, id))
            && error.kind() != io::ErrorKind::NotFound
        {
            error!(%error, segment = id, "cannot delete a dropped spool segment");
        }
        Some(DroppedSegment { segment: id, lost, lost_maybe_stored: lost_maybe })
    }

    /// Damage at `pos` hides the rest of its segment from the reader: its disk-only records
    /// from there on are finished as lost (records held in memory are still delivered). Returns
    /// how many, and the bytes skipped.
    pub(super) fn lose_rest(&self, pos: SpoolPos) -> (u64, u64) {
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
}
