//! The spool's unit tests on a real directory: writing and reading segments back, recovery of
//! every kind of damage (torn tails, flipped bytes, a full disk at start), quarantine, the ledger,
//! `drop_oldest`. One file over the usual size (~640 lines): they share one fixture set and read
//! as one specification of the on-disk format's guarantees.

use super::*;
use crate::telemetry::outcome::{Dropped, Refused};

fn config(dir: &Path) -> SpoolConfig {
    SpoolConfig {
        dir: dir.to_path_buf(),
        max_bytes: 1024 * 1024,
        segment_bytes: 256,
        fsync: Fsync::Always,
        max_body: 64 * 1024,
    }
}

fn payloads(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("record number {i:04}").into_bytes()).collect()
}

fn append_all(writer: &mut SpoolWriter, payloads: &[Vec<u8>]) -> Vec<SpoolPos> {
    let records: Vec<Entry<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| Entry { ingest_ms: 1_000 + i as u64, topic: None, key: None, payload: p.as_slice() })
        .collect();
    let appended = writer.append(&records);
    assert!(appended.error.is_none(), "{:?}", appended.error);
    assert_eq!(appended.durable, appended.positions.len());
    appended.positions
}

fn read_all(spool: &Arc<Spool>, from: SpoolPos, upto: SpoolPos) -> ReadBatch {
    spool.reader().read(from, upto, usize::MAX, usize::MAX).expect("read")
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

#[test]
fn records_written_come_back_in_order_across_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, recovered) = Spool::open(config(dir.path())).expect("open");
    assert_eq!(recovered, Recovered::default());
    let data = payloads(40);
    let positions = append_all(&mut writer, &data);
    assert!(segment_files(dir.path()).len() > 3, "small segments roll");
    assert!(read_all(&spool, positions[0], writer.end()).records.is_empty(), "written records are held in memory");
    assert_eq!(spool.evicted(positions.iter().map(|p| (*p, None)).collect()), 0);
    let batch = read_all(&spool, positions[0], writer.end());
    let read: Vec<_> = batch.records.iter().map(|r| r.payload.to_vec()).collect();
    assert_eq!(read, data);
    assert_eq!(batch.records.iter().map(|r| r.pos).collect::<Vec<_>>(), positions);
    assert_eq!(batch.next, Some(writer.end()));
}

#[test]
fn a_restart_finds_every_undelivered_record_and_sends_it_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = payloads(25);
    {
        let (_spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
        append_all(&mut writer, &data);
        // No close: a crash.
    }
    let (spool, writer, recovered) = Spool::open(config(dir.path())).expect("reopen");
    assert_eq!(recovered.records, 25);
    let backlog = spool.backlog().expect("everything is backlog");
    let batch = read_all(&spool, backlog, writer.end());
    assert_eq!(batch.records.iter().map(|r| r.payload.to_vec()).collect::<Vec<_>>(), data);
}

#[test]
fn a_segment_is_deleted_only_when_every_record_is_done_and_the_cursor_is_past_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    let positions = append_all(&mut writer, &payloads(40));
    let first = positions[0].segment;
    let in_first: Vec<_> = positions.iter().filter(|p| p.segment == first).copied().collect();
    for pos in &in_first[..in_first.len() - 1] {
        assert!(!spool.done(*pos).0);
    }
    assert_eq!(spool.delete_done(), 0, "one record of the first segment is not done");
    assert!(spool.done(*in_first.last().expect("records")).0);
    assert!(spool.delete_done() > 0);
    assert!(!segment_path(dir.path(), first).exists());
    // The active segment is never deleted, even when all its records are done.
    let active = writer.end().segment;
    for pos in positions.iter().filter(|p| p.segment == active) {
        spool.done(*pos);
    }
    spool.delete_done();
    assert!(segment_path(dir.path(), active).exists());
}

#[test]
fn evicted_records_become_backlog_and_their_segment_waits_for_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    let positions = append_all(&mut writer, &payloads(40));
    assert_eq!(spool.evicted(positions[..10].iter().map(|p| (*p, None)).collect()), 0);
    assert_eq!(spool.backlog(), Some(positions[0]));
    for pos in &positions[10..] {
        spool.done(*pos);
    }
    spool.delete_done();
    assert!(segment_path(dir.path(), positions[0].segment).exists(), "evicted records are still owed");
    let batch = read_all(&spool, positions[0], positions[10]);
    assert_eq!(batch.records.len(), 10);
    for record in &batch.records {
        spool.done(record.pos);
    }
    spool.delete_done();
    assert!(!segment_path(dir.path(), positions[0].segment).exists());
}

