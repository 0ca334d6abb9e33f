//! Decoding one complete Forward message (as the framer cut it) into JSON records, one event at
//! a time.
//!
//! Owns: the four modes, the options (`chunk`, `compressed`), gzip inflation and each event's
//! msgpack → JSON. Must not: hold a message's events all at once (a message of 350,000 tiny
//! events is still the message plus one record), believe a declared count before the values it
//! counts are there, or inflate a compressed message beyond `max_record_size`.
//!
//! A message is first delimited, not decoded: the framer's header rules walk its values
//! (`Skipper`), which is how its options, which follow its entries, and its number of events are
//! known before any event is decoded. Decoding one event is rmpv's.
//!
//! Each record becomes `{"tag": TAG, "time": RFC3339, ...the record's fields}` (a record's own
//! `tag` or `time` field wins). Non-string map keys become their JSON text; binary values become
//! (lossy) strings; extension values other than EventTime become hex strings; NaN and infinities
//! become null.

use std::borrow::Cow;
use std::io::Read;

use rmpv::ValueRef;

use super::{ENVELOPE_LEVELS, Item, header};
use crate::telemetry::outcome::Rejected;

/// A message, decoded all at once: what [`events`] yields, collected ([`decode`]).
#[derive(Debug, Default, PartialEq)]
pub struct Message {
    /// The `chunk` option: the client waits for `{"ack": chunk}`.
    pub chunk: Option<String>,
    /// One entry per event: its JSON record, or why it was refused.
    pub records: Vec<Result<Vec<u8>, Rejected>>,
}

/// Limits a message is decoded within.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest message, decompressed, and largest JSON record.
    pub max_record_size: usize,
    /// Deepest nesting of a record.
    pub max_json_depth: usize,
}

/// Decodes one complete message (as cut by [`ForwardFramer`](super::ForwardFramer)) and
/// collects every event, as tests read it. The agent uses [`events`], which holds one event at
/// a time.
pub fn decode(bytes: &[u8], limits: Limits) -> Result<Message, Rejected> {
    let events = events(bytes, limits)?;
    Ok(Message { chunk: events.chunk().map(str::to_string), records: events.collect() })
}

/// Reads one complete message (as cut by [`ForwardFramer`](super::ForwardFramer)) far enough
/// to know its mode, its options and how many events it holds — every event delimited, none
/// decoded. `Err` when the message as a whole is unusable (`malformed`; `too_deep` past the
/// framer's nesting rule; `too_large` once decompressed); a bad event inside a good message is
/// refused alone, when [`Events`] reaches it.
pub fn events(bytes: &[u8], limits: Limits) -> Result<Events<'_>, Rejected> {
    // The framer's rule (containers, the message's own array included), applied here too so
    // the decoder stands on its own.
    let deepest = limits.max_json_depth.saturating_add(ENVELOPE_LEVELS);
    let (mut at, items) = match array_header(bytes) {
        Some((len, items @ 2..=4)) => (len, items as usize),
        // No mode has this shape. Delimited first, so a message too deep to read is
        // `too_deep` whatever its shape.
        _ => {
            Skipper::new(deepest).value(bytes)?;
            return Err(Rejected::Malformed);
        }
    };
    // Where each of the (at most four) items starts and ends. Every item is delimited, so the
    // whole message is known to be complete msgpack before anything is decoded.
    let mut spans = [(0, 0); 4];
    let mut skipper = Skipper::new(deepest - 1);
    for span in spans.iter_mut().take(items) {
        let len = skipper.value(bytes.get(at..).unwrap_or_default())?;
        *span = (at, at + len);
        at += len;
    }
    let item = |i: usize| spans[..items].get(i).map(|&(start, end)| &bytes[start..end]);
    let tag = item(0).and_then(str_bytes).ok_or(Rejected::Malformed)?;
    let tag = std::str::from_utf8(tag).map_err(|_| Rejected::Malformed)?;
    let second = item(1).unwrap_or_default();
    let option = |i: usize| match item(i) {
        None => Ok(None),
        Some(option) if is_nil(option) => Ok(None),
        Some(option) if is_map(option) => Ok(Some(option)),
        Some(_) => Err(Rejected::Malformed),
    };
    let (mode, bytes, max_depth, chunk, left, broken) =
        if items >= 3 && scalar(second).is_some_and(|time| is_time(&time)) {
            // Message mode: [tag, time, record, option?]. The one event is the time and the
            // record, which lie side by side; the record is an item of the message.
            let chunk = chunk(option(3)?)?;
            let event = Cow::Borrowed(&bytes[spans[1].0..spans[2].1]);
            (Mode::Message, event, deepest - 1, chunk, 1, false)
        } else if items <= 3
            && let Some((len, entries)) = array_header(second)
        {
            // Forward mode: [tag, [[time, record], ...], option?]. Skipping the array delimited
            // every entry, so its declared length now counts entries that are there.
            let chunk = chunk(option(2)?)?;
            let count = usize::try_from(entries).map_err(|_| Rejected::Malformed)?;
            (Mode::Entries, Cow::Borrowed(&second[len..]), deepest - 2, chunk, count, false)
        } else if items <= 3
            && let Some(packed) = str_bytes(second).or_else(|| bin_bytes(second))
        {
            // PackedForward (and, with `compressed: "gzip"`, CompressedPackedForward) mode:
            // [tag, bin-or-str holding a msgpack stream of [time, record], option?]. The stream is
            // held to the framer's rule: no entry nests deeper than a whole message may.
            let option = option(2)?;
            let chunk = chunk(option)?;
            let stream = if compressed(option)? {
                Cow::Owned(gunzip(packed, limits.max_record_size)?)
            } else {
                Cow::Borrowed(packed)
            };
            let (count, broken) = count_entries(&stream, deepest);
            (Mode::Entries, stream, deepest, chunk, count, broken)
        } else {
            return Err(Rejected::Malformed);
        };
    Ok(Events { tag, chunk, limits, mode, bytes, max_depth, at: 0, left, broken })
}

