//! Framing: cutting a connection's byte stream into records, with hard length limits.
//!
//! Owns: newline framing (`lines`; a trailing `\r` is removed too), RFC 6587 octet counting
//! (`octet_counted`: `LEN SP MSG`, so records may hold newlines), the syslog stream framer that
//! tells the two apart per frame, and enforcing `max_record_size` while reading, so a writer
//! that never ends a record holds at most one record's worth of memory; and what a framer still
//! holds when the agent stops reading ([`Unfinished`]: the agent's end of a stream is not the
//! writer's end of a record, so it is `truncated`, never a record). Must not: allocate
//! beyond the limit (a declared length is never trusted for allocation), stop the stream on an
//! overlong record (it is discarded up to its end and reported), or judge content (UTF-8 and
//! JSON are [`super::record`]'s business).
//!
//! Hand-written because `tokio_util::codec::LinesCodec` ends the stream after a too-long line
//! and insists on UTF-8, and no crate frames RFC 6587 with a skip-don't-hold limit; Sluice
//! reports both cases and keeps the connection.

use bytes::{Buf, BytesMut};
use tokio_util::codec::Decoder;

#[cfg(test)]
pub(crate) mod tests;

/// One unit read from a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A record (a line without its ending, an octet-counted frame's body, a whole msgpack
    /// message).
    Record(BytesMut),
    /// A record longer than the limit was discarded; `len` bytes were thrown away.
    TooLarge {
        /// How long the discarded record was (without its framing).
        len: u64,
    },
    /// The stream cannot be framed any further (a length that is not a number, a truncated
    /// frame, an impossible msgpack marker): count `reason` and close the connection.
    Broken(crate::telemetry::outcome::Rejected),
    /// A record the writer had not finished when the agent stopped reading (see
    /// [`Unfinished`]); `len` bytes of it had arrived.
    Truncated {
        /// Bytes of it read.
        len: u64,
    },
}

/// What a framer holds when the agent stops reading a connection: the drain shut its read
/// side, it idled out, its read failed. That end of the stream is the agent's, not the writer's
/// end of a record: a last line without its newline, a frame without its end, is
/// [`Frame::Truncated`] (counted `truncated`, never stored as if it were whole); an overlong
/// record being skipped is still [`Frame::TooLarge`].
pub trait Unfinished {
    /// After the framer has cut every complete record out of `buf`: what it still holds, if
    /// anything, as one frame; `buf` is emptied and the framer left with nothing more to frame.
    fn unfinished(&mut self, buf: &mut BytesMut) -> Option<Frame>;

    /// After the framer has cut every complete record out of `buf`, while the connection reads
    /// on: the record in progress is given up (it held read room another connection waits for,
    /// `connection::PARTIAL_RECORD_HOLD`) — its bytes so far are dropped, how many is returned to
    /// count it `truncated`, and the rest of it is skipped as it arrives, silently, up to its
    /// end; the records after it are read as ever. `None` when no record is in progress (or one
    /// is being skipped as too large already).
    fn give_up_partial(&mut self, buf: &mut BytesMut) -> Option<u64>;
}

/// What `held` bytes of an unfinished record are.
fn truncated(buf: &mut BytesMut, held: usize) -> Option<Frame> {
    buf.clear();
    (held > 0).then_some(Frame::Truncated { len: held as u64 })
}

/// Decoder for newline-delimited records of at most `max_len` bytes.
#[derive(Debug)]
pub struct LineFramer {
    max_len: usize,
    /// Bytes already searched for a newline in the current buffer (avoids rescanning).
    scanned: usize,
    /// `Some(n)` while discarding an overlong record of which `n` bytes have been dropped.
    discarding: Option<u64>,
    /// The record being discarded was given up ([`Unfinished::give_up_partial`]) and counted
    /// already: its end makes no frame.
    silent: bool,
    /// A client session's lines ([`LineFramer::open_session`]): a last line without its newline
    /// is `Truncated`, never a record.
    whole_lines_only: bool,
}

impl LineFramer {
    /// A framer that accepts records of up to `max_len` bytes.
    pub fn new(max_len: usize) -> Self {
        Self { max_len, scanned: 0, discarding: None, silent: false, whole_lines_only: false }
    }