#[test]
fn drop_oldest_deletes_the_oldest_segment_and_reports_its_disk_only_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    let positions = append_all(&mut writer, &payloads(40));
    let first = positions[0].segment;
    let in_first = positions.iter().filter(|p| p.segment == first).count() as u64;
    // Two records of the first segment are in memory, one is done, the rest disk-only.
    assert_eq!(spool.evicted(positions[3..in_first as usize].iter().map(|p| (*p, None)).collect()), 0);
    spool.done(positions[0]);
    let before = spool.disk_bytes();
    let dropped = spool.drop_oldest().expect("a sealed segment");
    assert_eq!(dropped, DroppedSegment { segment: first, lost: in_first - 3, lost_maybe_stored: 0 });
    assert!(spool.disk_bytes() < before);
    assert_eq!(spool.backlog(), Some(SpoolPos::start_of(first + 1)), "the cursor skips the dropped segment");
}

/// Found by the cold review (issue 12): `drop_oldest` deleted a segment while some of its
/// records were held in memory; they still deliver, but no segment counted them any more, so a
/// shutdown before their delivery lost them uncounted.
#[test]
fn records_in_memory_of_a_dropped_segment_are_owed_until_delivered_or_evicted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    let positions = append_all(&mut writer, &payloads(40));
    let first = positions[0].segment;
    let in_first = positions.iter().filter(|p| p.segment == first).count();
    // Records 0..3 of the first segment are in memory; the rest of it is disk-only.
    assert_eq!(spool.evicted(positions[3..in_first].iter().map(|p| (*p, None)).collect()), 0);
    spool.drop_oldest().expect("a sealed segment");
    assert_eq!(spool.orphaned(), 3, "three records are held in memory with no segment");
    spool.done(positions[0]);
    assert_eq!(spool.orphaned(), 2, "one delivered");
    assert_eq!(spool.evicted(vec![(positions[1], None)]), 1, "one evicted: lost, counted by the caller");
    assert_eq!(spool.orphaned(), 1);
    spool.done(positions[0]);
    assert_eq!(spool.orphaned(), 1, "a second report of a delivered record changes nothing");
}

#[test]
fn a_damaged_segment_is_quarantined_at_start_and_its_intact_records_are_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = one_closed_segment_of_ten(dir.path());
    let mut data = std::fs::read(&file).expect("read");
    let report = segment::scan(&data);
    data[report.frames[4].start + 12] ^= 0xFF; // flip bits inside record 4
    std::fs::write(&file, &data).expect("write");

    let (spool, writer, recovered) = Spool::open(config(dir.path())).expect("open survives damage");
    assert_eq!(recovered.records, 9);
    assert_eq!(recovered.corrupt_regions, 1);
    assert_eq!(recovered.quarantined.len(), 1);
    assert_eq!(std::fs::read(&recovered.quarantined[0]).expect("quarantined copy"), data, "original kept as it was");
    let batch = read_all(&spool, spool.backlog().expect("backlog"), writer.end());
    let read: Vec<_> = batch.records.iter().map(|r| String::from_utf8_lossy(&r.payload).into_owned()).collect();
    assert_eq!(read.len(), 9);
    assert!(!read.contains(&"record number 0004".to_string()));
    assert!(read.contains(&"record number 0005".to_string()));
}

/// Writes ten records into one segment and closes it; the segment's path.
fn one_closed_segment_of_ten(dir: &Path) -> PathBuf {
    let mut config = config(dir);
    config.segment_bytes = 1024 * 1024;
    let (_spool, mut writer, _) = Spool::open(config).expect("open");
    append_all(&mut writer, &payloads(10));
    writer.close().expect("close");
    segment_files(dir).remove(0)
}

/// A segment with ten records, record 4 damaged.
fn a_damaged_segment(dir: &Path) -> (PathBuf, Vec<u8>) {
    let file = one_closed_segment_of_ten(dir);
    let mut data = std::fs::read(&file).expect("read");
    let report = segment::scan(&data);
    data[report.frames[4].start + 12] ^= 0xFF; // flip bits inside record 4
    std::fs::write(&file, &data).expect("write");
    (file, data)
}

/// Opens the spool as on a disk with no room for a copy of a segment.
fn open_on_a_full_disk(dir: &Path) -> (Arc<Spool>, SpoolWriter, Recovered) {
    NO_ROOM_FOR_COPIES.with(|full| full.set(true));
    let opened = Spool::open(config(dir));
    NO_ROOM_FOR_COPIES.with(|full| full.set(false));
    opened.expect("open survives an impossible repair")
}

