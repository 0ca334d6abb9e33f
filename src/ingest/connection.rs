//! One stream connection: check the peer, read frames, hand records to the [`RecordSink`],
//! answer acknowledgements.
//!
//! Owns: the per-connection read loop, the peer allowlist check, the idle timeout, the
//! accounting of bytes held in the read buffer, and numbering records for the acknowledgements
//! `replies` writes (`ACK`/`NAK` lines for acknowledged lines, `{"ack": chunk}` for Forward).
//! Must not: wait on anything but the socket, the rate limit and the buffer (no Kafka, no disk),
//! keep more than one record's worth of unread bytes, or end the connection because one record
//! was bad (only a stream that cannot be framed any further is closed).
//!
//! Acknowledged mode (`lines`, `octet_counted`): a connection whose first record is exactly
//! [`ACK_HANDSHAKE`] gets an `OK <point>` line back and from then on `ACK <n>` lines (records
//! 1..=n of this connection are settled) and `NAK <n> <reason>` lines (record n was refused),
//! written by a second task so reading never waits for the writer to read. A first record
//! that is a client session's handshake (`SLUICE/2 ACK …`, [`super::session`]) does the same
//! with the client's numbers, and each record carries the id and time the client gave it. See
//! `docs/PROTOCOL.md`.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures_util::{FutureExt, StreamExt};
use tokio::net::UnixStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::codec::{Decoder, FramedRead};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::forward::{self, ForwardFramer};
use super::framing::{Frame, LineFramer, OctetFramer, SyslogFramer, Unfinished};
use super::paced::PacedStream;
use super::replies::{PendingChunk, Replies};
use super::session::{self, ClientStamp, Session};
use super::sink::RecordSink;
use super::{IngestContext, ListenerContext};
use crate::buffer::ack::AckTracker;
use crate::config::Protocol;
use crate::envelope::PeerFragment;
use crate::telemetry::outcome::{ConnectionRefused, Rejected};

/// After shutdown starts, a connection keeps reading while data keeps coming, and stops once it
/// has been idle this long, or when the agent tells it to (half the drain timeout): then it
/// shuts the read side of its socket, so the writer's next write fails instead of landing where
/// nobody reads, takes in what is already queued, and closes. Every record it read is then
/// delivered, spooled, or counted.
pub const DRAIN_IDLE: Duration = Duration::from_millis(250);

/// Initial read buffer; it grows with the records, up to `max_record_size` plus one read.
const READ_CAPACITY: usize = 8 * 1024;

/// Unread bytes a connection may hold without asking: records up to about this size need no
/// room from the agent's shared read pool. With the read buffer's doubling a connection holds at
/// most twice this (32 KiB) unless it is given room.
pub const SMALL_READ: usize = 16 * 1024;

/// The unit the shared read pool is counted in.
pub const READ_UNIT: usize = 16 * 1024;

/// How long a connection may hold read room for a record whose bytes stopped coming, while
/// another connection waits for room: then the record is given up, counted `truncated`, the rest
/// of it skipped as it arrives and the room given back ([`super::ReadPool`]). A writer on a local
/// socket sends a record of any allowed size in milliseconds; one that stops in the middle of a
/// long record must not hold room others need.
pub const PARTIAL_RECORD_HOLD: Duration = Duration::from_secs(5);

/// The first line that switches a connection to acknowledged mode.
pub const ACK_HANDSHAKE: &[u8] = b"SLUICE/1 ACK";

/// Most records of one read offered together ([`RecordSink::offer_many`]).
const BATCH_RECORDS: usize = 128;

/// Most bytes of records taken from the read buffer for one batch: until the batch is offered
/// they count against no budget (the buffer's nor the connection's unread bytes), and one of them
/// may wait for room while the rest are held — so no more than the small share a connection may
/// hold unread anyway ([`SMALL_READ`]).
const BATCH_BYTES: usize = SMALL_READ;

/// How long one write of acknowledgements may wait for the writer to read them. A writer that
/// stops reading its acknowledgements would otherwise hold its connection, and its share of the
/// acknowledgement budget, for ever; after this the connection takes in the record in hand
/// (delivered, just not acknowledged) and closes.
pub const ACK_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a record on an acknowledged connection got no number.
pub(super) enum Unnumbered {
    /// The drain deadline came: the record is given up, counted as `drain_timeout`.
    Abandoned,
    /// The acknowledgement writer ended (the peer stopped reading them, or went away): the
    /// record is taken in without a number and the connection closes after it.
    WriterGone,
}

