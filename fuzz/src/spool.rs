//! `segment`: spool recovery over arbitrary bytes. Start-up recovery reads a segment file whole
//! with `segment::scan` (and writes back a copy holding only its intact frames); the backlog
//! reader streams it frame by frame with `segment::read_frame`. Both must agree, count every
//! damaged byte, and hold memory in proportion to the file, whatever it holds.
//!
//! The first byte chooses what the rest is:
//! - `0 mod 3`, a file: the rest is the segment file as found on disk;
//! - `1 mod 3`, a segment cut short: the rest describes records ([`records`]), written as the
//!   spool writer writes them, then cut at a chosen length;
//! - `2 mod 3`, a damaged segment: the same, with one byte changed.
//!
//! For a file, every byte is in an intact frame, the header or a counted damaged region, no
//! intact frame lies inside a damaged region, the repaired copy scans clean with the same
//! frames, and the stream reader returns exactly the frames before the first damage. For a
//! segment cut short the frames found are exactly the records written before the cut; for a
//! damaged one, every record but the one hit, which is one counted region. Not covered: reading a
//! segment recovery could not repair around its damage (`SegmentState::skips`; the spool's unit
//! tests cover it).

use sluice::buffer::spool::segment::{self as format, Frame, HEADER, MAX_BODY, ReadError, ScanReport};

use crate::alloc::peak_during;

/// Body limit of the second stream reading: small, so bodies above it are common.
pub const SMALL_BODY: usize = 64;
/// Ingest time of the first generated record: a real one (late 2025), as the agent writes.
pub const BASE_MS: u64 = 1_764_000_000_000;

/// Memory `scan` or the stream reader may hold for an input of `len` bytes: the frame ranges
/// (16 bytes per frame of at least 20 bytes, doubled by `Vec` growth), or one body, plus slack.
fn memory_bound(len: usize) -> usize {
    4096 + 4 * len
}

/// The target.
pub fn segment(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 3 {
        0 => file(rest),
        1 => cut(rest),
        _ => flipped(rest),
    }
}

/// One record as the spool writer is given it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Unix milliseconds.
    pub ingest_ms: u64,
    /// Kafka topic (none: a frame as segment version 2 wrote it).
    pub topic: Option<String>,
    /// Kafka key.
    pub key: Option<Vec<u8>>,
    /// Envelope.
    pub payload: Vec<u8>,
}

/// Records described by `data`: per record a byte `h` (bit 7: a key of `(h >> 4) & 7` bytes;
/// bit 3: a topic `t<low three bits>`; the low three bits move the ingest time), a payload length byte, then the key and the payload
/// (as much as is left). Key and payload bytes are made printable ASCII: they are envelope JSON
/// and text keys, which never hold a byte 0x00–0x05, the last byte of every length a frame may
/// declare (at most `MAX_BODY`, little-endian), so no record holds a whole frame of its own and
/// "the frames before the cut" is exact (short of a CRC-32C coincidence in the frame fields).
pub fn records(mut data: &[u8]) -> Vec<Record> {
    let printable = |bytes: &[u8]| bytes.iter().map(|b| b' ' + b % 95).collect::<Vec<u8>>();
    let mut out = Vec::new();
    while let Some((&h, rest)) = data.split_first() {
        let (payload_len, rest) = match rest.split_first() {
            Some((&n, rest)) => (usize::from(n), rest),
            None => (0, rest),
        };
        let key_len = usize::from((h >> 4) & 7);
        let (key, rest) = if h & 0x80 != 0 {
            let (key, rest) = rest.split_at(key_len.min(rest.len()));
            (Some(printable(key)), rest)
        } else {
            (None, rest)
        };
        let (payload, rest) = rest.split_at(payload_len.min(rest.len()));
        let ingest_ms = BASE_MS + out.len() as u64 * 1000 + u64::from(h & 0x07);
        let topic = (h & 0x08 != 0).then(|| format!("t{}", h & 0x07));
        out.push(Record { ingest_ms, topic, key, payload: printable(payload) });
        data = rest;
    }
    out
}

