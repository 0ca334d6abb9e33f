//! From a decoded record to the buffer, the same for every protocol.
//!
//! Owns: the content checks of [`super::record`], the protocol's transformation (syslog fields,
//! Forward's JSON), the rate limit (wait or drop), wrapping in an envelope, choosing the Kafka
//! key, pushing to the buffer, and counting accepted and refused records with the listener's
//! labels. Must not: wait on anything but the rate limit (`throttle`) and the buffer's `block`
//! policy, both cut short at the drain deadline; or touch shared counters per record (counts
//! are flushed in batches).

use bytes::{Bytes, BytesMut};
use serde_json::value::RawValue;
use tracing::trace;

use super::limit::LimitKey;
use super::{IngestContext, KeyRule, ListenerContext, record, redact, syslog};
use crate::buffer::ack::Ack;
use crate::buffer::{Admission, Record};
use crate::config::{Protocol, RateLimitAction};
use crate::envelope::PeerFragment;
use crate::ingest::session::ClientStamp;
use crate::telemetry::outcome::{Dropped, Failed, Rejected};
use tokio_util::sync::CancellationToken;

/// Flush local counters after this many records.
const COUNTER_FLUSH_EVERY: u64 = 256;

/// Bytes of one envelope arena: a connection's small envelopes are written one after the other
/// into an allocation this size, each record's payload a slice of it, instead of an allocation
/// each (measured: 4% less agent CPU per record at the max rate, docs/PERFORMANCE.md). An arena
/// is freed when the last of its records is handed to librdkafka. A connection's records leave
/// the buffer oldest first, so besides the records the budget counts, its arenas hold at most the
/// unused part of the one it writes into and the already-sent part of the oldest one still
/// alive (< 2 × this), plus less than [`ARENA_RECORD`] at the end of each full one. Kept while the
/// connection waits: an arena let go half-used would be held by its few records alone.
const ARENA_BYTES: usize = 8 * 1024;

/// Records' room a waiting connection keeps for its next batch (a batch is up to 128; see
/// [`RecordSink::waiting`]).
pub const IDLE_BATCH: usize = 16;

/// Bytes a waiting connection keeps for its next transformed record.
pub const IDLE_TRANSFORMED: usize = 4096;

/// The largest envelope written into an arena; a larger one gets an allocation of its own
/// (nothing of it stays with the connection).
const ARENA_RECORD: usize = 1024;

/// How a wait for buffer room ended.
enum Waited {
    Pushed,
    Abandoned,
    PastDeadline,
}

/// How a wait for rate-limit tokens ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tokens {
    Taken,
    /// The drain deadline.
    Abandoned,
    /// The sink's own deadline.
    PastDeadline,
    /// `drop`: none there.
    Refused,
}

impl Tokens {
    fn then(self, taken: bool) -> Self {
        if taken { self } else { Tokens::Refused }
    }
}

#[derive(Clone, Copy)]
enum Bucket {
    Records,
    Bytes,
}

/// One connection's (or datagram socket's) way into the buffer.
pub struct RecordSink<'a> {
    ingest: &'a IngestContext,
    listener: &'a ListenerContext,
    /// Whose rate-limit bucket records are charged to.
    limit_key: LimitKey,
    admission: Admission,
    /// The connection's peer as envelopes carry it (none where the socket cannot tell:
    /// datagrams).
    peer: PeerFragment,
    /// Where small envelopes are written: each record's payload is split off it (see
    /// [`ARENA_BYTES`]).
    arena: BytesMut,
    /// The key rule as last read, with the generation it was read at.
    key_rule: Option<(u64, KeyRule)>,
    /// Where a key template is rendered (kept between records).
    key_text: String,
    /// The topic route as last read, with the generation it was read at.
    topic_route: Option<(u64, std::sync::Arc<crate::topic::Route>)>,
    /// Where a topic template is rendered (kept between records).
    topic_text: String,
    /// A transformed record (syslog, Forward).
    transformed: Vec<u8>,
    /// A masked record (`redact`), kept between records.
    masked: String,
    /// Records of the batch being offered ([`RecordSink::offer_many`]) that already hold their
    /// room, waiting to enter the buffer together. Empty whenever the sink waits for anything.
    pending: Vec<Record>,
    /// Set while [`RecordSink::offer_many`] runs.
    batching: bool,
    /// The id and key time the record being offered carries (a client session's,
    /// [`RecordSink::offer_stamped`]); none: the agent's own.
    stamp: Option<ClientStamp>,
    /// Where the records' writer stops waiting (an OTLP Export's `export_timeout`): a record that
    /// would wait past it for buffer room or a rate limit is refused (`block_timeout`,
    /// `rate_limited`) instead, and its writer told to retry. None: only the drain deadline.
    deadline: Option<CancellationToken>,
    /// The record being joined from continuation lines (`multiline`; `lines` listeners).
    multiline: Option<super::multiline::Joiner>,
    /// Counted locally and flushed in batches: the hot path touches no shared counter.
    records: u64,
    /// Lines joined by `multiline`, counted like `records`.
    joined: u64,
    bytes: u64,
}

