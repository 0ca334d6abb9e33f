use std::time::Duration;

use bytesize::ByteSize;

use super::*;

fn buffer(max_bytes: u64, max_records: u32, when_full: WhenFull) -> Buffer {
    Buffer::new(&BufferConfig { max_bytes: ByteSize(max_bytes), max_records, when_full })
}

fn payload(len: usize) -> Bytes {
    Bytes::from(vec![b'x'; len])
}

#[tokio::test]
async fn hands_out_records_in_order_and_holds_them_until_their_lease_is_dropped() {
    let buffer = buffer(1000, 10, WhenFull::Block);
    for len in [10, 20, 30] {
        buffer.push(payload(len), None).await.expect("room");
    }
    let mut batch = Vec::new();
    buffer.pop_batch(2, &mut batch).await;
    assert_eq!(batch.iter().map(|r| r.payload.len()).collect::<Vec<_>>(), vec![10, 20]);
    assert_eq!(buffer.queued_records(), 1);
    // Popped but not acknowledged: still held.
    assert_eq!((buffer.held_records(), buffer.held_bytes()), (3, 60));
    batch.clear();
    assert_eq!((buffer.held_records(), buffer.held_bytes()), (1, 30));
}

#[tokio::test]
async fn drops_newest_when_buffer_full_and_counts_it() {
    let buffer = buffer(100, 10, WhenFull::DropNewest);
    buffer.push(payload(80), None).await.expect("room");
    assert_eq!(buffer.push(payload(30), None).await, Err(Dropped::Full(WhenFull::DropNewest)));
    assert_eq!(buffer.held_records(), 1);
    // Room for a smaller one remains.
    buffer.push(payload(20), None).await.expect("room");
}

#[tokio::test]
async fn drops_newest_when_the_record_count_is_reached() {
    let buffer = buffer(1000, 2, WhenFull::DropNewest);
    buffer.push(payload(1), None).await.expect("room");
    buffer.push(payload(1), None).await.expect("room");
    assert!(buffer.push(payload(1), None).await.is_err());
    assert_eq!(buffer.held_bytes(), 2);
}

#[tokio::test(start_paused = true)]
async fn blocks_a_writer_until_an_acknowledgement_frees_room() {
    let buffer = buffer(100, 10, WhenFull::Block);
    buffer.push(payload(90), None).await.expect("room");
    let waiting = tokio::spawn({
        let buffer = buffer.clone();
        async move { buffer.push(payload(50), None).await }
    });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!waiting.is_finished(), "the writer must wait while the buffer is full");
    let mut batch = Vec::new();
    buffer.pop_batch(10, &mut batch).await;
    drop(batch); // Kafka acknowledged the first record.
    tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("unblocked").expect("task").expect("pushed");
    assert_eq!(buffer.held_bytes(), 50);
}

#[tokio::test]
async fn requeued_records_come_back_first_in_failure_order_and_keep_their_lease() {
    let buffer = buffer(1000, 10, WhenFull::Block);
    for len in 1..=4 {
        buffer.push(payload(len), None).await.expect("room");
    }
    let mut batch = Vec::new();
    buffer.pop_batch(2, &mut batch).await;
    for record in batch.drain(..) {
        buffer.requeue(record);
    }
    assert_eq!(buffer.held_records(), 4);
    buffer.pop_batch(10, &mut batch).await;
    assert_eq!(batch.iter().map(|r| r.payload.len()).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
}

#[tokio::test(start_paused = true)]
async fn pop_waits_for_a_record_to_arrive() {
    let buffer = buffer(1000, 10, WhenFull::Block);
    let popper = tokio::spawn({
        let buffer = buffer.clone();
        async move {
            let mut batch = Vec::new();
            buffer.pop_batch(10, &mut batch).await;
            batch.len()
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!popper.is_finished());
    buffer.push(payload(5), None).await.expect("room");
    assert_eq!(popper.await.expect("task"), 1);
}

#[tokio::test]
async fn a_record_larger_than_the_whole_budget_is_admitted_alone_rather_than_waiting_forever() {
    let buffer = buffer(100, 10, WhenFull::Block);
    tokio::time::timeout(Duration::from_secs(1), buffer.push(payload(500), None))
        .await
        .expect("does not wait forever")
        .expect("admitted");
    assert_eq!(buffer.held_bytes(), 100);
}