/// One message's events, decoded one at a time as they are taken: an iterator of exactly
/// [`len`](ExactSizeIterator::len) results, known before the first is decoded.
///
/// It holds the message's bytes (borrowed), the inflated stream of a compressed message (at
/// most `max_record_size`, owned) and a position: nothing that grows with the number of
/// events. An event's msgpack becomes a tree (rmpv) and then JSON only when it is taken, and
/// the tree is gone before the JSON is returned, so while its caller waits for the buffer a
/// message holds its bytes plus the one record in hand.
#[derive(Debug)]
pub struct Events<'a> {
    tag: &'a str,
    chunk: Option<&'a str>,
    limits: Limits,
    mode: Mode,
    /// The events, back to back: part of the message, or the inflated packed stream.
    bytes: Cow<'a, [u8]>,
    /// The most containers one event (the entry; in Message mode the record) may nest:
    /// delimiting held every event to it, so decoding within it always succeeds.
    max_depth: usize,
    /// Where the next event starts in `bytes`.
    at: usize,
    /// Events not yet taken.
    left: usize,
    /// The last event stands for the rest of a packed stream that could not be delimited.
    broken: bool,
}

/// What one event is in `Events::bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Message mode: the time, then the record.
    Message,
    /// Forward and PackedForward: one `[time, record]` entry.
    Entries,
}

impl<'a> Events<'a> {
    /// The `chunk` option: the client waits for `{"ack": chunk}`.
    pub fn chunk(&self) -> Option<&'a str> {
        self.chunk
    }

    /// Bytes held beyond the message itself: the inflated stream of a compressed message (at
    /// most `max_record_size`), else none.
    pub fn inflated_len(&self) -> usize {
        match &self.bytes {
            Cow::Owned(inflated) => inflated.len(),
            Cow::Borrowed(_) => 0,
        }
    }

    /// Decodes the event at `at` and steps past it.
    fn decode_next(&mut self) -> Result<Vec<u8>, Rejected> {
        let bytes = self.bytes.get(self.at..).unwrap_or_default();
        let budget = rmpv_budget(self.max_depth);
        let mut reader = bytes;
        let event = match self.mode {
            Mode::Message => read_value(&mut reader, budget).and_then(|time| {
                let record = read_value(&mut reader, budget)?;
                Ok(record_json(self.tag, &time, &record, self.limits))
            }),
            Mode::Entries => read_value(&mut reader, budget).map(|entry| entry_json(self.tag, &entry, self.limits)),
        };
        let used = bytes.len() - reader.len();
        match event {
            Ok(json) => {
                self.at += used;
                json
            }
            Err(reason) => {
                // Never expected (delimiting read it within the same limit). Step over it if
                // it can be delimited; else nothing after it can be found, and every event
                // still to come is refused as well.
                match Skipper::new(self.max_depth).value(bytes) {
                    Ok(len) => self.at += len,
                    Err(_) => self.at = self.bytes.len(),
                }
                Err(reason)
            }
        }
    }
}

