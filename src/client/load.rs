//! The load generator: records split across connections (one thread each), at an optional
//! rate, for `sluice loadgen`, the benchmark (`sluice-bench`) and the integration tests' steady
//! load.
//!
//! Owns: connecting, sharing the records and the rate out over the connections, pacing, the
//! two ways of writing ([`Writes`]), stopping on request, and what was written. Must not: make
//! the records (the caller's [`Records`] does), read anything back, or judge speed (the
//! benchmark does, with its own checks).
//!
//! Plain threads and blocking writes, no async runtime: a blocked `write` (a full socket, an
//! agent whose buffer blocks) is what an app feels, and the benchmark times exactly that.

use std::io::{BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Record `index` of connection `connection`, newline included.
pub type Records = Arc<dyn Fn(u32, u64) -> Vec<u8> + Send + Sync>;

/// How records reach the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// Through a 64 KiB buffer, flushed before each pause and at the end: as many records per
    /// system call as fit (an app logging through a buffered writer).
    Buffered,
    /// One blocking `write` per record, each call timed ([`Report::write_nanos`]).
    Timed,
}

/// How many records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// This many in all, shared evenly over the connections (the first ones take one more
    /// when it does not divide).
    Records(u64),
    /// Until [`Running::stop`].
    UntilStopped,
}

/// A load to write.
#[derive(Debug, Clone)]
pub struct Load {
    /// The socket.
    pub socket: PathBuf,
    /// Concurrent connections (at least one).
    pub connections: u32,
    /// How many records.
    pub amount: Amount,
    /// Records per second over all connections; 0: as fast as the socket takes them.
    pub rate: u64,
    /// How they are written.
    pub writes: Writes,
}

/// What was written.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Records written.
    pub records: u64,
    /// Bytes written, newlines included.
    pub bytes: u64,
    /// From the first write to the last connection's close.
    pub elapsed: Duration,
    /// With [`Writes::Timed`]: every write call's duration, nanoseconds (saturating at
    /// `u32::MAX`), connection after connection.
    pub write_nanos: Vec<u32>,
}