impl<'a> RecordSink<'a> {
    /// A sink for one connection.
    pub fn new(
        ingest: &'a IngestContext,
        listener: &'a ListenerContext,
        limit_key: LimitKey,
        peer: PeerFragment,
    ) -> Self {
        Self {
            ingest,
            listener,
            limit_key,
            admission: Admission::default(),
            peer,
            arena: BytesMut::new(),
            key_rule: None,
            key_text: String::new(),
            topic_route: None,
            topic_text: String::new(),
            pending: Vec::new(),
            batching: false,
            stamp: None,
            deadline: None,
            multiline: listener
                .multiline
                .as_ref()
                .map(|rule| super::multiline::Joiner::new(rule.clone(), ingest.multiline_pool.clone())),
            transformed: Vec::new(),
            masked: String::new(),
            records: 0,
            joined: 0,
            bytes: 0,
        }
    }

    /// The sink's records wait for buffer room and rate limits only until `deadline` is cancelled
    /// (an OTLP Export's `export_timeout`): a record that would wait past it is refused
    /// (`block_timeout`, `rate_limited`) and its writer told to retry.
    pub fn until(mut self, deadline: CancellationToken) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Offers one record as read from the socket (a line, a frame body, a datagram), checking
    /// it and, for syslog, parsing it. `ack` is settled (or refused) with the record. On a
    /// `multiline` listener an unacknowledged line is joined first: the records it completes go
    /// on (see [`RecordSink::flush_multiline`] for the last one).
    pub async fn offer(&mut self, bytes: &[u8], ack: Option<Ack>) {
        if ack.is_none()
            && self.stamp.is_none()
            && let Some(joiner) = &mut self.multiline
        {
            let before = joiner.held();
            let pushed = joiner.push(bytes);
            let after = joiner.held();
            // The record being joined is read and not yet a record: the read-buffer gauge's.
            self.listener.buffered(after as i64 - before as i64);
            if pushed.joined {
                self.joined += 1;
            }
            if let Some(split) = pushed.split {
                self.listener.metrics.split(split);
            }
            if let Some(joined) = pushed.completed {
                // Its room in the pool is held until it is in the buffer.
                self.offer_one(&joined.bytes, None).await;
            }
            if let Some(alone) = pushed.alone {
                self.offer_one(&alone, None).await;
            }
            return;
        }
        self.offer_one(bytes, ack).await;
    }

    /// The record being joined, if any, offered now: `flush_timeout` passed without a line, or
    /// the connection is ending or draining.
    pub async fn flush_multiline(&mut self) {
        let Some(joiner) = self.multiline.as_mut() else { return };
        let held = joiner.held();
        if let Some(joined) = joiner.take() {
            self.listener.buffered(-(held as i64));
            self.offer_one(&joined.bytes, None).await;
        }
    }

    /// When the record being joined is due to be offered without its next line.
    pub fn multiline_due(&self) -> Option<tokio::time::Instant> {
        self.multiline.as_ref().filter(|joiner| joiner.pending()).map(super::multiline::Joiner::due)
    }

    async fn offer_one(&mut self, bytes: &[u8], ack: Option<Ack>) {
        let bytes = match self.listener.protocol {
            Protocol::Syslog => syslog::trim_trailer(bytes),
            // `echo msg | socat - UNIX-SENDTO:…` sends the newline too; it is not the record's.
            Protocol::Datagram => bytes.strip_suffix(b"\n").map_or(bytes, |b| b.strip_suffix(b"\r").unwrap_or(b)),
            _ => bytes,
        };
        let text = match record::validate(bytes, self.ingest.max_json_depth) {
            Ok(text) => text,
            Err(reason) => return self.reject(reason, ack),
        };
        if self.listener.protocol == Protocol::Syslog {
            let mut json = std::mem::take(&mut self.transformed);
            syslog::to_record(text, &mut json);
            // serde_json wrote it: valid UTF-8.
            let record = String::from_utf8_lossy(&json);
            self.submit(&record, bytes.len(), ack).await;
            drop(record);
            self.transformed = json;
        } else {
            self.submit(text, bytes.len(), ack).await;
        }
    }

