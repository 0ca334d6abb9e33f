//! Masking before anything leaves the pod (`[ingest.redact]`, or a listener's own): a JSON
//! record's fields by name, and text matching a pattern (e-mail addresses, card numbers, tokens,
//! or a regular expression), replaced by the mask before the envelope, key and topic are made
//! from the record — the original never reaches Kafka.
//!
//! Owns: the rules (checked at load; the `regex` crate: linear time), one pass that tells whether
//! any rule can match a record (one `RegexSet` over its bytes; most records stop there), then a
//! walk of a JSON record's tokens that rewrites only what matches: a field's whole value becomes
//! the mask as a string, a match inside a string value becomes the mask; every other byte is
//! kept as written (the app's JSON is never re-serialized). A text record's matches are masked in
//! place. Counted per rule (`sluice_ingest_redactions_total{listener, rule}`, one per value or
//! match masked). Hand-written: no crate walks JSON by byte spans without building it.
//!
//! Must not: let a masked record out unmasked (a string whose masking would leave it invalid is
//! masked whole), grow a record past the caller's limit (it is refused `too_large` instead), or
//! apply patterns to keys (a key is not data; a field rule names it).

use metrics::Counter;
use regex::{Regex, RegexSet};

use crate::config::{RedactConfig, RedactPreset};
use crate::telemetry;

/// One compiled rule.
#[derive(Debug)]
enum Rule {
    /// A field's name, matched ASCII case-insensitively against a key's text as written.
    Field(String),
    /// A pattern masked inside string values (and text records); card numbers also pass a Luhn
    /// check.
    Pattern { regex: Regex, luhn: bool },
}

/// A listener's masking rules, compiled.
#[derive(Debug)]
pub struct Redactor {
    mask: String,
    rules: Vec<Rule>,
    counters: Vec<Counter>,
    /// One pattern per rule (a field rule: `"name"` followed by `:`), case-insensitive where the
    /// rule is: whether anything can match at all.
    any: RegexSet,
    /// Whether any rule is a pattern (string values are then looked at).
    patterns: bool,
    /// Whether some pattern asserts where a text or line starts or ends (`^`, `$`, `\A`, `\z`):
    /// the quick test reads the whole record, whose start is not a value's, and could miss a
    /// value such a pattern matches alone. Every JSON record is then walked.
    anchored: bool,
}

/// Why a record cannot be shipped masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmasked {
    /// Masked, it would be larger than the caller allows.
    TooLarge,
    /// A JSON record the walk could not follow (never seen: the record parsed as JSON): refused
    /// rather than shipped unmasked.
    Unfollowable,
}

/// The regular expression of a preset.
pub fn preset_pattern(preset: RedactPreset) -> &'static str {
    match preset {
        // ASCII classes and boundaries throughout: a Unicode `\b` makes the lazy DFA give up on any
        // non-ASCII record, and matching falls back to the slower engine.
        RedactPreset::Email => r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
        // 13 to 19 digits, optionally grouped by spaces or dashes; a Luhn check follows (on each
        // window of a longer run too).
        RedactPreset::CreditCard => r"(?-u:\b)[0-9](?:[ -]?[0-9]){12,30}(?-u:\b)",
        RedactPreset::BearerToken => r"(?i-u)(?-u:\b)bearer[ \t]+[A-Za-z0-9._~+/-]+=*",
        RedactPreset::Jwt => r"(?-u:\b)eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+",
    }
}

/// Compiles a rule's pattern (a preset's, or its own); errors say why.
pub fn compile(pattern: &str) -> Result<Regex, regex::Error> {
    regex::RegexBuilder::new(pattern).size_limit(1 << 20).build()
}