impl Iterator for Events<'_> {
    type Item = Result<Vec<u8>, Rejected>;

    fn next(&mut self) -> Option<Self::Item> {
        self.left = self.left.checked_sub(1)?;
        if self.left == 0 && self.broken {
            // The rest of the stream cannot be delimited: one refusal stands for it.
            return Some(Err(Rejected::Malformed));
        }
        Some(self.decode_next())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Events<'_> {}

fn read_value<'a>(reader: &mut &'a [u8], budget: usize) -> Result<ValueRef<'a>, Rejected> {
    rmpv::decode::read_value_ref_with_max_depth(reader, budget).map_err(|error| match error {
        rmpv::decode::Error::DepthLimitExceeded => Rejected::TooDeep,
        _ => Rejected::Malformed,
    })
}

/// The rmpv depth budget that decodes any value nesting at most `containers` non-empty
/// containers: rmpv spends two levels on a container (the value, then its items) and up to
/// three on the value at the bottom (a string: value, string, bytes).
fn rmpv_budget(containers: usize) -> usize {
    containers.saturating_mul(2).saturating_add(3)
}

/// Counts the entries of a packed stream by delimiting them, none decoded; the second value
/// says the stream broke off: its last count is one refusal for everything from there on.
fn count_entries(stream: &[u8], max_depth: usize) -> (usize, bool) {
    let mut skipper = Skipper::new(max_depth);
    let (mut count, mut at) = (0, 0);
    while let Some(rest) = stream.get(at..).filter(|rest| !rest.is_empty()) {
        count += 1;
        match skipper.value(rest) {
            Ok(len) => at += len,
            Err(_) => return (count, true),
        }
    }
    (count, false)
}

/// Finds where msgpack values end without building them, by the framer's [`header`] rules: at
/// most `max_depth` nested non-empty containers (`too_deep`), nothing missing (`malformed`). A
/// declared length is only ever compared with the bytes that are there; what it remembers is
/// one count per container open on the current path.
#[derive(Debug)]
struct Skipper {
    max_depth: usize,
    /// Items still expected in each open container (a map counts keys and values).
    open: Vec<u64>,
}

impl Skipper {
    fn new(max_depth: usize) -> Self {
        Self { max_depth, open: Vec::new() }
    }

    /// The length of the one value at the start of `bytes`.
    fn value(&mut self, bytes: &[u8]) -> Result<usize, Rejected> {
        self.open.clear();
        let mut at = 0usize;
        loop {
            let rest = bytes.get(at..).unwrap_or_default();
            let (len, item) = match header(rest) {
                Some(Ok(header)) => header,
                // rmpv, which decodes what the skipper delimits, reads the never-used marker
                // as nil; so does the skipper. (The framer refuses it on the wire: only a
                // packed stream, or input that never met the framer, can hold one.)
                Some(Err(_)) => (1, Item::Payload(0)),
                None => return Err(Rejected::Malformed),
            };
            at += len;
            match item {
                Item::Payload(payload) => {
                    let payload = usize::try_from(payload).map_err(|_| Rejected::Malformed)?;
                    if payload > bytes.len() - at {
                        return Err(Rejected::Malformed);
                    }
                    at += payload;
                }
                Item::Container(0) => {}
                Item::Container(items) => {
                    if self.open.len() >= self.max_depth {
                        return Err(Rejected::TooDeep);
                    }
                    self.open.push(items);
                    continue;
                }
            }
            // A value ended: so may the containers it completes.
            loop {
                match self.open.last_mut() {
                    None => return Ok(at),
                    Some(left) if *left > 1 => {
                        *left -= 1;
                        break;
                    }
                    Some(_) => {
                        self.open.pop();
                    }
                }
            }
        }
    }
}

/// An array's header length and item count, if `bytes` starts with an array.
fn array_header(bytes: &[u8]) -> Option<(usize, u64)> {
    match (bytes.first()?, header(bytes)?.ok()?) {
        (0x90..=0x9f | 0xdc | 0xdd, (len, Item::Container(items))) => Some((len, items)),
        _ => None,
    }
}

fn is_map(bytes: &[u8]) -> bool {
    matches!(bytes.first(), Some(0x80..=0x8f | 0xde | 0xdf))
}

/// Nil, or the never-used marker, which rmpv reads as nil too.
fn is_nil(bytes: &[u8]) -> bool {
    matches!(bytes.first(), Some(0xc0 | 0xc1))
}

