//! Multiline: continuation lines joined to the record they belong to, so a stack trace written
//! as many lines is one record (`[ingest.listeners.NAME.multiline]`, `lines` listeners only).
//!
//! Owns: the rules — a `start` pattern (a matching line begins a record, the others continue
//! it), a `continuation` pattern (a matching line continues the record before it), or a preset
//! for the stack traces of Java (and every JVM logger), Python tracebacks, and Go panics — and
//! one connection's [`Joiner`]: the record being built, cut at `max_lines` / `max_bytes` or when
//! the agent-wide pool ([`MULTILINE_POOL_BYTES`]) has no room for it (counted: the record is
//! split, nothing is lost), handed on when the next record starts, when the connection ends, or
//! after `flush_timeout` without a line (the connection's read loop asks [`Joiner::due`]).
//! Must not: wait for anything (a record that finds no room in the pool is cut and goes on at
//! once), or hold more than `max_bytes` per connection. Regular expressions are the `regex`
//! crate's: linear in the line, whatever the pattern.

use std::sync::Arc;
use std::time::Duration;

use regex::bytes::Regex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{MultilineConfig, MultilinePreset};

/// Bytes all connections' records being joined may hold at once. A connection whose next line
/// finds no room hands its record on (cut, counted `pool`) and starts again from that line.
pub const MULTILINE_POOL_BYTES: usize = 8 * 1024 * 1024;

/// Why a record was cut before its rule ended it (the `reason` label of
/// `sluice_ingest_records_split_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// `max_lines`.
    MaxLines,
    /// `max_bytes`.
    MaxBytes,
    /// The agent-wide pool had no room.
    Pool,
}

impl Split {
    /// Every reason.
    pub const ALL: [Split; 3] = [Split::MaxLines, Split::MaxBytes, Split::Pool];

    /// The word used in the metric.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::MaxLines => "max_lines",
            Split::MaxBytes => "max_bytes",
            Split::Pool => "pool",
        }
    }
}

/// A listener's rule, compiled once.
#[derive(Debug)]
pub struct Rule {
    kind: Kind,
    max_lines: usize,
    max_bytes: usize,
    flush_timeout: Duration,
}

#[derive(Debug)]
enum Kind {
    Start(Regex),
    Continuation(Regex),
    Java(Regex),
    Python,
    Go(Regex),
}

/// Java's continuation lines: frames (`\tat …`), `... N more`, `Caused by:` / `Suppressed:`, and
/// an exception's first line (`java.lang.IllegalStateException: boom`), which a logger writes
/// after the message.
const JAVA_CONTINUATION: &str = r"^(\s+at\s|\s+\.\.\.\s\d+\s(more|common frames omitted)|\s*(Caused by|Suppressed):\s|([a-zA-Z_$][\w$]*\.)+[a-zA-Z_$][\w$]*(Exception|Error|Throwable)(:\s.*)?$)";

/// A Go panic's lines after its first: blank lines, goroutine headers, frames (`main.main()`,
/// `\t/src/main.go:5 +0x1d`), `created by …`, `[signal …`, a re-panic, the exit status.
const GO_CONTINUATION: &str =
    r"^(\s*$|goroutine\s\d+\s\[|\t|created by\s|\[signal\s|panic:\s|exit status\s\d+$|\S+\(.*\)$)";

impl Rule {
    /// Compiles `config` for a listener whose records are at most `max_record_size` (validated
    /// at load: the patterns compile).
    pub fn new(config: &MultilineConfig, max_record_size: bytesize::ByteSize) -> Result<Self, regex::Error> {
        let kind = match (config.preset, &config.start, &config.continuation) {
            (Some(MultilinePreset::Java), _, _) => Kind::Java(Regex::new(JAVA_CONTINUATION)?),
            (Some(MultilinePreset::Python), _, _) => Kind::Python,
            (Some(MultilinePreset::Go), _, _) => Kind::Go(Regex::new(GO_CONTINUATION)?),
            (None, Some(start), _) => Kind::Start(Regex::new(start)?),
            (None, None, Some(continuation)) => Kind::Continuation(Regex::new(continuation)?),
            (None, None, None) => Kind::Continuation(Regex::new("$^")?),
        };
        Ok(Self {
            kind,
            max_lines: config.max_lines as usize,
            max_bytes: config.max_bytes(max_record_size),
            flush_timeout: config.flush_timeout,
        })
    }