    /// [`RecordSink::offer`] for a record of a client session: its envelope carries `stamp`'s id
    /// and key time, the same each time the client sends it.
    pub async fn offer_stamped(&mut self, bytes: &[u8], ack: Option<Ack>, stamp: ClientStamp) {
        self.stamp = Some(stamp);
        self.offer(bytes, ack).await;
        self.stamp = None;
    }

    /// Offers records read together (the lines of one read, no acknowledgements asked), as
    /// [`RecordSink::offer`] each, `records` emptied. Those that find room at once enter the buffer
    /// together at the end — one lock, one wake-up of the shipper, one update of the ages —
    /// instead of one at a time; before anything that waits (a full buffer, a rate limit) the
    /// ones before it go in first, so order is kept and nothing waits with records in hand.
    pub async fn offer_many(&mut self, records: &mut Vec<BytesMut>) {
        self.batching = self.listener.limits.is_none();
        for bytes in records.drain(..) {
            self.offer(&bytes, None).await;
        }
        self.batching = false;
        self.flush_pending();
    }

    /// Puts the batch's records that hold their room into the buffer.
    fn flush_pending(&mut self) {
        if !self.pending.is_empty() {
            self.ingest.buffer.push_leased(&mut self.pending);
        }
    }

    /// Offers a record that is already JSON built by Sluice (a Forward event); `raw_len` is
    /// what it cost on the wire, for the byte counters and limits.
    pub async fn offer_json(&mut self, json: &[u8], raw_len: usize, ack: Option<Ack>) {
        match record::validate(json, self.ingest.max_json_depth) {
            Ok(text) => self.submit(text, raw_len, ack).await,
            Err(reason) => self.reject(reason, ack),
        }
    }

    /// Counts a refused record and refuses its ack.
    pub fn reject(&self, reason: Rejected, ack: Option<Ack>) {
        trace!(reason = reason.as_str(), "record refused");
        self.listener.metrics.rejected(reason);
        if let Some(ack) = ack {
            ack.refused(reason);
        }
    }

    /// Masking (`redact`), then [`RecordSink::admit`]: nothing after this sees the original.
    async fn submit(&mut self, text: &str, raw_len: usize, ack: Option<Ack>) {
        let Some(redact) = &self.listener.redact else {
            return self.admit(text, raw_len, ack).await;
        };
        let mut masked = std::mem::take(&mut self.masked);
        // A masked record may grow (a short value, a long mask): within what its message may be.
        match redact.apply(text, &mut masked, self.ingest.max_message / 2) {
            Ok(true) => self.admit(&masked, raw_len, ack).await,
            Ok(false) => self.admit(text, raw_len, ack).await,
            Err(redact::Unmasked::TooLarge) => self.reject(Rejected::TooLarge, ack),
            Err(redact::Unmasked::Unfollowable) => self.reject(Rejected::Malformed, ack),
        }
        self.masked = masked;
    }

