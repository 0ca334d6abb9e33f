//! Fluentd's Forward protocol: msgpack messages in Message, Forward, PackedForward and
//! CompressedPackedForward modes, with the `chunk` option answered by `{"ack": chunk}`.
//!
//! Owns: finding where one msgpack message ends in a byte stream without trusting declared
//! lengths ([`ForwardFramer`]), turning a message into JSON records one event at a time
//! ([`events`], in `decode`); the chunk acknowledgements are written beside the line
//! acknowledgements (`replies`). Must not: allocate from a declared length (a 4 GiB `str32`
//! header is skipped as bytes arrive, never reserved).
//!
//! The framer is hand-written: rmpv decodes complete values, but re-decoding a growing buffer
//! after every read would be quadratic for a slow writer; the framer keeps its place and skips
//! payloads, so each byte is looked at once. Its header rules (`header`) also delimit the
//! values of a complete message when it is decoded.

use bytes::{Buf, BytesMut};
use tokio_util::codec::Decoder;

use super::framing::Frame;
use crate::telemetry::outcome::Rejected;

mod decode;
#[cfg(test)]
mod tests;

pub use decode::{Events, Limits, Message, decode, events};

/// Container levels a message may use around its records: message array, entries array, entry
/// array (the record map is level four).
const ENVELOPE_LEVELS: usize = 3;

/// Decoder for one msgpack value at a time, of at most `max_len` bytes and `max_depth` nested
/// containers. A longer value is skipped as it arrives and reported as [`Frame::TooLarge`]; a
/// deeper one or an impossible marker breaks the stream.
#[derive(Debug)]
pub struct ForwardFramer {
    max_len: usize,
    max_depth: usize,
    /// Bytes of the current value already scanned (they stay in the buffer unless discarding).
    pos: usize,
    /// Items still expected in each open container (a map counts keys and values).
    open: Vec<u64>,
    /// Payload bytes of the current string, binary, number or extension still to skip.
    skip: u64,
    /// Bytes of the current (too large) value already thrown away.
    discarded: Option<u64>,
    /// The stream could not be framed: everything after is thrown away.
    broken: bool,
    /// The message being discarded was given up ([`Unfinished::give_up_partial`]) and counted
    /// already: its end makes no frame.
    silent: bool,
}

/// What a header says comes next.
enum Item {
    /// A payload of this many bytes follows.
    Payload(u64),
    /// A container of this many items follows.
    Container(u64),
}

impl ForwardFramer {
    /// A framer for messages whose records nest at most `max_json_depth` levels.
    pub fn new(max_len: usize, max_json_depth: usize) -> Self {
        Self {
            max_len,
            max_depth: max_json_depth + ENVELOPE_LEVELS,
            pos: 0,
            open: Vec::new(),
            skip: 0,
            discarded: None,
            broken: false,
            silent: false,
        }
    }

    /// Marks one value finished; returns the frame if that completed the top-level message.
    fn value_done(&mut self, buf: &mut BytesMut) -> Option<Frame> {
        while let Some(remaining) = self.open.last_mut() {
            *remaining -= 1;
            if *remaining > 0 {
                return None;
            }
            self.open.pop();
        }
        let len = std::mem::take(&mut self.pos);
        let frame = match self.discarded.take() {
            Some(_) if std::mem::take(&mut self.silent) => {
                // Given up and counted already: the next message follows.
                buf.advance(len);
                return None;
            }
            Some(discarded) => {
                buf.advance(len);
                Frame::TooLarge { len: discarded + len as u64 }
            }
            None if len > self.max_len => {
                buf.advance(len);
                Frame::TooLarge { len: len as u64 }
            }
            None => Frame::Record(buf.split_to(len)),
        };
        Some(frame)
    }

    /// Called when more bytes are needed: a value already over the limit stops being held.
    fn spill(&mut self, buf: &mut BytesMut) {
        if self.discarded.is_some() || self.pos > self.max_len {
            *self.discarded.get_or_insert(0) += self.pos as u64;
            buf.advance(self.pos);
            self.pos = 0;
        }
    }

    fn broken(&mut self, buf: &mut BytesMut, reason: Rejected) -> Frame {
        buf.clear();
        self.broken = true;
        self.pos = 0;
        self.open.clear();
        self.skip = 0;
        self.discarded = None;
        self.silent = false;
        Frame::Broken(reason)
    }
}

