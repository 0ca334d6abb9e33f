//! One connection: read frames, validate them, wrap them in envelopes, push them to the buffer.
//!
//! Owns: the per-connection read loop and what happens to each frame. Must not: wait on
//! anything but the socket and the buffer (no Kafka, no disk), keep more than one record's worth
//! of unread bytes, or end the connection because one record was bad.
//!
//! Rules for records (documented in the README):
//! - longer than `ingest.max_record_size`: discarded up to its newline, `reason="too_large"`;
//! - not valid UTF-8: rejected whole, `reason="invalid_utf8"` (rejecting rather than replacing
//!   bytes keeps every stored payload byte-identical to what the app wrote);
//! - empty (after removing `\r`): rejected, `reason="empty"`.
//!
//! In every case the connection continues with the next record.
//!
//! Acknowledged mode: a connection whose first line is exactly [`ACK_HANDSHAKE`] gets an
//! `OK <point>` line back and from then on `ACK <n>` lines (records 1..=n of this connection are
//! settled) and `NAK <n> <reason>` lines (record n was refused), written by a second task so
//! reading never waits for the writer to read. See `docs/PROTOCOL.md`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::value::RawValue;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::{debug, trace};

use super::framing::{Frame, LineFramer};
use super::{IngestContext, KeyRule};
use crate::buffer::Admission;
use crate::buffer::ack::{AckEvent, AckTracker};
use crate::envelope::{EnvelopeWriter, Peer};
use crate::telemetry::{self, Rejected};

/// After shutdown starts, a connection keeps reading while data keeps coming, and closes once
/// it has been idle this long (or at end of stream). Bounded overall by the drain deadline.
pub const DRAIN_IDLE: Duration = Duration::from_millis(250);

/// Initial read buffer; it grows with the records, up to `max_record_size` plus one read.
const READ_CAPACITY: usize = 8 * 1024;

/// The first line that switches a connection to acknowledged mode.
pub const ACK_HANDSHAKE: &[u8] = b"SLUICE/1 ACK";

/// Serves one connection until the writer closes it, it fails, or shutdown has drained it.
pub async fn serve(stream: UnixStream, context: Arc<IngestContext>, stop: CancellationToken) {
    let peer = match stream.peer_cred() {
        Ok(cred) => Peer { pid: cred.pid(), uid: cred.uid(), gid: cred.gid() },
        Err(error) => {
            debug!(%error, "no peer credentials");
            Peer::default()
        }
    };
    debug!(pid = ?peer.pid, uid = peer.uid, "connection opened");
    let open = metrics::gauge!(telemetry::INGEST_CONNECTIONS_OPEN);
    open.increment(1.0);
    let (read_half, write_half) = stream.into_split();
    let mut reader = RecordReader::new(&context, peer);
    let mut frames = FramedRead::with_capacity(read_half, LineFramer::new(context.max_record_size), READ_CAPACITY);
    let mut write_half = Some(write_half);
    let mut acks: Option<tokio::task::JoinHandle<()>> = None;
    let mut first = true;
    let mut draining = false;
    loop {
        let next = if draining {
            match tokio::time::timeout(DRAIN_IDLE, frames.next()).await {
                Ok(next) => next,
                Err(_) => break,
            }
        } else {
            tokio::select! {
                biased;
                next = frames.next() => next,
                _ = stop.cancelled() => { draining = true; continue; }
            }
        };
        match next {
            Some(Ok(Frame::Line(line))) if first && line.as_ref() == ACK_HANDSHAKE => {
                first = false;
                let tracker = AckTracker::new(context.ack_point);
                if let Some(writer) = write_half.take() {
                    acks = Some(tokio::spawn(write_acks(writer, tracker.clone(), context.abandon.clone())));
                }
                reader.tracker = Some(tracker);
            }
            Some(Ok(frame)) => {
                first = false;
                reader.handle(frame).await;
            }
            Some(Err(error)) => {
                debug!(%error, "read failed; closing connection");
                break;
            }
            None => break,
        }
    }
    reader.flush_counters();
    if let Some(tracker) = &reader.tracker {
        tracker.finish_reading();
    }
    if let Some(acks) = acks {
        // The writer may still be reading its acknowledgements: keep writing them until every
        // record is settled (or the agent gives up at its drain deadline).
        let _ = acks.await;
    }
    open.decrement(1.0);
    debug!("connection closed");
}

