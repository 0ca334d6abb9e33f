//! Steady load for fault tests: numbered records written at a rate until stopped, plain or in
//! acknowledged mode, so that a test can say at the end exactly which records must be stored.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

use super::acks::{AckReader, Settled, open_acknowledged};

/// Record `n` of the run tagged `tag`, as JSON with a little padding (about 200 bytes).
pub fn numbered(tag: &str, n: u64) -> String {
    format!(r#"{{"tag":"{tag}","n":{n},"level":"info","message":"numbered record {n}","pad":"{}"}}"#, "p".repeat(100))
}

/// The numbers of the records of run `tag` among `payloads`, with repeats (a duplicate shows).
pub fn numbers_in(tag: &str, payloads: &[String]) -> Vec<u64> {
    let prefix = format!(r#"{{"tag":"{tag}","n":"#);
    payloads.iter().filter_map(|p| p.strip_prefix(&prefix)?.split(',').next()?.parse().ok()).collect()
}

/// Numbered records written at a steady rate over several connections until stopped.
pub struct Load {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    written: Arc<AtomicU64>,
}

impl Load {
    /// Starts writing `rate` records/s in total over `connections` connections to `socket`.
    pub fn start(socket: &Path, tag: &str, rate: u64, connections: u64) -> Self {
        let stop = CancellationToken::new();
        let written = Arc::new(AtomicU64::new(0));
        let next = Arc::new(AtomicU64::new(0));
        let tasks = (0..connections)
            .map(|_| {
                let (socket, tag, stop, written, next) =
                    (socket.to_path_buf(), tag.to_string(), stop.clone(), written.clone(), next.clone());
                tokio::spawn(async move {
                    let mut stream = UnixStream::connect(&socket).await.expect("connect for load");
                    let per_tick = (rate / connections / 100).max(1);
                    let mut tick = tokio::time::interval(Duration::from_millis(10));
                    while !stop.is_cancelled() {
                        tick.tick().await;
                        let mut text = String::new();
                        let mut numbers = 0;
                        for _ in 0..per_tick {
                            text.push_str(&numbered(&tag, next.fetch_add(1, Ordering::Relaxed)));
                            text.push('\n');
                            numbers += 1;
                        }
                        // A blocked write (block policy, full buffer) is what an app feels; the
                        // load just waits with it.
                        stream.write_all(text.as_bytes()).await.expect("the agent keeps reading while the load runs");
                        written.fetch_add(numbers, Ordering::Relaxed);
                    }
                    let _ = stream.shutdown().await;
                })
            })
            .collect();
        Self { stop, tasks, written }
    }

    /// Stops, closes the connections and returns how many records were written (numbered
    /// 0..that).
    pub async fn stop(self) -> u64 {
        self.stop.cancel();
        for task in self.tasks {
            tokio::time::timeout(Duration::from_secs(60), task).await.expect("load stops").expect("load task");
        }
        self.written.load(Ordering::Relaxed)
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
