//! Steady load for fault tests: numbered records written at a rate until stopped, plain (the
//! one load generator, `sluice::client::load`) or in acknowledged mode, so that a test can say
//! at the end exactly which records must be stored.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice::client::load::{self as generator, Amount, Records, Running, Writes};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::acks::{AckReader, Settled, open_acknowledged};

/// Record `n` of the run tagged `tag`, as JSON with a little padding (about 200 bytes).
pub fn numbered(tag: &str, n: u64) -> String {
    format!(r#"{{"tag":"{tag}","n":{n},"level":"info","message":"numbered record {n}","pad":"{}"}}"#, "p".repeat(100))
}

/// [`numbered`] records `numbers` of run `tag`, as lines for `send_lines`.
pub fn numbered_lines(tag: &str, numbers: std::ops::Range<u64>) -> Vec<Vec<u8>> {
    numbers.map(|n| numbered(tag, n).into_bytes()).collect()
}

/// The numbers of the records of run `tag` among `payloads`, with repeats (a duplicate shows).
pub fn numbers_in(tag: &str, payloads: &[String]) -> Vec<u64> {
    let prefix = format!(r#"{{"tag":"{tag}","n":"#);
    payloads.iter().filter_map(|p| p.strip_prefix(&prefix)?.split(',').next()?.parse().ok()).collect()
}

/// The numbers of run `tag` stored in `logs`, with repeats.
pub async fn stored_numbers(db: &tokio_postgres::Client, tag: &str) -> Vec<u64> {
    let payloads: Vec<String> = super::column(db, "SELECT coalesce(record::text, message) FROM logs").await;
    numbers_in(tag, &payloads)
}

/// Each of `expected` stored exactly once among `numbers` (what [`stored_numbers`] read), and
/// nothing else.
pub fn assert_each_once(numbers: &[u64], expected: impl IntoIterator<Item = u64>) {
    let expected: std::collections::BTreeSet<u64> = expected.into_iter().collect();
    let stored: std::collections::BTreeSet<u64> = numbers.iter().copied().collect();
    assert_eq!(numbers.len(), stored.len(), "duplicate rows");
    let missing: Vec<_> = expected.difference(&stored).take(10).collect();
    assert!(missing.is_empty(), "{} records missing, e.g. {missing:?}", expected.difference(&stored).count());
    let unexpected: Vec<_> = stored.difference(&expected).take(10).collect();
    assert!(unexpected.is_empty(), "unexpected records {unexpected:?}");
}

/// Numbered records written at a steady rate over several connections until stopped (the one
/// load generator, `sluice::client::load`, numbering across connections in the order written).
pub struct Load(Running);

impl Load {
    /// Starts writing `rate` records/s in total over `connections` connections to `socket`.
    /// A blocked write (block policy, full buffer) is what an app feels; the load just waits
    /// with it.
    pub fn start(socket: &Path, tag: &str, rate: u64, connections: u64) -> Self {
        let next = Arc::new(AtomicU64::new(0));
        let tag = tag.to_string();
        let records: Records = Arc::new(move |_, _| {
            let mut line = numbered(&tag, next.fetch_add(1, Ordering::Relaxed)).into_bytes();
            line.push(b'\n');
            line
        });
        let generator = generator::Load {
            socket: socket.to_path_buf(),
            connections: u32::try_from(connections).expect("a few connections"),
            amount: Amount::UntilStopped,
            rate,
            writes: Writes::Buffered,
        };
        Self(generator.start(records).expect("connect for load"))
    }

    /// Stops, closes the connections and returns how many records were written (numbered
    /// 0..that).
    pub async fn stop(self) -> u64 {
        let running = self.0;
        let stopped =
            tokio::time::timeout(Duration::from_secs(60), tokio::task::spawn_blocking(move || running.stop()));
        let report = stopped.await.expect("load stops").expect("load threads");
        report.expect("the agent keeps reading while the load runs").records
    }
}

/// A writer in acknowledged mode that survives agent restarts: it reconnects and carries on
/// numbering, and remembers which numbers the agent acknowledged.
pub struct AckedSender {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    acked: Arc<Mutex<BTreeSet<u64>>>,
    refused: Arc<Mutex<BTreeSet<u64>>>,
    sent: Arc<AtomicU64>,
}

impl AckedSender {
    /// Starts writing about `rate` records/s to `socket`.
    pub fn start(socket: &Path, tag: &str, rate: u64) -> Self {
        let stop = CancellationToken::new();
        let acked = Arc::new(Mutex::new(BTreeSet::new()));
        let refused = Arc::new(Mutex::new(BTreeSet::new()));
        let sent = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run_acked(
            socket.to_path_buf(),
            tag.to_string(),
            rate,
            stop.clone(),
            acked.clone(),
            refused.clone(),
            sent.clone(),
        ));
        Self { stop, task, acked, refused, sent }
    }

    /// Records written so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Stops writing; waits up to `settle` for outstanding acknowledgements.
    pub async fn stop(self, settle: Duration) -> (BTreeSet<u64>, BTreeSet<u64>) {
        self.stop.cancel();
        let (acked, refused) = (self.acked.clone(), self.refused.clone());
        let _ = tokio::time::timeout(settle + Duration::from_secs(5), self.task).await;
        let acked = acked.lock().expect("acked").clone();
        let refused = refused.lock().expect("refused").clone();
        (acked, refused)
    }
}

async fn run_acked(
    socket: PathBuf,
    tag: String,
    rate: u64,
    stop: CancellationToken,
    acked: Arc<Mutex<BTreeSet<u64>>>,
    refused: Arc<Mutex<BTreeSet<u64>>>,
    sent: Arc<AtomicU64>,
) {
    let mut next = 0u64;
    while !stop.is_cancelled() {
        let Some((mut lines, mut write)) = open_acknowledged(&socket).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // Numbers written on this connection, by sequence (seq 1 = index 0), and what the
        // agent said of them.
        let numbers: Arc<Mutex<(Vec<u64>, AckReader)>> = Arc::default();
        let reader = tokio::spawn({
            let (numbers, acked, refused) = (numbers.clone(), acked.clone(), refused.clone());
            async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut numbers = numbers.lock().expect("numbers");
                    let settled =
                        numbers.1.line(&line).unwrap_or_else(|error| panic!("broken acknowledgements: {error}"));
                    for (index, how) in settled {
                        let n = numbers.0[index];
                        match how {
                            Settled::Acked => acked.lock().expect("acked").insert(n),
                            Settled::Naked(_) => refused.lock().expect("refused").insert(n),
                        };
                    }
                }
            }
        });
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let per_tick = (rate / 100).max(1);
        let mut broken = false;
        while !stop.is_cancelled() && !broken {
            tick.tick().await;
            let mut text = String::new();
            let mut batch = Vec::new();
            for _ in 0..per_tick {
                text.push_str(&numbered(&tag, next));
                text.push('\n');
                batch.push(next);
                next += 1;
            }
            {
                let mut numbers = numbers.lock().expect("numbers");
                numbers.0.extend(&batch);
                numbers.1.sent(batch.len());
            }
            if write.write_all(text.as_bytes()).await.is_err() {
                broken = true;
            } else {
                sent.fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
        }
        let _ = write.shutdown().await;
        // Read the remaining acknowledgements (the agent closes when all are settled).
        let _ = tokio::time::timeout(Duration::from_secs(30), reader).await;
    }
}
