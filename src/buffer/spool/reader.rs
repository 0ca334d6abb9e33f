//! The backlog reader: reads disk-only records back in order, skipping what is finished or
//! held in memory, reading around damage recovery found, and giving up (counted) the rest of a
//! segment whose damage it meets.
//!
//! Owns: reading back. Must not: hold a file between reads (a dropped segment must free its
//! room), hand on a record that is not disk-only, or stop the backlog on one bad segment.

use std::fs::File;
use std::io::{self, BufReader, Seek, SeekFrom};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tracing::error;

use super::*;

/// A record read back from disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskRecord {
    /// Where it is.
    pub pos: SpoolPos,
    /// When the agent read it (Unix ms).
    pub ingest_ms: u64,
    /// Its Kafka topic; `None` in a segment an earlier release wrote.
    pub topic: Option<crate::buffer::Topic>,
    /// Its Kafka key.
    pub key: Option<Bytes>,
    /// Its envelope.
    pub payload: Bytes,
    /// Kafka may hold it already (an earlier attempt was sent and never answered).
    pub maybe_stored: bool,
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
    pub(super) spool: Arc<Spool>,
    pub(super) file: Option<(u64, BufReader<File>, u64)>,
    pub(super) body: Vec<u8>,
    /// Reads in a row that failed with an I/O error at one position, and when the first did.
    pub(super) failures: Option<(SpoolPos, u32, std::time::Instant)>,
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

    pub(super) fn scan(
        &mut self,
        from: SpoolPos,
        upto: SpoolPos,
        max_records: usize,
        max_bytes: usize,
    ) -> io::Result<ReadBatch> {
        let mut last_topic: Option<crate::buffer::Topic> = None;
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
                    let taken = self
                        .spool
                        .lock()
                        .segments
                        .get_mut(&pos.segment)
                        .and_then(|s| s.hold(pos.index).then(|| s.maybe_stored.get(pos.index)));
                    if let Some(maybe_stored) = taken {
                        // Records in a row mostly share a topic: one allocation for them all.
                        let topic = frame.topic.map(|topic| match &last_topic {
                            Some(last) if &**last == topic => last.clone(),
                            _ => last_topic.insert(crate::buffer::Topic::from(topic)).clone(),
                        });
                        batch.records.push(DiskRecord {
                            pos,
                            ingest_ms: frame.ingest_ms,
                            topic,
                            key: frame.key.map(Bytes::copy_from_slice),
                            payload: Bytes::copy_from_slice(frame.payload),
                            maybe_stored,
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
                    pos = next;
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
                    pos = next;
                }
            }
        }
        batch.next = Some(pos);
        Ok(batch)
    }

    /// Gives up the rest of `pos`'s segment (damaged, or unreadable): its disk-only records are
    /// finished as lost and counted in `batch`. Returns how many, and where to read on (`upto`
    /// when nothing is left before it, which ends the read).
    pub(super) fn skip_rest(&mut self, pos: SpoolPos, upto: SpoolPos, batch: &mut ReadBatch) -> (u64, SpoolPos) {
        let (lost, skipped_bytes) = self.spool.lose_rest(pos);
        batch.corrupt_regions += 1;
        batch.corrupt_records += lost;
        batch.corrupt_bytes += skipped_bytes;
        (lost, self.next_segment(pos.segment).filter(|next| *next <= upto).unwrap_or(upto))
    }

    pub(super) fn next_segment(&mut self, after: u64) -> Option<SpoolPos> {
        self.file = None;
        self.spool.lock().segments.range(after + 1..).next().map(|(id, _)| SpoolPos::start_of(*id))
    }

    pub(super) fn open_at(&mut self, pos: SpoolPos) -> io::Result<()> {
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
