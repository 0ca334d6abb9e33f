//! What the fuzz targets share: feeding a decoder the way a socket does (in reads of varying
//! size, then end of stream) and checking what every frame must be.
//!
//! Each target is a function here, so `cargo test` in this crate replays the committed seeds
//! through exactly what the fuzzer runs (scripts/test does, without instrumentation).
//!
//! For the decoders the first input byte chooses the read sizes, so the fuzzer explores records
//! split across reads at every position, which is where framers go wrong. Beyond ingest: `row`
//! (the persister's envelope parsing, [`persist`]) and `segment` (spool recovery, [`spool`]);
//! they also assert that memory stays in proportion to the input, counted by this crate's
//! allocator ([`alloc`]).

pub mod alloc;
pub mod persist;
#[cfg(test)]
mod seeds;
pub mod spool;

pub use persist::row;
pub use spool::segment;

use bytes::BytesMut;
use sluice::ingest::forward::{self, ForwardFramer, Limits};
use sluice::ingest::framing::{Frame, LineFramer, OctetFramer, SyslogFramer, Unfinished};
use sluice::ingest::syslog;
use tokio_util::codec::Decoder;

/// The record size limit the targets use: small, so the fuzzer reaches "too large" often.
pub const MAX_RECORD: usize = 512;
/// The JSON depth limit the targets use: small, for the same reason.
pub const MAX_DEPTH: usize = 8;

/// Feeds `data` to `decoder` in reads of 1..=`step` bytes (`step` from the first byte), then
/// signals end of stream, calling `each` for every frame. Checks the framing invariants: no
/// record above the limit, the read buffer never above one record plus one read, and after a
/// `Broken` frame nothing more comes out.
pub fn feed<D>(mut decoder: D, data: &[u8], mut each: impl FnMut(&Frame))
where
    D: Decoder<Item = Frame, Error = std::io::Error> + Unfinished,
{
    let Some((&first, data)) = data.split_first() else { return };
    let step = usize::from(first % 64) + 1;
    // A framer may hold at most the record it is cutting plus what one read added.
    let bound = 2 * MAX_RECORD + 64 + step;
    let mut buf = BytesMut::new();
    let mut broken = false;
    let mut check = |frame: Frame, held: usize| -> bool {
        assert!(held <= bound, "read buffer grew to {held}");
        match &frame {
            Frame::Record(record) => {
                assert!(record.len() <= MAX_RECORD, "record of {} bytes above the limit", record.len())
            }
            Frame::TooLarge { len } => assert!(*len > MAX_RECORD as u64, "too large at {len} bytes"),
            Frame::Truncated { len } => assert!(*len as usize <= bound, "truncated at {len} bytes"),
            Frame::Broken(_) => {}
        }
        each(&frame);
        matches!(frame, Frame::Broken(_))
    };
    for chunk in data.chunks(step) {
        buf.extend_from_slice(chunk);
        while let Some(frame) = decoder.decode(&mut buf).expect("framers do not fail") {
            assert!(!broken, "a frame after Broken: {frame:?}");
            broken |= check(frame, buf.len());
        }
        assert!(buf.len() <= bound, "read buffer grew to {}", buf.len());
    }
    if first & 0x80 != 0 {
        // The agent's end of the stream (a drain, an idle timeout): what the framer still holds
        // is one frame at most, never a record, and nothing is held after it.
        if !broken && let Some(frame) = decoder.unfinished(&mut buf) {
            assert!(!matches!(frame, Frame::Record(_)), "an unfinished record passed for a whole one: {frame:?}");
            check(frame, 0);
        }
        assert!(buf.is_empty(), "{} bytes held after the agent's end of the stream", buf.len());
        return;
    }
    while !broken && let Some(frame) = decoder.decode_eof(&mut buf).expect("framers do not fail") {
        broken |= check(frame, buf.len());
    }
}

/// The content checks every record goes through; a record that passes is valid UTF-8.
pub fn validate(bytes: &[u8]) -> Option<&str> {
    sluice::ingest::record::validate(bytes, MAX_DEPTH).ok()
}

/// Asserts that `json` is one JSON object.
pub fn assert_json_object(json: &[u8]) {
    match serde_json::from_slice::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(_)) => {}
        other => panic!("not a JSON object: {other:?} from {:?}", String::from_utf8_lossy(json)),
    }
}

