//! What PostgreSQL cannot store of a JSON record that is valid JSON: its `\u0000` escapes and
//! its unpaired surrogates.
//!
//! Owns: the one scan for them, which both roles run — the agent refuses such a record at the
//! socket (`contains_nul`, `unpaired_surrogate`: the writer hears it, instead of a dead letter
//! far downstream that costs its partition round trips), and the persister keeps another
//! producer's as a dead letter with the same word. Must not: parse JSON or allocate.

/// An escape PostgreSQL cannot take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unstorable {
    /// `\u0000`.
    Nul,
    /// `\uD800`–`\uDFFF` that is not half of a pair.
    UnpairedSurrogate,
}

/// Whether JSON text `record` holds an escape PostgreSQL cannot take: `\u0000` (text refuses
/// U+0000, and derived text columns would carry it; `json` stores it, but `->>` fails on it) or
/// an unpaired surrogate (`\uD800`–`\uDBFF` not followed by `\uDC00`–`\uDFFF`, or the latter
/// alone: `json` stores it, then every JSON function reaching the row fails). A byte scan, not a
/// tree: it judges a record nested deeper than serde_json builds (whose derived fields are read
/// all the same), and builds nothing. In JSON text a backslash only ever starts an escape inside
/// a string, so each is checked and skipped with what it escapes (`\\u0000` is a backslash
/// and text).
pub fn unstorable_escape(record: &str) -> Option<Unstorable> {
    let bytes = record.as_bytes();
    let mut at = 0;
    while let Some(found) = bytes.get(at..).and_then(|rest| memchr::memchr(b'\\', rest)) {
        let escape = at + found;
        at = escape + 2;
        let Some(unit) = utf16_escape(bytes, escape) else { continue };
        match unit {
            0 => return Some(Unstorable::Nul),
            0xD800..=0xDBFF => match utf16_escape(bytes, escape + 6) {
                Some(0xDC00..=0xDFFF) => at = escape + 12,
                _ => return Some(Unstorable::UnpairedSurrogate),
            },
            0xDC00..=0xDFFF => return Some(Unstorable::UnpairedSurrogate),
            _ => at = escape + 6,
        }
    }
    None
}

/// The code unit of a `\uXXXX` escape starting at `at`, if one does.
fn utf16_escape(bytes: &[u8], at: usize) -> Option<u16> {
    let escape = bytes.get(at..at + 6)?;
    if !escape.starts_with(b"\\u") {
        return None;
    }
    let hex = std::str::from_utf8(&escape[2..]).ok()?;
    u16::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_escapes_and_unpaired_surrogates_are_found_and_escaped_backslashes_are_not() {
        assert_eq!(unstorable_escape(r#"{"a":"x\u0000y"}"#), Some(Unstorable::Nul));
        assert_eq!(unstorable_escape(r#"{"a":"\ud83d"}"#), Some(Unstorable::UnpairedSurrogate));
        assert_eq!(unstorable_escape(r#"{"a":"\udc00"}"#), Some(Unstorable::UnpairedSurrogate));
        assert_eq!(unstorable_escape(r#"{"a":"\ud83d\ude00"}"#), None, "a pair is a character");
        assert_eq!(unstorable_escape(r#"{"a":"\\u0000"}"#), None, "a backslash, then text");
        assert_eq!(unstorable_escape(r#"{"a":"\u0041"}"#), None);
    }
}
