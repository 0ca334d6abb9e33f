//! The soak's writers: every record carries its writer, its number and its try
//! (`{"w":"a1","seq":7,"try":0,…}`), so the end can say of each one where it went.
//!
//! - [`AckedWriter`]: acknowledged mode. It keeps what was ACKed and NAKed; a record still
//!   unsettled when its connection breaks is sent again (a new try) on the next connection.
//! - [`AckedWriter::start_session`]: a client session (`SLUICE/2`, docs/PROTOCOL.md): it numbers its records
//!   itself and sends again, under the same numbers and times, everything from the lowest record
//!   whose try it did not hear settled. Its records carry `try` 0 on every send: a record
//!   stored twice is two rows with one key.
//! - [`PlainWriter`]: no acknowledgements. One record per `write` call, so it knows exactly which
//!   records the kernel took (those the agent will read, or count); a write cut short leaves one
//!   record "uncertain".

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

use crate::support::{AckReader, Acknowledged, Settled, open_acknowledged};

/// The record `seq` (try `attempt`) of writer `writer`: about 200 bytes of JSON.
pub fn record(writer: &str, seq: u64, attempt: u32) -> String {
    let millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!(
        r#"{{"w":"{writer}","seq":{seq},"try":{attempt},"t":{millis},"level":"info","message":"soak record","pad":"{}"}}"#,
        "s".repeat(96)
    )
}

/// The record `seq` of a session writer, logged at `micros` (the same text on every send).
fn session_record(writer: &str, seq: u64, micros: i64) -> String {
    format!(
        r#"{{"w":"{writer}","seq":{seq},"try":0,"t":{},"level":"info","message":"soak record","pad":"{}"}}"#,
        micros / 1000,
        "c".repeat(96)
    )
}

/// What an acknowledged writer knows at the end.
#[derive(Default, Debug)]
pub struct AckedOutcome {
    /// Each record's tries, in order; a try ACKed, NAKed (with the reason) or unknown (its
    /// connection broke before it was settled, so it was sent again).
    pub tries: BTreeMap<u64, Vec<Try>>,
    pub sent: u64,
    pub resent: u64,
    pub connections: u64,
    /// Longest time from a record's write to its ACK.
    pub max_ack_wait: Duration,
    /// Acknowledgement lines the protocol does not allow (an ACK beyond what was sent, a NAK
    /// of a record already settled): each a failure of the soak.
    pub violations: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Try {
    Acked,
    Naked(String),
    Unknown,
    /// Written when the writer stopped and never settled (a stuck agent).
    Unsettled,
}

pub struct AckedWriter {
    stop: CancellationToken,
    /// Cancelled when the writer must give up waiting for its last acknowledgements.
    give_up: CancellationToken,
    task: tokio::task::JoinHandle<AckedOutcome>,
}

impl AckedWriter {
    /// Acknowledged mode (`SLUICE/1`): a record sent again is a new record (`try` 1, 2…).
    pub fn start(name: &str, socket: PathBuf, rate: u64) -> Self {
        let (stop, give_up) = (CancellationToken::new(), CancellationToken::new());
        let task = tokio::spawn(run_acked(name.to_string(), socket, rate, stop.clone(), give_up.clone()));
        Self { stop, give_up, task }
    }

    /// A client session (`SLUICE/2`): a record sent again keeps its number and time.
    pub fn start_session(name: &str, socket: PathBuf, rate: u64) -> Self {
        let (stop, give_up) = (CancellationToken::new(), CancellationToken::new());
        let task = tokio::spawn(run_session(name.to_string(), socket, rate, stop.clone(), give_up.clone()));
        Self { stop, give_up, task }
    }

    /// Stops writing new records; keeps (re)sending until every record is settled or `limit`
    /// passes.
    pub async fn finish(self, limit: Duration) -> AckedOutcome {
        self.stop.cancel();
        let give_up = self.give_up.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(limit).await;
            give_up.cancel();
        });
        let outcome = tokio::time::timeout(limit + Duration::from_secs(40), self.task)
            .await
            .expect("the writer ends after giving up")
            .expect("writer task");
        timer.abort();
        outcome
    }
}

