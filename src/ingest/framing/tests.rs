use super::*;
use crate::telemetry::outcome::Rejected;

/// Every frame `framer` cuts from `input`, read in those pieces, then end of stream. Shared by
/// the tests of every framer (`super::super::forward` too).
pub(crate) fn frames(framer: &mut impl Decoder<Item = Frame, Error = std::io::Error>, input: &[&[u8]]) -> Vec<Frame> {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for chunk in input {
        buf.extend_from_slice(chunk);
        while let Some(frame) = framer.decode(&mut buf).expect("decode never fails") {
            out.push(frame);
        }
    }
    while let Some(frame) = framer.decode_eof(&mut buf).expect("decode never fails") {
        out.push(frame);
    }
    out
}

fn line(text: &str) -> Frame {
    Frame::Record(BytesMut::from(text.as_bytes()))
}

#[test]
fn splits_records_at_newlines_and_strips_carriage_returns() {
    let out = frames(&mut LineFramer::new(100), &[b"one\ntwo\r\nthr", b"ee\n"]);
    assert_eq!(out, vec![line("one"), line("two"), line("three")]);
}

#[test]
fn keeps_a_last_record_without_newline_at_end_of_stream() {
    let out = frames(&mut LineFramer::new(100), &[b"one\ntail"]);
    assert_eq!(out, vec![line("one"), line("tail")]);
}

#[test]
fn reports_empty_lines_as_empty_records() {
    let out = frames(&mut LineFramer::new(100), &[b"\n\r\na\n"]);
    assert_eq!(out, vec![line(""), line(""), line("a")]);
}

#[test]
fn discards_an_overlong_record_up_to_its_newline_and_continues() {
    let long = vec![b'x'; 50];
    let out = frames(&mut LineFramer::new(10), &[b"before\n", &long, b"\nafter\n"]);
    assert_eq!(out, vec![line("before"), Frame::TooLarge { len: 50 }, line("after")]);
}

#[test]
fn discards_an_overlong_record_arriving_in_small_pieces_without_holding_it() {
    let mut framer = LineFramer::new(10);
    let mut buf = BytesMut::new();
    for _ in 0..1000 {
        buf.extend_from_slice(b"xxxxxxx");
        assert_eq!(framer.decode(&mut buf).expect("decode"), None);
        assert!(buf.len() <= 11 + 7, "buffer held {} bytes", buf.len());
    }
    buf.extend_from_slice(b"\nok\n");
    assert_eq!(framer.decode(&mut buf).expect("decode"), Some(Frame::TooLarge { len: 7000 }));
    assert_eq!(framer.decode(&mut buf).expect("decode"), Some(line("ok")));
}

#[test]
fn accepts_a_record_of_exactly_the_limit() {
    let out = frames(&mut LineFramer::new(5), &[b"12345\n123456\n12345\r\n"]);
    assert_eq!(out, vec![line("12345"), Frame::TooLarge { len: 6 }, line("12345")]);
}

#[test]
fn reports_an_overlong_unterminated_record_at_end_of_stream() {
    let out = frames(&mut LineFramer::new(4), &[b"ok\n0123456789"]);
    assert_eq!(out, vec![line("ok"), Frame::TooLarge { len: 10 }]);
}

// ---- octet counting (RFC 6587)

#[test]
fn octet_counting_keeps_newlines_inside_a_record() {
    let out = frames(&mut OctetFramer::new(100), &[b"11 line1\nline2", b"3 abc"]);
    assert_eq!(out, vec![line("line1\nline2"), line("abc")]);
}

#[test]
fn octet_counting_reassembles_frames_split_anywhere() {
    let input = b"5 hello12 hello world!";
    for split in 0..input.len() {
        let out = frames(&mut OctetFramer::new(100), &[&input[..split], &input[split..]]);
        assert_eq!(out, vec![line("hello"), line("hello world!")], "split at {split}");
    }
}

