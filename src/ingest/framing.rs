//! Newline framing with a hard length limit.
//!
//! Owns: cutting a byte stream into records at `\n` (a trailing `\r` is removed too) and
//! enforcing `ingest.max_record_size` while reading, so a writer that never sends a newline
//! holds at most one record's worth of memory. Must not: allocate beyond the limit, stop the
//! stream on an overlong record (it is discarded up to its newline and reported), or judge
//! content (UTF-8 and JSON are the connection's business).
//!
//! Hand-written because `tokio_util::codec::LinesCodec` ends the stream after a
//! too-long line and insists on UTF-8; Sluice reports both cases and keeps the connection.

use bytes::{Buf, BytesMut};
use tokio_util::codec::Decoder;

#[cfg(test)]
mod tests;

/// One unit read from a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A record, without its line ending.
    Line(BytesMut),
    /// A record longer than the limit was discarded; `len` bytes were thrown away.
    TooLarge {
        /// How long the discarded record was (without its newline).
        len: usize,
    },
}

/// Decoder for newline-delimited records of at most `max_len` bytes.
#[derive(Debug)]
pub struct LineFramer {
    max_len: usize,
    /// Bytes already searched for a newline in the current buffer (avoids rescanning).
    scanned: usize,
    /// `Some(n)` while discarding an overlong record of which `n` bytes have been dropped.
    discarding: Option<usize>,
}

impl LineFramer {
    /// A framer that accepts records of up to `max_len` bytes.
    pub fn new(max_len: usize) -> Self {
        Self { max_len, scanned: 0, discarding: None }
    }
}

impl Decoder for LineFramer {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        if let Some(dropped) = self.discarding {
            return Ok(match memchr::memchr(b'\n', buf) {
                Some(newline) => {
                    buf.advance(newline + 1);
                    self.discarding = None;
                    Some(Frame::TooLarge { len: dropped + newline })
                }
                None => {
                    self.discarding = Some(dropped + buf.len());
                    buf.clear();
                    None
                }
            });
        }
        match memchr::memchr(b'\n', &buf[self.scanned..]) {
            Some(offset) => {
                let end = self.scanned + offset;
                self.scanned = 0;
                let mut line = buf.split_to(end + 1);
                line.truncate(if end > 0 && line[end - 1] == b'\r' { end - 1 } else { end });
                if line.len() > self.max_len {
                    return Ok(Some(Frame::TooLarge { len: line.len() }));
                }
                Ok(Some(Frame::Line(line)))
            }
            None if buf.len() > self.max_len + 1 => {
                // No newline within the limit (+1 for a possible '\r'): this record is too
                // large whatever follows. Drop what we have and keep dropping to the newline.
                self.scanned = 0;
                self.discarding = Some(buf.len());
                buf.clear();
                Ok(None)
            }
            None => {
                self.scanned = buf.len();
                Ok(None)
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        self.scanned = 0;
        if let Some(dropped) = self.discarding.take() {
            return Ok(Some(Frame::TooLarge { len: dropped }));
        }
        if buf.is_empty() {
            return Ok(None);
        }
        // The writer closed after a last record without newline: it is still a record.
        let mut line = buf.split();
        if line.ends_with(b"\r") {
            line.truncate(line.len() - 1);
        }
        if line.len() > self.max_len {
            return Ok(Some(Frame::TooLarge { len: line.len() }));
        }
        Ok(Some(Frame::Line(line)))
    }
}