/// Serves one connection until the writer closes it, it idles out, it breaks, or shutdown has
/// drained it. `slot` is its place under `max_connections`, given back when it closes.
pub async fn serve(
    stream: UnixStream,
    id: u64,
    slot: OwnedSemaphorePermit,
    listener: Arc<ListenerContext>,
    ingest: Arc<IngestContext>,
    stop: CancellationToken,
) {
    let peer = super::peer_of(&stream);
    if !listener.admits(&peer) {
        debug!(uid = peer.uid, gid = peer.gid, "peer not in the allowlist; closing");
        listener.metrics.refused(ConnectionRefused::PeerDenied);
        return;
    }
    debug!(pid = ?peer.pid, uid = peer.uid, "connection opened");
    listener.metrics.accepted.increment(1);
    listener.metrics.open.increment(1.0);
    let paced = PacedStream::new(stream, listener.config.read_interval);
    let framer = Accounted::new(StreamFramer::new(&listener, ingest.max_json_depth), listener.clone());
    let progress = framer.progress.clone();
    let mut frames = FramedRead::with_capacity(paced, framer, READ_CAPACITY);
    let mut room = ReadRoom::new(&ingest, listener.config.max_record_bytes());
    let limit_key =
        listener.limits.as_ref().map_or(super::limit::LimitKey::Connection(id), |l| l.key_for(id, peer.uid));
    let mut sink = RecordSink::new(&ingest, &listener, limit_key, PeerFragment::new(Some(peer)));
    let mut replies =
        Replies { write_half: None, tracker: None, task: None, chunks: None, writer_gone: CancellationToken::new() };
    let idle = listener.config.idle_timeout;
    let mut first = true;
    // A client session (`SLUICE/2 ACK`), with the instance its records carry.
    let mut session: Option<(Session, [u8; 16])> = None;
    // A session handshake that could not be read: every record after it is refused.
    let mut refusing = false;
    let mut draining = false;
    // The read side is shut: what is queued is read to its end, nothing more can come.
    let mut read_shut = false;
    // The connection stops reading before the writer's end of stream (idle, a failed read, the
    // drain deadline while it waited for read room): what it holds is counted after the loop.
    let mut cut_short = false;
    // Records of one read offered together, and the frame after them when it is not one.
    let mut batch: Vec<BytesMut> = Vec::new();
    let mut deferred = None;
    loop {
        let ready = match deferred.take() {
            Some(next) => Some(next),
            None => frames.next().now_or_never(),
        };
        if ready.is_none() {
            if draining || read_shut {
                // No record waits for a continuation while the connection drains.
                sink.flush_multiline().await;
            }
            // Nothing more to read right now: publish the counts and let a burst's room go
            // before waiting.
            sink.waiting();
            batch.shrink_to(super::sink::IDLE_BATCH);
        }
        let next = if let Some(next) = ready {
            next
        } else if read_shut {
            frames.next().await
        } else if draining {
            let next = tokio::select! {
                biased;
                _ = ingest.stop_reading.cancelled() => None,
                next = tokio::time::timeout(DRAIN_IDLE, frames.next()) => next.ok(),
            };
            match next {
                Some(next) => next,
                None => {
                    // Idle, or told to stop: take in what is queued, then the end of stream — the
                    // agent's end, not the writer's: a record it had not finished is truncated.
                    shut_read(frames.get_ref());
                    frames.decoder_mut().cut = true;
                    read_shut = true;
                    continue;
                }
            }
        } else {
            let read = async {
                match idle {
                    Some(idle) => tokio::time::timeout(idle, frames.next()).await.ok(),
                    None => Some(frames.next().await),
                }
            };
            let overstayed = overstayed(&ingest.read_pool, &progress, tokio::time::Instant::now());
            let multiline_due = sink.multiline_due();
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(multiline_due.unwrap_or_else(tokio::time::Instant::now)), if multiline_due.is_some() => {
                    // The record being joined waited flush_timeout for its next line.
                    sink.flush_multiline().await;
                    continue;
                }
                _ = overstayed, if room.held() => {
                    // Its bytes stopped coming while another connection waits for the room it
                    // holds: the record is given up (the rest of it skipped as it arrives), the
                    // room given back, and the connection reads on.
                    let mut buffer = std::mem::take(frames.read_buffer_mut());
                    let given_up = frames.decoder_mut().inner.give_up_partial(&mut buffer);
                    *frames.read_buffer_mut() = buffer;
                    room.release();
                    frames.decoder_mut().allowed = SMALL_READ;
                    frames.decoder_mut().report(0);
                    *frames.read_buffer_mut() = BytesMut::with_capacity(READ_CAPACITY);
                    if let Some(len) = given_up {
                        debug!(len, "a partial record held read room another connection waits for; given up");
                        let ack = replies.line_ack(&ingest).await;
                        let unnumbered = session.is_some() && ack.is_none();
                        sink.reject(Rejected::Truncated, ack);
                        if unnumbered {
                            // A session's numbers would drift from the client's: read no further.
                            break;
                        }
                    }
                    continue;
                }
                next = read => match next {
                    Some(next) => next,
                    None => {
                        debug!("idle timeout; closing");
                        listener.metrics.idle_closed();
                        cut_short = true;
                        break;
                    }
                },
                _ = stop.cancelled() => { draining = true; continue; }
            }
        };
        let frame = match next {
            Some(Ok(Gated::Frame(frame))) => frame,
            Some(Ok(Gated::NeedRoom(held))) => {
                // A long record is arriving: it may grow past what a connection holds freely.
                let allowed = tokio::select! {
                    biased;
                    _ = ingest.abandon.cancelled() => {
                        cut_short = true;
                        break;
                    }
                    allowed = room.grow(held) => allowed,
                };
                frames.decoder_mut().allowed = allowed;
                continue;
            }
            Some(Err(error)) => {
                debug!(%error, "read failed; closing connection");
                cut_short = true;
                break;
            }
            None => break,
        };
        let lines = matches!(listener.protocol, Protocol::Lines | Protocol::OctetCounted);
        let handshake = first && lines && matches!(&frame, Frame::Record(bytes) if bytes.as_ref() == ACK_HANDSHAKE);
        let session_line = match &frame {
            Frame::Record(bytes) if first && lines => Session::parse(bytes),
            _ => None,
        };
        first = false;
        match frame {
            Frame::Record(_) if handshake => {
                frames.get_mut().stop_ticking();
                replies.write_half = acknowledgement_handle(frames.get_ref());
                replies.start_line_acks(&ingest, 0);
            }
            Frame::Record(_) if session_line.is_some() => match session_line {
                Some(Ok(opened)) => {
                    frames.get_mut().stop_ticking();
                    frames.decoder_mut().inner.open_session(session::MAX_PREFIX);
                    replies.write_half = acknowledgement_handle(frames.get_ref());
                    replies.start_line_acks(&ingest, opened.first - 1);
                    let instance = session::session_instance(ingest.envelopes.pod_identity(), &opened.session);
                    session = Some((opened, instance));
                }
                _ => {
                    // The writer asked for acknowledgements it cannot have: it hears nothing, and
                    // this line and every record after it are refused, counted.
                    debug!("malformed session handshake; refusing the connection's records");
                    listener.metrics.rejected(Rejected::Malformed);
                    refusing = true;
                }
            },
            Frame::Record(_) if refusing => listener.metrics.rejected(Rejected::Malformed),
            Frame::Record(bytes) if listener.protocol == Protocol::Forward => {
                forward_message(&bytes, frames.get_ref(), &mut sink, &mut replies, &ingest, &listener).await;
                if replies.task.is_some() {
                    frames.get_mut().stop_ticking();
                }
                if replies.writer_gone.is_cancelled() {
                    debug!("acknowledgements cannot be written; closing connection");
                    break;
                }
            }
            Frame::Record(bytes) if replies.tracker.is_none() => {
                // The records already read go to the buffer with this one.
                let mut held = bytes.len();
                batch.push(bytes);
                while batch.len() < BATCH_RECORDS && held < BATCH_BYTES {
                    match frames.next().now_or_never() {
                        Some(Some(Ok(Gated::Frame(Frame::Record(bytes))))) => {
                            held += bytes.len();
                            batch.push(bytes);
                        }
                        Some(other) => {
                            deferred = Some(other);
                            break;
                        }
                        None => break,
                    }
                }
                // What the connection holds while the batch may wait for room: its unread bytes
                // and the batch's (the framer reports again when it waits for more).
                let unread = frames.read_buffer().len();
                frames.decoder_mut().report(unread + held);
                sink.offer_many(&mut batch).await;
                // The batch is in the buffer (or counted): the connection holds its unread bytes.
                let unread = frames.read_buffer().len();
                frames.decoder_mut().report(unread);
            }
            Frame::Record(bytes) => {
                let ack = match &replies.tracker {
                    Some(tracker) => match numbered(tracker, &ingest, &replies.writer_gone).await {
                        Ok(ack) => Some(ack),
                        Err(Unnumbered::Abandoned) => {
                            sink.give_up();
                            continue;
                        }
                        Err(Unnumbered::WriterGone) => {
                            let n = replies.tracker.as_ref().map_or(0, |tracker| tracker.issued()) + 1;
                            let max_record = listener.config.max_record_bytes();
                            offer_line(
                                &mut sink,
                                &bytes,
                                None,
                                session.as_ref().map(|session| (session, n)),
                                max_record,
                            )
                            .await;
                            debug!("acknowledgements cannot be written; closing connection");
                            break;
                        }
                    },
                    None => None,
                };
                let numbered = match (&session, &ack) {
                    (Some(session), Some(ack)) => Some((session, ack.seq())),
                    _ => None,
                };
                offer_line(&mut sink, &bytes, ack, numbered, listener.config.max_record_bytes()).await;
            }
            Frame::TooLarge { len } => {
                debug!(len, "record too large");
                let ack = replies.line_ack(&ingest).await;
                let unnumbered = session.is_some() && ack.is_none();
                sink.reject(Rejected::TooLarge, ack);
                if unnumbered {
                    // A session's numbers would drift from the client's: read no further.
                    break;
                }
            }
            Frame::Broken(reason) => {
                debug!(reason = reason.as_str(), "stream cannot be framed; closing connection");
                let ack = replies.line_ack(&ingest).await;
                sink.reject(reason, ack);
                break;
            }
            Frame::Truncated { len } => {
                debug!(len, "the agent stopped reading before the writer finished this record");
                let ack = replies.line_ack(&ingest).await;
                let unnumbered = session.is_some() && ack.is_none();
                sink.reject(Rejected::Truncated, ack);
                if unnumbered {
                    break;
                }
            }
        }
        if room.held() && frames.read_buffer().len() <= SMALL_READ {
            // The long record is through: its room goes back, and so does the memory.
            room.release();
            frames.decoder_mut().allowed = SMALL_READ;
            let buffer = frames.read_buffer_mut();
            if buffer.capacity() > 2 * SMALL_READ {
                let rest = buffer.split();
                *buffer = BytesMut::with_capacity(READ_CAPACITY.max(rest.len()));
                buffer.extend_from_slice(&rest);
            }
        }
    }
    // The record being joined is whole: its lines all ended.
    sink.flush_multiline().await;
    if cut_short {
        let (buffer, framer) = {
            let parts = frames.into_parts();
            (parts.read_buf, parts.codec)
        };
        count_unread(framer, buffer, &mut sink, &replies, &ingest, &listener).await;
    } else {
        drop(frames);
    }
    sink.flush_counters();
    replies.finish().await;
    // The slot is free before the gauge says so: a writer that sees room finds it.
    drop(slot);
    listener.metrics.open.decrement(1.0);
    debug!("connection closed");
}