    /// How long a record waits for its next line before it is handed on.
    pub fn flush_timeout(&self) -> Duration {
        self.flush_timeout
    }
}

/// Where a preset's state machine is (Python's and Go's rules depend on the lines before).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Normal,
    /// Python: inside a traceback's frames (indented lines continue).
    Traceback,
    /// Python: after a traceback's exception line (a chained traceback may follow).
    AfterException,
    /// Go: inside a panic.
    Panic,
}

/// What one line did.
#[derive(Debug, Default)]
pub struct Pushed {
    /// A record the line completed (the one before it), to be offered.
    pub completed: Option<Joined>,
    /// The line itself as a record of its own, to be offered after `completed`: the pool had no
    /// room even for it.
    pub alone: Option<Vec<u8>>,
    /// The record was cut by a limit before its rule ended it.
    pub split: Option<Split>,
    /// The line was joined to the record before it.
    pub joined: bool,
}

/// A record joined, with its room in the pool: held until the record is in the buffer (or
/// counted), so a finished record waiting for buffer room still counts against the pool.
#[derive(Debug)]
pub struct Joined {
    /// The record: its lines, separated by `\n`.
    pub bytes: Vec<u8>,
    _room: Option<OwnedSemaphorePermit>,
}

/// One connection's record being joined.
pub struct Joiner {
    rule: Arc<Rule>,
    pool: Arc<Semaphore>,
    pending: Vec<u8>,
    lines: usize,
    /// The pool's room `pending` holds.
    room: Option<OwnedSemaphorePermit>,
    state: State,
    /// When the last line came (for `flush_timeout`).
    last: tokio::time::Instant,
}

impl Joiner {
    /// A joiner for one connection, its records' room taken from `pool`.
    pub fn new(rule: Arc<Rule>, pool: Arc<Semaphore>) -> Self {
        Self {
            rule,
            pool,
            pending: Vec::new(),
            lines: 0,
            room: None,
            state: State::Normal,
            last: tokio::time::Instant::now(),
        }
    }

    /// Whether a record is being joined.
    pub fn pending(&self) -> bool {
        self.lines > 0
    }

    /// When the record being joined is due to be handed on (`flush_timeout` after its last line).
    pub fn due(&self) -> tokio::time::Instant {
        self.last + self.rule.flush_timeout
    }

    /// Whether `line` continues the record being joined (and moves the preset's state).
    fn continues(&mut self, line: &[u8]) -> bool {
        let continues = match &self.rule.kind {
            Kind::Start(start) => !start.is_match(line),
            Kind::Continuation(continuation) | Kind::Java(continuation) => continuation.is_match(line),
            Kind::Python => {
                let traceback = line == b"Traceback (most recent call last):";
                let indented = line.first().is_some_and(|byte| byte.is_ascii_whitespace());
                let (continues, next) = match self.state {
                    _ if traceback => (true, State::Traceback),
                    State::Traceback if indented => (true, State::Traceback),
                    // The exception's own line ends the traceback.
                    State::Traceback => (true, State::AfterException),
                    State::AfterException
                        if line.trim_ascii().is_empty()
                            || line.starts_with(b"During handling of the above exception")
                            || line.starts_with(b"The above exception was the direct cause") =>
                    {
                        (true, State::AfterException)
                    }
                    _ => (false, State::Normal),
                };
                self.state = next;
                continues
            }
            Kind::Go(continuation) => {
                let starts = line.starts_with(b"panic: ") || line.starts_with(b"fatal error: ");
                // Inside a panic a re-panic (`panic: … [recovered]`) continues it.
                let continues = self.state == State::Panic && continuation.is_match(line);
                self.state = if starts || continues { State::Panic } else { State::Normal };
                continues
            }
        };
        continues && self.pending()
    }