    /// From now on the lines are a client session's (`ingest::session`): `prefix` more bytes
    /// each (the client's time, checked apart with the record's own limit), and a line the writer
    /// ended without its newline is `Truncated` — a resend of it whole has the same record id, so
    /// a part stored first would keep the whole out.
    pub fn open_session(&mut self, prefix: usize) {
        self.max_len += prefix;
        self.whole_lines_only = true;
    }
}

impl Decoder for LineFramer {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        if let Some(dropped) = self.discarding {
            match memchr::memchr(b'\n', buf) {
                Some(newline) => {
                    buf.advance(newline + 1);
                    self.discarding = None;
                    if !std::mem::take(&mut self.silent) {
                        return Ok(Some(Frame::TooLarge { len: dropped + newline as u64 }));
                    }
                    // Given up and counted already: the next record follows.
                }
                None => {
                    self.discarding = Some(dropped + buf.len() as u64);
                    buf.clear();
                    return Ok(None);
                }
            }
        }
        match memchr::memchr(b'\n', &buf[self.scanned..]) {
            Some(offset) => {
                let end = self.scanned + offset;
                self.scanned = 0;
                let mut line = buf.split_to(end + 1);
                line.truncate(if end > 0 && line[end - 1] == b'\r' { end - 1 } else { end });
                if line.len() > self.max_len {
                    return Ok(Some(Frame::TooLarge { len: line.len() as u64 }));
                }
                Ok(Some(Frame::Record(line)))
            }
            None if buf.len() > self.max_len + 1 => {
                // No newline within the limit (+1 for a possible '\r'): this record is too
                // large whatever follows. Drop what we have and keep dropping to the newline.
                self.scanned = 0;
                self.discarding = Some(buf.len() as u64);
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
        if self.whole_lines_only {
            let len = buf.len() as u64;
            buf.clear();
            return Ok(Some(Frame::Truncated { len }));
        }
        // The writer closed after a last record without newline: it is still a record.
        let mut line = buf.split();
        if line.ends_with(b"\r") {
            line.truncate(line.len() - 1);
        }
        if line.len() > self.max_len {
            return Ok(Some(Frame::TooLarge { len: line.len() as u64 }));
        }
        Ok(Some(Frame::Record(line)))
    }
}

impl Unfinished for LineFramer {
    fn unfinished(&mut self, buf: &mut BytesMut) -> Option<Frame> {
        self.scanned = 0;
        if let Some(dropped) = self.discarding.take() {
            let len = dropped + buf.len() as u64;
            buf.clear();
            // A record given up is counted already.
            return (!std::mem::take(&mut self.silent)).then_some(Frame::TooLarge { len });
        }
        let held = buf.len();
        truncated(buf, held)
    }

