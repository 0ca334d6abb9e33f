//! The spool's file format: a segment is a header followed by checksummed frames.
//!
//! ```text
//! segment := "SLUICESP" version:u32le frame*
//! frame   := body_len:u32le crc32c(body):u32le body
//! body    := stamp:u64le key_len:u32le (0xFFFFFFFF = no key) [topic_len:u8 topic] key payload
//! stamp   := ingest_ms, with bit 63 set when a topic follows key_len
//! ```
//!
//! Version 3 added the topic (`kafka.topic` may be a template: a record keeps the topic it was
//! routed to across restarts and reloads). A version 2 segment, which an earlier release left,
//! is read as it is: its frames have no topic, and go to the topic records without one go to
//! (`kafka.default_topic`, or `kafka.topic`). A release before version 3 finds a version 3
//! segment's header wrong and counts its records `corrupt`: never misread.
//!
//! Owns: encoding frames and finding them again, including after damage: [`scan`] skips a
//! corrupt region by looking for the next offset where a plausible length and a matching
//! checksum line up (a false match needs a 1-in-2^32 checksum coincidence). Must not: trust a
//! length before it is bounded ([`MAX_BODY`]), or allocate from a length read off disk.

use std::io::{self, Read};

#[cfg(test)]
mod tests;

/// Magic bytes and version at the start of every segment written.
pub const HEADER: &[u8; 12] = b"SLUICESP\x03\x00\x00\x00";
/// The header of a segment an earlier release wrote (frames without a topic): still read.
const HEADER_V2: &[u8; 12] = b"SLUICESP\x02\x00\x00\x00";
/// Bit 63 of a frame's stamp: a topic follows the key length.
const HAS_TOPIC: u64 = 1 << 63;
/// Bytes of a body before its key: ingest time and key length.
const BODY_PREFIX: usize = 12;
/// Bytes before a frame's body.
pub const FRAME_OVERHEAD: usize = 8;
/// Largest body a frame may declare: above any record the agent accepts (64 MiB + envelope).
pub const MAX_BODY: usize = 80 * 1024 * 1024;
const NO_KEY: u32 = u32::MAX;

/// Appends one frame to `out`. `ingest_ms` (Unix milliseconds) travels with the record so the
/// age of the oldest record and delivery latency stay true across restarts.
/// A topic (at most 249 bytes: a Kafka topic name) travels with it; `None` only in tests of
/// what an earlier release wrote.
pub fn encode(ingest_ms: u64, topic: Option<&str>, key: Option<&[u8]>, payload: &[u8], out: &mut Vec<u8>) {
    let key_len = key.map_or(NO_KEY, |key| key.len() as u32);
    let topic = topic.map(|topic| &topic.as_bytes()[..topic.len().min(u8::MAX as usize)]);
    let body_len = BODY_PREFIX + topic.map_or(0, |topic| 1 + topic.len()) + key.map_or(0, <[u8]>::len) + payload.len();
    let start = out.len();
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    let stamp = (ingest_ms & !HAS_TOPIC) | if topic.is_some() { HAS_TOPIC } else { 0 };
    out.extend_from_slice(&stamp.to_le_bytes());
    out.extend_from_slice(&key_len.to_le_bytes());
    if let Some(topic) = topic {
        out.push(topic.len() as u8);
        out.extend_from_slice(topic);
    }
    if let Some(key) = key {
        out.extend_from_slice(key);
    }
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[start + FRAME_OVERHEAD..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Total bytes a frame for this topic, key and payload takes on disk.
pub fn frame_len(topic: Option<&str>, key: Option<&[u8]>, payload: &[u8]) -> usize {
    FRAME_OVERHEAD
        + BODY_PREFIX
        + topic.map_or(0, |topic| 1 + topic.len().min(u8::MAX as usize))
        + key.map_or(0, <[u8]>::len)
        + payload.len()
}

/// A decoded frame, borrowing from its body.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// When the agent read the record (Unix milliseconds).
    pub ingest_ms: u64,
    /// The Kafka topic it was routed to; `None` in a segment an earlier release wrote.
    pub topic: Option<&'a str>,
    /// The Kafka key.
    pub key: Option<&'a [u8]>,
    /// The envelope.
    pub payload: &'a [u8],
}

/// Splits a checked body into key and payload; `None` if the key length does not fit.
fn split_body(body: &[u8]) -> Option<Frame<'_>> {
    let stamp = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
    let key_len = u32::from_le_bytes(body.get(8..BODY_PREFIX)?.try_into().ok()?);
    let mut rest = &body[BODY_PREFIX..];
    let topic = if stamp & HAS_TOPIC != 0 {
        let (&len, after) = rest.split_first()?;
        let topic = std::str::from_utf8(after.get(..len as usize)?).ok()?;
        rest = &after[len as usize..];
        Some(topic)
    } else {
        None
    };
    let ingest_ms = stamp & !HAS_TOPIC;
    if key_len == NO_KEY {
        return Some(Frame { ingest_ms, topic, key: None, payload: rest });
    }
    let key_len = key_len as usize;
    (key_len <= rest.len()).then(|| Frame { ingest_ms, topic, key: Some(&rest[..key_len]), payload: &rest[key_len..] })
}