/// Counts what a connection that stops reading before its writer's end of stream still holds
/// ([`Accounted::unread`]): a complete record it never offered (it waited for read room when
/// the drain deadline came) is given up like every record waiting then (`drain_timeout`; a
/// Forward message, each of its events), an overlong one is `too_large`, the one its writer had
/// not finished is `truncated` — refused to an acknowledged writer, which sends it again whole.
/// Nothing it read goes uncounted.
async fn count_unread(
    mut framer: Accounted<StreamFramer>,
    mut buffer: BytesMut,
    sink: &mut RecordSink<'_>,
    replies: &Replies,
    ingest: &IngestContext,
    listener: &ListenerContext,
) {
    let forward = matches!(framer.inner, StreamFramer::Forward(_));
    for frame in framer.unread(&mut buffer) {
        match frame {
            Frame::Record(bytes) if forward => {
                let limits = forward::Limits {
                    max_record_size: listener.config.max_record_bytes(),
                    max_json_depth: ingest.max_json_depth,
                };
                match forward::events(&bytes, limits) {
                    Ok(events) => (0..events.len()).for_each(|_| sink.give_up()),
                    Err(reason) => sink.reject(reason, None),
                }
            }
            Frame::Record(_) => sink.give_up(),
            Frame::TooLarge { .. } => sink.reject(Rejected::TooLarge, replies.line_ack(ingest).await),
            Frame::Truncated { .. } => sink.reject(Rejected::Truncated, replies.line_ack(ingest).await),
            Frame::Broken(reason) => sink.reject(reason, replies.line_ack(ingest).await),
        }
    }
}