    fn give_up_partial(&mut self, buf: &mut BytesMut) -> Option<u64> {
        if self.discarding.is_some() || buf.is_empty() {
            return None;
        }
        let held = buf.len() as u64;
        self.scanned = 0;
        self.discarding = Some(held);
        self.silent = true;
        buf.clear();
        Some(held)
    }
}

/// Longest length prefix accepted: ten digits (anything longer is not a length but garbage).
const MAX_LENGTH_DIGITS: usize = 10;

/// Decoder for RFC 6587 octet-counted frames, `LEN SP MSG`, of at most `max_len` bytes.
///
/// Line breaks between frames are tolerated (some senders add one). A body longer than the
/// limit is skipped as it arrives, never held; a prefix that is not a number breaks the stream.
#[derive(Debug)]
pub struct OctetFramer {
    max_len: usize,
    state: OctetState,
}

impl OctetFramer {
    /// From now on the frames are a client session's: `prefix` more bytes each (the client's
    /// time, checked apart with the record's own limit). A frame cut short is `Truncated`
    /// already.
    pub fn open_session(&mut self, prefix: usize) {
        self.max_len += prefix;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OctetState {
    /// Expecting `LEN SP`.
    Header,
    /// Expecting a body of this many bytes.
    Body(usize),
    /// Skipping an overlong body: `remaining` bytes still to skip, `len` declared.
    Discard { remaining: u64, len: u64 },
    /// Skipping the rest of a body given up ([`Unfinished::give_up_partial`]), counted already.
    Skip { remaining: u64 },
    /// The stream could not be framed: everything after is thrown away.
    Broken,
}

impl OctetFramer {
    /// A framer that accepts bodies of up to `max_len` bytes.
    pub fn new(max_len: usize) -> Self {
        Self { max_len, state: OctetState::Header }
    }

    fn broken(&mut self, buf: &mut BytesMut) -> Frame {
        buf.clear();
        self.state = OctetState::Broken;
        Frame::Broken(crate::telemetry::outcome::Rejected::Malformed)
    }
}

impl Decoder for OctetFramer {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        loop {
            match self.state {
                OctetState::Header => {
                    let skip = buf.iter().take_while(|&&b| b == b'\n' || b == b'\r').count();
                    buf.advance(skip);
                    let digits = buf.iter().take(MAX_LENGTH_DIGITS + 1).take_while(|b| b.is_ascii_digit()).count();
                    if digits > MAX_LENGTH_DIGITS {
                        return Ok(Some(self.broken(buf)));
                    }
                    match buf.get(digits) {
                        None => return Ok(None),
                        Some(b' ') if digits > 0 => {}
                        Some(_) => return Ok(Some(self.broken(buf))),
                    }
                    // Ten ASCII digits always fit in a u64.
                    let len = buf[..digits].iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
                    buf.advance(digits + 1);
                    self.state = match usize::try_from(len) {
                        Ok(len) if len <= self.max_len => OctetState::Body(len),
                        _ => OctetState::Discard { remaining: len, len },
                    };
                }
                OctetState::Body(len) => {
                    if buf.len() < len {
                        return Ok(None);
                    }
                    self.state = OctetState::Header;
                    return Ok(Some(Frame::Record(buf.split_to(len))));
                }
                OctetState::Discard { remaining, len } => {
                    let take = usize::try_from(remaining).unwrap_or(usize::MAX).min(buf.len());
                    buf.advance(take);
                    let remaining = remaining - take as u64;
                    if remaining > 0 {
                        self.state = OctetState::Discard { remaining, len };
                        return Ok(None);
                    }
                    self.state = OctetState::Header;
                    return Ok(Some(Frame::TooLarge { len }));
                }
                OctetState::Skip { remaining } => {
                    let take = usize::try_from(remaining).unwrap_or(usize::MAX).min(buf.len());
                    buf.advance(take);
                    let remaining = remaining - take as u64;
                    if remaining > 0 {
                        self.state = OctetState::Skip { remaining };
                        return Ok(None);
                    }
                    self.state = OctetState::Header;
                }
                OctetState::Broken => {
                    buf.clear();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        let truncated = match self.state {
            OctetState::Header => !buf.is_empty(),
            OctetState::Body(_) | OctetState::Discard { .. } => true,
            // Given up and counted already.
            OctetState::Skip { .. } | OctetState::Broken => false,
        };
        Ok(truncated.then(|| self.broken(buf)))
    }
}

impl Unfinished for OctetFramer {
    fn unfinished(&mut self, buf: &mut BytesMut) -> Option<Frame> {
        let state = std::mem::replace(&mut self.state, OctetState::Broken);
        match state {
            OctetState::Discard { len, .. } => {
                buf.clear();
                Some(Frame::TooLarge { len })
            }
            OctetState::Broken | OctetState::Skip { .. } => {
                buf.clear();
                None
            }
            OctetState::Header | OctetState::Body(_) => {
                // Blank lines between frames are no record.
                let held = buf.iter().filter(|&&b| b != b'\n' && b != b'\r').count();
                let held = if held == 0 { 0 } else { buf.len() };
                truncated(buf, held)
            }
        }
    }

    fn give_up_partial(&mut self, buf: &mut BytesMut) -> Option<u64> {
        let OctetState::Body(len) = self.state else { return None };
        let held = buf.len();
        self.state = OctetState::Skip { remaining: (len - held.min(len)) as u64 };
        buf.clear();
        Some(held as u64)
    }
}

/// Syslog over a stream: each frame is octet-counted if it starts with a digit and
/// newline-terminated otherwise (a syslog message starts with `<`), as rsyslog tells them
/// apart. Blank lines between frames are skipped: they hold no message.
#[derive(Debug)]
pub struct SyslogFramer {
    lines: LineFramer,
    octets: OctetFramer,
    /// The framing of the frame being read, once its first byte has been seen.
    current: Option<SyslogFraming>,
    /// A frame could not be cut: everything after is thrown away (as the other framers do).
    broken: bool,
    /// The record in progress was given up ([`Unfinished::give_up_partial`]): its rest is
    /// skipped here, then the next record's framing is judged anew.
    skipping: Option<SyslogSkip>,
}

/// What is left to skip of a syslog record given up.
#[derive(Debug, Clone, Copy)]
enum SyslogSkip {
    /// Up to and with the next newline.
    Line,
    /// This many bytes of an octet-counted body.
    Bytes(u64),
}

#[derive(Debug, Clone, Copy)]
enum SyslogFraming {
    Lines,
    Octets,
}

impl SyslogFramer {
    /// A framer for messages of up to `max_len` bytes.
    pub fn new(max_len: usize) -> Self {
        Self {
            lines: LineFramer::new(max_len),
            octets: OctetFramer::new(max_len),
            current: None,
            broken: false,
            skipping: None,
        }
    }

    fn step(&mut self, buf: &mut BytesMut, eof: bool) -> Result<Option<Frame>, std::io::Error> {
        if self.broken {
            buf.clear();
            return Ok(None);
        }
        match self.skipping {
            Some(SyslogSkip::Line) => match memchr::memchr(b'\n', buf) {
                Some(newline) => {
                    buf.advance(newline + 1);
                    self.skipping = None;
                }
                None => {
                    buf.clear();
                    return Ok(None);
                }
            },
            Some(SyslogSkip::Bytes(remaining)) => {
                let take = usize::try_from(remaining).unwrap_or(usize::MAX).min(buf.len());
                buf.advance(take);
                let remaining = remaining - take as u64;
                if remaining > 0 {
                    self.skipping = Some(SyslogSkip::Bytes(remaining));
                    return Ok(None);
                }
                self.skipping = None;
            }
            None => {}
        }
        let framing = match self.current {
            Some(framing) => framing,
            None => {
                let skip = buf.iter().take_while(|&&b| b == b'\n' || b == b'\r').count();
                buf.advance(skip);
                match buf.first() {
                    None => return Ok(None),
                    Some(byte) if byte.is_ascii_digit() => SyslogFraming::Octets,
                    Some(_) => SyslogFraming::Lines,
                }
            }
        };
        self.current = Some(framing);
        let frame = match (framing, eof) {
            (SyslogFraming::Lines, false) => self.lines.decode(buf)?,
            (SyslogFraming::Lines, true) => self.lines.decode_eof(buf)?,
            (SyslogFraming::Octets, false) => self.octets.decode(buf)?,
            (SyslogFraming::Octets, true) => self.octets.decode_eof(buf)?,
        };
        if frame.is_some() {
            self.current = None;
        }
        self.broken = matches!(frame, Some(Frame::Broken(_)));
        Ok(frame)
    }
}

impl Unfinished for SyslogFramer {
    fn unfinished(&mut self, buf: &mut BytesMut) -> Option<Frame> {
        if self.broken || self.skipping.is_some() {
            // Nothing held, or a record given up and counted already.
            self.broken = true;
            buf.clear();
            return None;
        }
        self.broken = true;
        match self.current.take() {
            Some(SyslogFraming::Lines) => self.lines.unfinished(buf),
            Some(SyslogFraming::Octets) => self.octets.unfinished(buf),
            None => {
                let held = buf.iter().filter(|&&b| b != b'\n' && b != b'\r').count();
                let held = if held == 0 { 0 } else { buf.len() };
                truncated(buf, held)
            }
        }
    }

    fn give_up_partial(&mut self, buf: &mut BytesMut) -> Option<u64> {
        if self.broken || self.skipping.is_some() {
            return None;
        }
        // The rest of the record is skipped here; the next one's framing is judged anew.
        let held = buf.len();
        let skip = match self.current {
            Some(SyslogFraming::Lines) if self.lines.discarding.is_none() && held > 0 => SyslogSkip::Line,
            Some(SyslogFraming::Octets) => match self.octets.state {
                OctetState::Body(len) => SyslogSkip::Bytes((len - held.min(len)) as u64),
                _ => return None,
            },
            _ => return None,
        };
        self.lines = LineFramer::new(self.lines.max_len);
        self.octets = OctetFramer::new(self.octets.max_len);
        self.current = None;
        self.skipping = Some(skip);
        buf.clear();
        Some(held as u64)
    }
}

impl Decoder for SyslogFramer {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        self.step(buf, false)
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        self.step(buf, true)
    }
}
