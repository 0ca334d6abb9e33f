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
    let expected: String = (0..10).map(|i| format!("record {i}\n")).collect();
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
    // 1,000 lines/s of 256 B: 5 lines per 5 ms, far below TICK_BYTES: the whole interval.
    let five_lines = units(&[[b'x'; 255].as_slice(), b"\n"].concat().repeat(5));
    assert_eq!(five_lines, 5 * (256 + WRITE_COST));
    assert_eq!(next_tick(five_lines, interval, interval), interval);
    // 64 Ki units in 4 ms: TICK_BYTES (48 Ki) arrive in 3 ms.
    assert_eq!(next_tick(64 * 1024, Duration::from_millis(4), interval), Duration::from_millis(3));
    assert_eq!(next_tick(0, interval, interval), interval);
}

#[test]
fn short_lines_count_as_the_writes_they_are() {
    // 250 lines of 32 B: 8,000 bytes, but the socket is full.
    let lines = [[b'x'; 31].as_slice(), b"\n"].concat().repeat(250);
    assert_eq!(lines.len(), 8000);
    assert!(units(&lines) > 4 * TICK_BYTES, "{}", units(&lines));
    assert!(is_hot(units(&lines), Duration::from_millis(5)), "and it is hot: read through epoll");
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

/// Found by the cold review: a tick's plain reads did not charge tokio's task budget, so a
/// writer that never let the socket empty kept the connection's task from ever yielding (and
/// from seeing shutdown), and on a one-thread runtime starved every other task.
#[test]
#[expect(clippy::disallowed_methods, reason = "the reader's work without awaiting is what the test is about")]
fn a_writer_that_never_lets_the_socket_empty_cannot_starve_other_tasks() {
    let (done, finished) = std::sync::mpsc::channel();
    // A one-thread runtime on a thread of its own: if the reader never yields, the timer task
    // never runs, and this test fails on the channel's timeout instead of hanging.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let (mut paced, mut writer) = pair(Duration::from_millis(5));
            let flood = std::thread::spawn(move || {
                let chunk = vec![b'x'; 4096];
                // Ends when the reader goes away (EPIPE).
                while writer.write_all(&chunk).is_ok() {}
            });
            let reader = tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n) = paced.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    // Handling what was read takes time, without awaiting (as framing and
                    // enveloping do): the writer refills the socket meanwhile.
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            tokio::time::sleep(Duration::from_millis(200)).await;
            reader.abort();
            let _ = reader.await;
            flood.join().expect("writer thread");
        });
        let _ = done.send(());
    });
    finished.recv_timeout(Duration::from_secs(60)).expect("the timer task ran beside the reader");
}

#[tokio::test]
async fn a_connection_that_stops_ticking_reads_through_epoll_from_then_on() {
    let (mut paced, mut writer) = pair(Duration::from_millis(5));
    let mut buf = vec![0; 1024];
    writer.write_all(b"SLUICE/1 ACK\n").expect("write");
    assert_eq!(paced.read(&mut buf).await.expect("read"), 13);
    assert!(ticking(&paced));
    paced.stop_ticking();
    writer.write_all(b"one\n").expect("write");
    assert_eq!(paced.read(&mut buf).await.expect("read"), 4);
    assert!(!ticking(&paced), "back on epoll, and it stays there");
    writer.write_all(b"two\n").expect("write");
    assert_eq!(paced.read(&mut buf).await.expect("read"), 4);
    assert!(!ticking(&paced));
}

#[tokio::test]
async fn a_tick_reads_at_most_a_chunk_however_large_the_buffer() {
    let (mut paced, mut writer) = pair(Duration::from_millis(5));
    let mut buf = vec![0; 4 * READ_CHUNK];
    writer.write_all(b"x\n").expect("write");
    assert_eq!(paced.read(&mut buf).await.expect("read"), 2);
    assert!(ticking(&paced));
    // More than a chunk in the socket before the tick (a tick that found it empty would
    // register the socket again, and tokio's own read takes all it can: seen under CI's load);
    // the rest from a thread, as it may block until the reader makes room.
    writer.write_all(&[b'y'; 2 * READ_CHUNK]).expect("write");
    let flood = std::thread::spawn(move || writer.write_all(&[b'y'; READ_CHUNK]).expect("write"));
    let n = paced.read(&mut buf).await.expect("read");
    assert!(n > 0 && n <= READ_CHUNK, "{n}");
    let mut rest = vec![0; 3 * READ_CHUNK - n];
    paced.read_exact(&mut rest).await.expect("the rest");
    flood.join().expect("writer");
}

#[test]
fn a_connection_is_hot_above_32_ki_units_per_millisecond_with_half_a_tick_of_them() {
    let line = [[b'x'; 255].as_slice(), b"\n"].concat();
    // 10,000 lines/s of 256 B: 50 lines per 5 ms.
    assert!(!is_hot(units(&line.repeat(50)), Duration::from_millis(5)));
    // Four writers at the max rate: ~85 lines per ms each.
    assert!(is_hot(units(&line.repeat(85)), Duration::from_millis(1)));
    // A few bytes over a very short tick is not a rate.
    assert!(!is_hot(4096, Duration::from_micros(10)));
}