/// Offers an acknowledged line: as it is, or, on a client session's connection (`session` with
/// the agent's number `n` of the record), split into the client's time and the record, stamped
/// with the session's id for the client's number of it. A session line without the time is
/// refused `malformed`; one whose record alone is over `max_record` bytes, `too_large`.
async fn offer_line(
    sink: &mut RecordSink<'_>,
    bytes: &[u8],
    ack: Option<crate::buffer::ack::Ack>,
    session: Option<(&(Session, [u8; 16]), u64)>,
    max_record: usize,
) {
    let Some(((opened, instance), n)) = session else {
        return sink.offer(bytes, ack).await;
    };
    match session::split_line(bytes) {
        // The framer allowed the prefix beside the record: the record alone keeps the limit.
        Some((_, record)) if record.len() > max_record => sink.reject(Rejected::TooLarge, ack),
        Some((time, record)) => {
            let stamp = ClientStamp { instance: *instance, seq: opened.seq(n), time };
            sink.offer_stamped(record, ack, stamp).await;
        }
        None => sink.reject(Rejected::Malformed, ack),
    }
}

/// The next record's number on an acknowledged connection, once the connection (and the agent)
/// may have another record unreported ([`crate::buffer::ack::AckBudget`]): a writer that does not
/// read its acknowledgements is held here, until [`ACK_WRITE_TIMEOUT`] ends its writer task.
pub(super) async fn numbered(
    tracker: &Arc<AckTracker>,
    ingest: &IngestContext,
    writer_gone: &CancellationToken,
) -> Result<crate::buffer::ack::Ack, Unnumbered> {
    tokio::select! {
        biased;
        _ = ingest.abandon.cancelled() => Err(Unnumbered::Abandoned),
        _ = writer_gone.cancelled() => Err(Unnumbered::WriterGone),
        _ = tracker.room() => Ok(tracker.issue()),
    }
}

