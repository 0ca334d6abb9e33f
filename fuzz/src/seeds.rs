//! Writes the committed seeds of `row` and `segment` from the real writers (the agent's
//! `EnvelopeWriter`, the spool's `SpoolWriter`), so they can be made again and stay what they
//! say they are:
//!
//! ```text
//! cargo test --manifest-path fuzz/Cargo.toml -- --ignored write_row_and_segment_seeds
//! ```

use std::path::{Path, PathBuf};

use chrono::{TimeZone, Utc};
use sluice::buffer::spool::segment::HEADER;
use sluice::buffer::spool::{Entry, Fsync, Spool, SpoolConfig};
use sluice::envelope::{EnvelopeKind, EnvelopeWriter, Peer, PeerFragment, PodMetadata};

fn seeds(target: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds").join(target);
    std::fs::create_dir_all(&dir).expect("the seeds directory");
    dir
}

fn put(dir: &Path, name: &str, mode: u8, body: &[u8]) {
    let mut bytes = vec![mode];
    bytes.extend_from_slice(body);
    std::fs::write(dir.join(name), bytes).expect("a seed written");
}

fn envelope(line: &str) -> Vec<u8> {
    envelope_as(EnvelopeKind::Json, line)
}

fn envelope_as(kind: EnvelopeKind, line: &str) -> Vec<u8> {
    let pod = PodMetadata {
        name: Some("web-1".into()),
        namespace: Some("shop".into()),
        container: None,
        node: None,
        info: Default::default(),
    };
    let instance = uuid::Uuid::parse_str("0197a5c0f0e07d3a8f1e2b3c4d5e6f70").expect("a uuid");
    let writer = EnvelopeWriter::with_instance(&pod, instance, kind);
    let peer = PeerFragment::new(Some(Peer { pid: Some(42), uid: 1000, gid: 1000 }));
    let now = Utc.with_ymd_and_hms(2026, 6, 1, 12, 0, 0).single().expect("a valid time");
    let mut out = bytes::BytesMut::new();
    writer.write(line, &peer, now, &mut out);
    out.to_vec()
}