/// The spool still opens, reads the segment as it is, skipping the damage, and loses nothing
/// intact. The damaged original is linked into the quarantine (a link needs no room) and its
/// damage counted once.
#[test]
fn a_damaged_segment_that_cannot_be_repaired_is_read_as_it_is_around_its_damage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (file, data) = a_damaged_segment(dir.path());
    let (spool, writer, recovered) = open_on_a_full_disk(dir.path());
    assert_eq!(recovered.records, 9, "the intact records are all in the ledger");
    assert_eq!(recovered.corrupt_regions, 1);
    assert_eq!(recovered.quarantined.len(), 1);
    assert_eq!(std::fs::read(&recovered.quarantined[0]).expect("quarantined"), data, "the original is kept");
    assert_eq!(std::fs::read(&file).expect("segment"), data, "left as it was");
    let batch = read_all(&spool, spool.backlog().expect("backlog"), writer.end());
    let read: Vec<_> = batch.records.iter().map(|r| String::from_utf8_lossy(&r.payload).into_owned()).collect();
    let expected: Vec<_> = (0..10).filter(|i| *i != 4).map(|i| format!("record number {i:04}")).collect();
    assert_eq!(read, expected, "every intact record, the ones behind the damage too");
    assert_eq!(batch.corrupt_records, 0);
    assert_eq!(batch.next, Some(writer.end()));
    for record in &batch.records {
        spool.done(record.pos);
    }
    assert_eq!(spool.undelivered(), 0);
    spool.delete_done();
    assert!(!file.exists());
    assert_eq!(std::fs::read(&recovered.quarantined[0]).expect("quarantined"), data, "deleting the segment keeps it");
}

/// Restarted while the segment is still there (its records not yet delivered), the damage is not
/// counted again; once there is room it is repaired.
#[test]
fn an_unrepaired_segment_is_counted_once_across_restarts_and_repaired_once_there_is_room() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (file, _) = a_damaged_segment(dir.path());
    let (_spool, _writer, first) = open_on_a_full_disk(dir.path());
    assert_eq!(first.corrupt_regions, 1);
    let (_spool, _writer, second) = open_on_a_full_disk(dir.path());
    assert_eq!((second.records, second.corrupt_regions), (9, 0), "counted at the first start only");
    let (spool, writer, third) = Spool::open(config(dir.path())).expect("reopen with room");
    assert_eq!((third.records, third.corrupt_regions), (9, 0));
    assert_eq!(segment::scan(&std::fs::read(&file).expect("segment")).corrupt_regions, 0, "repaired");
    let quarantined = std::fs::read_dir(dir.path().join("quarantine")).expect("quarantine").count();
    assert_eq!(quarantined, 1, "the original is in the quarantine once");
    assert_eq!(read_all(&spool, spool.backlog().expect("backlog"), writer.end()).records.len(), 9);
}

/// Without a quarantine to link into (none could be made), nothing says a start counted it: every
/// start counts it again, over-counted rather than lost uncounted when the segment goes.
#[test]
fn damage_that_cannot_even_be_linked_is_counted_at_every_start_rather_than_never() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (file, _) = a_damaged_segment(dir.path());
    std::fs::remove_dir_all(dir.path().join("quarantine")).expect("an agent of before, which had none");
    std::fs::write(dir.path().join("quarantine"), b"in the way").expect("block the quarantine");
    let (_spool, _writer, first) = open_on_a_full_disk(dir.path());
    let (spool, writer, second) = open_on_a_full_disk(dir.path());
    assert_eq!((first.corrupt_regions, second.corrupt_regions), (1, 1));
    assert_eq!((first.quarantined.len(), second.quarantined.len()), (0, 0));
    assert!(file.exists(), "read as it is");
    assert_eq!(read_all(&spool, spool.backlog().expect("backlog"), writer.end()).records.len(), 9);
}

/// A quarantine copy a crash left unfinished is removed at the next start.
#[test]
fn a_partial_quarantine_copy_is_removed_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("quarantine")).expect("quarantine");
    let partial = dir.path().join("quarantine").join("00000000000000000003.seg.20261201T000000.000000Z.partial");
    std::fs::write(&partial, b"half a copy").expect("write");
    let _ = Spool::open(config(dir.path())).expect("open");
    assert!(!partial.exists());
}

