//! Client sessions (`SLUICE/2 ACK`, docs/PROTOCOL.md): a client that numbers its records itself
//! and sends again what was not acknowledged after a reconnect stores each record once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::support::*;

/// A client of one session: records numbered 1..=total, each with the time it was "logged" (the
/// same on every send), written from the lowest unacknowledged one on every connection.
struct SessionClient {
    session: String,
    tag: String,
    times: Vec<i64>,
    /// Every record up to this number is acknowledged.
    acked: Arc<AtomicU64>,
    /// Records written, resends included.
    written: Arc<AtomicU64>,
    /// `NAK` lines heard.
    refused: Arc<AtomicU64>,
    /// After writing each of these numbers (once), the client stops until `resume`, having said
    /// so on `stopped`: the test kills the agent with records written and not yet acknowledged.
    stop_after: std::sync::Mutex<std::collections::VecDeque<u64>>,
    stopped: tokio::sync::Notify,
    resume: tokio::sync::Notify,
    /// Set when the client stops: the acknowledgements that come then are not heard, as when a
    /// connection dies with them on the way.
    deaf: Arc<std::sync::atomic::AtomicBool>,
}

impl SessionClient {
    fn new(tag: &str, total: u64, stop_after: &[u64]) -> Self {
        let start = chrono::Utc::now().timestamp_micros();
        Self {
            session: uuid::Uuid::now_v7().simple().to_string(),
            tag: tag.to_string(),
            times: (0..total as i64).map(|n| start + n).collect(),
            acked: Arc::default(),
            written: Arc::default(),
            refused: Arc::default(),
            stop_after: std::sync::Mutex::new(stop_after.iter().copied().collect()),
            stopped: tokio::sync::Notify::new(),
            resume: tokio::sync::Notify::new(),
            deaf: Arc::default(),
        }
    }

    fn total(&self) -> u64 {
        self.times.len() as u64
    }

    /// One connection: the handshake from the lowest unacknowledged record, then every record
    /// from there at about `rate` a second, reading acknowledgements meanwhile, until all are
    /// acknowledged or the connection breaks (the agent killed).
    async fn connection(&self, socket: &std::path::Path, rate: u64) {
        let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(2), UnixStream::connect(socket)).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            return;
        };
        let (read, mut write) = stream.into_split();
        let first = self.acked.load(Ordering::SeqCst) + 1;
        let handshake = format!("SLUICE/2 ACK session={} first={first}\n", self.session);
        if write.write_all(handshake.as_bytes()).await.is_err() {
            return;
        }
        let mut lines = BufReader::new(read).lines();
        match tokio::time::timeout(Duration::from_secs(5), lines.next_line()).await {
            Ok(Ok(Some(line))) if line.starts_with("OK ") => {}
            _ => return,
        }
        self.deaf.store(false, Ordering::SeqCst);
        let (acked, refused, deaf) = (self.acked.clone(), self.refused.clone(), self.deaf.clone());
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if deaf.load(Ordering::SeqCst) {
                    continue;
                }
                let mut words = line.split(' ');
                match (words.next(), words.next().and_then(|n| n.parse::<u64>().ok())) {
                    (Some("ACK"), Some(n)) => {
                        acked.fetch_max(n, Ordering::SeqCst);
                    }
                    (Some("NAK"), Some(_)) => {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => panic!("not in the protocol: {line}"),
                }
            }
        });
        let pause = Duration::from_micros(1_000_000 * 50 / rate.max(1));
        for n in first..=self.total() {
            let line = format!("{} {}\n", self.times[n as usize - 1], numbered(&self.tag, n));
            if write.write_all(line.as_bytes()).await.is_err() {
                break;
            }
            self.written.fetch_add(1, Ordering::SeqCst);
            let stop = {
                let mut stop_after = self.stop_after.lock().expect("lock");
                stop_after.front() == Some(&n) && stop_after.pop_front().is_some()
            };
            if stop {
                self.deaf.store(true, Ordering::SeqCst);
                self.stopped.notify_one();
                self.resume.notified().await;
            }
            if n % 50 == 0 {
                tokio::time::sleep(pause).await;
            }
        }
        // Everything is written: wait for the acknowledgements (or the connection's end).
        let _ = tokio::time::timeout(Duration::from_secs(30), reader).await;
    }
}