/// A second handle on the socket for the acknowledgement writer. None if it cannot be made (no
/// file descriptor left): acknowledgements then cannot be written, as when the writer task ends
/// (only a connection that asks for them is closed).
fn acknowledgement_handle(paced: &PacedStream) -> Option<std::os::unix::net::UnixStream> {
    match paced.writer() {
        Ok(handle) => Some(handle),
        Err(error) => {
            debug!(%error, "no handle for acknowledgements");
            None
        }
    }
}

/// Shuts the read side of a connection's socket. On a Unix stream socket the peer's next write
/// then fails (`EPIPE`) instead of landing in a socket nobody reads, while what is already
/// queued can still be read, up to the end of stream.
fn shut_read(paced: &PacedStream) {
    let Some(socket) = paced.socket() else { return };
    if let Err(error) = socket.shutdown(std::net::Shutdown::Read) {
        debug!(%error, "could not shut the read side of the socket");
    }
}

/// One Forward message, its events decoded one at a time: each goes to the sink before the
/// next is made, so while the sink waits for the buffer the connection holds the message and
/// one record, never all its events. A chunk is queued to the writer task (which acknowledges
/// it once every event is settled) before its first event is numbered.
async fn forward_message(
    bytes: &BytesMut,
    socket: &PacedStream,
    sink: &mut RecordSink<'_>,
    replies: &mut Replies,
    ingest: &IngestContext,
    listener: &ListenerContext,
) {
    let limits =
        forward::Limits { max_record_size: listener.config.max_record_bytes(), max_json_depth: ingest.max_json_depth };
    // A compressed message holds an inflation slot while its events go to the sink.
    let mut waited = None;
    let (events, _inflating) = loop {
        let events = match forward::events(bytes, limits) {
            Ok(events) => events,
            Err(reason) => return sink.reject(reason, None),
        };
        if events.inflated_len() == 0 {
            break (events, None);
        }
        if let Some(slot) = waited.take() {
            break (events, Some(slot));
        }
        if let Ok(slot) = ingest.inflations.clone().try_acquire_owned() {
            break (events, Some(slot));
        }
        // No slot: let the inflated stream go while waiting, then inflate again.
        let count = events.len();
        drop(events);
        tokio::select! {
            biased;
            _ = ingest.abandon.cancelled() => return (0..count).for_each(|_| sink.give_up()),
            // The pool is never closed.
            slot = ingest.inflations.clone().acquire_owned() => waited = slot.ok(),
        }
    };
    let count = events.len();
    let wire_len = bytes.len() / count.max(1);
    let chunk = match events.chunk() {
        Some(chunk) => {
            if replies.task.is_none() && replies.write_half.is_none() {
                // The first chunk: its writer task needs a handle of its own on the socket.
                replies.write_half = acknowledgement_handle(socket);
            }
            let (tracker, chunks) = replies.chunk_acks(ingest).await;
            // This reader alone numbers the connection's records, so the events get the next
            // `count` numbers, each issued as its event is offered.
            let last = tracker.issued() + count as u64;
            // Queued before any of its records can settle, so the writer knows the chunk first.
            let queued = tokio::select! {
                biased;
                _ = ingest.abandon.cancelled() => None,
                sent = chunks.send(PendingChunk { chunk: chunk.to_string(), last }) => Some(sent),
            };
            match queued {
                Some(Ok(())) => {}
                Some(Err(_)) => debug!("acknowledgement writer is gone"),
                // The drain deadline came first: none of the message's events is offered.
                None => return (0..count).for_each(|_| sink.give_up()),
            }
            Some((tracker, last))
        }
        None => None,
    };
    for (offered, event) in events.enumerate() {
        let ack = match &chunk {
            // Each event waits for room in the acknowledgement budget, as a line does.
            Some((tracker, last)) => match numbered(tracker, ingest, &replies.writer_gone).await {
                Ok(ack) => {
                    debug_assert!(ack.seq() <= *last, "only the reader numbers its connection's records");
                    Some(ack)
                }
                Err(Unnumbered::Abandoned) => {
                    // The drain deadline came first: this event and the rest are given up,
                    // and counted so.
                    (offered..count).for_each(|_| sink.give_up());
                    return;
                }
                // No acknowledgement can be written: the rest of the message is taken in
                // without numbers (the connection closes after it).
                Err(Unnumbered::WriterGone) => None,
            },
            None => None,
        };
        match event {
            Ok(json) => sink.offer_json(&json, wire_len, ack).await,
            Err(reason) => sink.reject(reason, ack),
        }
    }
    if let Some((tracker, last)) = &chunk {
        debug_assert!(
            tracker.issued() == *last || replies.writer_gone.is_cancelled(),
            "a chunk's events are numbered up to its last"
        );
    }
}