/// The backlog reader, at the end of the last segment while the writer has none yet (a full
/// disk at start), reports it has read everything: it must not be asked again and again.
#[test]
fn the_backlog_ends_at_the_last_recovered_segment_while_the_writer_has_no_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    one_closed_segment_of_ten(dir.path());
    let (spool, writer, _) = Spool::open(config(dir.path())).expect("open");
    let end = writer.end();
    drop(writer);
    std::fs::remove_file(segment_path(dir.path(), end.segment)).expect("as if it could not be made");
    spool.lock().segments.remove(&end.segment);
    let batch = read_all(&spool, spool.backlog().expect("backlog"), end);
    assert_eq!(batch.records.len(), 10);
    assert_eq!(batch.next, Some(end), "the cursor reaches the writer's end");
}

/// Damage found while reading the segment the writer still appends to is kept as a copy: a
/// link would follow later writes, and a restart would take them for damage already counted.
#[test]
fn damage_found_in_the_active_segment_is_kept_as_a_copy_not_a_link() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(dir.path());
    config.segment_bytes = 1024 * 1024;
    let (spool, mut writer, _) = Spool::open(config).expect("open");
    let positions = append_all(&mut writer, &payloads(10));
    assert_eq!(spool.evicted(positions.iter().map(|p| (*p, None)).collect()), 0);
    let path = segment_path(dir.path(), positions[0].segment);
    let mut data = std::fs::read(&path).expect("read");
    data[positions[3].offset as usize + 10] ^= 0xFF;
    std::fs::write(&path, &data).expect("write");
    let batch = read_all(&spool, positions[0], writer.end());
    assert_eq!(batch.corrupt_regions, 1);
    assert_eq!(std::fs::metadata(&path).expect("segment").nlink(), 1, "not linked");
    assert_eq!(std::fs::read_dir(dir.path().join("quarantine")).expect("quarantine").count(), 1, "copied");
}

/// Files this process holds open that are named `path` (Linux: `/proc/self/fd`).
fn held_open(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target.to_string_lossy().trim_end_matches(" (deleted)") == path.to_string_lossy())
        .count()
}

/// On a full disk a dropped segment frees its room only once no one holds it open: a reader that
/// kept its file between reads kept the room, and every later write was dropped for want of it.
#[test]
fn the_backlog_reader_holds_no_file_between_reads_so_a_dropped_segment_frees_its_room() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    let positions = append_all(&mut writer, &payloads(40));
    assert_eq!(spool.evicted(positions.iter().map(|p| (*p, None)).collect()), 0);
    let mut reader = spool.reader();
    let batch = reader.read(positions[0], writer.end(), 2, usize::MAX).expect("read");
    assert_eq!(batch.records.len(), 2, "stopped in the middle of the first segment");
    let first = segment_path(dir.path(), positions[0].segment);
    assert!(spool.drop_oldest().is_some());
    assert!(!first.exists());
    assert_eq!(held_open(&first), 0, "the dropped segment's room is free");
}

/// A kill in the middle of a write leaves a torn last frame: read as it is, it costs nothing.
#[test]
fn a_torn_tail_that_cannot_be_repaired_loses_no_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = one_closed_segment_of_ten(dir.path());
    let mut data = std::fs::read(&file).expect("read");
    let torn: Vec<u8> = data[segment::scan(&data).frames[0].clone()][..7].to_vec();
    data.extend_from_slice(&torn);
    std::fs::write(&file, &data).expect("write");

    let (spool, writer, recovered) = open_on_a_full_disk(dir.path());
    assert_eq!(recovered.records, 10);
    let batch = read_all(&spool, spool.backlog().expect("backlog"), writer.end());
    assert_eq!(batch.records.len(), 10);
    assert_eq!(batch.corrupt_records, 0);
    assert_eq!(batch.next, Some(writer.end()));
}

/// The spool's disk was full at start: no segment could be made. The writer writes nothing
/// (the caller's `when_full` decides), and makes the segment on a later append.
#[test]
fn a_writer_whose_segment_could_not_be_made_writes_nothing_and_makes_it_on_a_later_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, first, _) = Spool::open(config(dir.path())).expect("open");
    first.close().expect("close");
    let mut writer = SpoolWriter::pending(spool.clone(), 7);
    writer.inject(SpoolOp::Write, io::Error::from_raw_os_error(28));
    let data = payloads(3);
    let records: Vec<Entry<'_>> =
        data.iter().map(|p| Entry { ingest_ms: 1, topic: None, key: None, payload: p.as_slice() }).collect();
    let appended = writer.append(&records);
    assert!(appended.error.as_ref().is_some_and(SpoolIoError::disk_full), "{:?}", appended.error);
    assert!(appended.positions.is_empty());
    assert!(!segment_path(dir.path(), 7).exists());
    assert_eq!(spool.undelivered(), 0);
    writer.sync().expect("nothing to sync is not an error");

    let positions = append_all(&mut writer, &data);
    assert_eq!(positions[0], SpoolPos::start_of(7));
    assert!(segment_path(dir.path(), 7).exists());
    assert_eq!(spool.evicted(positions.iter().map(|p| (*p, None)).collect()), 0);
    let batch = read_all(&spool, positions[0], writer.end());
    assert_eq!(batch.records.iter().map(|r| r.payload.to_vec()).collect::<Vec<_>>(), data);
}