#[test]
fn octet_counting_tolerates_line_breaks_between_frames() {
    let out = frames(&mut OctetFramer::new(100), &[b"2 ab\n\r\n2 cd\n"]);
    assert_eq!(out, vec![line("ab"), line("cd")]);
}

#[test]
fn octet_counting_skips_an_overlong_body_without_holding_it_and_continues() {
    let mut framer = OctetFramer::new(10);
    let mut buf = BytesMut::from(&b"50 "[..]);
    assert_eq!(framer.decode(&mut buf).expect("decode"), None);
    for _ in 0..5 {
        buf.extend_from_slice(b"xxxxxxxxxx");
        let frame = framer.decode(&mut buf).expect("decode");
        assert!(buf.is_empty(), "skipped bytes are not held");
        if frame.is_some() {
            assert_eq!(frame, Some(Frame::TooLarge { len: 50 }));
        }
    }
    buf.extend_from_slice(b"2 ok");
    assert_eq!(framer.decode(&mut buf).expect("decode"), Some(line("ok")));
}

#[test]
fn octet_counting_does_not_allocate_a_declared_4_gib() {
    let mut framer = OctetFramer::new(1024);
    let mut buf = BytesMut::from(&b"4294967296 abc"[..]);
    assert_eq!(framer.decode(&mut buf).expect("decode"), None);
    assert!(buf.capacity() < 1024);
    assert_eq!(framer.decode_eof(&mut buf).expect("decode"), Some(Frame::Broken(Rejected::Malformed)));
}

#[test]
fn octet_counting_breaks_on_a_length_that_is_not_a_number() {
    for input in [&b"abc def"[..], b" 5 hello", b"12345678901 x", b"-1 x"] {
        let out = frames(&mut OctetFramer::new(100), &[input]);
        assert_eq!(out.first(), Some(&Frame::Broken(Rejected::Malformed)), "{input:?}");
    }
}

#[test]
fn octet_counting_reports_a_frame_truncated_by_end_of_stream() {
    let out = frames(&mut OctetFramer::new(100), &[b"3 ab"]);
    assert_eq!(out, vec![Frame::Broken(Rejected::Malformed)]);
    let out = frames(&mut OctetFramer::new(100), &[b"2 ab12"]);
    assert_eq!(out, vec![line("ab"), Frame::Broken(Rejected::Malformed)]);
}

#[test]
fn a_zero_length_frame_is_an_empty_record() {
    let out = frames(&mut OctetFramer::new(100), &[b"0 2 ab"]);
    assert_eq!(out, vec![line(""), line("ab")]);
}

// ---- syslog stream framing

#[test]
fn syslog_stream_tells_octet_counted_from_newline_frames_per_frame() {
    let out = frames(&mut SyslogFramer::new(100), &[b"<13>one\n8 <13>t\nwo<14>three\n\n<15>four"]);
    assert_eq!(out, vec![line("<13>one"), line("<13>t\nwo"), line("<14>three"), line("<15>four")]);
}

#[test]
fn syslog_stream_framing_survives_any_split() {
    let input = b"5 <1>a\n<2>bb\n6 <3>ccc";
    for split in 0..input.len() {
        let out = frames(&mut SyslogFramer::new(100), &[&input[..split], &input[split..]]);
        assert_eq!(out, vec![line("<1>a\n"), line("<2>bb"), line("<3>ccc")], "split at {split}");
    }
}

/// Found by `scripts/fuzz syslog`: after a broken octet count, the bytes of the next read were
/// framed as new lines. Every framer stays broken (the connection closes on the first `Broken`).
#[test]
fn syslog_stream_framing_stays_broken_after_a_bad_octet_count() {
    let out = frames(&mut SyslogFramer::new(100), &[b"9>nop", b"e\n<13>just text\n", b"<14>more\n"]);
    assert_eq!(out, vec![Frame::Broken(Rejected::Malformed)]);
}