/// The quick test's pattern for each rule (a field rule: its key followed by `:`).
fn quick_patterns(config: &RedactConfig) -> Vec<String> {
    config
        .rules
        .iter()
        .filter_map(|rule| match (&rule.field, rule.preset, &rule.regex) {
            (Some(field), _, _) => Some(format!(r#"(?i)"{}"\s*:"#, regex::escape(field))),
            (None, Some(preset), _) => Some(preset_pattern(preset).to_string()),
            (None, None, Some(pattern)) => Some(pattern.clone()),
            (None, None, None) => None,
        })
        .collect()
}

/// Builds the rules' combined quick test, as [`Redactor::new`] does: a set of rules each valid
/// alone may still be too large together (checked at load, naming the key).
pub fn check(config: &RedactConfig) -> Result<(), regex::Error> {
    regex::RegexSetBuilder::new(quick_patterns(config)).size_limit(QUICK_SET_LIMIT).build().map(drop)
}

/// Whether `pattern` asserts where a text or line starts or ends (a word boundary reads the same
/// in a value as in the record around it: a quote is not a word character). A pattern that does
/// not parse is taken as anchored (it does not compile either).
fn anchored(pattern: &str) -> bool {
    use regex_syntax::hir::Look;
    regex_syntax::parse(pattern).map_or(true, |hir| {
        let looks = hir.properties().look_set();
        [Look::Start, Look::End, Look::StartLF, Look::EndLF, Look::StartCRLF, Look::EndCRLF]
            .into_iter()
            .any(|look| looks.contains(look))
    })
}

/// How large the compiled quick test may be.
const QUICK_SET_LIMIT: usize = 1 << 22;

impl Redactor {
    /// The rules of `config` for `listener` (validated at load).
    pub fn new(config: &RedactConfig, listener: &str) -> Result<Self, regex::Error> {
        let mut rules = Vec::new();
        let mut counters = Vec::new();
        for rule in &config.rules {
            let compiled = match (&rule.field, rule.preset, &rule.regex) {
                (Some(field), _, _) => Rule::Field(field.clone()),
                (None, Some(preset), _) => {
                    Rule::Pattern { regex: compile(preset_pattern(preset))?, luhn: preset == RedactPreset::CreditCard }
                }
                (None, None, Some(pattern)) => Rule::Pattern { regex: compile(pattern)?, luhn: false },
                // Validated at load: exactly one of the three.
                (None, None, None) => continue,
            };
            rules.push(compiled);
            let counter = metrics::counter!(
                telemetry::INGEST_REDACTIONS,
                "listener" => listener.to_string(),
                "rule" => rule.name.clone()
            );
            counter.increment(0);
            counters.push(counter);
        }
        let patterns = rules.iter().any(|rule| matches!(rule, Rule::Pattern { .. }));
        let anchored = config.rules.iter().filter_map(|rule| rule.regex.as_deref()).any(anchored);
        let any = regex::RegexSetBuilder::new(quick_patterns(config)).size_limit(QUICK_SET_LIMIT).build()?;
        Ok(Self { mask: config.mask.clone(), rules, counters, any, patterns, anchored })
    }

    /// Masks `record` into `out` (cleared first): `Ok(true)` if anything was masked (then `out`
    /// is the record to ship), `Ok(false)` if nothing matched (`out` unspecified: ship `record`).
    /// `Err` if the masked record would exceed `limit` bytes.
    pub fn apply(&self, record: &str, out: &mut String, limit: usize) -> Result<bool, Unmasked> {
        out.clear();
        // The quick test reads the bytes as written; an escape (`\/`, `\u0040`, a key spelled
        // with one) can hide a match from it, so a record with a backslash is always walked, and
        // so is every JSON record when a pattern is anchored (a text record is matched whole, as
        // the quick test reads it).
        let json = crate::envelope::is_json_object(record);
        let walk = record.contains('\\') || (json && self.anchored);
        if !walk && !self.any.is_match(record) {
            return Ok(false);
        }
        // JSON as the envelope tells it (it parses): a `{…}` that is not JSON (a Python dict, a
        // Java map's toString) is text, and every pattern applies to all of it.
        if json { self.json(record, out, limit) } else { self.text(record, out, limit) }
    }

    /// A text record: every pattern's matches masked.
    fn text(&self, record: &str, out: &mut String, limit: usize) -> Result<bool, Unmasked> {
        let mut current = std::borrow::Cow::Borrowed(record);
        let mut masked = false;
        for (index, rule) in self.rules.iter().enumerate() {
            if let Rule::Pattern { regex, luhn } = rule
                && let Some(replaced) = self.mask_matches(regex, *luhn, &current, index)
            {
                current = std::borrow::Cow::Owned(replaced);
                masked = true;
            }
        }
        if !masked {
            return Ok(false);
        }
        if current.len() > limit {
            return Err(Unmasked::TooLarge);
        }
        out.push_str(&current);
        Ok(true)
    }

    /// `text` with the matches of `regex` masked (counted under rule `index`), or `None` if
    /// none was.
    fn mask_matches(&self, regex: &Regex, luhn: bool, text: &str, index: usize) -> Option<String> {
        let mut out = String::new();
        let mut last = 0;
        let mut count = 0;
        for found in regex.find_iter(text) {
            let (start, end) = if luhn {
                // The run itself, or the first window of 13-19 digits inside it that passes (a
                // card next to a quantity or an expiry date).
                match luhn_window(found.as_str()) {
                    Some((from, to)) => (found.start() + from, found.start() + to),
                    None => continue,
                }
            } else {
                (found.start(), found.end())
            };
            out.push_str(&text[last..start]);
            out.push_str(&self.mask);
            last = end;
            count += 1;
        }
        if count == 0 {
            return None;
        }
        out.push_str(&text[last..]);
        self.counters[index].increment(count);
        Some(out)
    }

    /// A JSON record, walked token by token: a masked field's value becomes `"mask"`; patterns
    /// mask inside string values. A record the walk cannot follow (it was validated as JSON only
    /// if it parses: this is a safety net) is masked as text.
    fn json(&self, record: &str, out: &mut String, limit: usize) -> Result<bool, Unmasked> {
        let bytes = record.as_bytes();
        let mut copied = 0;
        let mut masked = false;
        // Per open container: is it an object, and does a key come next?
        let mut stack: Vec<(bool, bool)> = Vec::new();
        // The rule whose field's value comes next.
        let mut pending: Option<usize> = None;
        let mut at = 0;
        while at < bytes.len() {
            match bytes[at] {
                b' ' | b'\t' | b'\n' | b'\r' | b':' => at += 1,
                b',' => {
                    if let Some(top) = stack.last_mut() {
                        top.1 = top.0;
                    }
                    at += 1;
                }
                b'}' | b']' => {
                    stack.pop();
                    at += 1;
                }
                open @ (b'{' | b'[') => {
                    if let Some(index) = pending.take() {
                        let Some(end) = container_end(bytes, at) else { return Err(Unmasked::Unfollowable) };
                        self.replace(record, &mut copied, at, end, index, out);
                        masked = true;
                        at = end;
                    } else {
                        stack.push((open == b'{', open == b'{'));
                        at += 1;
                    }
                }
                b'"' => {
                    let Some(end) = string_end(bytes, at) else { return Err(Unmasked::Unfollowable) };
                    let is_key = stack.last().is_some_and(|top| top.1);
                    if is_key {
                        if let Some(top) = stack.last_mut() {
                            top.1 = false;
                        }
                        pending = self.field_rule(&record[at + 1..end - 1]);
                    } else if let Some(index) = pending.take() {
                        self.replace(record, &mut copied, at, end, index, out);
                        masked = true;
                    } else if self.patterns
                        && let Some(content) = self.mask_string(&record[at + 1..end - 1])
                    {
                        out.push_str(&record[copied..at + 1]);
                        out.push_str(&content);
                        out.push('"');
                        copied = end;
                        masked = true;
                    }
                    at = end;
                }
                _ => {
                    // A number, true, false or null.
                    let end = bytes[at..]
                        .iter()
                        .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                        .map_or(bytes.len(), |offset| at + offset);
                    if let Some(index) = pending.take() {
                        self.replace(record, &mut copied, at, end, index, out);
                        masked = true;
                    } else if self.patterns && self.matches_scalar(&record[at..end]) {
                        // A number a pattern matches (a card number written as a JSON number):
                        // the mask, as a string.
                        out.push_str(&record[copied..at]);
                        out.push('"');
                        out.push_str(&self.mask);
                        out.push('"');
                        copied = end;
                        masked = true;
                    }
                    at = end.max(at + 1);
                }
            }
            if out.len() > limit {
                return Err(Unmasked::TooLarge);
            }
        }
        if !masked {
            return Ok(false);
        }
        out.push_str(&record[copied..]);
        if out.len() > limit {
            return Err(Unmasked::TooLarge);
        }
        Ok(true)
    }

    /// Writes what precedes `start` and the mask in place of `start..end` (a field's value).
    fn replace(&self, record: &str, copied: &mut usize, start: usize, end: usize, index: usize, out: &mut String) {
        out.push_str(&record[*copied..start]);
        out.push('"');
        out.push_str(&self.mask);
        out.push('"');
        *copied = end;
        self.counters[index].increment(1);
    }

    /// The field rule a key (its text as written, between its quotes; escapes decoded) names.
    fn field_rule(&self, key: &str) -> Option<usize> {
        let decoded = if key.contains('\\') { decode(key) } else { None };
        let key = decoded.as_deref().unwrap_or(key);
        self.rules.iter().position(|rule| matches!(rule, Rule::Field(name) if name.eq_ignore_ascii_case(key)))
    }

    /// Whether a pattern matches in a scalar token (a number, `true`, `false`, `null`), counted.
    fn matches_scalar(&self, token: &str) -> bool {
        self.rules.iter().enumerate().any(
            |(index, rule)| matches!(rule, Rule::Pattern { regex, luhn } if self.mask_matches(regex, *luhn, token, index).is_some()),
        )
    }

    /// A string value's content (as written, escapes and all) with the patterns' matches masked,
    /// or `None` if none matched. If masking broke an escape sequence, the whole content is the
    /// mask: nothing of it leaves unmasked, and the record stays valid JSON.
    fn mask_string(&self, content: &str) -> Option<String> {
        // Escaped text (`\/`, `\u0040`) is matched as it reads, then written back escaped.
        if content.contains('\\') {
            let Some(decoded) = decode(content) else { return Some(self.mask.clone()) };
            let masked = self.mask_value(&decoded)?;
            let quoted = serde_json::to_string(&masked).ok()?;
            return Some(quoted[1..quoted.len() - 1].to_string());
        }
        let masked = self.mask_value(content)?;
        // Without a backslash, no escape can be broken; checked all the same.
        Some(if valid_string_content(&masked) { masked } else { self.mask.clone() })
    }

    /// A string's text with the patterns' matches masked, or `None` if none matched.
    fn mask_value(&self, content: &str) -> Option<String> {
        let mut current = std::borrow::Cow::Borrowed(content);
        for (index, rule) in self.rules.iter().enumerate() {
            if let Rule::Pattern { regex, luhn } = rule
                && let Some(replaced) = self.mask_matches(regex, *luhn, &current, index)
            {
                current = std::borrow::Cow::Owned(replaced);
            }
        }
        match current {
            std::borrow::Cow::Borrowed(_) => None,
            std::borrow::Cow::Owned(replaced) => Some(replaced),
        }
    }
}

/// A JSON string's content (between its quotes, as written) decoded; `None` if it is not valid.
fn decode(content: &str) -> Option<String> {
    serde_json::from_str::<String>(&format!("\"{content}\"")).ok()
}

/// Within a run of digit groups (separated by a space or `-`), the first span of whole groups
/// holding 13-19 digits (byte offsets) that passes the Luhn check, the longest first: the card
/// beside a quantity or an expiry date. A run without separators is one group: a long number
/// (an order id) is never cut into a card.
fn luhn_window(run: &str) -> Option<(usize, usize)> {
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut start = None;
    for (at, c) in run.char_indices() {
        match (c.is_ascii_digit(), start) {
            (true, None) => start = Some(at),
            (false, Some(from)) => {
                groups.push((from, at));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(from) = start {
        groups.push((from, run.len()));
    }
    for first in 0..groups.len() {
        for last in (first..groups.len()).rev() {
            let span = &run[groups[first].0..groups[last].1];
            let digits = span.bytes().filter(u8::is_ascii_digit).count();
            if (13..=19).contains(&digits) && luhn_valid(span) {
                return Some((groups[first].0, groups[last].1));
            }
        }
    }
    None
}

/// The offset after the string starting at `start` (its closing quote included).
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = start + 1;
    loop {
        at += memchr::memchr2(b'"', b'\\', bytes.get(at..)?)?;
        if bytes[at] == b'\\' {
            at += 2;
        } else {
            return Some(at + 1);
        }
    }
}

/// The offset after the object or array starting at `start`.
fn container_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut at = start;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                at = string_end(bytes, at)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
    None
}

/// Whether `content` can stand between a JSON string's quotes: no bare quote or control
/// character, every backslash a whole escape.
fn valid_string_content(content: &str) -> bool {
    let bytes = content.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' | 0x00..=0x1f => return false,
            b'\\' => match bytes.get(at + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => at += 2,
                Some(b'u') if bytes.get(at + 2..at + 6).is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) => {
                    at += 6;
                }
                _ => return false,
            },
            _ => at += 1,
        }
    }
    true
}