#[test]
fn a_file_that_is_not_a_segment_is_quarantined_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(segment_path(dir.path(), 3), b"garbage that is not a spool segment").expect("write");
    let (_spool, writer, recovered) = Spool::open(config(dir.path())).expect("open survives");
    assert_eq!(recovered.records, 0);
    assert_eq!(recovered.corrupt_regions, 1);
    assert_eq!(writer.end().segment, 4, "numbering continues after the damaged file");
    assert!(!segment_path(dir.path(), 3).exists());
}

/// Not counted until it is moved, so a restart that moves it counts it once.
#[test]
fn a_file_that_is_not_a_segment_is_left_in_place_when_the_quarantine_cannot_be_made() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(segment_path(dir.path(), 3), b"garbage that is not a spool segment").expect("write");
    std::fs::write(dir.path().join("quarantine"), b"in the way").expect("block the quarantine");
    let (_spool, writer, recovered) = Spool::open(config(dir.path())).expect("open survives");
    assert_eq!(recovered.records, 0);
    assert_eq!(recovered.corrupt_regions, 0, "counted when it is moved");
    assert!(segment_path(dir.path(), 3).exists(), "damaged data is never deleted");
    assert_eq!(writer.end().segment, 4, "numbering continues after the damaged file");
    drop(writer);
    std::fs::remove_file(dir.path().join("quarantine")).expect("room again");
    let (_spool, _writer, moved) = Spool::open(config(dir.path())).expect("reopen");
    assert_eq!((moved.corrupt_regions, moved.quarantined.len()), (1, 1));
    assert!(!segment_path(dir.path(), 3).exists());
}

#[test]
fn damage_found_while_reading_skips_the_rest_of_that_segment_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    let positions = append_all(&mut writer, &payloads(40));
    assert_eq!(spool.evicted(positions.iter().map(|p| (*p, None)).collect()), 0);
    let victim = positions[1];
    let path = segment_path(dir.path(), victim.segment);
    let mut data = std::fs::read(&path).expect("read");
    data[victim.offset as usize + 10] ^= 0xFF;
    std::fs::write(&path, &data).expect("write");
    let batch = read_all(&spool, positions[0], writer.end());
    assert_eq!(batch.corrupt_regions, 1);
    let in_first = positions.iter().filter(|p| p.segment == victim.segment).count();
    assert_eq!(batch.records.len(), 40 - (in_first - 1));
}

#[test]
fn the_cap_is_measured_over_all_segment_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(dir.path());
    config.max_bytes = 600;
    let (spool, mut writer, _) = Spool::open(config).expect("open");
    assert!(writer.fits(500));
    append_all(&mut writer, &payloads(20));
    assert!(spool.disk_bytes() > 500, "{}", spool.disk_bytes());
    assert!(!writer.fits(200));
}

#[test]
fn the_oldest_undelivered_record_is_known_to_the_resolution_of_a_segment_even_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
        let positions = append_all(&mut writer, &payloads(40));
        assert_eq!(spool.oldest_undelivered_ms(), Some(1_000));
        let first = positions[0].segment;
        for pos in positions.iter().filter(|p| p.segment == first) {
            spool.done(*pos);
        }
        let second_first = positions.iter().find(|p| p.segment != first).expect("a second segment");
        let index = positions.iter().position(|p| p == second_first).expect("index") as u64;
        assert_eq!(spool.oldest_undelivered_ms(), Some(1_000 + index));
    }
    let (spool, _writer, _) = Spool::open(config(dir.path())).expect("reopen");
    assert_eq!(spool.oldest_undelivered_ms(), Some(1_000), "nothing was deleted, so everything is owed again");
}