fn deep(depth: usize, inner: &str) -> String {
    format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A segment file as the spool writes it, with the end offset of each frame.
fn spool_segment(records: &[(Option<&[u8]>, Vec<u8>)]) -> (Vec<u8>, Vec<usize>) {
    let dir = std::env::temp_dir().join(format!("sluice-fuzz-seeds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = SpoolConfig {
        dir: dir.clone(),
        max_bytes: 1 << 20,
        segment_bytes: 1 << 20,
        fsync: Fsync::Never,
        max_body: 1 << 16,
    };
    let (spool, mut writer, _) = Spool::open(config).expect("a spool");
    let entries: Vec<Entry<'_>> = records
        .iter()
        .enumerate()
        .map(|(i, (key, payload))| Entry {
            ingest_ms: 1_780_315_200_000 + i as u64,
            topic: (i % 2 == 0).then_some("sluice-logs"),
            key: *key,
            payload,
        })
        .collect();
    let appended = writer.append(&entries);
    assert!(appended.error.is_none() && appended.positions.len() == records.len(), "every record appended");
    let mut ends: Vec<usize> = appended.positions.iter().skip(1).map(|pos| pos.offset as usize).collect();
    writer.close().expect("closed");
    drop(spool);
    let file = std::fs::read(dir.join(format!("{:020}.seg", 0))).expect("the segment file");
    ends.push(file.len());
    std::fs::remove_dir_all(&dir).expect("the spool removed");
    (file, ends)
}

#[test]
#[ignore = "writes fuzz/seeds; run by hand when the formats change"]
fn write_row_and_segment_seeds() {
    let row = seeds("row");
    let (message, line) = (0, 1);
    put(&row, "v1_json", message, &envelope(r#"{"ts":1780315200.5,"level":"WARN","msg":"disk 91% full","n":1.50}"#));
    put(&row, "v1_text", message, &envelope("plain \"text\" line \\ ü"));
    let v2 =
        String::from_utf8(envelope(r#"{"msg":"from the future"}"#)).expect("utf-8").replace(r#""v":1"#, r#""v":2"#);
    put(&row, "v2_unsupported", message, v2.as_bytes());
    put(
        &row,
        "binary_json",
        message,
        &envelope_as(EnvelopeKind::Binary, r#"{"ts":1780315200.5,"level":"WARN","msg":"x"}"#),
    );
    put(&row, "binary_text", message, &envelope_as(EnvelopeKind::Binary, "plain \"text\" line \\ ü"));
    let binary = envelope_as(EnvelopeKind::Binary, r#"{"msg":"cut short"}"#);
    put(&row, "binary_truncated", message, &binary[..20]);
    let mut future = binary.clone();
    future[0] = 3;
    put(&row, "binary_unsupported", message, &future);
    put(&row, "binary_nul_in_record", message, &envelope_as(EnvelopeKind::Binary, r#"{"msg":"a\u0000b"}"#));
    let whole = envelope(r#"{"msg":"cut short"}"#);
    put(&row, "truncated", message, &whole[..whole.len() / 2]);
    put(&row, "no_value", message, b"");
    put(&row, "raw_nul", message, b"{\"v\":1,\x00\"id\":\"x\"}\x00\xff");
    put(&row, "nul_in_record", message, &envelope(r#"{"msg":"a\u0000b"}"#));
    let nul_pod = String::from_utf8(envelope(r#"{"msg":"ok"}"#)).expect("utf-8").replace("web-1", r"web\u0000-1");
    put(&row, "nul_in_pod", message, nul_pod.as_bytes());
    put(
        &row,
        "huge_numbers",
        message,
        br#"{"v":1,"id":"i-1","ingest_time":"2026-06-01T12:00:00Z","peer":{"pid":2147483647,"uid":4294967295,"gid":0},"format":"json","record":{"ts":1e308,"time":-1e300,"level":1e30,"n":123456789012345678901234567890}}"#,
    );
    put(&row, "huge_time", message, &envelope(r#"{"ts":1e300,"msg":"not a time"}"#));
    put(&row, "expired", message, &envelope(r#"{"msg":"old"}"#).replace_time("1999-06-01T12:00:00"));
    put(&row, "text_without_message", message, &envelope("x").replace_record(r#"{"msg":"no message"}"#));
    put(&row, "deep_record", message, &envelope(&format!(r#"{{"msg":"deep","x":{}}}"#, deep(140, "1"))));
    put(
        &row,
        "deep_record_nul_message",
        message,
        &envelope(&format!(r#"{{"msg":"a\u0000b","x":{}}}"#, deep(140, "1"))),
    );
    put(
        &row,
        "line_json",
        line,
        br#"{"@timestamp":"2026-06-01T11:59:59.5+02:00","severity":"Error","message":"boom","dup":1,"dup":2}"#,
    );
    put(&row, "line_text", line, "tab\there \"quoted\" \\u0000 literal ü".as_bytes());
    let line_json = 3;
    put(&row, "line_json_envelope", line_json, br#"{"level":"info","msg":"in the JSON envelope"}"#);
    put(
        &row,
        "line_deep_nul",
        line,
        format!(r#"{{"level":"INFO\u0000","x":{}}}"#, deep(130, r#""\u0000""#)).as_bytes(),
    );

    let segment = seeds("segment");
    let (file, cut, flip) = (0, 1, 2);
    let records: Vec<(Option<&[u8]>, Vec<u8>)> = vec![
        (Some(b"web-1"), envelope(r#"{"msg":"first"}"#)),
        (None, envelope("second, text")),
        (Some(b"web-1"), envelope(r#"{"msg":"third","n":3}"#)),
        (None, envelope("fourth")),
    ];
    let (data, ends) = spool_segment(&records);
    put(&segment, "file_valid", file, &data);
    put(&segment, "file_empty", file, b"");
    put(&segment, "file_header_only", file, HEADER);
    put(&segment, "file_cut_in_header", file, &data[..7]);
    put(&segment, "file_cut_in_frame_head", file, &data[..ends[1] + 5]);
    put(&segment, "file_cut_in_body", file, &data[..ends[1] + 40]);
    put(&segment, "file_cut_at_boundary", file, &data[..ends[2]]);
    let mut flipped = data.clone();
    flipped[ends[0] + 30] ^= 0x20;
    put(&segment, "file_flipped_byte", file, &flipped);
    // The second frame's length claims 64 MiB more than it has: damage, not an allocation.
    let mut huge = data.clone();
    huge[ends[0] + 3] = 0x04;
    put(&segment, "file_huge_length", file, &huge);
    let mut garbage = data[..ends[1]].to_vec();
    garbage.extend_from_slice(b"\x10\x00\x00\x00garbage between frames");
    garbage.extend_from_slice(&data[ends[1]..]);
    put(&segment, "file_garbage_between", file, &garbage);
    // Generated segments: position (u16le), mask, then records (see `spool::records`).
    let described = b"\x93\x30webkey{\"msg\":\"one\"}..........................\x05\x10{\"a\":1}\xa0\x08keyABCxyz";
    put(&segment, "cut_mid_record", cut, &[&[61, 0, 0][..], described].concat());
    put(&segment, "flip_length", flip, &[&[14, 0, 0x40][..], described].concat());
}

/// Edits of an envelope's text.
trait Edit {
    fn replace_time(&self, time: &str) -> Vec<u8>;
    fn replace_record(&self, record: &str) -> Vec<u8>;
}

impl Edit for Vec<u8> {
    fn replace_time(&self, time: &str) -> Vec<u8> {
        String::from_utf8_lossy(self).replace("2026-06-01T12:00:00", time).into_bytes()
    }

    fn replace_record(&self, record: &str) -> Vec<u8> {
        let text = String::from_utf8_lossy(self);
        let start = text.find(r#""record":"#).expect("a record") + r#""record":"#.len();
        format!("{}{record}}}", &text[..start]).into_bytes()
    }
}