/// The payload of a string or binary value at the start of `bytes` (already delimited).
fn payload(bytes: &[u8]) -> Option<&[u8]> {
    match header(bytes)?.ok()? {
        (len, Item::Payload(payload)) => bytes.get(len..len.checked_add(usize::try_from(payload).ok()?)?),
        _ => None,
    }
}

/// A string's raw bytes (not necessarily UTF-8).
fn str_bytes(bytes: &[u8]) -> Option<&[u8]> {
    if matches!(bytes.first(), Some(0xa0..=0xbf | 0xd9 | 0xda | 0xdb)) { payload(bytes) } else { None }
}

/// A binary value's bytes.
fn bin_bytes(bytes: &[u8]) -> Option<&[u8]> {
    if matches!(bytes.first(), Some(0xc4..=0xc6)) { payload(bytes) } else { None }
}

/// A value that is not a container, decoded (nothing to allocate).
fn scalar(bytes: &[u8]) -> Option<ValueRef<'_>> {
    match header(bytes)?.ok()? {
        (_, Item::Payload(_)) => rmpv::decode::read_value_ref_with_max_depth(&mut &bytes[..], rmpv_budget(0)).ok(),
        (_, Item::Container(_)) => None,
    }
}

/// The value of the option map's first `name` key, as bytes (a map already delimited).
fn option_field<'a>(option: Option<&'a [u8]>, name: &str) -> Result<Option<&'a [u8]>, Rejected> {
    let Some(option) = option else { return Ok(None) };
    let (mut at, items) = match header(option) {
        Some(Ok((len, Item::Container(items)))) => (len, items),
        _ => return Err(Rejected::Malformed),
    };
    let mut skipper = Skipper::new(usize::MAX);
    for _ in 0..items / 2 {
        let key = option.get(at..).unwrap_or_default();
        let key_len = skipper.value(key)?;
        let value = option.get(at + key_len..).unwrap_or_default();
        let value_len = skipper.value(value)?;
        if str_bytes(key).is_some_and(|key| key == name.as_bytes()) {
            return Ok(value.get(..value_len));
        }
        at += key_len + value_len;
    }
    Ok(None)
}

fn chunk(option: Option<&[u8]>) -> Result<Option<&str>, Rejected> {
    match option_field(option, "chunk")? {
        None => Ok(None),
        Some(chunk) => {
            let chunk = str_bytes(chunk).ok_or(Rejected::Malformed)?;
            std::str::from_utf8(chunk).map(Some).map_err(|_| Rejected::Malformed)
        }
    }
}

fn compressed(option: Option<&[u8]>) -> Result<bool, Rejected> {
    match option_field(option, "compressed")? {
        None => Ok(false),
        Some(kind) => match str_bytes(kind).ok_or(Rejected::Malformed)? {
            b"gzip" => Ok(true),
            b"text" => Ok(false),
            _ => Err(Rejected::Malformed),
        },
    }
}

/// Inflates gzip (one or more members) up to `max` bytes: a bomb stops at the limit.
fn gunzip(bytes: &[u8], max: usize) -> Result<Vec<u8>, Rejected> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|_| Rejected::Malformed)?;
    if out.len() > max {
        return Err(Rejected::TooLarge);
    }
    Ok(out)
}

fn is_time(value: &ValueRef<'_>) -> bool {
    matches!(value, ValueRef::Integer(_) | ValueRef::F32(_) | ValueRef::F64(_)) || event_time(value).is_some()
}

/// Fluentd's EventTime: extension 0, seconds and nanoseconds as big-endian u32s.
fn event_time(value: &ValueRef<'_>) -> Option<(i64, u32)> {
    match value {
        ValueRef::Ext(0, data) if data.len() == 8 => {
            let seconds = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
            let nanos = u32::from_be_bytes([data[4], data[5], data[6], data[7]]);
            Some((i64::from(seconds), nanos))
        }
        _ => None,
    }
}