impl Report {
    /// Records per second.
    pub fn records_per_second(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// What one connection wrote: records, bytes, call durations.
type Written = (u64, u64, Vec<u32>);

/// A load being written.
pub struct Running {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<std::io::Result<Written>>>,
    started: Instant,
}

impl Load {
    /// Connects every connection, then writes in the background.
    pub fn start(&self, records: Records) -> std::io::Result<Running> {
        let connections = self.connections.max(1);
        let mut streams = Vec::new();
        for _ in 0..connections {
            streams.push(UnixStream::connect(&self.socket)?);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let per_connection_rate = self.rate as f64 / f64::from(connections);
        let threads = streams
            .into_iter()
            .zip(0..)
            .map(|(stream, connection)| {
                let share = match self.amount {
                    Amount::Records(total) => Some(
                        total / u64::from(connections)
                            + u64::from(u64::from(connection) < total % u64::from(connections)),
                    ),
                    Amount::UntilStopped => None,
                };
                let (records, stop, writes) = (records.clone(), stop.clone(), self.writes);
                std::thread::spawn(move || {
                    write_connection(stream, connection, share, per_connection_rate, writes, &*records, &stop)
                })
            })
            .collect();
        Ok(Running { stop, threads, started })
    }

    /// Writes the whole load and waits until every connection has closed.
    pub fn run(&self, records: Records) -> std::io::Result<Report> {
        self.start(records)?.wait()
    }
}

impl Running {
    /// Waits until every connection has written its share and closed.
    pub fn wait(self) -> std::io::Result<Report> {
        let mut report = Report::default();
        for thread in self.threads {
            let (records, bytes, mut nanos) =
                thread.join().map_err(|_| std::io::Error::other("a load connection panicked"))??;
            report.records += records;
            report.bytes += bytes;
            report.write_nanos.append(&mut nanos);
        }
        report.elapsed = self.started.elapsed();
        Ok(report)
    }

    /// Stops after each connection's current record and closes them.
    pub fn stop(self) -> std::io::Result<Report> {
        self.stop.store(true, Ordering::Relaxed);
        self.wait()
    }
}

#[expect(clippy::disallowed_methods, reason = "a plain thread per connection, no async runtime: blocking is the point")]
fn write_connection(
    stream: UnixStream,
    connection: u32,
    share: Option<u64>,
    rate: f64,
    writes: Writes,
    records: &(dyn Fn(u32, u64) -> Vec<u8> + Send + Sync),
    stop: &AtomicBool,
) -> std::io::Result<Written> {
    let mut timed = Vec::with_capacity(match (writes, share) {
        (Writes::Timed, Some(share)) => usize::try_from(share).unwrap_or(0),
        _ => 0,
    });
    let mut writer = BufWriter::with_capacity(if writes == Writes::Buffered { 64 * 1024 } else { 0 }, stream);
    let (mut written, mut bytes) = (0u64, 0u64);
    let started = Instant::now();
    let mut index = 0u64;
    while share.is_none_or(|share| index < share) && !stop.load(Ordering::Relaxed) {
        if rate > 0.0 {
            let due = started + Duration::from_secs_f64(index as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                writer.flush()?;
                std::thread::sleep(wait);
            }
        }
        let line = records(connection, index);
        match writes {
            Writes::Buffered => writer.write_all(&line)?,
            Writes::Timed => {
                let call = Instant::now();
                writer.get_mut().write_all(&line)?;
                timed.push(u32::try_from(call.elapsed().as_nanos()).unwrap_or(u32::MAX));
            }
        }
        written += 1;
        bytes += line.len() as u64;
        index += 1;
    }
    writer.flush()?;
    let stream = writer.into_inner().map_err(|error| error.into_error())?;
    stream.shutdown(std::net::Shutdown::Write)?;
    Ok((written, bytes, timed))
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    use super::*;

    /// A socket whose reader keeps every byte; what it read once the writers closed.
    fn reader(dir: &std::path::Path, connections: usize) -> (PathBuf, JoinHandle<Vec<Vec<u8>>>) {
        let path = dir.join("load.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let reader = std::thread::spawn(move || {
            let readers: Vec<_> = (0..connections)
                .map(|_| {
                    let (mut stream, _) = listener.accept().expect("accept");
                    std::thread::spawn(move || {
                        let mut bytes = Vec::new();
                        stream.read_to_end(&mut bytes).expect("read");
                        bytes
                    })
                })
                .collect();
            readers.into_iter().map(|reader| reader.join().expect("reader")).collect()
        });
        (path, reader)
    }

    fn numbered() -> Records {
        Arc::new(|connection, index| format!("{connection}:{index}\n").into_bytes())
    }

    #[test]
    fn records_are_split_evenly_over_the_connections_each_numbered_from_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (socket, reader) = reader(dir.path(), 3);
        let load = Load { socket, connections: 3, amount: Amount::Records(10), rate: 0, writes: Writes::Timed };
        let report = load.run(numbered()).expect("load");
        assert_eq!((report.records, report.write_nanos.len()), (10, 10));
        let mut read: Vec<String> =
            reader.join().expect("reader").into_iter().map(|b| String::from_utf8(b).expect("utf-8")).collect();
        read.sort();
        assert_eq!(read, ["0:0\n0:1\n0:2\n0:3\n", "1:0\n1:1\n1:2\n", "2:0\n2:1\n2:2\n"]);
        assert_eq!(report.bytes, read.iter().map(|r| r.len() as u64).sum::<u64>());
    }

    #[test]
    #[expect(clippy::disallowed_methods, reason = "no runtime here: the load runs on threads of its own")]
    fn a_rate_paces_the_writes_and_a_stop_ends_them_with_every_record_written_counted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (socket, reader) = reader(dir.path(), 2);
        let load = Load { socket, connections: 2, amount: Amount::UntilStopped, rate: 200, writes: Writes::Buffered };
        let running = load.start(numbered()).expect("load");
        std::thread::sleep(Duration::from_millis(500));
        let report = running.stop().expect("stop");
        let read: usize =
            reader.join().expect("reader").iter().map(|b| b.iter().filter(|c| **c == b'\n').count()).sum();
        assert_eq!(read as u64, report.records);
        // A writer is never ahead of its schedule (however late the stop comes): at most 200/s
        // over the time it ran, plus the one each connection writes at its start; and a late one
        // catches up, so far fewer means the pacing is off.
        let most = (200.0 * report.elapsed.as_secs_f64()).ceil() as u64 + 2;
        let fewest = (50.0 * report.elapsed.as_secs_f64()) as u64;
        assert!(
            (fewest..=most).contains(&report.records),
            "paced at 200/s: {} records in {:?}",
            report.records,
            report.elapsed
        );
        assert!(report.write_nanos.is_empty(), "buffered writes are not timed");
    }
}