/// `records` as a segment file, as `SpoolWriter` writes one (header, then `segment::encode`
/// per record), with the end offset of each frame.
pub fn write(records: &[Record]) -> (Vec<u8>, Vec<usize>) {
    let mut file = HEADER.to_vec();
    let mut ends = Vec::with_capacity(records.len());
    for record in records {
        format::encode(record.ingest_ms, record.topic.as_deref(), record.key.as_deref(), &record.payload, &mut file);
        ends.push(file.len());
    }
    (file, ends)
}

fn position_and_mask(data: &[u8]) -> (usize, u8, &[u8]) {
    match data {
        [low, high, mask, rest @ ..] => (usize::from(u16::from_le_bytes([*low, *high])), (*mask).max(1), rest),
        _ => (0, 1, &[]),
    }
}

/// What the stream reader returns reading `data` after its header as the backlog reader does:
/// the frames, and how it stopped (`None`: a clean end; `Some(true)`: damage).
fn stream(data: &[u8], max_body: usize) -> (Vec<Record>, bool) {
    let mut reader = data.get(HEADER.len()..).unwrap_or_default();
    let mut body = Vec::new();
    let mut frames = Vec::new();
    loop {
        let (read, peak) = peak_during(|| format::read_frame(&mut reader, &mut body, max_body));
        assert!(peak <= memory_bound(data.len()), "read_frame held {peak} bytes for a {}-byte file", data.len());
        match read {
            Ok(true) => {
                assert!(body.len() <= max_body, "a body of {} bytes above the limit {max_body}", body.len());
                let frame = format::body_frame(&body).expect("read_frame checked the body");
                frames.push(record_of(&frame));
            }
            Ok(false) => return (frames, false),
            Err(ReadError::Corrupt) => return (frames, true),
            Err(ReadError::Io(error)) => panic!("reading from memory failed: {error}"),
        }
    }
}

fn record_of(frame: &Frame<'_>) -> Record {
    Record {
        ingest_ms: frame.ingest_ms,
        topic: frame.topic.map(str::to_string),
        key: frame.key.map(<[u8]>::to_vec),
        payload: frame.payload.to_vec(),
    }
}

/// `scan`, with its memory checked.
fn scan(data: &[u8]) -> ScanReport {
    let (report, peak) = peak_during(|| format::scan(data));
    assert!(peak <= memory_bound(data.len()), "scan held {peak} bytes for a {}-byte file", data.len());
    report
}

fn frames_of(data: &[u8], report: &ScanReport) -> Vec<Record> {
    report
        .frames
        .iter()
        .map(|range| {
            let (frame, len) = format::frame_at(data, range.start).expect("scan reported an intact frame");
            assert_eq!(len, range.len(), "frame length and range");
            record_of(&frame)
        })
        .collect()
}

/// Any file: the accounting, the repair and the stream reader (see the module docs).
pub fn file(data: &[u8]) {
    let report = scan(data);
    let header_ok = format::header_ok(data);
    assert_eq!(report.header_ok, header_ok, "header verdict");
    if !header_ok {
        assert!(report.frames.is_empty(), "frames trusted behind a wrong header");
        assert_eq!(report.corrupt_regions, u64::from(!data.is_empty()), "a wrong header is one damaged region");
        assert_eq!(report.corrupt_bytes, data.len() as u64, "a wrong header makes the whole file damage");
        // Recovery then keeps nothing of the file, so the stream reader never reads it.
        return;
    }
    // Every byte is header, intact frame or counted damage; no intact frame is skipped.
    let (mut cursor, mut regions, mut damaged_bytes) = (HEADER.len(), 0u64, 0u64);
    let mut leading = None;
    let gap = |from: usize, to: usize, regions: &mut u64, damaged_bytes: &mut u64| {
        if to > from {
            for offset in from..to {
                assert!(format::frame_at(data, offset).is_none(), "an intact frame at {offset} counted as damage");
            }
            *regions += 1;
            *damaged_bytes += (to - from) as u64;
        }
    };
    for (i, range) in report.frames.iter().enumerate() {
        assert!(range.start >= cursor && range.end <= data.len(), "frame {range:?} out of order or bounds");
        assert!(range.len() - format::FRAME_OVERHEAD <= MAX_BODY, "a body above MAX_BODY");
        if range.start > cursor && leading.is_none() {
            leading = Some(i);
        }
        gap(cursor, range.start, &mut regions, &mut damaged_bytes);
        cursor = range.end;
    }
    if cursor < data.len() && leading.is_none() {
        leading = Some(report.frames.len());
    }
    gap(cursor, data.len(), &mut regions, &mut damaged_bytes);
    assert_eq!(report.corrupt_regions, regions, "damaged regions counted");
    assert_eq!(report.corrupt_bytes, damaged_bytes, "damaged bytes counted");

    // The repaired copy recovery writes back scans clean, with the same records.
    let frames = frames_of(data, &report);
    let mut clean = HEADER.to_vec();
    for range in &report.frames {
        clean.extend_from_slice(&data[range.clone()]);
    }
    let again = scan(&clean);
    assert_eq!((again.corrupt_regions, again.corrupt_bytes), (0, 0), "the repaired copy has damage");
    assert_eq!(frames_of(&clean, &again), frames, "the repaired copy holds other records");

    // The stream reader gives up at the first damage: it returns the frames before it.
    let leading = leading.unwrap_or(frames.len());
    let damaged = report.corrupt_regions > 0;
    assert_eq!(stream(data, MAX_BODY), (frames[..leading].to_vec(), damaged), "the stream reader and scan disagree");
    // With a lower limit, it stops at the first body above it, as damage.
    let small = frames[..leading].iter().position(|record| frame_body_len(record) > SMALL_BODY).unwrap_or(leading);
    let (read, read_damaged) = stream(data, SMALL_BODY);
    assert_eq!(read, frames[..small].to_vec(), "frames read under the small limit");
    assert_eq!(read_damaged, small < leading || damaged, "how the small-limit read ended");
}