    /// Takes one line (without its newline).
    pub fn push(&mut self, line: &[u8]) -> Pushed {
        self.last = tokio::time::Instant::now();
        let mut pushed = Pushed::default();
        if self.continues(line) {
            let grown = self.pending.len() + 1 + line.len();
            let split = if self.lines >= self.rule.max_lines {
                Some(Split::MaxLines)
            } else if grown > self.rule.max_bytes {
                Some(Split::MaxBytes)
            } else if !self.take_room(line.len() + 1) {
                Some(Split::Pool)
            } else {
                None
            };
            match split {
                None => {
                    self.pending.push(b'\n');
                    self.pending.extend_from_slice(line);
                    self.lines += 1;
                    pushed.joined = true;
                    return pushed;
                }
                Some(split) => pushed.split = Some(split),
            }
        }
        // The line begins a record: the one before is complete.
        pushed.completed = self.take();
        if self.take_room(line.len()) {
            self.pending.extend_from_slice(line);
            self.lines = 1;
        } else {
            // No room even for the line alone: it is a record by itself, at once.
            pushed.split = Some(Split::Pool);
            pushed.alone = Some(line.to_vec());
        }
        pushed
    }

    /// The record being joined, handed on (at `flush_timeout`, or the connection's end).
    pub fn take(&mut self) -> Option<Joined> {
        if self.lines == 0 {
            return None;
        }
        self.lines = 0;
        if matches!(self.state, State::AfterException) {
            self.state = State::Normal;
        }
        let mut record = std::mem::take(&mut self.pending);
        // A traceback's blank lines after its end are not part of it.
        while record.last() == Some(&b'\n') {
            record.pop();
        }
        Some(Joined { bytes: record, _room: self.room.take() })
    }

    /// Bytes of the record being joined.
    pub fn held(&self) -> usize {
        self.pending.len()
    }

