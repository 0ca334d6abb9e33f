//! Issue 12, item 9: an I/O error is never an acknowledgement and never a policy drop.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use bytesize::ByteSize;

use super::*;
use crate::buffer::ack::{AckEvent, AckTracker};
use crate::buffer::spool::{Spool, SpoolConfig};
use crate::buffer::{Admission, Work};
use crate::config::{BufferConfig, BufferKind};
use crate::telemetry::outcome::{Dropped, Refused};

struct Setup {
    buffer: Buffer,
    spooler: Spooler,
    tracker: Arc<AckTracker>,
    _dir: tempfile::TempDir,
}

fn setup(fsync: Fsync, when_full: WhenFull) -> Setup {
    setup_sized(fsync, when_full, 1024 * 1024)
}

fn setup_sized(fsync: Fsync, when_full: WhenFull, spool_max_bytes: u64) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let spool_config = SpoolConfig {
        dir: dir.path().to_path_buf(),
        max_bytes: spool_max_bytes,
        segment_bytes: 512,
        fsync,
        max_body: 64 * 1024,
    };
    let (spool, writer, _) = Spool::open(spool_config).expect("spool");
    let config = BufferConfig {
        kind: BufferKind::Disk,
        max_bytes: ByteSize::mib(1),
        when_full,
        block_timeout: None,
        ..BufferConfig::default()
    };
    let buffer = Buffer::with_spool(&config, spool, writer.end());
    let spooler =
        Spooler { buffer: buffer.clone(), writer: Some(writer), fsync, errors: ErrorLog::default(), sync: None };
    Setup { buffer, spooler, tracker: AckTracker::new(AckPoint::Spooled), _dir: dir }
}

impl Setup {
    /// Housekeeping, and the end of the sync it started, if any.
    async fn housekeeping_and_sync(&mut self) {
        self.spooler.housekeeping().await;
        if self.spooler.sync.is_some() {
            let synced = sync_done(&mut self.spooler.sync).await;
            self.spooler.sync_ended(synced);
        }
    }

    /// Accepts `n` records, each with an ack, and takes them out of the intake as the spooler
    /// does.
    async fn accept(&self, n: usize) -> Vec<Record> {
        for i in 0..n {
            let payload = Bytes::from(format!("record {i:03} with some padding"));
            let ack = Some(self.tracker.issue());
            self.buffer.push(payload, None, None, 1_000, ack, &mut Admission::default()).await.expect("room");
        }
        let mut records = Vec::new();
        self.buffer.pop_intake_now(usize::MAX, &mut records);
        records
    }

    fn inject(&mut self, op: SpoolOp, error: io::Error) {
        self.spooler.writer.as_mut().expect("writer").inject(op, error);
    }