/// Issue 12, item 7: damage found while reading skipped the rest of its segment but counted one
/// `corrupt`; every disk-only record it hides is counted now, and the segment can still go.
#[test]
fn damage_found_while_reading_counts_every_disk_only_record_it_hides() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    let positions = append_all(&mut writer, &payloads(40));
    let first = positions[0].segment;
    let in_first = positions.iter().filter(|p| p.segment == first).count() as u64;
    assert!(in_first >= 4, "{in_first} records in the first segment");
    // Record 3 is in flight (held in memory); every other record is disk-only.
    let disk_only: Vec<_> = positions.iter().filter(|p| **p != positions[3]).map(|p| (*p, None)).collect();
    assert_eq!(spool.evicted(disk_only), 0);
    let path = segment_path(dir.path(), first);
    let mut data = std::fs::read(&path).expect("read");
    data[positions[1].offset as usize + 10] ^= 0xFF;
    std::fs::write(&path, &data).expect("write");

    let batch = read_all(&spool, positions[0], writer.end());
    assert_eq!(batch.corrupt_regions, 1);
    // Records 1.. of the first segment are hidden; record 3 is in memory and still delivered.
    assert_eq!(batch.corrupt_records, in_first - 2);
    assert_eq!(batch.records.len() as u64, 40 - (in_first - 1));
    for record in &batch.records {
        spool.done(record.pos);
    }
    assert_eq!(spool.undelivered(), 1, "only the record in flight is owed");
    let (deletable, _) = spool.done(positions[3]);
    assert!(deletable, "every record of the damaged segment is finished");
    spool.delete_done();
    assert!(!path.exists());
    assert_eq!(spool.undelivered(), 0);
}

#[test]
fn a_record_settled_twice_is_counted_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    let positions = append_all(&mut writer, &payloads(3));
    spool.done(positions[0]);
    spool.done(positions[0]);
    assert_eq!(spool.undelivered(), 2);
}

fn file_bytes(dir: &Path) -> u64 {
    segment_files(dir).iter().map(|path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)).sum()
}

/// Found by the cold review (issue 12): two concurrent `delete_done` calls (the delivery thread
/// and the spool writer) subtracted the same segment's bytes twice, so the cap stopped holding.
#[test]
fn concurrent_deletes_subtract_a_segment_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    for _ in 0..100 {
        let positions = append_all(&mut writer, &payloads(12));
        for pos in positions.iter().filter(|p| p.segment < writer.end().segment) {
            spool.done(*pos);
        }
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (spool, barrier) = (spool.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    spool.delete_done()
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("thread");
        }
        assert_eq!(spool.disk_bytes(), file_bytes(dir.path()));
    }
}

/// Found by the second cold review (issue 12): a record held in memory whose `spooled` ack
/// waited for a sync kept it there when `drop_oldest` deleted its segment; evicted later (lost,
/// counted `drop_oldest`), it was still acknowledged by the next sync.
#[test]
fn a_record_of_a_dropped_segment_is_never_acknowledged_by_a_later_sync() {
    use crate::buffer::ack::{AckEvent, AckPoint, AckTracker};
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    let positions = append_all(&mut writer, &payloads(40));
    let first = positions[0].segment;
    let tracker = AckTracker::new(AckPoint::Spooled);
    // Record 0 of the first segment: in memory, its ack waiting for a sync.
    spool.await_sync([(positions[0], tracker.issue())]);
    spool.drop_oldest().expect("a sealed segment");
    assert_eq!(positions[0].segment, first);
    assert_eq!(spool.evicted(vec![(positions[0], None)]), 1, "evicted after its segment went: lost");
    let refused = vec![AckEvent::Refused { seq: 1, reason: Refused::from(Dropped::DropOldest) }, AckEvent::Upto(1)];
    assert_eq!(tracker.take_events(), refused, "refused when it is lost");
    spool.synced(true);
    assert_eq!(tracker.take_events(), vec![], "and never acknowledged by the sync");
}

/// Found by the cold review (issue 12): a crash between the two renames of a segment repair
/// left the intact copy as `N.seg.tmp`, which the next start ignored: its records were neither
/// delivered nor counted.
#[test]
fn a_segment_repair_interrupted_by_a_crash_is_completed_at_the_next_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(dir.path());
    config.segment_bytes = 1024 * 1024;
    {
        let (_spool, mut writer, _) = Spool::open(config.clone()).expect("open");
        append_all(&mut writer, &payloads(10));
        writer.close().expect("close");
    }
    let segment = segment_files(dir.path()).remove(0);
    // Crashed after moving the original to the quarantine: only the copy is left.
    let copy = segment.with_extension("seg.tmp");
    std::fs::rename(&segment, &copy).expect("rename");
    let (spool, writer, _) = Spool::open(config.clone()).expect("open");
    assert_eq!(spool.undelivered(), 10, "the copy's records are owed again");
    assert!(segment.exists() && !copy.exists());
    drop((spool, writer));
    // Crashed while writing the copy: the original is still there, the copy may be partial.
    std::fs::write(&copy, b"partial").expect("write");
    let (spool, _writer, _) = Spool::open(config).expect("open");
    assert_eq!(spool.undelivered(), 10, "the original counts, once");
    assert!(!copy.exists(), "the partial copy is gone");
}