/// Reads a msgpack header at the start of `bytes`: its length and what follows. `None` if the
/// header is incomplete; `Some(Err)` for the one marker msgpack never uses.
fn header(bytes: &[u8]) -> Option<Result<(usize, Item), Rejected>> {
    let marker = *bytes.first()?;
    let be = |n: usize| -> Option<u64> {
        let field = bytes.get(1..1 + n)?;
        Some(field.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    };
    let item = match marker {
        0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (1, Item::Payload(0)),
        0x80..=0x8f => (1, Item::Container(2 * u64::from(marker & 0x0f))),
        0x90..=0x9f => (1, Item::Container(u64::from(marker & 0x0f))),
        0xa0..=0xbf => (1, Item::Payload(u64::from(marker & 0x1f))),
        0xc1 => return Some(Err(Rejected::Malformed)),
        0xc4 | 0xd9 => (2, Item::Payload(be(1)?)),
        0xc5 | 0xda => (3, Item::Payload(be(2)?)),
        0xc6 | 0xdb => (5, Item::Payload(be(4)?)),
        // ext 8/16/32: length, then a type byte, then the data.
        0xc7 => (3, Item::Payload(be(1)?)),
        0xc8 => (4, Item::Payload(be(2)?)),
        0xc9 => (6, Item::Payload(be(4)?)),
        0xca => (1, Item::Payload(4)),
        0xcb => (1, Item::Payload(8)),
        0xcc | 0xd0 => (1, Item::Payload(1)),
        0xcd | 0xd1 => (1, Item::Payload(2)),
        0xce | 0xd2 => (1, Item::Payload(4)),
        0xcf | 0xd3 => (1, Item::Payload(8)),
        // fixext 1/2/4/8/16: a type byte, then the data.
        0xd4 => (2, Item::Payload(1)),
        0xd5 => (2, Item::Payload(2)),
        0xd6 => (2, Item::Payload(4)),
        0xd7 => (2, Item::Payload(8)),
        0xd8 => (2, Item::Payload(16)),
        0xdc => (3, Item::Container(be(2)?)),
        0xdd => (5, Item::Container(be(4)?)),
        0xde => (3, Item::Container(2 * be(2)?)),
        0xdf => (5, Item::Container(2 * be(4)?)),
    };
    // The header's own bytes must be present too (ext headers include the type byte).
    (bytes.len() >= item.0).then_some(Ok(item))
}

impl Decoder for ForwardFramer {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        if self.broken {
            buf.clear();
            return Ok(None);
        }
        loop {
            if self.skip > 0 {
                let available = (buf.len() - self.pos) as u64;
                let take = self.skip.min(available);
                self.pos += take as usize;
                self.skip -= take;
                if self.skip > 0 {
                    self.spill(buf);
                    return Ok(None);
                }
                if let Some(frame) = self.value_done(buf) {
                    return Ok(Some(frame));
                }
                continue;
            }
            let (len, item) = match header(&buf[self.pos..]) {
                None => {
                    self.spill(buf);
                    return Ok(None);
                }
                Some(Err(reason)) => return Ok(Some(self.broken(buf, reason))),
                Some(Ok(header)) => header,
            };
            self.pos += len;
            match item {
                Item::Payload(0) | Item::Container(0) => {
                    if let Some(frame) = self.value_done(buf) {
                        return Ok(Some(frame));
                    }
                }
                Item::Payload(bytes) => self.skip = bytes,
                Item::Container(items) => {
                    if self.open.len() >= self.max_depth {
                        return Ok(Some(self.broken(buf, Rejected::TooDeep)));
                    }
                    self.open.push(items);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        if self.broken || (buf.is_empty() && self.pos == 0 && self.discarded.is_none() && self.open.is_empty()) {
            return Ok(None);
        }
        // The writer went away in the middle of a message.
        Ok(Some(self.broken(buf, Rejected::Malformed)))
    }
}

impl super::framing::Unfinished for ForwardFramer {
    fn unfinished(&mut self, buf: &mut BytesMut) -> Option<Frame> {
        if self.broken {
            buf.clear();
            return None;
        }
        let (discarded, held, open, silent) = (self.discarded, buf.len(), !self.open.is_empty(), self.silent);
        // Nothing more is framed after the agent's end of the stream.
        let _ = self.broken(buf, Rejected::Malformed);
        match discarded {
            // A message given up is counted already.
            Some(_) if silent => None,
            Some(dropped) => Some(Frame::TooLarge { len: dropped + held as u64 }),
            None if held > 0 || open => Some(Frame::Truncated { len: held as u64 }),
            None => None,
        }
    }

    fn give_up_partial(&mut self, buf: &mut BytesMut) -> Option<u64> {
        if self.broken || self.discarded.is_some() || (buf.is_empty() && self.open.is_empty() && self.skip == 0) {
            return None;
        }
        // The message goes on being walked to its end, its bytes let go as they arrive.
        let held = buf.len() as u64;
        self.discarded = Some(0);
        self.silent = true;
        self.spill(buf);
        Some(held)
    }
}