    /// Takes `bytes` of the pool's room for the record, without waiting.
    fn take_room(&mut self, bytes: usize) -> bool {
        let Ok(bytes) = u32::try_from(bytes.max(1)) else { return false };
        match self.pool.clone().try_acquire_many_owned(bytes) {
            Ok(permit) => {
                match &mut self.room {
                    Some(room) => room.merge(permit),
                    None => self.room = Some(permit),
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Lets what a burst grew go, keeping nothing beyond the record being joined.
    pub fn shrink(&mut self) {
        self.pending.shrink_to(4096);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joiner(config: MultilineConfig) -> Joiner {
        Joiner::new(
            Arc::new(Rule::new(&config, bytesize::ByteSize::mib(1)).expect("rule")),
            Arc::new(Semaphore::new(MULTILINE_POOL_BYTES)),
        )
    }

    fn preset(preset: MultilinePreset) -> MultilineConfig {
        MultilineConfig { preset: Some(preset), ..MultilineConfig::default() }
    }

    /// Every record `text`'s lines make, in order.
    fn records(joiner: &mut Joiner, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for line in text.lines() {
            let pushed = joiner.push(line.as_bytes());
            for record in pushed.completed.map(|joined| joined.bytes).into_iter().chain(pushed.alone) {
                out.push(String::from_utf8(record).expect("utf-8"));
            }
        }
        out.extend(joiner.take().map(|record| String::from_utf8(record.bytes).expect("utf-8")));
        out
    }

    const JAVA: &str = "2026-12-06 INFO started\n2026-12-06 ERROR request failed\njava.lang.IllegalStateException: outer\n\tat dev.App.handle(App.java:10)\n\tat dev.App.main(App.java:3)\nCaused by: java.io.IOException: inner\n\tat dev.Db.query(Db.java:7)\n\t... 2 more\n2026-12-06 INFO next";

    #[test]
    fn the_java_preset_joins_an_exception_and_its_causes_to_the_message_before_them() {
        let records = records(&mut joiner(preset(MultilinePreset::Java)), JAVA);
        assert_eq!(records.len(), 3, "{records:#?}");
        assert!(records[1].starts_with("2026-12-06 ERROR request failed\njava.lang.IllegalStateException: outer"));
        assert!(records[1].ends_with("\t... 2 more"));
        assert_eq!(records[2], "2026-12-06 INFO next");
    }

    #[test]
    fn the_python_preset_joins_chained_tracebacks_and_stops_after_the_exception_line() {
        let text = "ERROR:app:failed\nTraceback (most recent call last):\n  File \"a.py\", line 3, in f\n    g()\nKeyError: 'x'\n\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"a.py\", line 5, in f\n    raise ValueError(\"y\")\nValueError: y\nINFO:app:next";
        let records = records(&mut joiner(preset(MultilinePreset::Python)), text);
        assert_eq!(records.len(), 2, "{records:#?}");
        assert!(records[0].starts_with("ERROR:app:failed\nTraceback"));
        assert!(records[0].ends_with("ValueError: y"));
        assert_eq!(records[1], "INFO:app:next");
    }

    #[test]
    fn the_go_preset_keeps_a_panic_with_its_goroutines_as_one_record() {
        let text = "starting\npanic: boom\n\ngoroutine 1 [running]:\nmain.main()\n\t/src/main.go:5 +0x1d\nexit status 2\nafter";
        let records = records(&mut joiner(preset(MultilinePreset::Go)), text);
        assert_eq!(
            records,
            [
                "starting",
                "panic: boom\n\ngoroutine 1 [running]:\nmain.main()\n\t/src/main.go:5 +0x1d\nexit status 2",
                "after"
            ]
        );
    }

    #[test]
    fn a_start_pattern_begins_records_and_limits_split_them_counted() {
        let config = MultilineConfig { start: Some(r"^\d{4}-".into()), max_lines: 3, ..MultilineConfig::default() };
        let mut joiner = joiner(config);
        let records = records(&mut joiner, "2026- a\nb\nc\nd\n2026- e");
        assert_eq!(records, ["2026- a\nb\nc", "d", "2026- e"], "max_lines cut after three lines");
        let config = MultilineConfig {
            start: Some(r"^\d{4}-".into()),
            max_bytes: Some(bytesize::ByteSize::b(8)),
            ..MultilineConfig::default()
        };
        let mut joiner = super::Joiner::new(
            Arc::new(Rule::new(&config, bytesize::ByteSize::mib(1)).expect("rule")),
            Arc::new(Semaphore::new(1024)),
        );
        assert!(joiner.push(b"2026- a").completed.is_none());
        let pushed = joiner.push(b"bbbb");
        assert_eq!(
            (pushed.split, pushed.completed.map(|joined| joined.bytes).as_deref()),
            (Some(Split::MaxBytes), Some(&b"2026- a"[..]))
        );
    }

    #[test]
    fn a_full_pool_cuts_the_record_instead_of_waiting() {
        let config = MultilineConfig { start: Some("^S".into()), ..MultilineConfig::default() };
        let pool = Arc::new(Semaphore::new(12));
        let mut joiner =
            Joiner::new(Arc::new(Rule::new(&config, bytesize::ByteSize::mib(1)).expect("rule")), pool.clone());
        assert!(joiner.push(b"S12345").completed.is_none());
        let pushed = joiner.push(b"continued");
        assert_eq!(pushed.split, Some(Split::Pool));
        let completed = pushed.completed.expect("the record before");
        assert_eq!(completed.bytes, b"S12345");
        assert_eq!(pool.available_permits(), 6, "a finished record keeps its room until it is in the buffer");
        assert_eq!(pushed.alone.as_deref(), Some(&b"continued"[..]), "no room left to join it: on its own");
        drop(completed);
        assert!(!joiner.pending());
        assert_eq!(pool.available_permits(), 12, "every byte's room given back");
        assert!(joiner.push(b"S1").completed.is_none());
        let pushed = joiner.push(b"a line longer than the whole pool");
        assert_eq!(pushed.split, Some(Split::Pool));
        assert_eq!(pushed.completed.map(|joined| joined.bytes).as_deref(), Some(&b"S1"[..]));
        assert_eq!(pushed.alone.as_deref(), Some(&b"a line longer than the whole pool"[..]), "on its own, at once");
        assert!(!joiner.pending());
    }
}
