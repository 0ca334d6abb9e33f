use super::*;

fn segment(frames: &[(Option<&[u8]>, &[u8])]) -> Vec<u8> {
    let mut data = HEADER.to_vec();
    for (i, (key, payload)) in frames.iter().enumerate() {
        encode(1_000 + i as u64, None, *key, payload, &mut data);
    }
    data
}

#[test]
fn frames_round_trip_with_and_without_keys() {
    let data = segment(&[(None, b"one"), (Some(b"k"), b"two"), (Some(b""), b"")]);
    let report = scan(&data);
    assert!(report.header_ok);
    assert_eq!(report.corrupt_regions, 0);
    let frames: Vec<_> = report.frames.iter().map(|r| frame_at(&data, r.start).expect("intact").0).collect();
    assert_eq!(
        frames,
        vec![
            Frame { ingest_ms: 1_000, topic: None, key: None, payload: b"one" },
            Frame { ingest_ms: 1_001, topic: None, key: Some(b"k"), payload: b"two" },
            Frame { ingest_ms: 1_002, topic: None, key: Some(b""), payload: b"" }
        ]
    );
    assert_eq!(report.frames[0].len(), frame_len(None, None, b"one"));
}

#[test]
fn a_flipped_bit_loses_only_its_own_frame() {
    let mut data = segment(&[(None, b"first"), (None, b"second"), (None, b"third")]);
    let second = scan(&data).frames[1].clone();
    data[second.start + FRAME_OVERHEAD + 5] ^= 0x10;
    let report = scan(&data);
    assert_eq!(report.corrupt_regions, 1);
    let payloads: Vec<_> = report.frames.iter().map(|r| frame_at(&data, r.start).expect("intact").0.payload).collect();
    assert_eq!(payloads, vec![&b"first"[..], &b"third"[..]]);
}

#[test]
fn a_torn_last_frame_is_one_corrupt_region() {
    let mut data = segment(&[(None, b"kept"), (None, b"torn by a crash")]);
    data.truncate(data.len() - 4);
    let report = scan(&data);
    assert_eq!(report.frames.len(), 1);
    assert_eq!(report.corrupt_regions, 1);
}

#[test]
fn a_wrong_header_trusts_nothing() {
    let mut data = segment(&[(None, b"x")]);
    data[0] = b'X';
    let report = scan(&data);
    assert!(!report.header_ok);
    assert!(report.frames.is_empty());
    assert_eq!(report.corrupt_regions, 1);
}

#[test]
fn a_huge_declared_length_is_damage_not_an_allocation() {
    let mut data = segment(&[(None, b"x")]);
    let frame_start = HEADER.len();
    data[frame_start..frame_start + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(scan(&data).frames.is_empty());
    let mut reader = &data[frame_start..];
    let mut body = Vec::new();
    assert!(matches!(read_frame(&mut reader, &mut body, 1024), Err(ReadError::Corrupt)));
    assert!(body.capacity() < 1024);
}

#[test]
fn read_frame_does_not_allocate_a_declared_length_the_file_cannot_back() {
    // Found by the `segment` fuzz target: a length below the limit but beyond the file's end was
    // allocated (and zeroed) in full before the read came up short, and the reader's buffer
    // kept that capacity.
    let mut data = segment(&[(None, b"x")]);
    let frame_start = HEADER.len();
    data[frame_start + 3] = 0x04; // 64 MiB more than the frame has
    let mut reader = &data[frame_start..];
    let mut body = Vec::new();
    assert!(matches!(read_frame(&mut reader, &mut body, MAX_BODY), Err(ReadError::Corrupt)));
    assert!(body.capacity() < 64 * 1024, "capacity {}", body.capacity());
}

#[test]
fn read_frame_streams_frames_and_reports_a_clean_end() {
    let data = segment(&[(Some(b"key"), b"payload"), (None, b"next")]);
    let mut reader = &data[HEADER.len()..];
    let mut body = Vec::new();
    assert!(read_frame(&mut reader, &mut body, 1024).expect("first"));
    assert_eq!(
        body_frame(&body),
        Some(Frame { ingest_ms: 1_000, topic: None, key: Some(b"key"), payload: b"payload" })
    );
    assert!(read_frame(&mut reader, &mut body, 1024).expect("second"));
    assert!(!read_frame(&mut reader, &mut body, 1024).expect("end"));
}

#[test]
fn a_frame_keeps_its_topic_beside_its_key() {
    let mut data = HEADER.to_vec();
    encode(1_000, Some("logs.shop"), Some(b"k"), b"one", &mut data);
    encode(1_001, Some("logs.cart"), None, b"", &mut data);
    let report = scan(&data);
    assert_eq!(report.corrupt_regions, 0);
    let frames: Vec<_> = report.frames.iter().map(|r| frame_at(&data, r.start).expect("intact").0).collect();
    assert_eq!(
        frames,
        vec![
            Frame { ingest_ms: 1_000, topic: Some("logs.shop"), key: Some(b"k"), payload: b"one" },
            Frame { ingest_ms: 1_001, topic: Some("logs.cart"), key: None, payload: b"" },
        ]
    );
    assert_eq!(report.frames[0].len(), frame_len(Some("logs.shop"), Some(b"k"), b"one"));
}

/// A spool an earlier release left (version 2: no topics) is read after an upgrade, its records
/// without a topic (they go to the default one).
#[test]
fn reads_a_version_2_segment_an_earlier_release_wrote() {
    // Bytes as version 2 wrote them: header, then ingest_ms, key length, key, payload.
    let mut data = b"SLUICESP\x02\x00\x00\x00".to_vec();
    let body: Vec<u8> = [&1_000u64.to_le_bytes()[..], &1u32.to_le_bytes(), b"k", b"old record"].concat();
    data.extend_from_slice(&(body.len() as u32).to_le_bytes());
    data.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    data.extend_from_slice(&body);
    let report = scan(&data);
    assert!(report.header_ok);
    assert_eq!(report.corrupt_regions, 0);
    let (frame, _) = frame_at(&data, report.frames[0].start).expect("intact");
    assert_eq!(frame, Frame { ingest_ms: 1_000, topic: None, key: Some(b"k"), payload: b"old record" });
}

#[test]
fn refuses_a_segment_of_an_unknown_version() {
    let mut data = b"SLUICESP\x04\x00\x00\x00".to_vec();
    encode(1_000, Some("t"), None, b"x", &mut data);
    assert!(!scan(&data).header_ok);
}
