//! Log lines that repeat, collapsed: the first line of a kind is written, its repeats are only
//! counted, and while they go on one line a minute is written carrying their count.
//!
//! Owns: deciding whether a line of a given kind is written now ([`Repeats::admit`]), and
//! forgetting the kinds of a condition that ended ([`Repeats::clear`]), so its next occurrence is
//! written at once. A sidecar runs beside every pod: during a Kafka outage librdkafka reports a
//! failed connection every few tens of milliseconds, and at 1,000 pods one line each is 30,000
//! lines a second into the node's log pipeline. Must not: hold more than [`MAX_KINDS`] kinds
//! (the one written longest ago is forgotten), decide what a kind is (the caller's key: an error
//! code, a librdkafka facility), or hide the first line of a kind.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// How often a line that keeps repeating is written again, with the count of its repeats.
pub const REMINDER_EVERY: Duration = Duration::from_secs(60);

/// Most kinds remembered at once; keys come from small fixed sets (error codes, facilities), so
/// this is only a bound against a caller that builds keys from varying text.
pub const MAX_KINDS: usize = 64;

/// Repeated log lines of one area (Kafka's client, PostgreSQL's writes), collapsed.
pub struct Repeats {
    kinds: Mutex<VecDeque<Kind>>,
    every: Duration,
}

struct Kind {
    key: String,
    /// When a line of this kind was last written.
    written: Instant,
    /// Lines of this kind not written since.
    repeats: u64,
}

impl std::fmt::Debug for Repeats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repeats").field("kinds", &self.lock().len()).field("every", &self.every).finish()
    }
}

impl Default for Repeats {
    fn default() -> Self {
        Self::new(REMINDER_EVERY)
    }
}

impl Repeats {
    /// Collapses repeats of each kind, writing a reminder every `every` while they go on.
    pub const fn new(every: Duration) -> Self {
        Self { kinds: Mutex::new(VecDeque::new()), every }
    }

    /// Whether a line of kind `key` is written now: `Some(n)` — write it, saying it came `n`
    /// more times since the last line of its kind — or `None`: it is counted, not written.
    pub fn admit(&self, key: &str) -> Option<u64> {
        let now = Instant::now();
        let mut kinds = self.lock();
        if let Some(kind) = kinds.iter_mut().find(|kind| kind.key == key) {
            if now.duration_since(kind.written) < self.every {
                kind.repeats += 1;
                return None;
            }
            kind.written = now;
            return Some(std::mem::take(&mut kind.repeats));
        }
        if kinds.len() >= MAX_KINDS {
            // Forget the kind written longest ago; its next line is written as a first.
            if let Some(oldest) = kinds.iter().enumerate().min_by_key(|(_, kind)| kind.written).map(|(at, _)| at) {
                kinds.remove(oldest);
            }
        }
        kinds.push_back(Kind { key: key.to_string(), written: now, repeats: 0 });
        Some(0)
    }

    /// The condition behind these lines ended (Kafka answers again): every kind is forgotten, so
    /// the next occurrence is written at once. Returns how many lines were counted and not
    /// written since their kind's last line.
    pub fn clear(&self) -> u64 {
        self.lock().drain(..).map(|kind| kind.repeats).sum()
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Kind>> {
        self.kinds.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A librdkafka log line's kind: its facility and its text with the parts that change between
/// repeats (numbers: ports, counts, milliseconds; what comes in parentheses) left out, so
/// `Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)`
/// and the same line a second later are one kind.
pub fn librdkafka_kind(facility: &str, message: &str) -> String {
    let mut kind = String::with_capacity(facility.len() + message.len().min(120) + 1);
    kind.push_str(facility);
    kind.push(' ');
    let mut depth = 0usize;
    for c in message.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth > 0 || c.is_ascii_digit() => {}
            _ => kind.push(c),
        }
        if kind.len() >= 120 {
            break;
        }
    }
    kind
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn writes_the_first_line_of_a_kind_then_one_a_minute_with_the_count_of_repeats() {
        let repeats = Repeats::default();
        assert_eq!(repeats.admit("all_brokers_down"), Some(0), "the first is written");
        for _ in 0..599 {
            tokio::time::advance(Duration::from_millis(100)).await;
            assert_eq!(repeats.admit("all_brokers_down"), None, "repeats within the minute are counted");
        }
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(repeats.admit("all_brokers_down"), Some(599), "a reminder a minute later, with the count");
        assert_eq!(repeats.admit("all_brokers_down"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn kinds_are_collapsed_apart_and_clearing_writes_the_next_at_once() {
        let repeats = Repeats::default();
        assert_eq!(repeats.admit("a"), Some(0));
        assert_eq!(repeats.admit("b"), Some(0), "another kind is written");
        assert_eq!(repeats.admit("a"), None);
        assert_eq!(repeats.admit("b"), None);
        assert_eq!(repeats.clear(), 2, "what was counted and not written");
        assert_eq!(repeats.admit("a"), Some(0), "a new episode starts with a line");
    }

    #[tokio::test(start_paused = true)]
    async fn never_remembers_more_than_its_bound_of_kinds() {
        let repeats = Repeats::default();
        for n in 0..MAX_KINDS * 4 {
            assert_eq!(repeats.admit(&format!("kind {n}")), Some(0));
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        assert_eq!(repeats.lock().len(), MAX_KINDS);
    }

    #[test]
    fn a_librdkafka_line_and_its_repeats_are_one_kind() {
        let first = librdkafka_kind(
            "FAIL",
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)",
        );
        let later = librdkafka_kind(
            "FAIL",
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 12ms in state CONNECT, 4 identical error(s) suppressed)",
        );
        assert_eq!(first, later);
        assert_ne!(first, librdkafka_kind("ERROR", "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed"));
    }
}
