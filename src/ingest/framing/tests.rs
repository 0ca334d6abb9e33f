use super::*;

fn frames(framer: &mut LineFramer, input: &[&[u8]]) -> Vec<Frame> {
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
    Frame::Line(BytesMut::from(text.as_bytes()))
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