/// Makes segment `id` fail every read with an I/O error (a directory opens, but `read` fails
/// with `EISDIR`), as a failing disk would.
fn make_unreadable(dir: &Path, id: u64) {
    let path = segment_path(dir, id);
    std::fs::remove_file(&path).expect("remove");
    std::fs::create_dir(&path).expect("a directory in its place");
}

/// Found by the cold review (issue 12): an I/O error on a backlog read was retried for ever at
/// the same place, so a segment the disk cannot read stopped the backlog, and once the spool was
/// full, the writers. After a few failures the rest of the segment is given up, counted.
#[test]
fn a_segment_that_keeps_failing_to_read_is_given_up_and_counted_after_a_few_tries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    let positions = append_all(&mut writer, &payloads(40));
    assert_eq!(spool.evicted(positions.iter().map(|p| (*p, None)).collect()), 0);
    let first = positions[0].segment;
    let in_first = positions.iter().filter(|p| p.segment == first).count();
    make_unreadable(dir.path(), first);
    let mut reader = spool.reader();
    for _ in 1..MAX_READ_FAILURES {
        assert!(reader.read(positions[0], writer.end(), usize::MAX, usize::MAX).is_err(), "retried at first");
    }
    let batch = reader.read(positions[0], writer.end(), usize::MAX, usize::MAX).expect("given up, then read on");
    assert_eq!(batch.corrupt_records, in_first as u64, "the unreadable segment's records are counted");
    assert_eq!(batch.records.len(), 40 - in_first, "the rest is read");
    assert_eq!(spool.undelivered(), 40 - in_first as u64);
    let quarantined = std::fs::read_dir(dir.path().join("quarantine")).expect("quarantine").count();
    assert_eq!(quarantined, 1, "the unreadable segment is kept in the quarantine, not deleted");
}

/// Found with the one above: records read before an I/O error in the same read were marked held
/// and then thrown away with the error, so nobody held them and their segment never finished.
#[test]
fn records_read_before_an_io_error_are_handed_on_not_left_held_by_nobody() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
    let positions = append_all(&mut writer, &payloads(40));
    assert_eq!(spool.evicted(positions.iter().map(|p| (*p, None)).collect()), 0);
    let second = positions.iter().map(|p| p.segment).find(|s| *s != positions[0].segment).expect("two segments");
    let before = positions.iter().filter(|p| p.segment < second).count();
    make_unreadable(dir.path(), second);
    let batch = spool.reader().read(positions[0], writer.end(), usize::MAX, usize::MAX).expect("what was read");
    assert_eq!(batch.records.len(), before, "the records before the failing segment");
    assert_eq!(batch.next, Some(SpoolPos::start_of(second)), "the next read starts at the failure");
}

/// Issue 30 (found by the soak at seed 2086022712): records an earlier run handed to librdkafka
/// and never saw confirmed were recovered from its spool, and counted lost when `drop_oldest`
/// took their segment — while Kafka held 467 of them. Such a record is marked (`maybe_stored`),
/// the mark kept across a restart, and a record lost with its mark is counted apart.
#[test]
fn a_record_kafka_may_hold_stays_marked_across_a_restart_and_is_counted_apart_when_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let positions = {
        let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
        let positions = append_all(&mut writer, &payloads(40));
        let first = positions[0].segment;
        let in_first: Vec<SpoolPos> = positions.iter().copied().filter(|p| p.segment == first).collect();
        // Two of the first segment come back from librdkafka unconfirmed, the rest never left.
        let back = in_first.iter().enumerate().map(|(n, pos)| (*pos, None, n < 2)).collect();
        assert_eq!(spool.evicted_marked(back), (0, 0));
        assert_eq!(spool.save_maybe_stored().expect("saved"), 2);
        drop(writer);
        positions
    };
    // The next start: the marks are read back onto the recovered records.
    let (spool, _writer, recovered) = Spool::open(config(dir.path())).expect("reopen");
    assert_eq!(recovered.records, 40);
    assert!(spool.maybe_stored(positions[0]) && spool.maybe_stored(positions[1]));
    assert!(!spool.maybe_stored(positions[2]));
    let batch = read_all(&spool, positions[0], positions[39]);
    assert!(batch.records[0].maybe_stored && !batch.records[2].maybe_stored, "the reader hands the mark on");
    // Back to disk, then the segment is dropped: its two marked records are counted apart.
    let in_first = positions.iter().filter(|p| p.segment == positions[0].segment).count() as u64;
    assert_eq!(spool.evicted(batch.records.iter().map(|r| (r.pos, None)).collect()), 0);
    let dropped = spool.drop_oldest().expect("a sealed segment");
    assert_eq!((dropped.lost, dropped.lost_maybe_stored), (in_first, 2));
}

