use std::time::Duration;

use bytesize::ByteSize;

use super::*;
use crate::telemetry::outcome::{Dropped, Refused};

/// `buffer.max_bytes` for leases covering exactly `n` records of `len` bytes each (a fifth of
/// the configured budget is librdkafka's).
fn room(n: usize, len: usize) -> u64 {
    let leases = n * (len + RECORD_OVERHEAD);
    (leases * LIBRDKAFKA_SHARE).div_ceil(LIBRDKAFKA_SHARE - 1) as u64
}

fn config(max_bytes: u64, max_records: u32, when_full: WhenFull) -> BufferConfig {
    BufferConfig {
        max_bytes: ByteSize(max_bytes),
        max_records,
        when_full,
        block_timeout: None,
        ..BufferConfig::default()
    }
}

fn buffer(max_bytes: u64, max_records: u32, when_full: WhenFull) -> Buffer {
    Buffer::new(&config(max_bytes, max_records, when_full))
}

fn payload(len: usize) -> Bytes {
    Bytes::from(vec![b'x'; len])
}

async fn push(buffer: &Buffer, len: usize) -> Result<(), BufferFull> {
    buffer.push(payload(len), None, None, 1_000, None, &mut Admission::default()).await
}

fn lens(records: &[Record]) -> Vec<usize> {
    records.iter().map(|r| r.payload.len()).collect()
}

#[tokio::test]
async fn hands_out_records_in_order_and_holds_them_until_their_lease_is_dropped() {
    let buffer = buffer(room(10, 30), 10, WhenFull::Block);
    for len in [10, 20, 30] {
        push(&buffer, len).await.expect("room");
    }
    let mut batch = Vec::new();
    buffer.pop_batch(2, &mut batch);
    assert_eq!(lens(&batch), vec![10, 20]);
    assert_eq!(buffer.queued_records(), 1);
    // Popped but not acknowledged: still held.
    assert_eq!((buffer.held_records(), buffer.held_bytes()), (3, 60 + 3 * RECORD_OVERHEAD));
    batch.clear();
    assert_eq!((buffer.held_records(), buffer.held_bytes()), (1, 30 + RECORD_OVERHEAD));
}

#[tokio::test]
async fn drops_newest_when_buffer_full_and_counts_it() {
    let buffer = buffer(room(1, 80) + 30, 10, WhenFull::DropNewest);
    push(&buffer, 80).await.expect("room");
    assert_eq!(push(&buffer, 30).await, Err(BufferFull(Dropped::DropNewest)));
    assert_eq!(buffer.held_records(), 1);
}

#[tokio::test]
async fn drops_newest_when_the_record_count_is_reached() {
    let buffer = buffer(room(10, 10), 2, WhenFull::DropNewest);
    push(&buffer, 1).await.expect("room");
    push(&buffer, 1).await.expect("room");
    assert!(push(&buffer, 1).await.is_err());
    assert_eq!(buffer.held_records(), 2);
}

#[tokio::test]
async fn drops_oldest_waiting_records_to_make_room_and_counts_them() {
    let buffer = buffer(room(3, 10), 10, WhenFull::DropOldest);
    for len in [1, 2, 3] {
        push(&buffer, len).await.expect("room");
    }
    push(&buffer, 4).await.expect("the oldest makes room");
    let mut batch = Vec::new();
    buffer.pop_batch(10, &mut batch);
    assert_eq!(lens(&batch), vec![2, 3, 4]);
}

#[tokio::test]
async fn drop_oldest_drops_the_new_record_when_everything_held_is_already_at_kafka() {
    let buffer = buffer(room(1, 10), 10, WhenFull::DropOldest);
    push(&buffer, 5).await.expect("room");
    let mut in_flight = Vec::new();
    buffer.pop_batch(10, &mut in_flight);
    assert_eq!(push(&buffer, 5).await, Err(BufferFull(Dropped::DropOldest)));
}