fn time_rfc3339(value: &ValueRef<'_>) -> Option<String> {
    let (seconds, nanos) = match value {
        ValueRef::Integer(seconds) => (seconds.as_i64()?, 0),
        ValueRef::F32(seconds) => split_seconds(f64::from(*seconds))?,
        ValueRef::F64(seconds) => split_seconds(*seconds)?,
        other => event_time(other)?,
    };
    let time = chrono::DateTime::from_timestamp(seconds, nanos)?;
    Some(time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
}

fn split_seconds(seconds: f64) -> Option<(i64, u32)> {
    if !seconds.is_finite() || seconds.abs() > 1e15 {
        return None;
    }
    let whole = seconds.floor();
    Some((whole as i64, ((seconds - whole) * 1e9) as u32))
}

fn entry_json(tag: &str, entry: &ValueRef<'_>, limits: Limits) -> Result<Vec<u8>, Rejected> {
    match entry {
        ValueRef::Array(pair) if pair.len() == 2 && is_time(&pair[0]) => record_json(tag, &pair[0], &pair[1], limits),
        _ => Err(Rejected::Malformed),
    }
}

/// `{"tag":…,"time":…, fields…}` for one event.
fn record_json(tag: &str, time: &ValueRef<'_>, record: &ValueRef<'_>, limits: Limits) -> Result<Vec<u8>, Rejected> {
    let ValueRef::Map(fields) = record else { return Err(Rejected::Malformed) };
    let has = |name: &str| fields.iter().any(|(key, _)| matches!(key, ValueRef::String(k) if k.as_str() == Some(name)));
    let mut out = Vec::with_capacity(64);
    out.push(b'{');
    let mut first = true;
    if !has("tag") {
        out.extend_from_slice(b"\"tag\":");
        write_str(tag, &mut out);
        first = false;
    }
    if let Some(time) = time_rfc3339(time).filter(|_| !has("time")) {
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(b"\"time\":");
        write_str(&time, &mut out);
        first = false;
    }
    for (key, value) in fields {
        if !first {
            out.push(b',');
        }
        first = false;
        write_key(key, &mut out);
        out.push(b':');
        write_json(value, 1, limits.max_json_depth, &mut out)?;
    }
    out.push(b'}');
    if out.len() > limits.max_record_size {
        return Err(Rejected::TooLarge);
    }
    Ok(out)
}

fn write_str(text: &str, out: &mut Vec<u8>) {
    // Serialising a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

fn lossy(text: &rmpv::Utf8StringRef<'_>) -> String {
    match text.as_str() {
        Some(text) => text.to_string(),
        None => String::from_utf8_lossy(text.as_bytes()).into_owned(),
    }
}

fn write_key(key: &ValueRef<'_>, out: &mut Vec<u8>) {
    match key {
        ValueRef::String(text) => match text.as_str() {
            Some(text) => write_str(text, out),
            None => write_str(&lossy(text), out),
        },
        ValueRef::Binary(bytes) => write_str(&String::from_utf8_lossy(bytes), out),
        other => {
            let mut text = Vec::new();
            // A key is a scalar here or its JSON text; depth is bounded by the decoder.
            let _ = write_json(other, 1, usize::MAX, &mut text);
            write_str(&String::from_utf8_lossy(&text), out);
        }
    }
}

/// Writes a msgpack value as JSON; `depth` is the nesting of the containing record (1 for its
/// top-level fields).
fn write_json(value: &ValueRef<'_>, depth: usize, max_depth: usize, out: &mut Vec<u8>) -> Result<(), Rejected> {
    match value {
        ValueRef::Nil => out.extend_from_slice(b"null"),
        ValueRef::Boolean(true) => out.extend_from_slice(b"true"),
        ValueRef::Boolean(false) => out.extend_from_slice(b"false"),
        ValueRef::Integer(number) => match (number.as_i64(), number.as_u64()) {
            (Some(n), _) => out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes()),
            (None, Some(n)) => out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes()),
            (None, None) => out.extend_from_slice(b"null"),
        },
        ValueRef::F32(number) => write_float(f64::from(*number), out),
        ValueRef::F64(number) => write_float(*number, out),
        ValueRef::String(text) => match text.as_str() {
            Some(text) => write_str(text, out),
            None => write_str(&lossy(text), out),
        },
        ValueRef::Binary(bytes) => write_str(&String::from_utf8_lossy(bytes), out),
        ValueRef::Ext(kind, data) => match time_rfc3339(value) {
            Some(time) if *kind == 0 => write_str(&time, out),
            _ => write_str(&hex(data), out),
        },
        ValueRef::Array(items) => {
            if depth >= max_depth {
                return Err(Rejected::TooDeep);
            }
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(item, depth + 1, max_depth, out)?;
            }
            out.push(b']');
        }
        ValueRef::Map(fields) => {
            if depth >= max_depth {
                return Err(Rejected::TooDeep);
            }
            out.push(b'{');
            for (i, (key, value)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_key(key, out);
                out.push(b':');
                write_json(value, depth + 1, max_depth, out)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

fn write_float(number: f64, out: &mut Vec<u8>) {
    // serde_json writes NaN and infinities as null; writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &number);
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|byte| format!("{byte:02x}")).collect()
}