struct Sent {
    seq: u64,
    attempt: u32,
    at: Instant,
}

async fn run_acked(
    name: String,
    socket: PathBuf,
    rate: u64,
    stop: CancellationToken,
    give_up: CancellationToken,
) -> AckedOutcome {
    let mut outcome = AckedOutcome::default();
    let mut next = 0u64;
    // Records to send again (their last try is unknown), oldest first.
    let mut again: VecDeque<(u64, u32)> = VecDeque::new();
    let per_tick = (rate / 100).max(1);
    loop {
        if give_up.is_cancelled() || (stop.is_cancelled() && again.is_empty()) {
            break;
        }
        let Some((lines, mut write)) = open_acknowledged(&socket).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        outcome.connections += 1;
        // This connection's records by sequence number (1-based), and what the agent said.
        let sent: Arc<Mutex<(Vec<Sent>, AckReader)>> = Arc::default();
        let reader = read_acks(lines, sent.clone(), |line| line.to_string());
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let mut broken = false;
        while !broken && !give_up.is_cancelled() {
            tick.tick().await;
            let mut batch: Vec<(u64, u32)> = Vec::new();
            while batch.len() < per_tick as usize {
                if let Some(resend) = again.pop_front() {
                    batch.push(resend);
                } else if !stop.is_cancelled() {
                    batch.push((next, 0));
                    next += 1;
                } else {
                    break;
                }
            }
            if batch.is_empty() {
                break; // stopped, nothing left to send again: wait for the last acknowledgements
            }
            let text: String = batch.iter().map(|&(seq, attempt)| record(&name, seq, attempt) + "\n").collect();
            {
                let mut sent = sent.lock().expect("sent");
                sent.1.sent(batch.len());
                for &(seq, attempt) in &batch {
                    sent.0.push(Sent { seq, attempt, at: Instant::now() });
                    outcome.sent += 1;
                    if attempt > 0 {
                        outcome.resent += 1;
                    }
                }
            }
            // A write the agent does not take (a full buffer holds it) ends when the writer
            // gives up: then it is unsettled.
            tokio::select! {
                written = write.write_all(text.as_bytes()) => broken = written.is_err(),
                _ = give_up.cancelled() => break,
            }
        }
        end_connection(write, reader, &give_up, &mut outcome).await;
        let sent = sent.lock().expect("sent");
        for (record, state) in sent.0.iter().zip(sent.1.settled()) {
            let state = match state {
                Some(Settled::Acked) => Try::Acked,
                Some(Settled::Naked(reason)) => Try::Naked(reason.clone()),
                None if give_up.is_cancelled() => Try::Unsettled,
                None => Try::Unknown,
            };
            if state == Try::Unknown {
                again.push_back((record.seq, record.attempt + 1));
            }
            outcome.tries.entry(record.seq).or_default().push(state);
        }
    }
    // Records queued to send again when the writer gave up are unsettled too.
    for (seq, _) in again {
        if let Some(last) = outcome.tries.get_mut(&seq).and_then(|tries| tries.last_mut()) {
            *last = Try::Unsettled;
        }
    }
    outcome
}

/// Opens a connection of `session` whose first record is `first` (`SLUICE/2 ACK`, answered
/// `OK <point>`); `None` if the agent is not there, does not answer within a few seconds, or
/// answers otherwise.
async fn open_session(socket: &std::path::Path, session: &str, first: u64) -> Option<Acknowledged> {
    let stream = tokio::time::timeout(Duration::from_secs(2), UnixStream::connect(socket)).await.ok()?.ok()?;
    let (read, mut write) = stream.into_split();
    write.write_all(format!("SLUICE/2 ACK session={session} first={first}\n").as_bytes()).await.ok()?;
    let mut lines = BufReader::new(read).lines();
    match tokio::time::timeout(Duration::from_secs(5), lines.next_line()).await {
        Ok(Ok(Some(line))) if line.starts_with("OK ") => Some((lines, write)),
        _ => None,
    }
}