/// Every frame `framer` cuts from `input`, then what it still holds when the agent stops reading
/// ([`Unfinished`]).
fn frames_cut(
    framer: &mut (impl Decoder<Item = Frame, Error = std::io::Error> + Unfinished),
    input: &[u8],
) -> Vec<Frame> {
    let mut buf = BytesMut::from(input);
    let mut out = Vec::new();
    while let Some(frame) = framer.decode(&mut buf).expect("decode never fails") {
        out.push(frame);
    }
    out.extend(framer.unfinished(&mut buf));
    assert!(buf.is_empty(), "nothing is held after");
    out
}

/// Issue 30, item 6: at an end of stream the agent caused, a last line without its newline is
/// not a record (at the writer's end of stream it still is: see above).
#[test]
fn what_the_writer_had_not_finished_when_the_agent_stops_reading_is_truncated() {
    assert_eq!(
        frames_cut(&mut LineFramer::new(100), b"one\nhalf a li"),
        vec![line("one"), Frame::Truncated { len: 9 }]
    );
    assert_eq!(frames_cut(&mut LineFramer::new(100), b"one\n"), vec![line("one")], "nothing held, nothing counted");
    assert_eq!(
        frames_cut(&mut LineFramer::new(4), b"far too long"),
        vec![Frame::TooLarge { len: 12 }],
        "a record being skipped as too large stays too large"
    );
    assert_eq!(
        frames_cut(&mut OctetFramer::new(100), b"3 one5 tw"),
        vec![Frame::Record(BytesMut::from(&b"one"[..])), Frame::Truncated { len: 2 }]
    );
    assert_eq!(frames_cut(&mut OctetFramer::new(100), b"3 one\n"), vec![Frame::Record(BytesMut::from(&b"one"[..]))]);
    assert_eq!(
        frames_cut(&mut SyslogFramer::new(100), b"<13>whole\n<13>ha"),
        vec![line("<13>whole"), Frame::Truncated { len: 6 }]
    );
}

/// `framer` reads `before`, gives up the record in progress, then reads `after`: what it held
/// when it gave up, and every frame after.
fn give_up_between(
    framer: &mut (impl Decoder<Item = Frame, Error = std::io::Error> + Unfinished),
    before: &[u8],
    after: &[u8],
) -> (Option<u64>, Vec<Frame>) {
    let mut buf = BytesMut::from(before);
    while framer.decode(&mut buf).expect("decode never fails").is_some() {}
    let held = framer.give_up_partial(&mut buf);
    assert!(buf.is_empty(), "nothing of it is held after");
    buf.extend_from_slice(after);
    let mut out = Vec::new();
    while let Some(frame) = framer.decode(&mut buf).expect("decode never fails") {
        out.push(frame);
    }
    (held, out)
}

/// Issue 30, item 10 (cold review of the fix): a record given up for read room others wait for
/// is counted once, its rest skipped silently as it arrives, and the records after it read.
#[test]
fn a_record_given_up_is_skipped_to_its_end_silently_and_the_next_ones_are_read() {
    assert_eq!(
        give_up_between(&mut LineFramer::new(100), b"first\nhalf of a l", b"ong line\nnext\n"),
        (Some(11), vec![line("next")])
    );
    assert_eq!(give_up_between(&mut LineFramer::new(100), b"whole\n", b"next\n"), (None, vec![line("next")]));
    assert_eq!(
        give_up_between(&mut OctetFramer::new(100), b"10 abc", b"defghij5 hello"),
        (Some(3), vec![Frame::Record(BytesMut::from(&b"hello"[..]))])
    );
    assert_eq!(
        give_up_between(&mut SyslogFramer::new(100), b"<13>half", b" of it\n5 <13>x"),
        (Some(8), vec![Frame::Record(BytesMut::from(&b"<13>x"[..]))]),
        "the next record's framing is judged anew"
    );
    assert_eq!(
        give_up_between(&mut SyslogFramer::new(100), b"20 <13>ten bytes", b"1234567<13>next\n"),
        (Some(13), vec![line("<13>next")])
    );
}