/// Writes `OK`, then `NAK`/`ACK` lines as records settle, until all are reported after the
/// reader finished, the peer goes away, or the drain deadline passes.
async fn write_acks(mut writer: OwnedWriteHalf, tracker: Arc<AckTracker>, abandon: CancellationToken) {
    let hello = format!("OK {}\n", tracker.point().as_str());
    if writer.write_all(hello.as_bytes()).await.is_err() {
        return;
    }
    let mut text = String::new();
    loop {
        let events = tokio::select! {
            events = tracker.next_events() => events,
            _ = abandon.cancelled() => break,
        };
        text.clear();
        for event in events {
            match event {
                AckEvent::Refused { seq, reason } => text.push_str(&format!("NAK {seq} {reason}\n")),
                AckEvent::Upto(seq) => text.push_str(&format!("ACK {seq}\n")),
            }
        }
        if writer.write_all(text.as_bytes()).await.is_err() {
            debug!("acknowledgement reader went away");
            break;
        }
        if tracker.reading_done() && tracker.all_reported() {
            break;
        }
    }
    let _ = writer.shutdown().await;
}

/// Turns frames into buffered records for one connection.
struct RecordReader<'a> {
    context: &'a IngestContext,
    /// Set in acknowledged mode.
    tracker: Option<Arc<AckTracker>>,
    admission: Admission,
    peer_fragment: String,
    scratch: Vec<u8>,
    /// Counted locally and flushed in batches: the hot path touches no shared counter.
    records: u64,
    bytes: u64,
}

/// Flush local counters after this many records.
const COUNTER_FLUSH_EVERY: u64 = 256;

impl<'a> RecordReader<'a> {
    fn new(context: &'a IngestContext, peer: Peer) -> Self {
        Self {
            context,
            tracker: None,
            admission: Admission::default(),
            peer_fragment: EnvelopeWriter::peer_fragment(&peer),
            scratch: Vec::with_capacity(1024),
            records: 0,
            bytes: 0,
        }
    }

    async fn handle(&mut self, frame: Frame) {
        let mut ack = self.tracker.as_ref().map(|tracker| tracker.issue());
        let line = match frame {
            Frame::TooLarge { len } => {
                trace!(len, "record too large");
                return reject(Rejected::TooLarge, ack);
            }
            Frame::Line(line) => line,
        };
        if line.is_empty() {
            return reject(Rejected::Empty, ack);
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            return reject(Rejected::InvalidUtf8, ack);
        };
        let now = chrono::Utc::now();
        self.context.envelopes.write(text, &self.peer_fragment, now, &mut self.scratch);
        let key = match &*self.context.key.read().unwrap_or_else(|poisoned| poisoned.into_inner()) {
            KeyRule::None => None,
            KeyRule::Fixed(key) => Some(key.clone()),
            KeyRule::Field(field) => field_key(text, field),
        };
        self.records += 1;
        self.bytes += line.len() as u64;
        if self.records >= COUNTER_FLUSH_EVERY {
            self.flush_counters();
        }
        let payload = Bytes::copy_from_slice(&self.scratch);
        let abandon = self.context.abandon.clone();
        let ingest_ms = now.timestamp_millis() as u64;
        let push = self.context.buffer.push(payload, key, ingest_ms, ack.take(), &mut self.admission);
        tokio::select! {
            // A drop by policy is counted (and its ack refused) by the buffer.
            _ = push => {}
            _ = abandon.cancelled() => {
                // The record (and its ack, never settled) is given up at the drain deadline.
                metrics::counter!(telemetry::SHIP_FAILED, telemetry::REASON => "drain_timeout").increment(1);
            }
        }
    }

    fn flush_counters(&mut self) {
        if self.records > 0 {
            metrics::counter!(telemetry::INGEST_RECORDS).increment(self.records);
            metrics::counter!(telemetry::INGEST_BYTES).increment(self.bytes);
            self.records = 0;
            self.bytes = 0;
        }
    }
}

fn reject(reason: Rejected, ack: Option<crate::buffer::ack::Ack>) {
    metrics::counter!(telemetry::INGEST_REJECTED, telemetry::REASON => reason.as_str()).increment(1);
    if let Some(ack) = ack {
        ack.refused(reason.as_str());
    }
}

/// The key from a JSON record's top-level `field`: a string's content, or any other value's JSON
/// text. `None` for text records or when the field is absent.
fn field_key(line: &str, field: &str) -> Option<Bytes> {
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