/// Issue 31: an acknowledged writer that sent again after a reconnect what it had not heard
/// acknowledged stored those records twice — the row's key held the ingest time, so a resend was
/// a new row. A client session names its records (`<session>-<seq>` in its pod, key time the
/// client's): a record sent twice, or three times, across two agent kills, is one row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_resending_what_was_not_acknowledged_across_agent_kills_stores_each_record_once() {
    let setup = Scenario::new("session")
        .disk_buffer()
        .partitions(2)
        .set("buffer", "fsync", "always")
        .set("ingest", "ack_point", "delivered")
        .build()
        .await;
    let (config, topic) = (&setup.config, &setup.topic);
    let _persister = setup.persister().await;
    let db = setup.db().await;
    let mut agent = setup.agent().await;
    let client = Arc::new(SessionClient::new(topic, 3000, &[825, 1830]));
    let writing = {
        let (client, socket) = (client.clone(), config.socket());
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
            while client.acked.load(Ordering::SeqCst) < client.total() && tokio::time::Instant::now() < deadline {
                client.connection(&socket, 300).await;
            }
        })
    };
    // Killed twice once Kafka has what the client wrote, whose last acknowledgements the client
    // did not hear (the connection died with them on the way): it sends those again.
    for _ in 0..2 {
        within(Duration::from_secs(60), "the client stops for the kill", client.stopped.notified()).await;
        until_settled(config.agent_admin(), sluice::telemetry::SHIP_DELIVERED, &[]).await;
        let unheard = client.written.load(Ordering::SeqCst) - client.acked.load(Ordering::SeqCst);
        assert!(unheard > 0, "records written whose acknowledgement the client did not hear");
        agent.kill();
        agent = setup.agent().await;
        client.resume.notify_one();
    }
    within(Duration::from_secs(150), "every record acknowledged", writing).await.expect("the client");
    let (total, written) = (client.total(), client.written.load(Ordering::SeqCst));
    assert_eq!(client.acked.load(Ordering::SeqCst), total, "every record acknowledged");
    assert_eq!(client.refused.load(Ordering::SeqCst), 0, "none refused");
    assert!(written > total, "records were sent again: {written} written for {total}");

    until_rows(&db, total as i64).await;
    // Past this, a duplicate would have arrived too.
    until_nothing_left(config).await;
    let numbers = stored_numbers(&db, topic).await;
    assert_each_once(&numbers, 1..total + 1);
    drop(agent);
}

/// A session's acknowledgements carry the client's numbers; a line without the client's time is
/// refused `malformed` under its number; the time prefix is allowed beside a record of the
/// largest size, and the record alone keeps the limit; a last line the writer ends without its
/// newline is `truncated`, never a record (its resend, whole, has the same id); a handshake that
/// cannot be read gets no answer and every record after it is refused, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_hears_its_own_numbers_and_a_malformed_line_or_handshake_is_refused() {
    let setup = Scenario::new("session-words").listener("default", "max_record_size", "1 KiB").build().await;
    let (_, _agent) = setup.listening_agent().await;
    let config = &setup.config;
    let session = uuid::Uuid::now_v7().simple().to_string();

    let stream = UnixStream::connect(config.socket()).await.expect("connect");
    let (read, mut write) = stream.into_split();
    let now = chrono::Utc::now().timestamp_micros();
    let largest = format!("{{\"pad\":\"{}\"}}", "x".repeat(1024 - 10));
    let over = format!("{{\"pad\":\"{}\"}}", "x".repeat(1025 - 10));
    assert_eq!((largest.len(), over.len()), (1024, 1025));
    let text = format!(
        "SLUICE/2 ACK session={session} first=100\n{now} {}\nno time here\n{now} {largest}\n{now} {over}\n{now} {}\n{now} {{\"cut\":",
        numbered("words", 100),
        numbered("words", 104)
    );
    write.write_all(text.as_bytes()).await.expect("write");
    write.shutdown().await.expect("the writer ends, its last line unfinished");
    let mut lines = BufReader::new(read).lines();
    let mut heard = Vec::new();
    while let Some(line) = within(Duration::from_secs(20), "acknowledgements", lines.next_line()).await.expect("read") {
        heard.push(line);
    }
    assert_eq!(heard.first().map(String::as_str), Some("OK delivered"), "{heard:?}");
    for expected in ["NAK 101 malformed", "NAK 103 too_large", "NAK 105 truncated", "ACK 105"] {
        assert!(heard.iter().any(|line| line == expected), "{expected} in {heard:?}");
    }
    assert!(!heard.iter().any(|line| line == "NAK 102 too_large"), "the prefix is not the record's: {heard:?}");

    let stream = UnixStream::connect(config.socket()).await.expect("connect");
    let (read, mut write) = stream.into_split();
    let text = format!("SLUICE/2 ACK session={session} first=0\n{now} {}\n", numbered("words", 1));
    write.write_all(text.as_bytes()).await.expect("write");
    write.shutdown().await.expect("shutdown");
    let mut lines = BufReader::new(read).lines();
    let end = within(Duration::from_secs(10), "the connection closed", lines.next_line()).await;
    assert!(matches!(end, Ok(None) | Err(_)), "no answer: {end:?}");
    let malformed = [("reason", "malformed")];
    let metrics = until_metric(config.agent_admin(), sluice::telemetry::INGEST_REJECTED, &malformed, 3.0).await;
    assert_eq!(metrics.count(sluice::telemetry::INGEST_REJECTED, &malformed), 3.0);
}