fn frame_body_len(record: &Record) -> usize {
    format::frame_len(record.topic.as_deref(), record.key.as_deref(), &record.payload) - format::FRAME_OVERHEAD
}

/// A valid segment cut at any length: exactly the records before the cut, and one damaged
/// region for a torn last frame.
pub fn cut(data: &[u8]) {
    let (position, _, rest) = position_and_mask(data);
    let written = records(rest);
    let (whole, ends) = write(&written);
    let cut = position % (whole.len() + 1);
    let data = &whole[..cut];
    let report = scan(data);
    if cut < HEADER.len() {
        assert!(!report.header_ok && report.frames.is_empty(), "a torn header trusted");
        assert_eq!((report.corrupt_regions, report.corrupt_bytes), (u64::from(cut > 0), cut as u64));
        return;
    }
    let kept = ends.iter().take_while(|&&end| end <= cut).count();
    let last_end = kept.checked_sub(1).map_or(HEADER.len(), |i| ends[i]);
    assert_eq!(frames_of(data, &report), written[..kept].to_vec(), "not the records before the cut");
    let torn = cut - last_end;
    assert_eq!(
        (report.corrupt_regions, report.corrupt_bytes),
        (u64::from(torn > 0), torn as u64),
        "a torn last frame is one damaged region of its bytes"
    );
    assert_eq!(stream(data, MAX_BODY), (written[..kept].to_vec(), torn > 0), "the stream reader on a cut segment");
    file(data);
}

/// A valid segment with one byte changed: every record but the one hit, whose bytes are one
/// damaged region (CRC-32C detects every error within 32 bits).
pub fn flipped(data: &[u8]) {
    let (position, mask, rest) = position_and_mask(data);
    let written = records(rest);
    let (mut data, ends) = write(&written);
    let at = position % data.len();
    data[at] ^= mask;
    let report = scan(&data);
    if at < HEADER.len() {
        assert!(!report.header_ok && report.frames.is_empty(), "a damaged header trusted");
        assert_eq!((report.corrupt_regions, report.corrupt_bytes), (1, data.len() as u64));
        return;
    }
    let hit = ends.iter().position(|&end| at < end).expect("the byte is in a frame");
    let start = hit.checked_sub(1).map_or(HEADER.len(), |i| ends[i]);
    let mut expected = written.clone();
    expected.remove(hit);
    assert_eq!(frames_of(&data, &report), expected, "a changed byte lost other records than its own");
    assert_eq!(
        (report.corrupt_regions, report.corrupt_bytes),
        (1, (ends[hit] - start) as u64),
        "the damaged record is one counted region"
    );
    assert_eq!(stream(&data, MAX_BODY), (written[..hit].to_vec(), true), "the stream reader on a damaged segment");
    file(&data);
}
