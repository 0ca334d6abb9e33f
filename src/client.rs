//! The client side of the socket: `sluice send` (records from arguments or stdin, for shells
//! and scripts) and `sluice loadgen` (sample records, the way an app would write them).
//!
//! Owns: a small, dependency-free writer and load generator for the demo and for tests (N
//! connections, a record count, an optional rate, a mix of JSON and plain-text lines). Must not:
//! be used to make claims about speed; that is the benchmark's job (its own command, with its
//! own checks).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWriteExt, BufWriter};
use tokio::net::UnixStream;

/// What to send.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// The agent's socket.
    pub socket: PathBuf,
    /// Records in total, spread evenly over the connections.
    pub records: u64,
    /// Concurrent connections.
    pub connections: u32,
    /// Records per second over all connections; 0 sends as fast as the socket takes them.
    pub rate: u64,
    /// Every n-th record is plain text, the others JSON (0: all JSON).
    pub text_every: u64,
    /// Pad (or cut) every record to exactly this many bytes (0: natural size, ~110 bytes).
    pub size: usize,
}

/// What was sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadReport {
    /// Records written.
    pub records: u64,
    /// Bytes written, newlines included.
    pub bytes: u64,
    /// Wall time from first connect to last close.
    pub elapsed: Duration,
}

impl LoadReport {
    /// Records per second.
    pub fn records_per_second(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The `index`-th record of connection `connection`: JSON, or text every `text_every`-th.
pub fn sample_record(connection: u32, index: u64, text_every: u64) -> String {
    if text_every > 0 && index % text_every == text_every - 1 {
        format!("plain text record {connection}-{index}: GET /api/orders/{index} 200 in {} ms", index % 97)
    } else {
        format!(
            r#"{{"time":"{}","level":"{}","message":"order {index} processed","connection":{connection},"seq":{index},"user":"user-{}"}}"#,
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            ["info", "debug", "warn", "error"][(index % 4) as usize],
            index % 1000,
        )
    }
}

/// Pads a record to `size` bytes (a JSON record gets a `pad` field, so it stays valid JSON), or
/// cuts it if it is longer (it may then be a text record).
fn fit(line: &mut String, size: usize) {
    if line.len() >= size {
        line.truncate(size);
        return;
    }
    if line.ends_with('}') && line.len() + 10 <= size {
        line.pop();
        line.push_str(",\"pad\":\"");
        let fill = size - line.len() - 2;
        line.extend(std::iter::repeat_n('p', fill));
        line.push_str("\"}");
    } else if line.ends_with('}') {
        // Too little room for a field: whitespace inside the object keeps it JSON.
        line.pop();
        let fill = size - line.len() - 1;
        line.extend(std::iter::repeat_n(' ', fill));
        line.push('}');
    } else {
        let fill = size - line.len();
        line.extend(std::iter::repeat_n(' ', fill));
    }
}

/// Sends the load and waits until every connection has written and closed.
pub async fn run(spec: &LoadSpec) -> std::io::Result<LoadReport> {
    let started = Instant::now();
    let connections = spec.connections.max(1);
    let mut tasks = Vec::new();
    for connection in 0..connections {
        let share = spec.records / u64::from(connections)
            + u64::from(u64::from(connection) < spec.records % u64::from(connections));
        let spec = spec.clone();
        tasks.push(tokio::spawn(async move { load_connection(&spec, connection, share, connections).await }));
    }
    let mut bytes = 0;
    for task in tasks {
        bytes += task.await.map_err(std::io::Error::other)??;
    }
    Ok(LoadReport { records: spec.records, bytes, elapsed: started.elapsed() })
}

async fn load_connection(spec: &LoadSpec, connection: u32, records: u64, connections: u32) -> std::io::Result<u64> {
    let stream = UnixStream::connect(&spec.socket).await?;
    let mut writer = BufWriter::with_capacity(64 * 1024, stream);
    let per_connection_rate = spec.rate as f64 / f64::from(connections);
    let started = Instant::now();
    let mut bytes = 0;
    for index in 0..records {
        if per_connection_rate > 0.0 {
            let due = started + Duration::from_secs_f64(index as f64 / per_connection_rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                writer.flush().await?;
                tokio::time::sleep(wait).await;
            }
        }
        let mut line = sample_record(connection, index, spec.text_every);
        if spec.size > 0 {
            fit(&mut line, spec.size);
        }
        line.push('\n');
        writer.write_all(line.as_bytes()).await?;
        bytes += line.len() as u64;
    }
    writer.flush().await?;
    writer.into_inner().shutdown().await?;
    Ok(bytes)
}

/// Writes each of `records` as one line, or, when there are none, copies `stdin` to the socket
/// as it is (one record per line). Returns the bytes written.
pub async fn send(socket: &std::path::Path, records: &[String], stdin: impl AsyncRead + Unpin) -> std::io::Result<u64> {
    let mut stream = UnixStream::connect(socket).await?;
    let written = if records.is_empty() {
        let mut stdin = stdin;
        tokio::io::copy(&mut stdin, &mut stream).await?
    } else {
        let mut text = records.join("\n");
        text.push('\n');
        stream.write_all(text.as_bytes()).await?;
        text.len() as u64
    };
    stream.shutdown().await?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_padded_to_the_exact_size_and_stay_json() {
        for size in [120, 256, 1024] {
            let mut line = sample_record(1, 2, 0);
            fit(&mut line, size);
            assert_eq!(line.len(), size);
            assert!(crate::envelope::is_json_object(&line), "{line}");
        }
    }
}