/// Whether `data` starts with a segment header this release reads (version 3, or 2).
pub fn header_ok(data: &[u8]) -> bool {
    data.get(..HEADER.len()).is_some_and(|head| head == HEADER || head == HEADER_V2)
}

/// A frame at `offset` in `data`, if a whole, intact one starts there.
pub fn frame_at(data: &[u8], offset: usize) -> Option<(Frame<'_>, usize)> {
    let head = data.get(offset..offset + FRAME_OVERHEAD)?;
    let body_len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    if !(BODY_PREFIX..=MAX_BODY).contains(&body_len) {
        return None;
    }
    let crc = u32::from_le_bytes(head[4..8].try_into().ok()?);
    let body = data.get(offset + FRAME_OVERHEAD..offset + FRAME_OVERHEAD + body_len)?;
    // The key length must fit before the checksum is worth computing: while resynchronising
    // over damaged bytes this cheap test rejects almost every offset.
    let frame = split_body(body)?;
    if crc32c::crc32c(body) != crc {
        return None;
    }
    Some((frame, FRAME_OVERHEAD + body_len))
}

/// What [`scan`] found in a whole segment held in memory.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Byte ranges of intact frames, in order.
    pub frames: Vec<std::ops::Range<usize>>,
    /// Damaged regions skipped (each lost at least one record).
    pub corrupt_regions: u64,
    /// Bytes in damaged regions.
    pub corrupt_bytes: u64,
    /// False if the header itself is wrong (then nothing else is trusted).
    pub header_ok: bool,
}

/// Finds every intact frame of a segment, skipping damaged regions.
pub fn scan(data: &[u8]) -> ScanReport {
    let mut report = ScanReport::default();
    if !header_ok(data) {
        report.header_ok = false;
        if !data.is_empty() {
            report.corrupt_regions = 1;
            report.corrupt_bytes = data.len() as u64;
        }
        return report;
    }
    report.header_ok = true;
    let mut offset = HEADER.len();
    while offset < data.len() {
        if let Some((_, len)) = frame_at(data, offset) {
            report.frames.push(offset..offset + len);
            offset += len;
            continue;
        }
        // Damaged: look for the next offset where an intact frame starts.
        let start = offset;
        offset += 1;
        while offset < data.len() && frame_at(data, offset).is_none() {
            offset += 1;
        }
        report.corrupt_regions += 1;
        report.corrupt_bytes += (offset - start) as u64;
    }
    report
}

/// Why reading a frame from a stream failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be read.
    #[error("spool read failed: {0}")]
    Io(#[from] io::Error),
    /// A frame's length or checksum is wrong.
    #[error("damaged frame")]
    Corrupt,
}

/// Reads the next frame from `reader` into `body`; `Ok(false)` at a clean end of file. A
/// declared length above `max_body` is damage, and nothing is allocated for it; below it, `body`
/// grows only with the bytes that arrive, so a damaged length the file cannot back is never an
/// allocation (`body` is kept between reads: it would hold that memory for good).
pub fn read_frame(reader: &mut impl Read, body: &mut Vec<u8>, max_body: usize) -> Result<bool, ReadError> {
    let mut head = [0u8; FRAME_OVERHEAD];
    match read_full(reader, &mut head)? {
        0 => return Ok(false),
        n if n < FRAME_OVERHEAD => return Err(ReadError::Corrupt),
        _ => {}
    }
    let body_len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if !(BODY_PREFIX..=max_body.min(MAX_BODY)).contains(&body_len) {
        return Err(ReadError::Corrupt);
    }
    body.clear();
    if reader.take(body_len as u64).read_to_end(body)? < body_len {
        return Err(ReadError::Corrupt);
    }
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if crc32c::crc32c(body) != crc || split_body(body).is_none() {
        return Err(ReadError::Corrupt);
    }
    Ok(true)
}

/// Splits a body read by [`read_frame`].
pub fn body_frame(body: &[u8]) -> Option<Frame<'_>> {
    split_body(body)
}

fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}