/// The Luhn check of a card number's digits (separators skipped).
fn luhn_valid(number: &str) -> bool {
    let digits: Vec<u32> = number.chars().filter_map(|c| c.to_digit(10)).collect();
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| if i % 2 == 1 { if d * 2 > 9 { d * 2 - 9 } else { d * 2 } } else { d })
        .sum();
    sum.is_multiple_of(10)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RedactRule;

    fn rule(name: &str) -> RedactRule {
        RedactRule { name: name.into(), field: None, preset: None, regex: None }
    }

    fn redactor() -> Redactor {
        let config = RedactConfig {
            mask: "[REDACTED]".into(),
            rules: vec![
                RedactRule { field: Some("password".into()), ..rule("password") },
                RedactRule { field: Some("card".into()), ..rule("card_field") },
                RedactRule { preset: Some(RedactPreset::Email), ..rule("email") },
                RedactRule { preset: Some(RedactPreset::CreditCard), ..rule("credit_card") },
                RedactRule { regex: Some("sk_live_[0-9a-zA-Z]{8}".into()), ..rule("api_key") },
            ],
        };
        Redactor::new(&config, "test").expect("compiles")
    }

    fn masked(record: &str) -> String {
        let mut out = String::new();
        match redactor().apply(record, &mut out, 1 << 20).expect("within limit") {
            true => out,
            false => record.to_string(),
        }
    }

    #[test]
    fn masks_a_fields_whole_value_at_any_depth_and_keeps_every_other_byte() {
        assert_eq!(
            masked(r#"{"user":"ann", "Password":"hunter2","n":1.50,"deep":{"password":{"a":[1,"x"]}},"card":4111}"#),
            r#"{"user":"ann", "Password":"[REDACTED]","n":1.50,"deep":{"password":"[REDACTED]"},"card":"[REDACTED]"}"#
        );
        assert_eq!(masked(r#"{"list":[{"password":null}]}"#), r#"{"list":[{"password":"[REDACTED]"}]}"#);
        assert_eq!(masked(r#"{"note":"password"}"#), r#"{"note":"password"}"#, "a value is not a key");
    }

    #[test]
    fn masks_patterns_inside_string_values_and_text_records() {
        assert_eq!(
            masked(r#"{"msg":"mail ann@example.com, key sk_live_abcd1234","email":"bob@example.org"}"#),
            r#"{"msg":"mail [REDACTED], key [REDACTED]","email":"[REDACTED]"}"#
        );
        assert_eq!(masked("login from ann@example.com ok"), "login from [REDACTED] ok");
        assert_eq!(masked(r#"{"ann@example.com":1}"#), r#"{"ann@example.com":1}"#, "keys are not data");
    }

    #[test]
    fn masks_card_numbers_that_pass_luhn_only() {
        assert_eq!(masked("paid with 4111 1111 1111 1111 today"), "paid with [REDACTED] today");
        assert_eq!(masked("order 4111111111111112"), "order 4111111111111112", "fails Luhn: an order id");
    }

    #[test]
    fn a_match_across_an_escape_is_made_on_the_text_as_it_reads_and_written_back_escaped() {
        let config = RedactConfig {
            mask: "[REDACTED]".into(),
            rules: vec![RedactRule { regex: Some(r#"secret"q"#.into()), ..rule("odd") }],
        };
        let redactor = Redactor::new(&config, "test").expect("compiles");
        let mut out = String::new();
        // Matched as the string reads (`secret"quote`), written back escaped.
        assert!(redactor.apply(r#"{"m":"a secret\"quote"}"#, &mut out, 1 << 20).expect("within"));
        assert_eq!(out, r#"{"m":"a [REDACTED]uote"}"#);
        serde_json::from_str::<serde_json::Value>(&out).expect("valid JSON");
    }

    /// Cold review (issue 32): what the first masking let through.
    #[test]
    fn masks_what_escapes_number_tokens_and_non_json_braces_hid() {
        assert_eq!(masked("{'user': 'ann@example.com'}"), "{'user': '[REDACTED]'}", "a Python dict is text");
        assert_eq!(masked("{email=ann@example.com}"), "{email=[REDACTED]}", "a Java map is text");
        assert_eq!(masked(r#"{"cc":4111111111111111}"#), r#"{"cc":"[REDACTED]"}"#, "a card as a JSON number");
        assert_eq!(masked(r#"{"m":"mail ann@example.com"}"#), r#"{"m":"mail [REDACTED]"}"#);
        assert_eq!(masked(r#"{"password":"hunter2"}"#), r#"{"password":"[REDACTED]"}"#);
        let config = RedactConfig {
            mask: "[REDACTED]".into(),
            rules: vec![RedactRule { preset: Some(RedactPreset::BearerToken), ..rule("bearer") }],
        };
        let bearer = Redactor::new(&config, "test").expect("compiles");
        let mut out = String::new();
        assert!(bearer.apply(r#"{"h":"Bearer abc\/def+ghi=="}"#, &mut out, 1 << 20).expect("within"));
        assert_eq!(out, r#"{"h":"[REDACTED]"}"#, "PHP's escaped slash does not cut the token short");
    }

    #[test]
    fn masks_a_card_number_beside_other_digits() {
        assert_eq!(masked("qty 2 4111 1111 1111 1111"), "qty 2 [REDACTED]");
        assert_eq!(masked("card 4111 1111 1111 1111 12 27"), "card [REDACTED] 12 27");
    }

    #[test]
    fn refuses_to_grow_a_record_past_the_limit() {
        let record = format!("{{{}\"x\":0}}", r#""password":1,"#.repeat(100));
        let mut out = String::new();
        assert_eq!(redactor().apply(&record, &mut out, record.len() + 10), Err(Unmasked::TooLarge));
    }

    #[test]
    fn an_anchored_pattern_masks_a_whole_value_though_the_record_does_not_start_with_it() {
        let config = RedactConfig {
            mask: "[REDACTED]".into(),
            rules: vec![RedactRule { regex: Some(r"^\d{3}-\d{2}-\d{4}$".into()), ..rule("ssn") }],
        };
        let redactor = Redactor::new(&config, "test").expect("compiles");
        let mut out = String::new();
        assert!(redactor.apply(r#"{"ssn":"123-45-6789","n":1}"#, &mut out, 1 << 20).expect("within"));
        assert_eq!(out, r#"{"ssn":"[REDACTED]","n":1}"#);
        assert!(!redactor.apply(r#"{"note":"call 123-45-6789 now"}"#, &mut out, 1 << 20).expect("within"));
        assert!(redactor.apply("123-45-6789", &mut out, 1 << 20).expect("within"), "a text record whole");
        assert!(!redactor.apply("ssn 123-45-6789", &mut out, 1 << 20).expect("within"));
        assert!(!anchored(r"(?-u:\b)eyJ[a-z]+"), "a word boundary is not an anchor");
        assert!(anchored(r"(?m)^secret") && anchored(r"\Atoken\z"));
    }

    #[test]
    fn a_record_nothing_matches_is_left_alone() {
        let mut out = String::new();
        assert!(!redactor().apply(r#"{"user":"ann","n":1}"#, &mut out, 1 << 20).expect("within"));
        assert!(!redactor().apply("plain line", &mut out, 1 << 20).expect("within"));
    }

    #[test]
    fn masked_json_stays_valid_json_for_generated_records() {
        use proptest::prelude::*;
        let redactor = redactor();
        let value = proptest::collection::vec(
            prop_oneof![
                Just("\"password\"".to_string()),
                Just("\"ann@example.com\"".to_string()),
                Just("\"a\\\"b\"".to_string()),
                Just("4111 1111 1111 1111".to_string()),
                Just("[1,{\"password\":2}]".to_string()),
                Just("null".to_string()),
            ],
            1..6,
        );
        proptest!(crate::test_support::prop_config(256), |(values in value)| {
            let record = format!(
                "{{{}}}",
                values.iter().enumerate().map(|(i, v)| format!("\"{}\":{v}", if i % 2 == 0 { "password" } else { "k" })).collect::<Vec<_>>().join(",")
            );
            prop_assume!(serde_json::from_str::<serde_json::Value>(&record).is_ok());
            let mut out = String::new();
            if redactor.apply(&record, &mut out, 1 << 20).expect("within") {
                let parsed: serde_json::Value = serde_json::from_str(&out).expect("masked JSON parses");
                prop_assert!(!out.contains("ann@example.com"));
                prop_assert_eq!(parsed.as_object().map(|o| o.len()), serde_json::from_str::<serde_json::Value>(&record).ok().and_then(|v| v.as_object().map(|o| o.len())));
            }
        });
    }
}