/// The framer a stream listener's protocol uses.
#[derive(Debug)]
pub enum StreamFramer {
    /// `lines`.
    Lines(LineFramer),
    /// `octet_counted`.
    Octets(OctetFramer),
    /// `syslog` over a stream.
    Syslog(SyslogFramer),
    /// `forward`.
    Forward(ForwardFramer),
}

impl StreamFramer {
    /// A client session's records follow (`SLUICE/2`): each line or frame carries `prefix` more
    /// bytes, and a line is whole or `Truncated` (`LineFramer::open_session`). Only `lines` and
    /// `octet_counted` take the handshake.
    fn open_session(&mut self, prefix: usize) {
        match self {
            Self::Lines(lines) => lines.open_session(prefix),
            Self::Octets(octets) => octets.open_session(prefix),
            Self::Syslog(_) | Self::Forward(_) => {}
        }
    }

    /// The framer for `listener`'s protocol and record limit.
    pub fn new(listener: &ListenerContext, max_json_depth: usize) -> Self {
        let max = listener.config.max_record_bytes();
        match listener.protocol {
            // An `otlp` listener's connections are HTTP's (`super::otlp`), never framed here.
            Protocol::Lines | Protocol::Datagram | Protocol::Otlp => StreamFramer::Lines(LineFramer::new(max)),
            Protocol::OctetCounted => StreamFramer::Octets(OctetFramer::new(max)),
            Protocol::Syslog => StreamFramer::Syslog(SyslogFramer::new(max)),
            Protocol::Forward => StreamFramer::Forward(ForwardFramer::new(max, max_json_depth)),
        }
    }
}

impl Decoder for StreamFramer {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        match self {
            StreamFramer::Lines(framer) => framer.decode(buf),
            StreamFramer::Octets(framer) => framer.decode(buf),
            StreamFramer::Syslog(framer) => framer.decode(buf),
            StreamFramer::Forward(framer) => framer.decode(buf),
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        match self {
            StreamFramer::Lines(framer) => framer.decode_eof(buf),
            StreamFramer::Octets(framer) => framer.decode_eof(buf),
            StreamFramer::Syslog(framer) => framer.decode_eof(buf),
            StreamFramer::Forward(framer) => framer.decode_eof(buf),
        }
    }
}

impl Unfinished for StreamFramer {
    fn unfinished(&mut self, buf: &mut BytesMut) -> Option<Frame> {
        match self {
            StreamFramer::Lines(framer) => framer.unfinished(buf),
            StreamFramer::Octets(framer) => framer.unfinished(buf),
            StreamFramer::Syslog(framer) => framer.unfinished(buf),
            StreamFramer::Forward(framer) => framer.unfinished(buf),
        }
    }

