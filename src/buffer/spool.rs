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
//! Its parts: [`segment`] (the file format), `recovery` (opening), `ledger` (the three states),
//! `writer` ([`SpoolWriter`]) and `reader` ([`SpoolReader`]); written by hand because they are
//! the product's core — what no crate decides for us is exactly when a record may be forgotten.
//!
//! Must not: be called from a reader task (everything here does file I/O and runs on the
//! blocking pool or the delivery thread), delete a segment with an unacknowledged record, or
//! stop the agent because of a damaged file.

use std::fs::File;
use std::io::{self};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

mod ledger;
mod reader;
mod recovery;
pub mod segment;
mod writer;

pub use crate::config::Fsync;
use ledger::{SegmentState, State};
pub use reader::{DiskRecord, MAX_READ_FAILURES, READ_FAILURE_GRACE, ReadBatch, SpoolReader};
#[cfg(test)]
use recovery::NO_ROOM_FOR_COPIES;
use segment::HEADER;
pub use writer::{Appended, Entry, PendingSync, SpoolIoError, SpoolOp, SpoolWriter};

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

impl SpoolConfig {
    /// The spool of `buffer.type = "disk"`, from `[buffer]` and the listeners' largest record.
    pub fn for_config(config: &crate::config::Config) -> Self {
        let max_bytes = config.buffer.max_disk_bytes.as_u64();
        let record = usize::try_from(config.largest_record()).unwrap_or(usize::MAX);
        SpoolConfig {
            dir: config.buffer.path.clone(),
            max_bytes,
            // Several segments fit under the cap, so delivered ones can be freed while others fill.
            segment_bytes: (max_bytes / 8).clamp(64 * 1024, 16 * 1024 * 1024),
            fsync: config.buffer.fsync,
            // JSON-escaping a text line can grow it up to six times; the envelope adds a little.
            max_body: record.saturating_mul(6).saturating_add(64 * 1024),
        }
    }
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
    /// Of those, records Kafka may hold already (an attempt was sent with no answer): counted
    /// `unconfirmed`, the rest `drop_oldest`.
    pub lost_maybe_stored: u64,
}

fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("{segment:020}.seg"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Spool {
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

    /// A reader of disk-only records.
    pub fn reader(self: &Arc<Self>) -> SpoolReader {
        SpoolReader { spool: self.clone(), file: None, body: Vec::new(), failures: None }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