#[tokio::test(start_paused = true)]
async fn blocks_a_writer_until_an_acknowledgement_frees_room() {
    let buffer = buffer(room(1, 90), 10, WhenFull::Block);
    push(&buffer, 90).await.expect("room");
    let waiting = tokio::spawn({
        let buffer = buffer.clone();
        async move { push(&buffer, 50).await }
    });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!waiting.is_finished(), "the writer must wait while the buffer is full");
    let mut batch = Vec::new();
    buffer.pop_batch(10, &mut batch);
    drop(batch); // Kafka acknowledged the first record.
    tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("unblocked").expect("task").expect("pushed");
    assert_eq!(buffer.held_bytes(), 50 + RECORD_OVERHEAD);
}

#[tokio::test(start_paused = true)]
async fn block_timeout_holds_a_writer_once_then_sheds_until_there_is_room() {
    let config =
        BufferConfig { block_timeout: Some(Duration::from_secs(1)), ..config(room(1, 10), 10, WhenFull::Block) };
    let buffer = Buffer::new(&config);
    let mut admission = Admission::default();
    buffer.push(payload(10), None, None, 1_000, None, &mut admission).await.expect("room");

    let started = tokio::time::Instant::now();
    let first = buffer.push(payload(10), None, None, 1_000, None, &mut admission).await;
    assert_eq!(first, Err(BufferFull(Dropped::BlockTimeout)));
    assert_eq!(started.elapsed(), Duration::from_secs(1), "held for exactly the timeout");

    let started = tokio::time::Instant::now();
    assert_eq!(
        buffer.push(payload(10), None, None, 1_000, None, &mut admission).await,
        Err(BufferFull(Dropped::BlockTimeout))
    );
    assert_eq!(started.elapsed(), Duration::ZERO, "while still full, later records are dropped at once");

    let mut batch = Vec::new();
    buffer.pop_batch(10, &mut batch);
    batch.clear();
    buffer.push(payload(10), None, None, 1_000, None, &mut admission).await.expect("room again ends the shedding");
    assert!(!admission.shedding);
}

