//! A datagram listener: one datagram, one record (`datagram`, or `syslog` over `SOCK_DGRAM`,
//! which is what `logger -u` and most syslog libraries send).
//!
//! Owns: the receive loop of one datagram socket and draining what the kernel still queues at
//! shutdown. Must not: hold more than one datagram (the receive buffer is `max_record_size` plus
//! one byte, so an overlong datagram is detected, not reassembled), or claim a peer it cannot
//! know (datagram sockets carry no `SO_PEERCRED`; envelopes from here have no `peer`).
//!
//! There are no connections: `max_connections`, `idle_timeout` and the peer allowlist do not
//! apply (config validation refuses the last), and a rate limit keyed `connection` is one bucket
//! for the whole socket. With `throttle`, waiting leaves datagrams in the kernel queue until
//! writers block in `send`, which is the backpressure a datagram socket has.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixDatagram;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::limit::LimitKey;
use super::sink::RecordSink;
use super::{IngestContext, ListenerContext};
use crate::envelope::PeerFragment;
use crate::telemetry::outcome::Rejected;

/// Receives datagrams until `stop`, then removes the socket's path (a writer's next `sendto`
/// fails instead of queueing where nobody will read) and takes what is already queued, until the
/// agent stops reading (half the drain timeout). What is still queued then is counted as
/// `drain_timeout`, up to [`MAX_COUNTED_AFTER_STOP`] datagrams.
pub async fn serve(
    socket: UnixDatagram,
    path: &std::path::Path,
    listener: Arc<ListenerContext>,
    ingest: Arc<IngestContext>,
    stop: CancellationToken,
) {
    let max = listener.config.max_record_bytes();
    let mut buf = vec![0u8; max + 1];
    let mut sink = RecordSink::new(&ingest, &listener, LimitKey::Connection(0), PeerFragment::new(None));
    while !stop.is_cancelled() {
        let received = match socket.try_recv(&mut buf) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                // Nothing queued: publish the counts before waiting.
                sink.flush_counters();
                tokio::select! {
                    biased;
                    received = socket.recv(&mut buf) => received,
                    _ = stop.cancelled() => break,
                }
            }
            other => other,
        };
        match received {
            Ok(len) => take(&mut sink, &buf, len, max).await,
            Err(error) => {
                warn!(%error, listener = %listener.name, "receive failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    // New writers find no socket; one that connected before can still send (a connected
    // datagram socket does not need the path).
    if let Err(error) = std::fs::remove_file(path) {
        debug!(%error, "could not remove the datagram socket's path");
    }
    // What writers already sent is in the kernel's queue: take it before closing, until the
    // agent says to stop reading (writers that keep sending would keep this going for ever).
    while !ingest.stop_reading.is_cancelled() {
        match socket.try_recv(&mut buf) {
            Ok(len) => take(&mut sink, &buf, len, max).await,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) => {
                warn!(%error, listener = %listener.name, "receive failed while draining");
                break;
            }
        }
    }
    // Still queued: received (the writers' sends succeeded) but not taken in. Counted, so the
    // loss is not silent; bounded, as a connected writer may keep sending.
    let mut counted = 0;
    while counted < MAX_COUNTED_AFTER_STOP {
        match socket.try_recv(&mut buf) {
            Ok(0) => {}
            Ok(_) => {
                sink.give_up();
                counted += 1;
            }
            Err(_) => break,
        }
    }
    if counted > 0 {
        warn!(listener = %listener.name, datagrams = counted, "datagrams still queued when reading stopped are counted as drain_timeout");
    }
    sink.flush_counters();
}

/// Datagrams still queued when reading stops that are counted before the socket closes.
pub const MAX_COUNTED_AFTER_STOP: usize = 100_000;

async fn take(sink: &mut RecordSink<'_>, buf: &[u8], len: usize, max: usize) {
    match len {
        // A zero-length datagram carries no record: it is how a second agent probes whether
        // the socket is alive.
        0 => {}
        len if len > max => sink.reject(Rejected::TooLarge, None),
        len => sink.offer(&buf[..len], None).await,
    }
}
