//! Client sessions (`SLUICE/2 ACK`, docs/PROTOCOL.md): a client that numbers its records itself
//! and sends again what was not acknowledged after a reconnect stores each record once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
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
            let stop = {
                let mut stop_after = self.stop_after.lock().expect("lock");
                stop_after.front() == Some(&n) && stop_after.pop_front().is_some()
            };
            if stop {
                // Deaf before the last record is written: its acknowledgement, however quick, is
                // one the client does not hear.
                self.deaf.store(true, Ordering::SeqCst);
            }
            if write.write_all(line.as_bytes()).await.is_err() {
                break;
            }
            self.written.fetch_add(1, Ordering::SeqCst);
            if stop {
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
/// client's): a record sent twice, or three times, across two agent kills and a persister's, is
/// one row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_resending_what_was_not_acknowledged_across_agent_and_persister_kills_stores_each_record_once() {
    let setup = Scenario::new("session")
        .disk_buffer()
        .partitions(2)
        .set("buffer", "fsync", "always")
        .set("ingest", "ack_point", "delivered")
        .build()
        .await;
    let (config, topic) = (&setup.config, &setup.topic);
    let mut persister = setup.persister().await;
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
    // did not hear (the connection died with them on the way): it sends those again. The
    // persister is killed the first time too: Kafka delivers again what it had not committed.
    for kill in 0..2 {
        within(Duration::from_secs(60), "the client stops for the kill", client.stopped.notified()).await;
        until_settled(config.agent_admin(), sluice::telemetry::SHIP_DELIVERED, &[]).await;
        let unheard = client.written.load(Ordering::SeqCst) - client.acked.load(Ordering::SeqCst);
        assert!(unheard > 0, "records written whose acknowledgement the client did not hear");
        agent.kill();
        if kill == 0 {
            persister.kill();
            persister = setup.persister().await;
        }
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
    drop((agent, persister));
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

/// One step of a client session in [`any_interleaving_of_sends_acknowledgements_and_disconnects_stores_each_record_once`].
#[derive(Debug, Clone)]
enum Step {
    /// Write the connection's next records (opening one from the lowest record not heard
    /// acknowledged when there is none); a number not sent before is a new record, logged now.
    Send(u64),
    /// Read acknowledgements until everything written on the connection is settled.
    HearAcknowledgements,
    /// Open a new connection starting `back` records below the lowest not heard acknowledged
    /// (records the agent already acknowledged are sent again too).
    Reopen { back: u64 },
    /// Drop the connection without reading what the agent said.
    Disconnect,
    /// Write part of the next record's line, end the connection there, and drop it.
    Cut,
    /// SIGKILL the agent and start it again on the same spool.
    KillAgent,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        8 => (1u64..=12).prop_map(Step::Send),
        3 => Just(Step::HearAcknowledgements),
        2 => (0u64..=4).prop_map(|back| Step::Reopen { back }),
        2 => Just(Step::Disconnect),
        1 => Just(Step::Cut),
    ]
}

/// A case: its steps, and where (if anywhere) the agent is killed among them.
fn session_case() -> impl proptest::strategy::Strategy<Value = Vec<Step>> {
    use proptest::prelude::*;
    (proptest::collection::vec(step(), 1..24), proptest::option::weighted(0.15, any::<prop::sample::Index>())).prop_map(
        |(mut steps, kill)| {
            if let Some(at) = kill {
                steps.insert(at.index(steps.len() + 1), Step::KillAgent);
            }
            steps
        },
    )
}

/// A client's connection in a case: what it wrote (`first..next`) and heard (`ACK` up to
/// `heard`, from `first - 1`).
struct CaseConnection {
    lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    write: tokio::net::unix::OwnedWriteHalf,
    first: u64,
    next: u64,
    heard: u64,
}

/// A client session driven step by step; it checks every line the agent says against the
/// protocol as it hears it.
struct CaseClient {
    socket: std::path::PathBuf,
    session: String,
    tag: String,
    /// The time each record was logged (number n at n - 1): the same on every send.
    logged: Vec<i64>,
    /// Every record up to this number is acknowledged (ACKs are cumulative).
    acked: u64,
    /// Records written, sends again included.
    written: u64,
    connection: Option<CaseConnection>,
}

impl CaseClient {
    async fn open(&mut self, first: u64) -> Result<(), String> {
        self.connection = None;
        for _ in 0..100 {
            if let Ok(stream) = UnixStream::connect(&self.socket).await {
                let (read, mut write) = stream.into_split();
                let handshake = format!("SLUICE/2 ACK session={} first={first}\n", self.session);
                if write.write_all(handshake.as_bytes()).await.is_ok() {
                    let mut lines = BufReader::new(read).lines();
                    match tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await {
                        Ok(Ok(Some(line))) if line == "OK spooled" => {
                            self.connection =
                                Some(CaseConnection { lines, write, first, next: first, heard: first - 1 });
                            return Ok(());
                        }
                        other => return Err(format!("the handshake was answered {other:?}")),
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("the agent's socket took no connection for 5 s".to_string())
    }

    async fn connection(&mut self) -> Result<&mut CaseConnection, String> {
        if self.connection.is_none() {
            self.open(self.acked + 1).await?;
        }
        Ok(self.connection.as_mut().expect("open"))
    }

    /// The line of record `n` (logging it now if it is new), without its newline.
    fn line(&mut self, n: u64) -> String {
        if n > self.logged.len() as u64 {
            self.logged.push(chrono::Utc::now().timestamp_micros());
        }
        format!("{} {}", self.logged[n as usize - 1], numbered(&self.tag, n))
    }

    async fn send(&mut self, records: u64) -> Result<(), String> {
        let first = self.connection().await?.next;
        let text: String = (first..first + records).map(|n| self.line(n) + "\n").collect();
        let connection = self.connection.as_mut().expect("open");
        if connection.write.write_all(text.as_bytes()).await.is_err() {
            return Err("the agent closed a connection it had not finished".to_string());
        }
        connection.next += records;
        self.written += records;
        Ok(())
    }

    async fn hear_acknowledgements(&mut self) -> Result<(), String> {
        let Some(connection) = self.connection.as_mut() else { return Ok(()) };
        let (first, last) = (connection.first, connection.next - 1);
        while connection.heard < last {
            let line = match tokio::time::timeout(Duration::from_secs(20), connection.lines.next_line()).await {
                Ok(Ok(Some(line))) => line,
                other => {
                    return Err(format!(
                        "waiting for ACK {last} (heard {}), the agent said {other:?}",
                        connection.heard
                    ));
                }
            };
            let number = line.strip_prefix("ACK ").and_then(|n| n.parse::<u64>().ok());
            match number {
                Some(n) if n >= first && n <= last && n > connection.heard => {
                    connection.heard = n;
                    self.acked = self.acked.max(n);
                }
                _ => return Err(format!("{line:?} on a connection that sent {first}..={last}")),
            }
        }
        Ok(())
    }

    async fn cut(&mut self) -> Result<(), String> {
        let next = self.connection().await?.next;
        let line = self.line(next);
        let connection = self.connection.as_mut().expect("open");
        let _ = connection.write.write_all(&line.as_bytes()[..line.len() / 2]).await;
        let _ = connection.write.shutdown().await;
        self.connection = None;
        Ok(())
    }

    /// Sends every record logged and not yet heard acknowledged, until all are.
    async fn finish(&mut self) -> Result<(), String> {
        for _ in 0..5 {
            let total = self.logged.len() as u64;
            if self.acked >= total {
                return Ok(());
            }
            self.open(self.acked + 1).await?;
            let left = total - self.acked;
            self.send(left).await?;
            self.hear_acknowledgements().await?;
        }
        Err(format!("{} of {} records acknowledged after five connections", self.acked, self.logged.len()))
    }
}

/// Issue 31: the session handshake under any interleaving a client can produce — records sent
/// once or several times, from the lowest one not heard acknowledged or from below it,
/// connections dropped with acknowledgements unread or a line half written, the agent killed —
/// stores each record exactly once, and every line the agent says carries a number the
/// connection sent, acknowledged in order. The cases are drawn from `SLUICE_PROP_SEED` (12 by
/// default; `SLUICE_PROP_CASES` of them, 100 by default) and their rows checked together at the
/// end, so a run costs one drain; a failing case prints its steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn any_interleaving_of_sends_acknowledgements_and_disconnects_stores_each_record_once() {
    use proptest::strategy::{Strategy, ValueTree};
    let from_env = |name: &str| std::env::var(name).ok().and_then(|value| value.parse::<u64>().ok());
    let (cases, seed) = (from_env("SLUICE_PROP_CASES").unwrap_or(100), from_env("SLUICE_PROP_SEED").unwrap_or(12));
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    });
    let cases: Vec<Vec<Step>> =
        (0..cases).map(|_| session_case().new_tree(&mut runner).expect("a case").current()).collect();

    let setup = Scenario::new("session-prop")
        .disk_buffer()
        .set("buffer", "fsync", "always")
        .set("ingest", "ack_point", "spooled")
        .build()
        .await;
    let (config, topic) = (&setup.config, &setup.topic);
    let _persister = setup.persister().await;
    let db = setup.db().await;
    let mut agent = setup.agent().await;
    let mut totals = Vec::new();
    for (index, steps) in cases.iter().enumerate() {
        let mut client = CaseClient {
            socket: config.socket(),
            session: uuid::Uuid::now_v7().simple().to_string(),
            tag: format!("{topic}-{index}"),
            logged: Vec::new(),
            acked: 0,
            written: 0,
            connection: None,
        };
        for step in steps {
            let done = match step {
                Step::Send(records) => client.send(*records).await,
                Step::HearAcknowledgements => client.hear_acknowledgements().await,
                Step::Reopen { back } => client.open((client.acked + 1).saturating_sub(*back).max(1)).await,
                Step::Disconnect => {
                    client.connection = None;
                    Ok(())
                }
                Step::Cut => client.cut().await,
                Step::KillAgent => {
                    client.connection = None;
                    agent.kill();
                    agent = setup.agent().await;
                    Ok(())
                }
            };
            if let Err(error) = done {
                panic!("case {index} at {step:?}: {error}\nsteps: {steps:?}\nagent:\n{}", agent.log_tail(40));
            }
        }
        if let Err(error) = client.finish().await {
            panic!("case {index} finishing: {error}\nsteps: {steps:?}\nagent:\n{}", agent.log_tail(40));
        }
        totals.push((client.tag.clone(), client.logged.len() as u64, client.written, steps));
    }

    let total: u64 = totals.iter().map(|(_, records, _, _)| records).sum();
    let kills = cases.iter().flatten().filter(|step| matches!(step, Step::KillAgent)).count();
    let written: u64 = totals.iter().map(|(_, _, written, _)| written).sum();
    eprintln!("{} cases (seed {seed}): {total} records written {written} times, {kills} agent kills", cases.len());
    until_rows(&db, total as i64).await;
    // Past this, a duplicate would have arrived too.
    until_nothing_left(config).await;
    for (tag, records, _, steps) in &totals {
        let numbers = stored_numbers(&db, tag).await;
        let mut sorted = numbers.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (1..=*records).collect::<Vec<_>>(), "case {tag}: each record once; steps {steps:?}");
    }
    drop(agent);
}

/// Issue 31 (cold review): a session's partial record given up for read room another connection
/// waited for, after its acknowledgements could no longer be written, was refused without a
/// number and the connection read on: its next record took the given-up record's number, so it
/// was stored under that id and then, sent again under its own, stored twice. A session
/// connection now reads no further once a record cannot be numbered, as for `too_large` and
/// `truncated`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_record_given_up_for_read_room_after_its_acks_failed_does_not_shift_the_numbers() {
    // One record of 8 MiB may need the whole read pool: a partial one holds it alone.
    let pipeline = Scenario::new("session-giveup").listener("default", "max_record_size", "8 MiB").pipeline().await;
    let (config, db, tag) = (&pipeline.config, &pipeline.db, pipeline.topic.clone());
    let session = uuid::Uuid::now_v7().simple().to_string();
    let times: Vec<i64> = (0..3).map(|n| chrono::Utc::now().timestamp_micros() + n).collect();
    let line = |n: u64| format!("{} {}\n", times[n as usize - 1], numbered(&tag, n));

    let stream = UnixStream::connect(config.socket()).await.expect("connect");
    let (read, mut write) = stream.into_split();
    write.write_all(format!("SLUICE/2 ACK session={session} first=1\n").as_bytes()).await.expect("handshake");
    let mut lines = BufReader::new(read).lines();
    let hello = within(Duration::from_secs(10), "the handshake's answer", lines.next_line()).await;
    assert!(matches!(&hello, Ok(Some(line)) if line.starts_with("OK ")), "{hello:?}");
    // The client stops reading: the agent's next acknowledgement cannot be written.
    let read = lines.into_inner().into_inner();
    let stream = read.reunite(write).expect("the halves of one stream");
    let stream = stream.into_std().expect("std stream");
    stream.shutdown(std::net::Shutdown::Read).expect("shut the read side");
    let mut stream = UnixStream::from_std(stream).expect("tokio stream");
    stream.write_all(line(1).as_bytes()).await.expect("record 1");
    until_rows(db, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // its ACK written, and failed

    // Record 2 stops half way, holding the read pool; another connection's long line waits for it.
    let head = format!("{} {{\"tag\":\"{tag}\",\"pad\":\"", times[1]);
    stream.write_all(head.as_bytes()).await.expect("record 2's head");
    stream.write_all(&vec![b'h'; 8 * 1024 * 1024 - 4096]).await.expect("record 2's body");
    let mut waiter = UnixStream::connect(config.socket()).await.expect("connect");
    let mut long = format!("{{\"message\":\"waiting\",\"pad\":\"{}\"}}", "w".repeat(100 * 1024)).into_bytes();
    long.push(b'\n');
    waiter.write_all(&long).await.expect("the waiting line");
    let truncated = [("listener", "default"), ("reason", "truncated")];
    until_metric_at_least(config.agent_admin(), sluice::telemetry::INGEST_REJECTED, &truncated, 1.0).await;
    // The writer goes on: the rest of record 2, then record 3 — which must not take number 2.
    let _ = stream.write_all(b"\"}\n").await;
    let _ = stream.write_all(line(3).as_bytes()).await;
    drop(stream);

    // The client sends again what it never heard acknowledged: 2 and 3, under their numbers.
    let mut again = UnixStream::connect(config.socket()).await.expect("connect");
    let text = format!("SLUICE/2 ACK session={session} first=2\n{}{}", line(2), line(3));
    again.write_all(text.as_bytes()).await.expect("resend");
    again.shutdown().await.expect("shutdown");
    let mut answers = String::new();
    let _ = within(Duration::from_secs(20), "the resend's acknowledgements", again.read_to_string(&mut answers)).await;
    assert!(answers.lines().any(|line| line == "ACK 3"), "{answers:?}");

    until_rows(db, 4).await; // the three records and the waiting line
    until_nothing_left(config).await;
    let numbers = stored_numbers(db, &tag).await;
    assert_each_once(&numbers, 1..=3);
}