    /// Rate limit, envelope, key, buffer.
    async fn admit(&mut self, text: &str, raw_len: usize, ack: Option<Ack>) {
        if let Some(limits) = &self.listener.limits {
            let allowed = match limits.action {
                RateLimitAction::Drop => Tokens::Taken.then(limits.check(&self.limit_key, raw_len).is_ok()),
                RateLimitAction::Throttle => self.wait_for_tokens(raw_len).await,
            };
            if allowed != Tokens::Taken {
                match allowed {
                    // `drop`, or its writer's wait ended (it is told to retry).
                    Tokens::Refused | Tokens::PastDeadline => return self.reject(Rejected::RateLimited, ack),
                    // The drain deadline passed while waiting: read, so counted as read, and
                    // given up.
                    Tokens::Abandoned | Tokens::Taken => {
                        self.records += 1;
                        self.bytes += raw_len as u64;
                        return self.abandoned();
                    }
                }
            }
        }
        let now = chrono::Utc::now();
        let stamp = self.stamp.take();
        let envelopes = &self.ingest.envelopes;
        let write = |out: &mut BytesMut| match &stamp {
            Some(stamp) => envelopes.write_stamped(text, &self.peer, stamp, out),
            None => envelopes.write(text, &self.peer, now, out),
        };
        // Room for the envelope (a JSON envelope's escapes beyond it are reserved as written).
        let room = text.len() + envelopes.headroom();
        let payload = if room <= ARENA_RECORD {
            if self.arena.capacity() - self.arena.len() < room {
                self.arena = BytesMut::with_capacity(ARENA_BYTES);
            }
            write(&mut self.arena);
            self.arena.split().freeze()
        } else {
            let mut own = BytesMut::with_capacity(room);
            write(&mut own);
            own.freeze()
        };
        let key = match self.ingest.key.current(&mut self.key_rule) {
            KeyRule::None => None,
            KeyRule::Fixed(key) => Some(key.clone()),
            KeyRule::Field(field) => field_key(text, field),
            KeyRule::Template(template, pod) => {
                let mut key = std::mem::take(&mut self.key_text);
                let rendered = template.render(pod, text, &mut key).then(|| Bytes::copy_from_slice(key.as_bytes()));
                self.key_text = key;
                rendered
            }
        };
        if payload.len() + key.as_ref().map_or(0, Bytes::len) > self.ingest.max_message {
            // Within max_record_size as written, but its message is larger than anything the
            // buffer and librdkafka are sized for.
            return self.reject(Rejected::TooLarge, ack);
        }
        let (topic, defaulted) = self.ingest.topics.current(&mut self.topic_route).route(text, &mut self.topic_text);
        if let Some(why) = defaulted {
            self.ingest.topics.count(why, 1);
        }
        let topic = Some(topic);
        self.records += 1;
        self.bytes += raw_len as u64;
        if self.records >= COUNTER_FLUSH_EVERY {
            self.flush_counters();
        }
        let ingest_ms = now.timestamp_millis() as u64;
        // Past the drain deadline nothing more enters the buffer: the final count may already
        // be taken. Checked first; a push that completes at once (room in the buffer) then
        // never registers with the token, which every connection shares.
        if self.ingest.abandon.is_cancelled() {
            for _ in self.pending.drain(..) {
                // Taken in, never in the buffer: given up like this one (its room goes back).
                self.ingest.abandoned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Failed::DrainTimeout.count(1);
            }
            return self.abandoned();
        }
        if self.batching && ack.is_none() {
            let cost = self.ingest.buffer.cost(payload.len(), key.as_ref().map_or(0, Bytes::len));
            if let Some(lease) = self.ingest.buffer.try_admit(cost, &mut self.admission) {
                self.pending.push(Record {
                    payload,
                    topic,
                    key,
                    lease,
                    retries: 0,
                    pos: None,
                    ingest_ms,
                    ack: None,
                    maybe_stored: false,
                });
                return;
            }
        }
        // This one may wait for room: the records before it go in first.
        self.flush_pending();
        let ingest = self.ingest;
        let deadline = self.deadline.clone().unwrap_or_default();
        let waited = {
            let mut push = std::pin::pin!(ingest.buffer.push(payload, topic, key, ingest_ms, ack, &mut self.admission));
            // A drop by policy is counted (and its ack refused) by the buffer.
            match futures_util::FutureExt::now_or_never(push.as_mut()) {
                Some(_) => Waited::Pushed,
                None => tokio::select! {
                    biased;
                    _ = ingest.abandon.cancelled() => Waited::Abandoned,
                    _ = deadline.cancelled() => Waited::PastDeadline,
                    _ = push => Waited::Pushed,
                },
            }
        };
        match waited {
            Waited::Pushed => {}
            Waited::Abandoned => self.abandoned(),
            // Its writer's wait ended (the push, and the ack in it, let go): dropped as a full
            // buffer's wait that ran out is.
            Waited::PastDeadline => Dropped::BlockTimeout.count(1),
        }
    }