    fn give_up_partial(&mut self, buf: &mut BytesMut) -> Option<u64> {
        match self {
            StreamFramer::Lines(framer) => framer.give_up_partial(buf),
            StreamFramer::Octets(framer) => framer.give_up_partial(buf),
            StreamFramer::Syslog(framer) => framer.give_up_partial(buf),
            StreamFramer::Forward(framer) => framer.give_up_partial(buf),
        }
    }
}

/// What the connection's reader gets: a frame, or word that the unread bytes have reached what
/// it may hold (`held` bytes) and it must get room before reading on.
pub enum Gated {
    /// A frame.
    Frame(Frame),
    /// Room needed for more than this many unread bytes.
    NeedRoom(usize),
}

/// A framer that reports how many bytes its connection holds unread to the listener's
/// `sluice_ingest_read_buffer_bytes` (whenever it has framed all it can of a read), and stops the
/// reading when they reach what the connection may hold ([`Gated::NeedRoom`]).
struct Accounted<D> {
    inner: D,
    listener: Arc<ListenerContext>,
    held: usize,
    /// Unread bytes the connection may hold: [`SMALL_READ`], plus room from the shared pool.
    allowed: usize,
    /// The agent shut the socket's read side: the end of the stream is its own, and a record the
    /// writer had not finished is [`Frame::Truncated`], not a record ([`Unfinished`]).
    cut: bool,
    /// When the bytes held last changed (a read added some, a frame took some).
    progress: Arc<Progress>,
}

