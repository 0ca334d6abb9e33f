use std::io::Write as _;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::*;

fn pair(interval: Duration) -> (PacedStream, StdUnixStream) {
    let (ours, theirs) = StdUnixStream::pair().expect("socket pair");
    ours.set_nonblocking(true).expect("non-blocking");
    let ours = UnixStream::from_std(ours).expect("registered");
    (PacedStream::new(ours, interval), theirs)
}

fn ticking(stream: &PacedStream) -> bool {
    matches!(stream.mode, Mode::Ticking(_))
}

#[tokio::test]
async fn a_busy_connection_is_read_in_ticks_and_goes_back_to_epoll_when_a_tick_finds_nothing() {
    let (mut paced, mut writer) = pair(Duration::from_millis(5));
    let mut buf = vec![0; 64 * 1024];
    writer.write_all(b"one\n").expect("write");
    let n = paced.read(&mut buf).await.expect("read");
    assert_eq!(&buf[..n], b"one\n");
    assert!(ticking(&paced), "after a read the socket is out of epoll, read on a timer");
    // Written between ticks: read at the next tick, every byte, in order.
    let expected: String = (0..100).map(|i| format!("record {i}\n")).collect();
    writer.write_all(expected.as_bytes()).expect("write");
    let mut got = Vec::new();
    while got.len() < expected.len() {
        let n = paced.read(&mut buf).await.expect("read");
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, expected.as_bytes());
    // Nothing more: the next tick finds the socket empty and registers it again; a write
    // then wakes the reader through epoll.
    let reader = tokio::spawn(async move {
        let n = paced.read(&mut buf).await.expect("read");
        (buf[..n].to_vec(), paced)
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    writer.write_all(b"later\n").expect("write");
    let (later, paced) = tokio::time::timeout(Duration::from_secs(5), reader).await.expect("woken").expect("task");
    assert_eq!(later, b"later\n");
    assert!(ticking(&paced), "ticking again after the wake-up");
}

#[tokio::test]
async fn a_zero_interval_reads_each_write_through_epoll() {
    let (mut paced, mut writer) = pair(Duration::ZERO);
    let mut buf = vec![0; 1024];
    writer.write_all(b"a\n").expect("write");
    let n = paced.read(&mut buf).await.expect("read");
    assert_eq!(&buf[..n], b"a\n");
    assert!(!ticking(&paced));
}

#[tokio::test]
async fn the_end_of_stream_is_seen_in_either_mode() {
    for interval in [Duration::ZERO, Duration::from_millis(5)] {
        let (mut paced, mut writer) = pair(interval);
        writer.write_all(b"last\n").expect("write");
        drop(writer);
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), paced.read_to_end(&mut got))
            .await
            .expect("not waiting forever")
            .expect("read");
        assert_eq!(got, b"last\n", "interval {interval:?}");
    }
}

#[tokio::test]
async fn a_shut_read_side_ends_the_stream_while_ticking() {
    let (mut paced, mut writer) = pair(Duration::from_millis(5));
    writer.write_all(b"one\n").expect("write");
    let mut buf = vec![0; 1024];
    assert_eq!(paced.read(&mut buf).await.expect("read"), 4);
    assert!(ticking(&paced));
    paced.socket().expect("socket").shutdown(std::net::Shutdown::Read).expect("shut");
    let n =
        tokio::time::timeout(Duration::from_secs(5), paced.read(&mut buf)).await.expect("not forever").expect("read");
    assert_eq!(n, 0, "end of stream");
}

#[test]
fn the_next_tick_comes_sooner_the_more_the_last_one_brought() {
    let interval = Duration::from_millis(5);
    // 1,000 records/s of 256 B: 1.3 KiB per 5 ms, far below TICK_BYTES: the whole interval.
    assert_eq!(next_tick(1280, interval, interval), interval);
    // 64 KiB in 4 ms: TICK_BYTES (8 KiB) arrive in half a millisecond.
    assert_eq!(next_tick(64 * 1024, Duration::from_millis(4), interval), Duration::from_micros(500));
    assert_eq!(next_tick(0, interval, interval), interval);
}

#[tokio::test]
async fn the_writer_handle_reaches_the_peer_in_either_mode() {
    let (mut paced, mut theirs) = pair(Duration::from_millis(5));
    std::io::Write::write_all(&mut paced.writer().expect("writer"), b"OK\n").expect("write");
    theirs.write_all(b"x\n").expect("write");
    let mut buf = vec![0; 16];
    assert_eq!(paced.read(&mut buf).await.expect("read"), 2);
    assert!(ticking(&paced));
    std::io::Write::write_all(&mut paced.writer().expect("writer"), b"ACK 1\n").expect("write");
    let mut got = [0; 9];
    std::io::Read::read_exact(&mut theirs, &mut got).expect("read");
    assert_eq!(&got, b"OK\nACK 1\n");
}