    /// `throttle`: waits until the record's tokens are there, record bucket first, then byte
    /// bucket (a record token is never charged twice), or the drain deadline or the sink's own
    /// deadline passes.
    async fn wait_for_tokens(&self, len: usize) -> Tokens {
        let Some(limits) = &self.listener.limits else { return Tokens::Taken };
        let deadline = self.deadline.clone().unwrap_or_default();
        let mut counted = false;
        for bucket in [Bucket::Records, Bucket::Bytes] {
            loop {
                let result = match bucket {
                    Bucket::Records => limits.check_records(&self.limit_key),
                    Bucket::Bytes => limits.check_bytes(&self.limit_key, len),
                };
                let Err(wait) = result else { break };
                if !counted {
                    self.listener.metrics.throttled.increment(1);
                    counted = true;
                }
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = self.ingest.abandon.cancelled() => return Tokens::Abandoned,
                    _ = deadline.cancelled() => return Tokens::PastDeadline,
                }
            }
        }
        Tokens::Taken
    }

    /// A record read but given up at the drain deadline before it got a number (acknowledged
    /// mode): counted as `drain_timeout`.
    pub fn give_up(&mut self) {
        self.records += 1;
        self.abandoned();
    }

    /// A record read but never offered because its writer's wait ran out (an OTLP Export past
    /// its `export_timeout`; the client is told to retry): counted as `block_timeout`, the wait
    /// for buffer room that ran out.
    pub fn timed_out(&mut self) {
        self.records += 1;
        Dropped::BlockTimeout.count(1);
    }

    /// A record given up at the drain deadline (its ack, never settled, is not acknowledged).
    fn abandoned(&self) {
        Failed::DrainTimeout.count(1);
        self.ingest.abandoned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The connection is about to wait for its writer: the counts are published, and what a
    /// burst grew is let go (a batch's records, a long transformed record), so an idle connection
    /// holds no more than [`IDLE_BATCH`] records' room (its arena is kept: see `ARENA_BYTES`).
    pub fn waiting(&mut self) {
        self.flush_counters();
        self.pending.shrink_to(IDLE_BATCH);
        self.transformed.shrink_to(IDLE_TRANSFORMED);
        self.key_text.shrink_to(IDLE_TRANSFORMED);
        self.topic_text.shrink_to(IDLE_TRANSFORMED);
        self.masked.clear();
        self.masked.shrink_to(IDLE_TRANSFORMED);
        if let Some(joiner) = &mut self.multiline {
            joiner.shrink();
        }
    }

    /// Adds the local counts to the listener's counters.
    pub fn flush_counters(&mut self) {
        if self.joined > 0 {
            self.listener.metrics.lines_joined.increment(self.joined);
            self.joined = 0;
        }
        if self.records > 0 {
            self.listener.metrics.records.increment(self.records);
            self.listener.metrics.bytes.increment(self.bytes);
            self.records = 0;
            self.bytes = 0;
        }
    }
}

impl Drop for RecordSink<'_> {
    fn drop(&mut self) {
        // Only a task stopped mid-way (a panic) leaves a record being joined here: it was never
        // handed on, counted as cut short.
        if let Some(joiner) = &mut self.multiline {
            let held = joiner.held();
            if joiner.take().is_some() {
                self.listener.buffered(-(held as i64));
                self.listener.metrics.rejected(Rejected::Truncated);
            }
        }
        // Only a batch cut short (its task stopped mid-way) leaves records here.
        self.flush_pending();
        self.flush_counters();
    }
}

/// The key from a JSON record's top-level `field`: a string's content, or any other value's JSON
/// text. `None` for text records or when the field is absent.
pub fn field_key(line: &str, field: &str) -> Option<Bytes> {
    if !crate::envelope::is_json_object(line) {
        return None;
    }
    let object: std::collections::HashMap<std::borrow::Cow<'_, str>, &RawValue> = serde_json::from_str(line).ok()?;
    let value = object.get(field)?;
    match serde_json::from_str::<std::borrow::Cow<'_, str>>(value.get()) {
        Ok(text) => Some(Bytes::copy_from_slice(text.as_bytes())),
        Err(_) => Some(Bytes::copy_from_slice(value.get().as_bytes())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_key_takes_string_content_and_other_values_as_json() {
        assert_eq!(field_key(r#"{"user":"ann","n":1}"#, "user"), Some(Bytes::from_static(b"ann")));
        assert_eq!(field_key(r#"{"user":"ann","n":12}"#, "n"), Some(Bytes::from_static(b"12")));
        assert_eq!(field_key(r#"{"user":"ann"}"#, "missing"), None);
        assert_eq!(field_key("plain text", "user"), None);
    }
}
