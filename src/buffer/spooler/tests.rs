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

struct Setup {
    buffer: Buffer,
    spooler: Spooler,
    tracker: Arc<AckTracker>,
    _dir: tempfile::TempDir,
}

fn setup(fsync: Fsync, when_full: WhenFull) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let spool_config = SpoolConfig {
        dir: dir.path().to_path_buf(),
        max_bytes: 1024 * 1024,
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
            self.buffer.push(payload, None, 1_000, ack, &mut Admission::default()).await.expect("room");
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
    let frame = crate::buffer::segment::frame_len(None, b"record 000 with some padding");
    let per_segment = (512 - crate::buffer::segment::HEADER.len()) / frame;
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

#[tokio::test]
async fn a_full_disk_under_drop_newest_refuses_the_records_that_did_not_fit() {
    let mut s = setup(Fsync::Never, WhenFull::DropNewest);
    let records = s.accept(3).await;
    s.inject(SpoolOp::Write, io::Error::from_raw_os_error(28));
    s.spooler.write(records, &CancellationToken::new()).await;
    let refused: Vec<AckEvent> = (1..=3).map(|seq| AckEvent::Refused { seq, reason: "drop_newest" }).collect();
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
    run(buffer.clone(), spooler.writer.expect("writer"), spooler.fsync, stop).await;
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