#[tokio::test(start_paused = true)]
async fn a_quiet_connection_gets_its_turn_while_a_flooding_one_waits() {
    let buffer = buffer(room(1, 10), 10, WhenFull::Block);
    push(&buffer, 10).await.expect("room");
    let flood = tokio::spawn({
        let buffer = buffer.clone();
        async move {
            for _ in 0..5 {
                push(&buffer, 10).await.expect("eventually room");
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let quiet = tokio::spawn({
        let buffer = buffer.clone();
        async move { push(&buffer, 10).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Free room twice: the flooder's pending record first (it came first), then the quiet one.
    let mut sent = Vec::new();
    for _ in 0..2 {
        buffer.pop_batch(1, &mut sent);
        sent.clear();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(quiet.is_finished(), "the quiet connection was served before the flooder's later records");
    flood.abort();
}

#[tokio::test]
async fn requeued_records_come_back_first_in_failure_order_and_keep_their_lease() {
    let buffer = buffer(room(10, 10), 10, WhenFull::Block);
    for len in 1..=4 {
        push(&buffer, len).await.expect("room");
    }
    let mut batch = Vec::new();
    buffer.pop_batch(2, &mut batch);
    for record in batch.drain(..) {
        buffer.requeue(record);
    }
    assert_eq!(buffer.held_records(), 4);
    buffer.pop_batch(10, &mut batch);
    assert_eq!(lens(&batch), vec![1, 2, 3, 4]);
}

#[tokio::test(start_paused = true)]
async fn the_shipper_waits_for_work_to_arrive() {
    let buffer = buffer(room(10, 10), 10, WhenFull::Block);
    let waiter = tokio::spawn({
        let buffer = buffer.clone();
        async move { buffer.next_work(false).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiter.is_finished());
    push(&buffer, 5).await.expect("room");
    assert_eq!(waiter.await.expect("task"), Work::Memory);
}

#[tokio::test]
async fn a_record_larger_than_the_whole_budget_is_admitted_alone_rather_than_waiting_forever() {
    let buffer = buffer(room(1, 10), 10, WhenFull::Block);
    tokio::time::timeout(Duration::from_secs(1), push(&buffer, 5000))
        .await
        .expect("does not wait forever")
        .expect("admitted");
    assert_eq!(buffer.held_bytes(), buffer.max_bytes());
}

#[tokio::test]
async fn a_refused_record_settles_its_ack_as_refused_with_the_policy_name() {
    let buffer = buffer(room(1, 10), 10, WhenFull::DropNewest);
    let tracker = ack::AckTracker::new(AckPoint::Delivered);
    push(&buffer, 10).await.expect("room");
    let result = buffer.push(payload(10), None, None, 1_000, Some(tracker.issue()), &mut Admission::default()).await;
    assert!(result.is_err());
    assert_eq!(
        tracker.take_events(),
        vec![ack::AckEvent::Refused { seq: 1, reason: Refused::from(Dropped::DropNewest) }, ack::AckEvent::Upto(1)]
    );
}

mod disk {
    use super::*;
    use crate::buffer::spool::{Fsync, SpoolConfig};

    fn disk_buffer(dir: &std::path::Path, max_bytes: u64) -> (Buffer, spool::SpoolWriter) {
        let spool_config = SpoolConfig {
            dir: dir.to_path_buf(),
            max_bytes: 1024 * 1024,
            segment_bytes: 4096,
            fsync: Fsync::Never,
            max_body: 64 * 1024,
        };
        let (spool, writer, _) = Spool::open(spool_config).expect("spool");
        let config = BufferConfig { kind: crate::config::BufferKind::Disk, ..config(max_bytes, 1000, WhenFull::Block) };
        (Buffer::with_spool(&config, spool, writer.end()), writer)
    }

    /// What the spooler does: write the intake, hand it on.
    fn spool_intake(buffer: &Buffer, writer: &mut spool::SpoolWriter) {
        let mut records = Vec::new();
        buffer.pop_intake_now(usize::MAX, &mut records);
        let frames: Vec<spool::Entry<'_>> = records
            .iter()
            .map(|r| spool::Entry { ingest_ms: r.ingest_ms, topic: None, key: None, payload: r.payload.as_ref() })
            .collect();
        let appended = writer.append(&frames);
        assert!(appended.error.is_none());
        let positions = appended.positions;
        for (record, pos) in records.iter_mut().zip(positions) {
            record.pos = Some(pos);
        }
        buffer.spooled(records, writer.end());
    }

    #[tokio::test]
    async fn accepted_records_wait_for_the_spool_writer_before_the_shipper_sees_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (buffer, mut writer) = disk_buffer(dir.path(), room(100, 20));
        push(&buffer, 20).await.expect("room");
        assert_eq!(buffer.poll_work(false), None, "not yet on disk");
        spool_intake(&buffer, &mut writer);
        assert_eq!(buffer.poll_work(false), Some(Work::Memory));
    }

    #[tokio::test]
    async fn memory_pressure_evicts_spooled_records_to_the_backlog_instead_of_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (buffer, mut writer) = disk_buffer(dir.path(), room(4, 20));
        for _ in 0..4 {
            push(&buffer, 20).await.expect("room");
        }
        spool_intake(&buffer, &mut writer);
        // Full, but everything is on disk: a new record evicts the oldest and gets in at once.
        tokio::time::timeout(Duration::from_millis(100), push(&buffer, 20))
            .await
            .expect("does not block")
            .expect("room");
        let spool = buffer.spool().expect("spool").clone();
        let backlog = spool.backlog().expect("the evicted record is backlog");
        match buffer.poll_work(true) {
            Some(Work::Backlog { from, upto }) => {
                assert_eq!(from, backlog);
                assert!(upto > from);
            }
            other => panic!("expected backlog work, got {other:?}"),
        }
        // Alternation: the other lane when the backlog is not preferred.
        assert_eq!(buffer.poll_work(false), Some(Work::Memory));
    }

    /// Regression: a reader found nothing to evict (everything still in the intake), waited on
    /// the semaphore, and was never woken when those records reached the spool.
    #[tokio::test(start_paused = true)]
    async fn a_reader_waiting_for_room_gets_it_as_soon_as_the_intake_reaches_the_spool() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (buffer, mut writer) = disk_buffer(dir.path(), room(4, 20));
        for _ in 0..4 {
            push(&buffer, 20).await.expect("room");
        }
        let waiting = tokio::spawn({
            let buffer = buffer.clone();
            async move { push(&buffer, 20).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "nothing is on disk yet, so nothing can leave memory");
        spool_intake(&buffer, &mut writer);
        tokio::time::timeout(Duration::from_millis(100), waiting)
            .await
            .expect("woken by the spooled records")
            .expect("task")
            .expect("room");
    }

    /// The records a backlog read would send now.
    fn read_backlog(buffer: &Buffer) -> Vec<SpoolPos> {
        let spool = buffer.spool().expect("spool").clone();
        match buffer.poll_work(true) {
            Some(Work::Backlog { from, upto }) => {
                spool.reader().read(from, upto, 100, 1 << 20).expect("read").records.iter().map(|r| r.pos).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Regression (issue 12, item 6): the backlog ran from the cursor to the first record still
    /// queued in memory, across records the memory lane had already popped: those went to Kafka
    /// twice and were counted delivered twice.
    #[tokio::test]
    async fn the_backlog_never_covers_records_the_memory_lane_already_sent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (buffer, mut writer) = disk_buffer(dir.path(), room(4, 20));
        for _ in 0..4 {
            push(&buffer, 20).await.expect("room");
        }
        let written = {
            let mut records = Vec::new();
            buffer.pop_intake_now(usize::MAX, &mut records);
            let frames: Vec<spool::Entry<'_>> = records
                .iter()
                .map(|r| spool::Entry { ingest_ms: r.ingest_ms, topic: None, key: None, payload: r.payload.as_ref() })
                .collect();
            let positions = writer.append(&frames).positions;
            for (record, pos) in records.iter_mut().zip(&positions) {
                record.pos = Some(*pos);
            }
            buffer.spooled(records, writer.end());
            positions
        };
        push(&buffer, 20).await.expect("evicts the oldest");
        let mut in_flight = Vec::new();
        buffer.pop_batch(1, &mut in_flight);
        assert_eq!(in_flight.len(), 1);
        let in_memory: Vec<SpoolPos> =
            buffer.lock().fresh.iter().chain(&in_flight).filter_map(|record| record.pos).collect();
        let disk_only: Vec<SpoolPos> = written.into_iter().filter(|pos| !in_memory.contains(pos)).collect();
        assert!(!disk_only.is_empty());
        assert_eq!(read_backlog(&buffer), disk_only, "only disk-only records, not the one in flight");
    }

    /// The same, with disk-only records on both sides of one in flight.
    #[tokio::test]
    async fn the_backlog_skips_a_record_in_flight_between_two_evicted_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (buffer, mut writer) = disk_buffer(dir.path(), room(10, 20));
        for _ in 0..4 {
            push(&buffer, 20).await.expect("room");
        }
        spool_intake(&buffer, &mut writer);
        let mut all = Vec::new();
        buffer.pop_batch(4, &mut all);
        let positions: Vec<SpoolPos> = all.iter().filter_map(|r| r.pos).collect();
        // Record 1 stays in flight; 0, 2 and 3 come back unsent (shutdown-like) and are disk-only.
        let spool = buffer.spool().expect("spool").clone();
        let mut in_flight = Vec::new();
        for (i, record) in all.into_iter().enumerate() {
            if i == 1 {
                in_flight.push(record);
            } else {
                assert_eq!(spool.evicted(vec![(record.pos.expect("spooled"), None)]), 0);
            }
        }
        assert_eq!(read_backlog(&buffer), vec![positions[0], positions[2], positions[3]]);
    }

    #[tokio::test]
    async fn the_backlog_cursor_clears_once_it_reaches_the_records_in_memory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (buffer, mut writer) = disk_buffer(dir.path(), room(2, 20));
        for _ in 0..2 {
            push(&buffer, 20).await.expect("room");
        }
        spool_intake(&buffer, &mut writer);
        push(&buffer, 20).await.expect("evicts one");
        let spool = buffer.spool().expect("spool").clone();
        let Some(Work::Backlog { from, upto }) = buffer.poll_work(true) else { panic!("backlog expected") };
        let batch = spool.reader().read(from, upto, 100, 1 << 20).expect("read");
        assert_eq!(batch.records.len(), 1);
        assert_eq!(buffer.poll_work(true), Some(Work::Memory), "the backlog is read: only memory work is left");
    }
}

#[tokio::test]
async fn the_oldest_held_record_sets_the_age_until_it_is_settled() {
    let buffer = buffer(room(10, 10), 10, WhenFull::Block);
    assert_eq!(buffer.oldest_undelivered_ms(), None);
    buffer.push(payload(5), None, None, 5_000, None, &mut Admission::default()).await.expect("room");
    buffer.push(payload(5), None, None, 9_000, None, &mut Admission::default()).await.expect("room");
    assert_eq!(buffer.oldest_undelivered_ms(), Some(5_000));
    let mut batch = Vec::new();
    buffer.pop_batch(1, &mut batch);
    let first = batch.pop().expect("record");
    buffer.settled(first.lease.bytes(), first.ingest_ms);
    assert_eq!(buffer.oldest_undelivered_ms(), Some(9_000));
}

#[test]
fn leases_merged_for_one_return_give_back_all_their_room_and_leases_of_other_pools_stay_apart() {
    let buffer = buffer(room(10, 100), 10, WhenFull::DropNewest);
    let (bytes, records) = (buffer.shared.bytes.available_permits(), buffer.shared.records.available_permits());
    let cost = buffer.cost(100, 0);
    let mut merged = buffer.try_lease(cost).expect("room");
    let other = buffer.try_lease(cost).expect("room");
    assert!(merged.same_pools(&other));
    merged.absorb(other);
    assert_eq!((merged.bytes(), merged.records()), (2 * cost, 2));
    drop(merged);
    assert_eq!(
        (buffer.shared.bytes.available_permits(), buffer.shared.records.available_permits()),
        (bytes, records),
        "every record's room is back"
    );

    let elsewhere = Buffer::new(&config(room(10, 100), 10, WhenFull::DropNewest));
    let mut mine = buffer.try_lease(cost).expect("room");
    let theirs = elsewhere.try_lease(cost).expect("room");
    assert!(!mine.same_pools(&theirs));
    mine.absorb(theirs);
    assert_eq!(mine.bytes(), cost, "a lease of other pools is not merged");
    assert_eq!(elsewhere.shared.records.available_permits(), 10, "it went back to its own pool");
}

#[tokio::test]
async fn records_that_hold_their_room_enter_the_buffer_together_in_order() {
    let buffer = buffer(room(10, 100), 10, WhenFull::DropNewest);
    let mut admission = Admission::default();
    let mut records: Vec<Record> = (1..=3)
        .map(|len| {
            let lease = buffer.try_admit(buffer.cost(len, 0), &mut admission).expect("room");
            Record {
                topic: None,
                payload: payload(len),
                key: None,
                lease,
                retries: 0,
                pos: None,
                ingest_ms: 1_000,
                ack: None,
                maybe_stored: false,
            }
        })
        .collect();
    buffer.push_leased(&mut records);
    assert!(records.is_empty());
    assert_eq!(buffer.held_records(), 3);
    assert_eq!(buffer.oldest_undelivered_ms(), Some(1_000));
    let mut out = Vec::new();
    buffer.pop_batch(10, &mut out);
    assert_eq!(lens(&out), [1, 2, 3]);
}