/// Issue 30 (cold review): the marks file was read by segment id and index alone, and deleted as
/// soon as it was read. A file older than the segments (ids start again at 0 once the spool is
/// empty) put marks on records that were never sent; a start that failed after reading it lost
/// the marks for good. A mark applies only to the segment it was written for, and stays until
/// the next drain writes the file again.
#[test]
fn a_mark_applies_only_to_the_segment_it_was_written_for_and_outlives_a_failed_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let positions = {
        let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
        let positions = append_all(&mut writer, &payloads(3));
        spool.may_be_stored([positions[0]]);
        assert_eq!(spool.save_maybe_stored().expect("saved"), 1);
        positions
    };
    // A start that reads the marks and then fails (a port in use): the next one still has them.
    drop(Spool::open(config(dir.path())).expect("a start that fails later"));
    let (spool, _writer, _) = Spool::open(config(dir.path())).expect("reopen");
    assert!(spool.maybe_stored(positions[0]), "the marks outlive a start that failed");
    drop((spool, _writer));

    // The marks file outlives its segment; a new segment takes the same id, with other records.
    let marks = std::fs::read(dir.path().join(super::ledger::MAYBE_STORED_FILE)).expect("marks");
    let other = tempfile::tempdir().expect("tempdir");
    let new_positions = {
        let (_spool, mut writer, _) = Spool::open(config(other.path())).expect("open");
        let later: Vec<Entry<'_>> = [b"later 0", b"later 1", b"later 2"]
            .iter()
            .map(|payload| Entry { ingest_ms: 9_000, topic: None, key: None, payload: payload.as_slice() })
            .collect();
        writer.append(&later).positions
    };
    assert_eq!(new_positions[0].segment, positions[0].segment, "the same id again");
    std::fs::write(other.path().join(super::ledger::MAYBE_STORED_FILE), marks).expect("stale marks");
    let (spool, _writer, _) = Spool::open(config(other.path())).expect("reopen");
    assert!(new_positions.iter().all(|pos| !spool.maybe_stored(*pos)), "a stale mark lands on no record");
}

/// Soak seed 356379158: records Kafka acknowledged in a segment the drain left on disk (others of
/// it still owed: Kafka was away) are read again at the next start — the ledger's `finished`
/// bits are not on disk. Dropped then (`drop_oldest`), they were counted as never stored: 304
/// records counted lost were rows. The drain marks them too (`maybe-stored`: Kafka holds them),
/// so lost later they are counted `unconfirmed`, never as "not stored".
#[test]
fn records_kafka_acknowledged_in_a_segment_left_on_disk_are_not_counted_lost_when_dropped_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let positions = {
        let (spool, mut writer, _) = Spool::open(config(dir.path())).expect("open");
        let positions = append_all(&mut writer, &payloads(40));
        let first = positions[0].segment;
        let in_first: Vec<SpoolPos> = positions.iter().copied().filter(|p| p.segment == first).collect();
        // Kafka acknowledged the first five of the first segment; the rest never left.
        for pos in &in_first[..5] {
            spool.done(*pos);
        }
        assert_eq!(spool.save_maybe_stored().expect("saved"), 5);
        drop(writer);
        positions
    };
    let (spool, _writer, recovered) = Spool::open(config(dir.path())).expect("reopen");
    assert_eq!(recovered.records, 40, "the whole segment is read again");
    assert!(spool.maybe_stored(positions[0]) && spool.maybe_stored(positions[4]));
    assert!(!spool.maybe_stored(positions[5]));
    let in_first = positions.iter().filter(|p| p.segment == positions[0].segment).count() as u64;
    let dropped = spool.drop_oldest().expect("a sealed segment");
    assert_eq!((dropped.lost, dropped.lost_maybe_stored), (in_first, 5), "the five Kafka holds are not counted lost");
}
