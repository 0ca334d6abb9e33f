//! What every record must be before it is wrapped: the checks shared by all protocols.
//!
//! Owns: the content rules (not empty, valid UTF-8, no U+0000, JSON nested no deeper than
//! `ingest.max_json_depth`). Must not: allocate, or judge framing (that is the framer's) or size
//! (checked while reading, before the bytes are held).
//!
//! - empty: `reason="empty"`;
//! - not UTF-8: `reason="invalid_utf8"` (rejected rather than repaired, so every stored payload
//!   is byte-identical to what the app wrote);
//! - contains a NUL byte, or (a record starting with `{`) its JSON escape `\u0000`:
//!   `reason="contains_nul"` (PostgreSQL text cannot hold U+0000; refusing at the socket tells
//!   the writer, instead of a dead letter far downstream — Go's `encoding/json` and JavaScript
//!   write the escape for a NUL in a string);
//! - a record starting with `{` holding a `\uD800`–`\uDFFF` escape that is not half of a pair:
//!   `reason="unpaired_surrogate"` (`json` would store it, and every JSON query reaching the row
//!   would fail; the persister's dead letter has the same word);
//! - a record starting with `{` whose brackets (outside strings) nest deeper than the limit:
//!   `reason="too_deep"`. JSON parsers recurse per level; this bounds their stack and time. The
//!   scan does not parse, so text that only looks like deep JSON is refused too.

use crate::telemetry::outcome::Rejected;

/// Checks one record and returns it as text.
pub fn validate(bytes: &[u8], max_json_depth: usize) -> Result<&str, Rejected> {
    if bytes.is_empty() {
        return Err(Rejected::Empty);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| Rejected::InvalidUtf8)?;
    if memchr::memchr(0, bytes).is_some() {
        return Err(Rejected::ContainsNul);
    }
    if bytes[0] == b'{' {
        if json_depth_exceeds(bytes, max_json_depth) {
            return Err(Rejected::TooDeep);
        }
        match crate::storable::unstorable_escape(text) {
            Some(crate::storable::Unstorable::Nul) => return Err(Rejected::ContainsNul),
            Some(crate::storable::Unstorable::UnpairedSurrogate) => return Err(Rejected::UnpairedSurrogate),
            None => {}
        }
    }
    Ok(text)
}

/// True if brackets outside strings nest deeper than `max`. A byte scan: cheaper than parsing,
/// and it stops at the first level too deep (so a megabyte of `[` costs nothing to refuse).
/// Inside a string it jumps from quote or backslash to the next with memchr, which is where
/// most of a log record's bytes are.
pub fn json_depth_exceeds(bytes: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let exceeded = for_each_bracket(bytes, |byte| match byte {
        b'{' | b'[' => {
            depth += 1;
            depth > max
        }
        _ => {
            depth = depth.saturating_sub(1);
            false
        }
    });
    exceeded == Scan::Stopped
}

/// How many objects and arrays `bytes` opens, outside strings (the same scan as
/// [`json_depth_exceeds`]).
pub fn json_containers(bytes: &[u8]) -> usize {
    let mut containers = 0usize;
    for_each_bracket(bytes, |byte| {
        if matches!(byte, b'{' | b'[') {
            containers += 1;
        }
        false
    });
    containers
}

/// How a bracket scan ended.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// `each` asked to stop.
    Stopped,
    /// The bytes ended (or a string in them never closed).
    Ended,
}

/// Calls `each` with every `{`, `[`, `}` and `]` of `bytes` outside strings, until it returns
/// true. Inside a string the scan jumps from quote or backslash to the next with memchr, which is
/// where most of a log record's bytes are.
fn for_each_bracket(bytes: &[u8], mut each: impl FnMut(u8) -> bool) -> Scan {
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                // Skip to the closing quote; a backslash escapes the byte after it.
                let mut from = at + 1;
                loop {
                    match memchr::memchr2(b'"', b'\\', &bytes[from..]) {
                        Some(offset) if bytes[from + offset] == b'\\' => from += offset + 2,
                        Some(offset) => {
                            at = from + offset;
                            break;
                        }
                        None => return Scan::Ended,
                    }
                    if from >= bytes.len() {
                        return Scan::Ended;
                    }
                }
            }
            byte @ (b'{' | b'[' | b'}' | b']') if each(byte) => return Scan::Stopped,
            _ => {}
        }
        at += 1;
    }
    Scan::Ended
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_objects_and_arrays_outside_strings() {
        assert_eq!(json_containers(br#"{"a":[{"b":"{[x"},[]]}"#), 4);
        assert_eq!(json_containers(br#""\"{""#), 0, "an escaped quote does not end the string");
    }

    #[test]
    fn accepts_text_and_json_within_limits() {
        assert_eq!(validate(b"hello", 4), Ok("hello"));
        assert_eq!(validate(br#"{"a":{"b":[1,2]}}"#, 3), Ok(r#"{"a":{"b":[1,2]}}"#));
    }

    #[test]
    fn refuses_empty_invalid_utf8_and_nul_with_their_reasons() {
        assert_eq!(validate(b"", 4), Err(Rejected::Empty));
        assert_eq!(validate(b"caf\xe9", 4), Err(Rejected::InvalidUtf8));
        assert_eq!(validate(b"a\0b", 4), Err(Rejected::ContainsNul));
    }

    /// Issue 30, item 11 (cold review): `\u0000` — what Go's `encoding/json` and JavaScript
    /// write for a NUL — passed the agent and became a dead letter in the persister, at ~2 round
    /// trips apiece. It is refused at the socket, with the word the raw byte gets; so is an
    /// unpaired surrogate, the persister's other dead letter of a valid JSON record.
    #[test]
    fn refuses_json_escapes_postgres_cannot_store_with_their_reasons() {
        assert_eq!(validate(br#"{"msg":"a\u0000b"}"#, 4), Err(Rejected::ContainsNul));
        assert_eq!(validate(br#"{"msg":"cut emoji \ud83d"}"#, 4), Err(Rejected::UnpairedSurrogate));
        assert_eq!(validate(br#"{"msg":"\ud83d\ude00 and \\u0000"}"#, 4).map(|_| ()), Ok(()));
        assert_eq!(validate(br#"text \u0000 is text"#, 4).map(|_| ()), Ok(()), "only JSON records");
    }

    #[test]
    fn refuses_json_nested_deeper_than_the_limit() {
        assert_eq!(validate(br#"{"a":{"b":[1]}}"#, 2), Err(Rejected::TooDeep));
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(validate(deep.as_bytes(), 64), Err(Rejected::TooDeep));
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        assert_eq!(validate(br#"{"a":"[[[[[[\"{{{{"}"#, 1), Ok(r#"{"a":"[[[[[[\"{{{{"}"#));
        assert_eq!(validate(br#"{"a\\":"\\","b":[[1]]}"#, 2), Err(Rejected::TooDeep));
        assert_eq!(validate(br#"{"a\\":"\\","b":[1]}"#, 2), Ok(r#"{"a\\":"\\","b":[1]}"#));
        assert!(!json_depth_exceeds(br#""ends in a backslash\"#, 0));
    }

    #[test]
    fn text_starting_with_a_bracket_is_judged_only_as_json_objects_are() {
        assert_eq!(validate(b"[[[[[[[[ not json", 2), Ok("[[[[[[[[ not json"));
    }
}
