//! The client side of the socket: `sluice send` (records from arguments or stdin, for shells
//! and scripts) and `sluice loadgen` (sample records, the way an app would write them), with
//! [`load`], the one load generator (also the benchmark's and the integration tests').
//!
//! Owns: a small, dependency-free writer, and loadgen's records (N connections, a record count,
//! an optional rate, a mix of JSON and plain-text lines). Must not: be used to make claims about
//! speed; that is the benchmark's job (its own tool, `sluice-bench`, with its own checks).

pub mod load;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWriteExt};
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
    /// Wall time from the first write to the last close.
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

impl LoadSpec {
    /// The generator and loadgen's records for this spec (buffered writes).
    pub fn generator(&self) -> (load::Load, load::Records) {
        let generator = load::Load {
            socket: self.socket.clone(),
            connections: self.connections,
            amount: load::Amount::Records(self.records),
            rate: self.rate,
            writes: load::Writes::Buffered,
        };
        let (text_every, size) = (self.text_every, self.size);
        let records: load::Records = Arc::new(move |connection, index| {
            let mut line = sample_record(connection, index, text_every);
            if size > 0 {
                fit(&mut line, size);
            }
            line.push('\n');
            line.into_bytes()
        });
        (generator, records)
    }
}

/// Sends the load and waits until every connection has written and closed (blocking: the
/// generator's threads do the writing).
pub fn run(spec: &LoadSpec) -> std::io::Result<LoadReport> {
    let (generator, records) = spec.generator();
    let report = generator.run(records)?;
    Ok(LoadReport { records: report.records, bytes: report.bytes, elapsed: report.elapsed })
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