/// The session's acknowledgement lines carry its own numbers; the connection's [`AckReader`]
/// counts from 1 on each connection: `n` becomes `n - first + 1`.
fn connection_numbered(line: &str, first: u64) -> String {
    let mut words = line.splitn(3, ' ');
    match (words.next(), words.next().and_then(|n| n.parse::<u64>().ok())) {
        (Some(kind), Some(n)) if n >= first => {
            let rest = words.next().map(|r| format!(" {r}")).unwrap_or_default();
            format!("{kind} {}{rest}", n - first + 1)
        }
        _ => line.to_string(), // not in the protocol: AckReader says so
    }
}

async fn run_session(
    name: String,
    socket: PathBuf,
    rate: u64,
    stop: CancellationToken,
    give_up: CancellationToken,
) -> AckedOutcome {
    let session = uuid::Uuid::now_v7().simple().to_string();
    let mut outcome = AckedOutcome::default();
    // The time each record was logged, by number (1-based): the same on every send.
    let mut logged: Vec<i64> = Vec::new();
    // The lowest record whose last try was not heard settled: each connection starts there.
    let mut from = 1u64;
    let per_tick = (rate / 100).max(1);
    loop {
        let unsettled = from <= logged.len() as u64;
        if give_up.is_cancelled() || (stop.is_cancelled() && !unsettled) {
            break;
        }
        let Some((lines, mut write)) = open_session(&socket, &session, from).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        outcome.connections += 1;
        let first = from;
        let sent: Arc<Mutex<(Vec<Sent>, AckReader)>> = Arc::default();
        let reader = read_acks(lines, sent.clone(), move |line| connection_numbered(line, first));
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let mut next = first;
        let mut broken = false;
        while !broken && !give_up.is_cancelled() {
            tick.tick().await;
            let mut text = String::new();
            let mut batch = 0;
            while batch < per_tick {
                if next > logged.len() as u64 {
                    if stop.is_cancelled() {
                        break;
                    }
                    logged.push(chrono::Utc::now().timestamp_micros());
                }
                let micros = logged[next as usize - 1];
                text.push_str(&format!("{micros} {}\n", session_record(&name, next, micros)));
                let mut sent = sent.lock().expect("sent");
                sent.1.sent(1);
                sent.0.push(Sent { seq: next, attempt: 0, at: Instant::now() });
                outcome.sent += 1;
                if outcome.tries.get(&next).is_some_and(|tries| !tries.is_empty()) {
                    outcome.resent += 1;
                }
                next += 1;
                batch += 1;
            }
            if batch == 0 {
                break; // stopped, everything sent: wait for the last acknowledgements
            }
            tokio::select! {
                written = write.write_all(text.as_bytes()) => broken = written.is_err(),
                _ = give_up.cancelled() => break,
            }
        }
        end_connection(write, reader, &give_up, &mut outcome).await;
        let sent = sent.lock().expect("sent");
        // The next connection starts at the first record not heard settled; those after it are
        // sent again too (the numbers of a connection follow each other), settled or not.
        from = next;
        for (record, state) in sent.0.iter().zip(sent.1.settled()) {
            let state = match state {
                Some(Settled::Acked) => Try::Acked,
                Some(Settled::Naked(reason)) => Try::Naked(reason.clone()),
                None if give_up.is_cancelled() => Try::Unsettled,
                None => Try::Unknown,
            };
            if state == Try::Unknown {
                from = from.min(record.seq);
            }
            outcome.tries.entry(record.seq).or_default().push(state);
        }
    }
    // Records still to be sent again when the writer gave up are unsettled.
    for seq in from..=logged.len() as u64 {
        if let Some(last) = outcome.tries.get_mut(&seq).and_then(|tries| tries.last_mut())
            && *last == Try::Unknown
        {
            *last = Try::Unsettled;
        }
    }
    outcome
}

/// What the agent says on one connection, read until it closes: each line (renumbered to the
/// connection's count by `renumber`) applied to `sent`; the longest wait for an ACK, and the
/// first line the protocol does not allow (a finding, not a reason to resend).
fn read_acks(
    mut lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    sent: Arc<Mutex<(Vec<Sent>, AckReader)>>,
    renumber: impl Fn(&str) -> String + Send + 'static,
) -> tokio::task::JoinHandle<(Duration, Option<String>)> {
    tokio::spawn(async move {
        let mut max_wait = Duration::ZERO;
        let mut violation = None;
        while let Ok(Some(line)) = lines.next_line().await {
            let mut sent = sent.lock().expect("sent");
            match sent.1.line(&renumber(&line)) {
                Ok(settled) => {
                    for (index, how) in settled {
                        if how == Settled::Acked {
                            max_wait = max_wait.max(sent.0[index].at.elapsed());
                        }
                    }
                }
                Err(error) => {
                    violation.get_or_insert(error);
                }
            }
        }
        (max_wait, violation)
    })
}

