//! What a connection writes back, beside what it reads: `OK` / `ACK n` / `NAK n reason` lines
//! for acknowledged lines and `{"ack": chunk}` for Forward chunks, each from a task of its own so
//! reading never waits for the writer to read.
//!
//! Owns: starting that task on demand, the order of what it writes, and giving up on a writer
//! that does not read (`ACK_WRITE_TIMEOUT`) or at the drain deadline. Must not: acknowledge a
//! record before it reached the connection's ack point, or a Forward chunk with a refused
//! record (the client resends it).

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::IngestContext;
use super::connection::{ACK_WRITE_TIMEOUT, numbered};
use crate::buffer::ack::{AckEvent, AckTracker};

/// What a connection writes back, started on demand.
pub(super) struct Replies {
    /// A second handle on the connection's socket, registered when a writer task starts.
    pub(super) write_half: Option<std::os::unix::net::UnixStream>,
    pub(super) tracker: Option<Arc<AckTracker>>,
    pub(super) task: Option<JoinHandle<()>>,
    /// Forward: chunks waiting for acknowledgement, to the writer task.
    pub(super) chunks: Option<mpsc::Sender<PendingChunk>>,
    /// Cancelled when the writer task ends: nothing more can be acknowledged.
    pub(super) writer_gone: CancellationToken,
}

impl Replies {
    /// Acknowledged lines: every record from now on is numbered. `ACK` and `NAK` lines carry the
    /// agent's numbers plus `offset` (a client session's numbers start at its `first`).
    pub(super) fn start_line_acks(&mut self, ingest: &IngestContext, offset: u64) {
        let tracker = AckTracker::within(ingest.ack_point, ingest.acks.clone());
        if let Some(writer) = self.registered_writer() {
            let gone = self.writer_gone.clone().drop_guard();
            let abandon = ingest.abandon.clone();
            let tracker = tracker.clone();
            self.task = Some(tokio::spawn(async move {
                let _gone = gone;
                write_line_acks(writer, tracker, offset, abandon).await;
            }));
        }
        self.tracker = Some(tracker);
    }

    /// In acknowledged-lines mode, a number for a record that is refused before it has a body
    /// (none if the drain deadline came while waiting for room: the refusal is still counted).
    pub(super) async fn line_ack(&self, ingest: &IngestContext) -> Option<crate::buffer::ack::Ack> {
        match (&self.tracker, &self.chunks) {
            (Some(tracker), None) => numbered(tracker, ingest, &self.writer_gone).await.ok(),
            _ => None,
        }
    }

    /// Forward: the tracker and the writer task, started at the first chunk.
    pub(super) async fn chunk_acks(&mut self, ingest: &IngestContext) -> (Arc<AckTracker>, mpsc::Sender<PendingChunk>) {
        if let (Some(tracker), Some(chunks)) = (&self.tracker, &self.chunks) {
            return (tracker.clone(), chunks.clone());
        }
        let tracker = AckTracker::within(ingest.ack_point, ingest.acks.clone());
        let (chunks, receiver) = mpsc::channel(MAX_PENDING_CHUNKS);
        if let Some(writer) = self.registered_writer() {
            let gone = self.writer_gone.clone().drop_guard();
            let write = write_chunk_acks(writer, tracker.clone(), receiver, ingest.abandon.clone());
            self.task = Some(tokio::spawn(async move {
                let _gone = gone;
                write.await;
            }));
        }
        self.tracker = Some(tracker.clone());
        self.chunks = Some(chunks.clone());
        (tracker, chunks)
    }

    /// The write handle, registered with the event loop; none (and nothing can be acknowledged:
    /// `writer_gone`) if it cannot be.
    fn registered_writer(&mut self) -> Option<OwnedWriteHalf> {
        let Some(stream) = self.write_half.take() else {
            self.writer_gone.cancel();
            return None;
        };
        match tokio::net::UnixStream::from_std(stream) {
            Ok(stream) => Some(stream.into_split().1),
            Err(error) => {
                debug!(%error, "cannot register the acknowledgement writer");
                self.writer_gone.cancel();
                None
            }
        }
    }

