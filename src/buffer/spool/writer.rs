//! The spool writer: appends records to the active segment (one write and at most one sync per
//! batch), rolls segments, and says exactly which records a failed write or sync left undurable.
//!
//! Owns: the active segment's file (made on the first write when the disk was full at start)
//! and fsync. Must not: acknowledge what a failed write or sync covered, or leave a half-written
//! frame in front of later ones.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::sync::Arc;
use std::time::Instant;

use super::*;

/// Appends records to the active segment. One writer per spool; it lives on the blocking pool.
pub struct SpoolWriter {
    pub(super) spool: Arc<Spool>,
    /// The active segment's file; `None` until it could be made (a full disk at start).
    pub(super) file: Option<File>,
    /// Ingest time of the active segment's first record.
    pub(super) first_ingest_ms: Option<u64>,
    pub(super) segment: u64,
    pub(super) offset: u64,
    /// The index the next record gets in the active segment.
    pub(super) index: u32,
    pub(super) unsynced: bool,
    pub(super) last_sync: Instant,
    pub(super) scratch: Vec<u8>,
    /// See [`SpoolWriter::inject`].
    #[cfg(test)]
    pub(super) faults: std::collections::VecDeque<(SpoolOp, u32, io::Error)>,
    /// Test seam: where the active segment was last synced, and the byte ranges (segment, from,
    /// to) an injected fsync failure left unsynced ([`SpoolWriter::take_failed_syncs`]).
    #[cfg(test)]
    pub(super) synced_to: u64,
    #[cfg(test)]
    pub(super) failed_syncs: Vec<(u64, u64, u64)>,
}

/// A sync of the active segment running off the write path ([`SpoolWriter::sync_due`]).
pub struct PendingSync {
    pub(super) file: File,
    /// The test seam's injected failure, if any.
    pub(super) fault: Option<io::Error>,
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
    pub(super) fn failed(mut self, op: SpoolOp, error: io::Error, synced: usize, fsync: Fsync) -> Self {
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
    pub(super) fn pending(spool: Arc<Spool>, segment: u64) -> Self {
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
    pub(super) fn start_segment(&mut self) -> io::Result<()> {
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
    pub(super) fn create_segment(spool: &Spool, segment: u64) -> io::Result<File> {
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
        for Entry { ingest_ms, topic, key, payload } in records {
            let len = segment::frame_len(*topic, *key, payload) as u64;
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
            segment::encode(*ingest_ms, *topic, *key, payload, &mut self.scratch);
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
    pub(super) fn flush_scratch(&mut self, records: u64) -> io::Result<()> {
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

    pub(super) fn roll(&mut self) -> Result<(), (SpoolOp, io::Error)> {
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
    pub(super) fn fault(&mut self, op: SpoolOp) -> Option<io::Error> {
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
    pub(super) fn fault(&mut self, _: SpoolOp) -> Option<io::Error> {
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
    /// Its Kafka topic (`None`: the default one, as an earlier release wrote).
    pub topic: Option<&'a str>,
    /// Its Kafka key.
    pub key: Option<&'a [u8]>,
    /// Its envelope.
    pub payload: &'a [u8],
}