/// When a connection's unread bytes last changed ([`overstayed`]): a record whose bytes still
/// come is not held up by its writer.
#[derive(Debug)]
struct Progress {
    epoch: tokio::time::Instant,
    /// Milliseconds after `epoch`.
    last_ms: std::sync::atomic::AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Self { epoch: tokio::time::Instant::now(), last_ms: std::sync::atomic::AtomicU64::new(0) }
    }

    fn now(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn last(&self) -> tokio::time::Instant {
        self.epoch + Duration::from_millis(self.last_ms.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl<D> Accounted<D> {
    fn new(inner: D, listener: Arc<ListenerContext>) -> Self {
        Self { inner, listener, held: 0, allowed: SMALL_READ, cut: false, progress: Arc::new(Progress::new()) }
    }

    fn report(&mut self, now: usize) {
        if now != self.held {
            self.listener.buffered(now as i64 - self.held as i64);
            self.held = now;
            self.progress.now();
        }
    }
}

/// Ends when this connection should give up the record it holds read room for: its bytes have
/// not changed for [`PARTIAL_RECORD_HOLD`] while it waited for its writer (counted from
/// `waiting_since`, when it began waiting, or from its last byte — time spent waiting for the
/// buffer, a rate limit or its acknowledgements does not count), another connection waits for
/// room, and it is this connection's turn ([`super::ReadPool::claim_cut`]: one per
/// [`super::CUT_SPACING`], so one waiter costs one record, not every holder's).
async fn overstayed(pool: &super::ReadPool, progress: &Progress, waiting_since: tokio::time::Instant) {
    loop {
        let due = progress.last().max(waiting_since) + PARTIAL_RECORD_HOLD;
        if tokio::time::Instant::now() < due {
            tokio::time::sleep_until(due).await;
            continue;
        }
        pool.until_wanted().await;
        if progress.last().max(waiting_since) + PARTIAL_RECORD_HOLD > tokio::time::Instant::now() {
            continue;
        }
        if pool.claim_cut() {
            return;
        }
        tokio::time::sleep(super::CUT_SPACING).await;
    }
}

impl<D: Decoder<Item = Frame, Error = std::io::Error> + Unfinished> Accounted<D> {
    /// What is still held when the connection stops reading before the writer's end of stream
    /// (the drain deadline while it waited for read room, the idle timeout, a failed read):
    /// complete records not yet framed (only while it waited for read room), then the unfinished
    /// one. `buf` is emptied.
    fn unread(&mut self, buf: &mut BytesMut) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Ok(Some(frame)) = self.inner.decode(buf) {
            frames.push(frame);
        }
        frames.extend(self.inner.unfinished(buf));
        self.report(0);
        frames
    }
}

impl<D: Decoder<Item = Frame, Error = std::io::Error> + Unfinished> Decoder for Accounted<D> {
    type Item = Gated;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Gated>, Self::Error> {
        if buf.len() > self.allowed {
            self.report(buf.len());
            // Not handed to the framer yet: it sees these bytes once there is room for them.
            return Ok(Some(Gated::NeedRoom(buf.len())));
        }
        let frame = self.inner.decode(buf);
        if !matches!(frame, Ok(Some(_))) {
            // Reported when the framer waits for more (what the connection then holds), not
            // after every record: the gauge is shared by the listener's connections, and a read
            // of many records would touch it for each.
            self.report(buf.len());
        }
        frame.map(|frame| frame.map(Gated::Frame))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Gated>, Self::Error> {
        // Nothing more arrives: what is held is all there is. At the agent's own end of the
        // stream, what the writer had not finished is truncated, not a record.
        let frame = match self.inner.decode(buf) {
            Ok(None) if self.cut => Ok(self.inner.unfinished(buf)),
            Ok(None) => self.inner.decode_eof(buf),
            other => other,
        };
        self.report(buf.len());
        frame.map(|frame| frame.map(Gated::Frame))
    }
}

impl<D> Drop for Accounted<D> {
    fn drop(&mut self) {
        self.report(0);
    }
}

/// A connection's share of the agent's read pool: room to hold a long record's bytes unread
/// beyond [`SMALL_READ`]. Without it, 1,024 connections each reading a 1 MiB record would hold
/// a GiB; with it, all connections together hold at most the pool (twice it, with the read
/// buffers' doubling) beyond their small share.
///
/// Room grows by doubling as long as the pool has it; when it does not, the connection lets go
/// of what it holds and waits for all a record can need (`full`), so two connections never wait
/// for each other's room (no hold-and-wait). The pool always has at least `full`.
struct ReadRoom {
    pool: Arc<super::ReadPool>,
    full: u32,
    held: Option<OwnedSemaphorePermit>,
}

impl ReadRoom {
    fn new(ingest: &IngestContext, max_record_size: usize) -> Self {
        Self { pool: ingest.read_pool.clone(), full: read_units(max_record_size), held: None }
    }

    fn held(&self) -> bool {
        self.held.is_some()
    }

    /// Unread bytes the connection may hold: with all a record can need, no more limit here
    /// (the framer holds no more than a record and one read).
    fn allowed(&self) -> usize {
        match &self.held {
            Some(held) if held.num_permits() >= self.full as usize => usize::MAX,
            Some(held) => SMALL_READ + held.num_permits() * READ_UNIT,
            None => SMALL_READ,
        }
    }

    /// Room for more than `held` unread bytes; returns how many may be held now.
    async fn grow(&mut self, held: usize) -> usize {
        let have = self.held.as_ref().map_or(0, |held| held.num_permits() as u32);
        let needed = (held.saturating_sub(SMALL_READ) / READ_UNIT + 1) as u32;
        let wanted = needed.max(have.saturating_mul(2)).min(self.full);
        if wanted > have {
            match self.pool.room.clone().try_acquire_many_owned(wanted - have) {
                Ok(more) => match &mut self.held {
                    Some(permit) => permit.merge(more),
                    None => self.held = Some(more),
                },
                Err(_) => {
                    self.held = None;
                    let _waiting = self.pool.waiting();
                    // The pool is never closed.
                    if let Ok(all) = self.pool.room.clone().acquire_many_owned(self.full).await {
                        self.held = Some(all);
                    }
                }
            }
        }
        self.allowed()
    }

    fn release(&mut self) {
        self.held = None;
    }
}

/// Pool units a record of `max_record_size` can need unread: the record and one read chunk.
pub fn read_units(max_record_size: usize) -> u32 {
    u32::try_from((max_record_size + 64 * 1024).div_ceil(READ_UNIT)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::replies::write_acks;

    /// Found by the cold review (issue 12): an acknowledgement write waited for ever on a writer
    /// that does not read them, holding its connection and its share of the acknowledgement
    /// budget.
    #[tokio::test(start_paused = true)]
    async fn an_acknowledgement_write_the_writer_never_reads_gives_up_after_the_timeout() {
        let (ours, _theirs) = UnixStream::pair().expect("socket pair");
        let (_read, mut write) = ours.into_split();
        let never_read = vec![b'A'; 16 * 1024 * 1024];
        let started = tokio::time::Instant::now();
        let written = write_acks(&mut write, &never_read, &CancellationToken::new()).await;
        assert!(!written, "the write gives up");
        assert!(started.elapsed() >= ACK_WRITE_TIMEOUT, "after the timeout, not before");
    }

    #[tokio::test]
    async fn an_acknowledgement_write_ends_at_the_drain_deadline() {
        let (ours, _theirs) = UnixStream::pair().expect("socket pair");
        let (_read, mut write) = ours.into_split();
        let abandon = CancellationToken::new();
        abandon.cancel();
        assert!(!write_acks(&mut write, &vec![b'A'; 16 * 1024 * 1024], &abandon).await);
    }
}
