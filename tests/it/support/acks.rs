//! Reading the agent's acknowledgement lines on one connection (docs/PROTOCOL.md), strictly: the
//! one reading both the tests' `AckedSender` and the soak's `AckedWriter` use, and the handshake
//! that opens such a connection.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// A connection in acknowledged mode: its acknowledgement lines, and where records go.
pub type Acknowledged = (Lines<BufReader<OwnedReadHalf>>, OwnedWriteHalf);

/// Connects to `socket` and asks for acknowledged mode (`SLUICE/1 ACK`, answered `OK <point>`);
/// `None` if the agent is not there, does not answer within a few seconds, or answers otherwise.
pub async fn open_acknowledged(socket: &Path) -> Option<Acknowledged> {
    let stream = tokio::time::timeout(Duration::from_secs(2), UnixStream::connect(socket)).await.ok()?.ok()?;
    let (read, mut write) = stream.into_split();
    write.write_all(b"SLUICE/1 ACK\n").await.ok()?;
    let mut lines = BufReader::new(read).lines();
    match tokio::time::timeout(Duration::from_secs(5), lines.next_line()).await {
        Ok(Ok(Some(line))) if line.starts_with("OK ") => Some((lines, write)),
        _ => None,
    }
}

/// How one record of a connection was settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    Acked,
    /// Refused, with the reason the agent gave.
    Naked(String),
}

/// What the lines said so far about the records sent on one connection, numbered from 1.
/// `ACK n` settles every record up to n not refused before; `NAK n reason` refuses record n,
/// which must be sent and not yet settled. Any other line breaks the protocol.
#[derive(Debug, Default)]
pub struct AckReader {
    sent: usize,
    upto: usize,
    settled: Vec<Option<Settled>>,
}

impl AckReader {
    /// `records` more were written on the connection.
    pub fn sent(&mut self, records: usize) {
        self.sent += records;
        self.settled.resize(self.sent, None);
    }

    /// Applies one line; the records it settled (0-based index, how). `Err`: the line breaks
    /// the protocol, and nothing changed.
    pub fn line(&mut self, line: &str) -> Result<Vec<(usize, Settled)>, String> {
        let mut words = line.split_whitespace();
        let (kind, number) = (words.next(), words.next().and_then(|n| n.parse::<usize>().ok()));
        match (kind, number) {
            (Some("ACK"), Some(n)) if n <= self.sent => {
                let mut newly = Vec::new();
                for index in self.upto..n {
                    if self.settled[index].is_none() {
                        self.settled[index] = Some(Settled::Acked);
                        newly.push((index, Settled::Acked));
                    }
                }
                self.upto = self.upto.max(n);
                Ok(newly)
            }
            (Some("NAK"), Some(n)) if n > self.upto && n <= self.sent && self.settled[n - 1].is_none() => {
                let settled = Settled::Naked(words.next().unwrap_or("").to_string());
                self.settled[n - 1] = Some(settled.clone());
                Ok(vec![(n - 1, settled)])
            }
            _ => Err(format!("{line:?} after ACK {} with {} records sent on the connection", self.upto, self.sent)),
        }
    }

    /// How each record sent was settled, if it was.
    pub fn settled(&self) -> &[Option<Settled>] {
        &self.settled
    }
}