/// Ends a connection's writing and waits for the agent to close it (it does once every record
/// of the connection is settled, or it dies), unless the writer gives up first.
async fn end_connection(
    mut write: tokio::net::unix::OwnedWriteHalf,
    reader: tokio::task::JoinHandle<(Duration, Option<String>)>,
    give_up: &CancellationToken,
    outcome: &mut AckedOutcome,
) {
    let _ = write.shutdown().await;
    // The agent closes once every record of the connection is settled (or it dies).
    let max_wait = tokio::select! {
        result = reader => match result {
            Ok((max_wait, violation)) => {
                outcome.violations.extend(violation);
                max_wait
            }
            Err(error) => {
                outcome.violations.push(format!("the acknowledgement reader failed: {error}"));
                Duration::ZERO
            }
        },
        _ = give_up.cancelled() => Duration::ZERO,
    };
    outcome.max_ack_wait = outcome.max_ack_wait.max(max_wait);
}

/// What a plain writer knows at the end.
#[derive(Default, Debug)]
pub struct PlainOutcome {
    /// Records the kernel took whole.
    pub written: BTreeSet<u64>,
    /// Records a write cut short: part of the line may have reached the agent.
    pub uncertain: BTreeSet<u64>,
    /// Records not written at all (no connection, or the write failed at once).
    pub unwritten: u64,
    pub connections: u64,
}

pub struct PlainWriter {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<PlainOutcome>,
}

impl PlainWriter {
    pub fn start(name: &str, socket: PathBuf, rate: u64) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run_plain(name.to_string(), socket, rate, stop.clone()));
        Self { stop, task }
    }

    pub async fn finish(self) -> PlainOutcome {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the plain writer stops")
            .expect("plain writer task")
    }
}

async fn run_plain(name: String, socket: PathBuf, rate: u64, stop: CancellationToken) -> PlainOutcome {
    let mut outcome = PlainOutcome::default();
    let mut next = 0u64;
    let per_tick = (rate / 100).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut stream: Option<UnixStream> = None;
    while !stop.is_cancelled() {
        tick.tick().await;
        if stream.is_none()
            && let Ok(Ok(connected)) =
                tokio::time::timeout(Duration::from_millis(500), UnixStream::connect(&socket)).await
        {
            outcome.connections += 1;
            stream = Some(connected);
        }
        for _ in 0..per_tick {
            let seq = next;
            next += 1;
            let Some(connected) = stream.as_mut() else {
                outcome.unwritten += 1;
                continue;
            };
            let line = record(&name, seq, 0) + "\n";
            // A blocked write is what the app feels (rate limits, a full buffer): bounded here so
            // the writer notices a stopped agent.
            match tokio::time::timeout(Duration::from_secs(5), write_counted(connected, line.as_bytes())).await {
                Ok(Ok(n)) if n == line.len() => {
                    outcome.written.insert(seq);
                }
                Ok(Ok(0)) | Ok(Err(_)) => {
                    outcome.unwritten += 1;
                    stream = None;
                }
                Ok(Ok(_)) | Err(_) => {
                    // Part of the line (or an unknown part, after a timeout) reached the socket.
                    outcome.uncertain.insert(seq);
                    stream = None;
                }
            }
        }
    }
    if let Some(mut connected) = stream {
        let _ = connected.shutdown().await;
    }
    outcome
}

/// Writes `bytes`, returning how many the kernel took before an error (or all of them).
async fn write_counted(stream: &mut UnixStream, bytes: &[u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < bytes.len() {
        match stream.write(&bytes[done..]).await {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(error) if done == 0 => return Err(error),
            Err(_) => break,
        }
    }
    Ok(done)
}