    /// The records handed on to the shipper, taken as its memory lane would.
    fn fresh(&self) -> Vec<Record> {
        let mut records = Vec::new();
        assert_eq!(self.buffer.poll_work(false), Some(Work::Memory));
        self.buffer.pop_batch(usize::MAX, &mut records);
        records
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(5)
}

#[tokio::test]
async fn a_failed_fsync_under_always_never_acknowledges_a_record_as_spooled() {
    let mut s = setup(Fsync::Always, WhenFull::Block);
    let records = s.accept(3).await;
    s.inject(SpoolOp::Fsync, eio());
    s.spooler.write(records, &CancellationToken::new()).await;
    assert_eq!(s.tracker.take_events(), vec![], "no ACK after a failed fsync");
    let mut sent = s.fresh();
    assert_eq!(sent.len(), 3, "the records go on to Kafka");
    for record in &mut sent {
        let ack = record.ack.take().expect("the ack waits with its record");
        assert_eq!(ack.point(), AckPoint::Delivered, "held until Kafka has it");
        ack.durable();
    }
    assert_eq!(s.tracker.take_events(), vec![AckEvent::Upto(3)]);
}

#[tokio::test]
async fn records_synced_before_a_failed_fsync_are_acknowledged_and_the_rest_are_held() {
    let mut s = setup(Fsync::Always, WhenFull::Block);
    // One batch across a segment roll: the roll's sync works, the final one fails.
    let frame = crate::buffer::spool::segment::frame_len(None, None, b"record 000 with some padding");
    let per_segment = (512 - crate::buffer::spool::segment::HEADER.len()) / frame;
    let batch = per_segment + per_segment / 2;
    let records = s.accept(batch).await;
    s.spooler.writer.as_mut().expect("writer").inject_after(SpoolOp::Fsync, 1, eio());
    s.spooler.write(records, &CancellationToken::new()).await;
    assert_eq!(s.tracker.take_events(), vec![AckEvent::Upto(per_segment as u64)], "the synced first segment");
    let held: Vec<u64> = s
        .fresh()
        .iter()
        .filter_map(|record| record.ack.as_ref().filter(|ack| ack.point() == AckPoint::Delivered).map(|ack| ack.seq()))
        .collect();
    assert_eq!(held, (per_segment as u64 + 1..=batch as u64).collect::<Vec<_>>(), "the rest wait for Kafka");
}

#[tokio::test]
async fn a_failed_interval_fsync_holds_its_acks_until_the_records_are_delivered() {
    let mut s = setup(Fsync::Interval(Duration::from_millis(1)), WhenFull::Block);
    let records = s.accept(3).await;
    s.inject(SpoolOp::Fsync, eio());
    s.spooler.write(records, &CancellationToken::new()).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    s.housekeeping_and_sync().await;
    assert_eq!(s.tracker.take_events(), vec![], "no ACK: the sync failed");
    // A later sync that works does not vouch for what the failed one covered.
    tokio::time::sleep(Duration::from_millis(5)).await;
    s.housekeeping_and_sync().await;
    assert_eq!(s.tracker.take_events(), vec![]);
    let spool = s.buffer.spool().expect("spool").clone();
    for record in s.fresh() {
        let (_, parked) = spool.done(record.pos.expect("spooled"));
        let ack = parked.expect("the ack was parked for the delivery");
        assert_eq!(ack.point(), AckPoint::Delivered);
        ack.durable();
    }
    assert_eq!(s.tracker.take_events(), vec![AckEvent::Upto(3)]);
}

#[tokio::test]
async fn an_interval_ack_is_settled_by_the_delivery_when_it_comes_before_the_sync() {
    let mut s = setup(Fsync::Interval(Duration::from_secs(3600)), WhenFull::Block);
    let records = s.accept(2).await;
    s.spooler.write(records, &CancellationToken::new()).await;
    assert_eq!(s.tracker.take_events(), vec![], "waiting for the sync");
    let spool = s.buffer.spool().expect("spool").clone();
    for record in s.fresh() {
        let (_, parked) = spool.done(record.pos.expect("spooled"));
        parked.expect("the ack waits in the spool").durable();
    }
    assert_eq!(s.tracker.take_events(), vec![AckEvent::Upto(2)]);
    spool.synced(false);
    assert_eq!(s.tracker.take_events(), vec![], "nothing is settled twice");
}

#[tokio::test(start_paused = true)]
async fn a_plain_io_error_is_never_a_policy_drop_even_under_drop_oldest() {
    let mut s = setup(Fsync::Never, WhenFull::DropOldest);
    // Sealed segments that drop_oldest could throw away.
    let first = s.accept(20).await;
    s.spooler.write(first, &CancellationToken::new()).await;
    let spool = s.buffer.spool().expect("spool").clone();
    let undelivered_before = spool.undelivered();
    let records = s.accept(3).await;
    s.inject(SpoolOp::Write, eio());
    s.spooler.write(records, &CancellationToken::new()).await;
    assert_eq!(spool.undelivered(), undelivered_before + 3, "held, retried and written; nothing dropped");
    let events = s.tracker.take_events();
    assert!(events.iter().all(|event| matches!(event, AckEvent::Upto(_))), "no refusal: {events:?}");
    assert_eq!(events.last(), Some(&AckEvent::Upto(23)));
}

/// Found by the cold review: under `block` a batch larger than the spool's free room waited
/// for room for the whole batch, so the room that was free stayed unused (and the batch could
/// wait for room the backlog would free only if this very batch were written first).
#[tokio::test]
async fn under_block_a_batch_larger_than_the_free_room_writes_the_oldest_that_fit() {
    let mut s = setup_sized(Fsync::Never, WhenFull::Block, 4 * 1024);
    let records = s.accept(300).await;
    let stop = CancellationToken::new();
    let cancel = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    s.spooler.write(records, &stop).await;
    let spool = s.buffer.spool().expect("spool").clone();
    let written = spool.undelivered();
    assert!(written > 0 && written < 300, "the oldest that fit are written: {written} of 300");
    assert!(spool.disk_bytes() * 10 > spool.max_bytes() * 8, "the free room is used: {} bytes", spool.disk_bytes());
    let events = s.tracker.take_events();
    let refused = events.iter().filter(|event| matches!(event, AckEvent::Refused { .. })).count() as u64;
    assert_eq!(refused, 300 - written, "only the rest waited, then were given up at the deadline: {events:?}");
}

/// Found by the second cold review (issue 12): at the drain's third stage (the readers are done,
/// the spool writer is told to stop) a write waiting for disk room under `block` gave up at
/// once, counting the readers' last records `drain_timeout` with most of the drain still left
/// and the shipper freeing room. It now waits until the deadline (`give_up`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_stop_a_write_waiting_for_disk_room_waits_for_the_deadline_not_the_stop() {
    let s = setup_sized(Fsync::Never, WhenFull::Block, 4 * 1024);
    let Setup { buffer, spooler, tracker, _dir } = s;
    for i in 0..300 {
        let payload = Bytes::from(format!("record {i:03} with some padding"));
        buffer.push(payload, None, None, 1_000, Some(tracker.issue()), &mut Admission::default()).await.expect("room");
    }
    let stop = CancellationToken::new();
    stop.cancel();
    let give_up = CancellationToken::new();
    let writing = tokio::spawn(run(buffer.clone(), spooler.writer.expect("writer"), spooler.fsync, stop, give_up));
    // The shipper delivers what is spooled, freeing room as it goes.
    let spool = buffer.spool().expect("spool").clone();
    let delivered = tokio::time::timeout(Duration::from_secs(10), async {
        let mut delivered = 0;
        while !writing.is_finished() || buffer.poll_work(false).is_some() {
            if buffer.poll_work(false) == Some(Work::Memory) {
                let mut batch = Vec::new();
                buffer.pop_batch(usize::MAX, &mut batch);
                for record in batch {
                    delivered += 1;
                    buffer.settled(record.lease.bytes(), record.ingest_ms);
                    let _ = spool.done(record.pos.expect("spooled"));
                }
                spool.delete_done();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        delivered
    })
    .await
    .expect("the writer finishes once everything fitted");
    assert_eq!(delivered, 300, "every record was written, none given up");
    let events = tracker.take_events();
    assert!(events.iter().all(|event| matches!(event, AckEvent::Upto(_))), "no refusal: {events:?}");
}

/// Found by CI (a clean clone): `sluice_spool_bytes` above `max_disk_bytes`. A batch was checked
/// against the cap by its frames and two segment headers, but a batch spanning several segments
/// opens a header for each.
#[tokio::test]
async fn the_spool_never_passes_its_cap_by_the_headers_of_the_segments_a_batch_opens() {
    for when_full in [WhenFull::DropNewest, WhenFull::Block] {
        let mut s = setup_sized(Fsync::Never, when_full, 4 * 1024);
        let records = s.accept(300).await;
        let stop = CancellationToken::new();
        stop.cancel();
        s.spooler.write(records, &stop).await;
        let spool = s.buffer.spool().expect("spool").clone();
        assert!(spool.undelivered() > 0, "{when_full:?}: something was written");
        assert!(
            spool.disk_bytes() <= spool.max_bytes(),
            "{when_full:?}: {} bytes on disk, cap {}",
            spool.disk_bytes(),
            spool.max_bytes()
        );
    }
}

#[tokio::test]
async fn a_full_disk_under_drop_newest_refuses_the_records_that_did_not_fit() {
    let mut s = setup(Fsync::Never, WhenFull::DropNewest);
    let records = s.accept(3).await;
    s.inject(SpoolOp::Write, io::Error::from_raw_os_error(28));
    s.spooler.write(records, &CancellationToken::new()).await;
    let refused: Vec<AckEvent> =
        (1..=3).map(|seq| AckEvent::Refused { seq, reason: Refused::from(Dropped::DropNewest) }).collect();
    let mut expected = refused;
    expected.push(AckEvent::Upto(3));
    assert_eq!(s.tracker.take_events(), expected);
}

#[tokio::test]
async fn a_failed_close_does_not_acknowledge_what_it_did_not_sync() {
    let mut s = setup(Fsync::Interval(Duration::from_secs(3600)), WhenFull::Block);
    let records = s.accept(2).await;
    s.spooler.write(records, &CancellationToken::new()).await;
    s.inject(SpoolOp::Fsync, eio());
    let stop = CancellationToken::new();
    stop.cancel();
    let Setup { buffer, spooler, tracker, _dir } = s;
    run(buffer.clone(), spooler.writer.expect("writer"), spooler.fsync, stop.clone(), stop).await;
    assert_eq!(tracker.take_events(), vec![], "close could not sync: no ACK");
}

#[tokio::test]
async fn an_interval_sync_settles_the_acks_of_what_was_written_before_it_and_not_after() {
    let mut s = setup(Fsync::Interval(Duration::from_millis(1)), WhenFull::Block);
    let first = s.accept(2).await;
    s.spooler.write(first, &CancellationToken::new()).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    s.spooler.housekeeping().await;
    assert!(s.spooler.sync.is_some(), "the sync runs off the write path");
    // Written while that sync runs: not covered by it.
    let second = s.accept(1).await;
    s.spooler.write(second, &CancellationToken::new()).await;
    let synced = sync_done(&mut s.spooler.sync).await;
    s.spooler.sync_ended(synced);
    assert_eq!(s.tracker.take_events(), vec![AckEvent::Upto(2)], "only the first two");
    tokio::time::sleep(Duration::from_millis(5)).await;
    s.housekeeping_and_sync().await;
    assert_eq!(s.tracker.take_events(), vec![AckEvent::Upto(3)]);
}

fn numbered(i: usize) -> Bytes {
    Bytes::from(format!("{{\"n\":{i:06},\"pad\":\"..............................................\"}}"))
}

/// Found by the cold review (issue 12): a Kafka outage that outlasted the spool under `block`
/// left the intake holding the whole budget; when Kafka came back, readers queued on the fair
/// semaphore took every lease the acknowledgements freed, the backlog lane never got a chunk, no
/// segment finished, and the spool writer never got disk room: nothing moved, for ever. The
/// backlog now has a reserve readers never get.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_full_spool_under_block_the_backlog_still_moves_while_writers_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spool_config = SpoolConfig {
        dir: dir.path().to_path_buf(),
        max_bytes: 32 * 1024,
        segment_bytes: 4 * 1024,
        fsync: Fsync::Never,
        max_body: 64 * 1024,
    };
    let (spool, writer, _) = Spool::open(spool_config).expect("spool");
    let config = crate::config::Config::from_toml(
        "[buffer]\ntype = \"disk\"\nmax_bytes = \"128 KiB\"\nmax_records = 100000\nblock_timeout = \"20ms\"\n\
         [ingest.listeners.default]\nmax_record_size = \"8 KiB\"\n",
    )
    .expect("valid");
    let buffer = Buffer::for_config_with_spool(&config, spool.clone(), writer.end());
    let stop = CancellationToken::new();
    let spooler = tokio::spawn(run(buffer.clone(), writer, Fsync::Never, stop.clone(), stop.clone()));
    // Kafka down: what the memory lane takes stays in flight.
    let mut in_flight: Vec<Record> = Vec::new();
    let mut admission = Admission::default();
    for i in 0..4000 {
        let _ = buffer.push(numbered(i), None, None, 1_000, None, &mut admission).await;
        if buffer.poll_work(false) == Some(Work::Memory) {
            buffer.pop_batch(512, &mut in_flight);
        }
        if i % 50 == 0 {
            tokio::task::yield_now().await;
        }
    }
    // The spool writer fills the spool up to its cap.
    let filled = tokio::time::timeout(Duration::from_secs(5), async {
        while spool.disk_bytes() * 10 < spool.max_bytes() * 8 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(filled.is_ok(), "the spool filled: {} bytes; {}", spool.disk_bytes(), buffer.describe());
    let on_disk = spool.undelivered();
    // Kafka is back, while writers keep writing (and waiting for room).
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let buffer = buffer.clone();
            tokio::spawn(async move {
                let mut admission = Admission::default();
                for i in 0..200_000 {
                    let _ = buffer.push(numbered(i), None, None, 1_000, None, &mut admission).await;
                    if i % 10 == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for record in in_flight.drain(..) {
        buffer.settled(record.lease.bytes(), record.ingest_ms);
        let _ = spool.done(record.pos.expect("spooled"));
    }
    // The shipper's lanes, delivering at once what they take (Kafka healthy).
    let mut shipped_from_backlog = 0;
    let mut prefer = true;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(60) && shipped_from_backlog < on_disk {
        match buffer.poll_work(prefer) {
            Some(Work::Backlog { from, upto }) => {
                if let Some(lease) = buffer.try_backlog_lease() {
                    let batch = spool.reader().read(from, upto, lease.records(), lease.bytes()).expect("read");
                    shipped_from_backlog += batch.records.len() as u64;
                    for record in batch.records {
                        let _ = spool.done(record.pos);
                    }
                    spool.delete_done();
                }
            }
            Some(Work::Memory) => {
                let mut batch = Vec::new();
                buffer.pop_batch(512, &mut batch);
                for record in batch {
                    buffer.settled(record.lease.bytes(), record.ingest_ms);
                    let _ = spool.done(record.pos.expect("spooled"));
                }
                spool.delete_done();
            }
            None => {}
        }
        prefer = !prefer;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for writer in &writers {
        writer.abort();
    }
    stop.cancel();
    let _ = spooler.await;
    assert!(
        shipped_from_backlog >= on_disk,
        "the backlog moved: {shipped_from_backlog} of the {on_disk} records on disk shipped in 60 s"
    );
}

/// Found by the cold review: the biased select served the intake first, so under steady load a
/// finished interval sync was never collected, no further sync started, and no `spooled` ack was
/// settled until the load paused (`fsync = "10ms"` silently not honoured).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interval_syncs_keep_settling_acks_under_steady_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spool_config = SpoolConfig {
        dir: dir.path().to_path_buf(),
        max_bytes: 1 << 30,
        segment_bytes: 16 * 1024 * 1024,
        fsync: Fsync::Interval(Duration::from_millis(10)),
        max_body: 64 * 1024,
    };
    let (spool, writer, _) = Spool::open(spool_config).expect("spool");
    let config = BufferConfig {
        kind: BufferKind::Disk,
        max_bytes: ByteSize::mib(16),
        max_records: 1_000_000,
        when_full: WhenFull::Block,
        block_timeout: None,
        ..BufferConfig::default()
    };
    let buffer = Buffer::with_spool(&config, spool.clone(), writer.end());
    let stop = CancellationToken::new();
    let spooler = tokio::spawn(run(
        buffer.clone(),
        writer,
        Fsync::Interval(Duration::from_millis(10)),
        stop.clone(),
        stop.clone(),
    ));
    let tracker = AckTracker::new(AckPoint::Spooled);
    let load = CancellationToken::new();
    let pusher = tokio::spawn({
        let (buffer, tracker, load) = (buffer.clone(), tracker.clone(), load.clone());
        async move {
            let mut admission = Admission::default();
            let mut i = 0;
            while !load.is_cancelled() {
                let _ = buffer.push(numbered(i), None, None, 1_000, Some(tracker.issue()), &mut admission).await;
                i += 1;
                if i % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }
    });
    // Records spooled are also "delivered" at once here, so memory stays free.
    let drainer = tokio::spawn({
        let (buffer, load) = (buffer.clone(), load.clone());
        async move {
            while !load.is_cancelled() {
                let mut batch = Vec::new();
                buffer.pop_batch(4096, &mut batch);
                for record in batch {
                    buffer.settled(record.lease.bytes(), record.ingest_ms);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    // Waits (a hang detector's 30 s, however slow the disk's fsync) for the acknowledgement to
    // reach `at_least` records, while the load goes on.
    let mut acked = 0;
    let mut until_acked = async |at_least: u64| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::time::Instant::now() < deadline {
            for event in tracker.take_events() {
                if let AckEvent::Upto(n) = event {
                    acked = n;
                }
            }
            if acked >= at_least {
                return acked;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        acked
    };
    let first = until_acked(1).await;
    // Records issued after that acknowledgement need a later sync to be acknowledged in turn.
    let issued_then = tracker.issued().max(first + 1);
    let second = until_acked(issued_then).await;
    let issued = tracker.issued();
    load.cancel();
    let _ = pusher.await;
    let _ = drainer.await;
    stop.cancel();
    let _ = spooler.await;
    // How many depends on the disk's fsync time; that they keep coming under load does not.
    assert!(issued > issued_then, "the load ran on: {issued} records, {issued_then} at the first acknowledgement");
    assert!(
        first > 0 && second >= issued_then,
        "acknowledged {first}, then {second} (waiting for {issued_then}), of {issued} records under load"
    );
}