    /// The reader is done: let the writer finish telling what it knows (or give up at the drain
    /// deadline).
    pub(super) async fn finish(mut self) {
        // The chunk queue closes first, so the Forward writer sees the end before the tracker
        // reports everything settled.
        self.chunks = None;
        if let Some(tracker) = &self.tracker {
            tracker.finish_reading();
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// Writes `OK`, then `NAK`/`ACK` lines as records settle, until all are reported after the
/// reader finished, the peer goes away, or the drain deadline passes.
async fn write_line_acks(
    mut writer: OwnedWriteHalf,
    tracker: Arc<AckTracker>,
    offset: u64,
    abandon: CancellationToken,
) {
    let hello = format!("OK {}\n", tracker.point().as_str());
    if !write_acks(&mut writer, hello.as_bytes(), &abandon).await {
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
                AckEvent::Refused { seq, reason } => {
                    text.push_str(&format!("NAK {} {}\n", seq + offset, reason.as_str()));
                }
                AckEvent::Upto(seq) => text.push_str(&format!("ACK {}\n", seq + offset)),
            }
        }
        if !write_acks(&mut writer, text.as_bytes(), &abandon).await {
            break;
        }
        if tracker.reading_done() && tracker.all_reported() {
            break;
        }
    }
    let _ = writer.shutdown().await;
}

/// Writes `bytes` to the acknowledgement reader, unless it takes longer than
/// [`ACK_WRITE_TIMEOUT`] or the drain deadline comes. False if the writer task should end.
pub(super) async fn write_acks(writer: &mut OwnedWriteHalf, bytes: &[u8], abandon: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        _ = abandon.cancelled() => false,
        written = tokio::time::timeout(ACK_WRITE_TIMEOUT, writer.write_all(bytes)) => match written {
            Ok(Ok(())) => true,
            Ok(Err(error)) => {
                debug!(%error, "acknowledgement reader went away");
                false
            }
            Err(_) => {
                debug!(timeout = ?ACK_WRITE_TIMEOUT, "the writer does not read its acknowledgements; closing");
                false
            }
        },
    }
}

/// `{"ack": chunk}`, msgpack-encoded.
pub fn ack_response(chunk: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunk.len() + 8);
    // Writing into a Vec cannot fail.
    let _ = rmp::encode::write_map_len(&mut out, 1);
    let _ = rmp::encode::write_str(&mut out, "ack");
    let _ = rmp::encode::write_str(&mut out, chunk);
    out
}

/// A chunk waiting for its records: acknowledged once every record numbered up to `last` is
/// settled, unless one of its records was refused.
#[derive(Debug)]
pub struct PendingChunk {
    /// The chunk id the client sent.
    pub chunk: String,
    /// The number of the chunk's last record on the connection (its first is one more than the
    /// previous chunk's last).
    pub last: u64,
}

/// Most chunks waiting for acknowledgement per connection; beyond it the reader waits (the
/// client is sending faster than records become durable).
pub const MAX_PENDING_CHUNKS: usize = 1024;

/// Writes `{"ack": chunk}` for each chunk in order once its records are durable, until the
/// reader is done and every chunk is answered, the client goes away, or the drain deadline
/// passes. A chunk with a refused record is not answered: the client resends it.
pub async fn write_chunk_acks(
    writer: OwnedWriteHalf,
    tracker: Arc<AckTracker>,
    chunks: mpsc::Receiver<PendingChunk>,
    abandon: CancellationToken,
) {
    write_chunk_acks_within(writer, tracker, chunks, abandon, MAX_PENDING_CHUNKS).await;
}

/// [`write_chunk_acks`] holding at most `max_pending` chunks (tests use a small bound).
pub(super) async fn write_chunk_acks_within(
    mut writer: OwnedWriteHalf,
    tracker: Arc<AckTracker>,
    mut chunks: mpsc::Receiver<PendingChunk>,
    abandon: CancellationToken,
    max_pending: usize,
) {
    let mut pending: VecDeque<(PendingChunk, bool)> = VecDeque::new();
    // Refused records of chunks not taken from the channel yet (the pending bound was reached):
    // their chunk is marked when it arrives. Bounded by the connection's unsettled records.
    let mut refused_ahead: std::collections::BTreeSet<u64> = std::collections::BTreeSet::new();
    let mut watermark = 0u64;
    let mut reader_done = false;
    loop {
        tokio::select! {
            biased;
            chunk = chunks.recv(), if !reader_done && pending.len() < max_pending => match chunk {
                Some(chunk) => {
                    let later = refused_ahead.split_off(&(chunk.last + 1));
                    let failed = !refused_ahead.is_empty();
                    refused_ahead = later;
                    pending.push_back((chunk, failed));
                }
                None => reader_done = true,
            },
            events = tracker.next_events() => {
                for event in events {
                    match event {
                        AckEvent::Refused { seq, .. } => {
                            // The chunk holding `seq` is the first whose last record is >= seq;
                            // if it is still in the channel, remember the refusal for it.
                            match pending.iter_mut().find(|(chunk, _)| chunk.last >= seq) {
                                Some((_, failed)) => *failed = true,
                                None => {
                                    refused_ahead.insert(seq);
                                }
                            }
                        }
                        AckEvent::Upto(seq) => watermark = seq,
                    }
                }
            }
            _ = abandon.cancelled() => break,
        }
        let mut reply = Vec::new();
        while pending.front().is_some_and(|(chunk, _)| chunk.last <= watermark) {
            if let Some((chunk, failed)) = pending.pop_front() {
                if failed {
                    debug!(chunk = %chunk.chunk, "chunk had a refused record; not acknowledged");
                } else {
                    reply.extend_from_slice(&ack_response(&chunk.chunk));
                }
            }
        }
        if !reply.is_empty() && !write_acks(&mut writer, &reply, &abandon).await {
            break;
        }
        if reader_done && pending.is_empty() {
            break;
        }
        if reader_done && tracker.reading_done() && tracker.all_reported() && !pending.is_empty() {
            // Cannot happen (every chunk's records are issued before it is queued); never spin.
            break;
        }
    }
    let _ = writer.shutdown().await;
}