/// `lines`: LineFramer then the content checks. No record holds a newline, and the fast JSON
/// depth scan agrees with [`reference_depth_exceeds`].
pub fn lines(data: &[u8]) {
    feed(LineFramer::new(MAX_RECORD), data, |frame| {
        if let Frame::Record(record) = frame {
            assert!(!record.contains(&b'\n'), "a line holds a newline");
            for max in [0, 1, 2, MAX_DEPTH] {
                assert_eq!(
                    sluice::ingest::record::json_depth_exceeds(record, max),
                    reference_depth_exceeds(record, max),
                    "depth scan disagrees at max {max} on {:?}",
                    String::from_utf8_lossy(record)
                );
            }
            let _ = validate(record);
        }
    });
}

/// The JSON depth rule written the obvious way, one byte at a time.
pub fn reference_depth_exceeds(bytes: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in bytes {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// `octet_counted`: OctetFramer (RFC 6587) then the content checks.
pub fn octet_counted(data: &[u8]) {
    feed(OctetFramer::new(MAX_RECORD), data, |frame| {
        if let Frame::Record(record) = frame {
            let _ = validate(record);
        }
    });
}

fn syslog_message(bytes: &[u8]) {
    if let Some(text) = validate(syslog::trim_trailer(bytes)) {
        let mut json = Vec::new();
        syslog::to_record(text, &mut json);
        assert_json_object(&json);
    }
}

/// `syslog`: the whole input as one datagram, and as a stream (octet-counted or newline per
/// frame); trailer trimming, the content checks and the parser, whose output must be one JSON
/// object.
pub fn syslog(data: &[u8]) {
    syslog_message(data.get(1..).unwrap_or_default());
    feed(SyslogFramer::new(MAX_RECORD), data, |frame| {
        if let Frame::Record(record) = frame {
            syslog_message(record);
        }
    });
}

/// `forward`: the msgpack framer, then decoding each message in all four modes, one event at a
/// time as the agent does. The number of events known before decoding is exactly the number
/// decoded, and never more than the bytes they are read from (a declared count is not
/// believed); every accepted event is one JSON object within the size and depth limits.
pub fn forward(data: &[u8]) {
    let limits = Limits { max_record_size: MAX_RECORD, max_json_depth: MAX_DEPTH };
    feed(ForwardFramer::new(MAX_RECORD, MAX_DEPTH), data, |frame| {
        if let Frame::Record(message) = frame
            && let Ok(events) = forward::events(message, limits)
        {
            let count = events.len();
            assert!(events.inflated_len() <= MAX_RECORD, "inflated to {} bytes", events.inflated_len());
            assert!(count <= message.len() + events.inflated_len(), "{count} events from {} bytes", message.len());
            let mut decoded = 0;
            for record in events {
                decoded += 1;
                if let Ok(record) = record {
                    assert!(record.len() <= MAX_RECORD, "an event of {} bytes above the limit", record.len());
                    assert_json_object(&record);
                    assert!(!sluice::ingest::record::json_depth_exceeds(&record, MAX_DEPTH), "too deep an event");
                }
            }
            assert_eq!(decoded, count, "events counted up front and events decoded");
        }
    });
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn replay(target: &str, run: fn(&[u8])) {
        // Cargo's value at run time: a test binary another clone built names that clone.
        let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
        let dir = Path::new(&root).join("seeds").join(target);
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("the seeds directory") {
            let path = entry.expect("a seed").path();
            // Shown with a failure: which seed it was.
            eprintln!("seed {}", path.display());
            run(&std::fs::read(&path).expect("a readable seed"));
            seen += 1;
        }
        assert!(seen > 0, "no seeds in {}", dir.display());
    }

    #[test]
    fn every_lines_seed_passes_the_lines_target() {
        replay("lines", super::lines);
    }

    #[test]
    fn every_octet_counted_seed_passes_the_octet_counted_target() {
        replay("octet_counted", super::octet_counted);
    }

    #[test]
    fn every_syslog_seed_passes_the_syslog_target() {
        replay("syslog", super::syslog);
    }

    #[test]
    fn every_forward_seed_passes_the_forward_target() {
        replay("forward", super::forward);
    }

    #[test]
    fn every_row_seed_passes_the_row_target() {
        replay("row", super::row);
    }

    #[test]
    fn every_segment_seed_passes_the_segment_target() {
        replay("segment", super::segment);
    }
}
