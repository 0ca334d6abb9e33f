//! The `otlp` listener: OpenTelemetry's OTLP logs, so every OpenTelemetry SDK's exporter writes to
//! Sluice unchanged — gRPC `LogsService/Export` and HTTP `POST /v1/logs` (protobuf or JSON, gzip),
//! on the listener's Unix socket and on pod loopback (`addresses`, by default the SDKs' own
//! endpoints `127.0.0.1:4317` and `:4318`); every address answers both (HTTP/1.1, and HTTP/2
//! with or without a preface).
//!
//! Owns: binding the loopback addresses (refused where the pod shares the node's network), the
//! connections (hyper, one task each, within `max_connections`), reading an Export within its
//! limits — the body pool ([`BODY_POOL_BYTES`], shared by the listener's connections), one Export
//! decoded at a time per [`EXPORT_SLOTS`] slot, `max_message_size` as sent and inflated — and
//! answering it in gRPC's or HTTP's terms ([`export`] decides what). gRPC is spoken here, not by
//! tonic: a unary call is one length-prefixed message each way and a status in the trailers, and
//! owning that reading is what bounds it (a declared length is never allocated, an inflated
//! message stops at the cap). Must not: answer an Export before its records reached
//! `ingest.ack_point` or were refused; hold more than the pool's bytes of request bodies; wait
//! past the listener's `export_timeout` or the drain's deadline.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use metrics::Counter;
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsPartialSuccess, ExportLogsServiceResponse};
use prost::Message as _;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, warn};

use super::{IngestContext, IngestError, ListenerContext};
use crate::config::ListenerConfig;
use crate::envelope::{Peer, PeerFragment};
use crate::telemetry;
use crate::telemetry::outcome::{ConnectionRefused, Rejected};

pub mod convert;
pub mod decode;
pub mod export;

use decode::Refusal;
use export::{Answer, RetryWhy, Sender};

/// Bytes of request bodies one `otlp` listener's connections may hold at once while they read
/// them (never less than one `max_message_size`). A request that finds none waits, within its
/// `export_timeout`.
pub const BODY_POOL_BYTES: usize = 32 * 1024 * 1024;

/// Exports of one listener decoded (and inflated) at once while their records go to the buffer;
/// the others wait with only their bodies.
pub const EXPORT_SLOTS: usize = 4;

/// Bodies at least this large are inflated and decoded on the blocking pool.
const BLOCKING_DECODE: usize = 64 * 1024;

/// HTTP/2 streams a connection may have open at once (the SDKs send one Export at a time).
const MAX_STREAMS: u32 = 16;

/// HTTP/2 flow-control windows: what a connection may send that is not read yet. A connection
/// holds at most this much unread whatever its peer declares.
const STREAM_WINDOW: u32 = 64 * 1024;
const CONNECTION_WINDOW: u32 = 128 * 1024;

/// How long a client is asked to wait before it retries (`Retry-After`, gRPC `RetryInfo`).
const RETRY_AFTER_SECONDS: u32 = 1;

/// The gRPC method OTLP/gRPC exporters call.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";

/// The HTTP path OTLP/HTTP exporters post to.
const HTTP_EXPORT: &str = "/v1/logs";

/// Binds `config`'s loopback addresses (none for a listener without any). Refused where the pod
/// shares the node's network, unless `allow_host_network`: there, the node's loopback is every
/// process's on the node.
pub fn bind_tcp(name: &str, config: &ListenerConfig) -> Result<Vec<TcpListener>, IngestError> {
    let addresses = config.tcp_addresses();
    if addresses.is_empty() {
        return Ok(Vec::new());
    }
    if !config.allow_host_network
        && let Some(ip) = host_network()
    {
        return Err(IngestError::HostNetwork { listener: name.to_string(), ip });
    }
    addresses
        .into_iter()
        .map(|address| {
            let bind = || -> std::io::Result<TcpListener> {
                let socket = std::net::TcpListener::bind(address)?;
                socket.set_nonblocking(true)?;
                TcpListener::from_std(socket)
            };
            let listener = bind().map_err(|source| IngestError::BindTcp { address, source })?;
            info!(listener = name, protocol = "otlp", %address, "listening");
            Ok(listener)
        })
        .collect()
}

/// The pod's IP if it shares the node's network: the Downward API's `POD_IP` equal to `HOST_IP`
/// (the chart and `sluice inject` set both from `status.podIP` and `status.hostIP`).
pub fn host_network() -> Option<String> {
    let read = |name: &str| std::env::var(name).ok();
    shares_node_network(read("POD_IP"), read("HOST_IP"))
}

/// The pod's IP if it is the node's (both known, and equal).
fn shares_node_network(pod_ip: Option<String>, host_ip: Option<String>) -> Option<String> {
    let (pod, host) = (pod_ip.filter(|ip| !ip.is_empty())?, host_ip.filter(|ip| !ip.is_empty())?);
    (pod == host).then_some(pod)
}

/// What a listener's connections share.
struct Shared {
    ingest: Arc<IngestContext>,
    listener: Arc<ListenerContext>,
    /// Request bodies being read, in bytes ([`BODY_POOL_BYTES`]).
    bodies: Arc<Semaphore>,
    /// Exports decoded at once ([`EXPORT_SLOTS`]).
    slots: Arc<Semaphore>,
    /// Connections open at once (`max_connections`, over the socket and every address).
    connections: Arc<Semaphore>,
    /// Where Exports run once read (the agent's connection tracker: the drain waits for them).
    tasks: TaskTracker,
    /// The next TCP connection's number, apart from the Unix socket's (from 2^62).
    tcp_ids: std::sync::atomic::AtomicU64,
    metrics: ExportMetrics,
}

/// `sluice_ingest_otlp_exports_total{listener, transport, outcome}` handles.
struct ExportMetrics {
    counters: Vec<((Transport, Outcome), Counter)>,
}

impl ExportMetrics {
    fn new(listener: &str) -> Self {
        let mut counters = Vec::new();
        for transport in [Transport::Grpc, Transport::Http] {
            for outcome in Outcome::ALL {
                let labels = [
                    ("listener", listener.to_string()),
                    ("transport", transport.as_str().to_string()),
                    ("outcome", outcome.as_str().to_string()),
                ];
                let counter = metrics::counter!(telemetry::INGEST_OTLP_EXPORTS, &labels);
                counter.increment(0);
                counters.push(((transport, outcome), counter));
            }
        }
        Self { counters }
    }

    fn count(&self, transport: Transport, outcome: Outcome) {
        if let Some((_, counter)) = self.counters.iter().find(|(key, _)| *key == (transport, outcome)) {
            counter.increment(1);
        }
    }
}

/// How an Export came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Grpc,
    Http,
}

impl Transport {
    fn as_str(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Http => "http",
        }
    }
}

/// How an Export was answered (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Every record reached the ack point.
    Ok,
    /// Some records were refused for good (`partial_success`).
    PartialSuccess,
    /// The client was told to retry (full buffer, deadline, rate limit, the drain).
    Retry,
    /// The request itself was refused: too large, not OTLP, an unsupported encoding.
    Refused,
}

impl Outcome {
    const ALL: [Outcome; 4] = [Outcome::Ok, Outcome::PartialSuccess, Outcome::Retry, Outcome::Refused];

    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::PartialSuccess => "partial_success",
            Outcome::Retry => "retry",
            Outcome::Refused => "refused",
        }
    }
}

/// Serves the listener's Unix socket and loopback addresses until `stop`; each connection is a
/// task on `tracker`, which finishes the Exports it is answering (each within its
/// `export_timeout`) and closes.
pub async fn serve(
    unix: UnixListener,
    path: &Path,
    tcp: Vec<TcpListener>,
    listener: Arc<ListenerContext>,
    ingest: Arc<IngestContext>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let max_message = listener.config.max_message_bytes();
    let shared = Arc::new(Shared {
        bodies: Arc::new(Semaphore::new(BODY_POOL_BYTES.max(2 * (max_message + 5)))),
        slots: Arc::new(Semaphore::new(EXPORT_SLOTS)),
        connections: Arc::new(Semaphore::new(listener.config.max_connections as usize)),
        metrics: ExportMetrics::new(&listener.name),
        tasks: tracker.clone(),
        tcp_ids: std::sync::atomic::AtomicU64::new(1 << 62),
        ingest,
        listener,
    });
    let unix = accept_unix(unix, path.to_path_buf(), shared.clone(), tracker.clone(), stop.clone());
    let mut accepting = vec![tokio::spawn(unix)];
    for socket in tcp {
        accepting.push(tokio::spawn(accept_tcp(socket, shared.clone(), tracker.clone(), stop.clone())));
    }
    for task in accepting {
        if let Err(error) = task.await {
            warn!(%error, "an OTLP accept loop failed");
        }
    }
}

/// Its socket file goes at the stop, while the socket still listens: removed after it closed, the
/// path might already be a replacement agent's (the dead socket looks stale to it). Exports still
/// in the backlog get no answer, and their SDKs send them again.
async fn accept_unix(
    socket: UnixListener,
    path: PathBuf,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let mut next_id = 0;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => return super::remove_socket_file(&path),
            accepted = socket.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                next_id += 1;
                let peer = super::peer_of(&stream);
                if !shared.listener.admits(&peer) {
                    shared.listener.metrics.refused(ConnectionRefused::PeerDenied);
                    continue;
                }
                spawn_connection(stream, Some(peer), next_id, &shared, &tracker, &stop);
            }
            Err(error) => accept_failed(&shared, error).await,
        }
    }
}

async fn accept_tcp(socket: TcpListener, shared: Arc<Shared>, tracker: TaskTracker, stop: CancellationToken) {
    // Numbered apart from the Unix socket's connections (rate-limit buckets are per connection).
    // One numbering for all the listener's addresses (rate-limit buckets are per connection).
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = socket.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let next_id = shared.tcp_ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Err(error) = stream.set_nodelay(true) {
                    debug!(%error, "could not set TCP_NODELAY");
                }
                spawn_connection(stream, None, next_id, &shared, &tracker, &stop);
            }
            Err(error) => accept_failed(&shared, error).await,
        }
    }
}

async fn accept_failed(shared: &Shared, error: std::io::Error) {
    // EMFILE and friends: back off instead of spinning; the listener survives.
    warn!(%error, listener = %shared.listener.name, "accept failed");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

fn spawn_connection<IO>(
    io: IO,
    peer: Option<Peer>,
    id: u64,
    shared: &Arc<Shared>,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Ok(slot) = shared.connections.clone().try_acquire_owned() else {
        shared.listener.metrics.refused(ConnectionRefused::MaxConnections);
        return;
    };
    let span = tracing::info_span!("connection", listener = %shared.listener.name, id);
    let task = connection(io, peer, id, slot, shared.clone(), stop.clone());
    tracker.spawn(crate::lifecycle::contain("connection", task).instrument(span));
}

/// One connection: HTTP/1.1 or HTTP/2, each request answered by [`handle`]. It closes after
/// `idle_timeout` with no request (HTTP/2 `GOAWAY`, then at most [`CLOSE_GRACE`] for what it is
/// answering), takes no new request at `stop`, and is dropped outright at the drain deadline
/// (`abandon`): a peer that never answers the `GOAWAY`'s ping, or never reads, cannot hold it.
async fn connection<IO>(
    io: IO,
    peer: Option<Peer>,
    id: u64,
    _slot: OwnedSemaphorePermit,
    shared: Arc<Shared>,
    stop: CancellationToken,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let listener = &shared.listener;
    listener.metrics.accepted.increment(1);
    listener.metrics.open.increment(1.0);
    let limit_key = listener
        .limits
        .as_ref()
        .map_or(super::limit::LimitKey::Connection(id), |limits| limits.key_for(id, peer.map_or(0, |peer| peer.uid)));
    let activity = Arc::new(Activity::default());
    let service = {
        let (shared, activity) = (shared.clone(), activity.clone());
        hyper::service::service_fn(move |request| {
            let (shared, busy) = (shared.clone(), activity.begin());
            async move {
                let response = handle(request, &shared, limit_key, peer).await;
                drop(busy);
                Ok::<_, Infallible>(response)
            }
        })
    };
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(std::time::Duration::from_secs(30));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(16 * 1024);
    let served = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(served);
    let idle = listener.config.idle_timeout;
    let mut closing: Option<tokio::time::Instant> = None;
    let result = loop {
        let idle_check = match (idle, closing) {
            (Some(idle), None) => activity.quiet_since().map(|since| since + idle),
            _ => None,
        };
        tokio::select! {
            biased;
            result = served.as_mut() => break result,
            // The drain deadline: whatever it still holds goes (its Exports end on the same
            // token, counted).
            _ = shared.ingest.abandon.cancelled() => break Ok(()),
            _ = stop.cancelled(), if closing.is_none() => {
                served.as_mut().graceful_shutdown();
                closing = Some(tokio::time::Instant::now() + listener.config.export_timeout + CLOSE_GRACE);
            }
            _ = tokio::time::sleep_until(closing.unwrap_or_else(tokio::time::Instant::now)), if closing.is_some() => {
                debug!("the peer did not let the connection close; dropping it");
                break Ok(());
            }
            _ = tokio::time::sleep_until(idle_check.unwrap_or_else(tokio::time::Instant::now)), if idle_check.is_some() => {
                if activity.quiet_since().is_some_and(|since| since + idle.unwrap_or_default() <= tokio::time::Instant::now()) {
                    debug!("idle timeout; closing");
                    listener.metrics.idle_closed();
                    served.as_mut().graceful_shutdown();
                    closing = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                }
            }
        }
    };
    if let Err(error) = result {
        debug!(%error, "connection ended");
    }
    listener.metrics.open.decrement(1.0);
}

/// How long a closing connection may take to finish what it is answering before it is dropped.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A connection's requests in flight, and since when it has had none.
#[derive(Default)]
struct Activity {
    state: std::sync::Mutex<(usize, Option<tokio::time::Instant>)>,
}

impl Activity {
    /// A request starts; it ends when the guard goes (answered, or dropped by the peer).
    fn begin(self: &Arc<Self>) -> Busy {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.0 += 1;
        Busy(self.clone())
    }

    /// Since when no request has been in flight (the connection's start, before the first).
    fn quiet_since(&self) -> Option<tokio::time::Instant> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if state.0 > 0 {
            return None;
        }
        Some(*state.1.get_or_insert_with(tokio::time::Instant::now))
    }
}

/// One request in flight ([`Activity::begin`]).
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.0 -= 1;
        if state.0 == 0 {
            state.1 = Some(tokio::time::Instant::now());
        }
    }
}

type Body = BoxBody<Bytes, Infallible>;

/// Whether a content type is gRPC's (protobuf): `application/grpc`, `application/grpc+proto`.
fn is_grpc(content_type: &str) -> bool {
    let media = content_type.split(';').next().unwrap_or("").trim();
    media == "application/grpc" || media == "application/grpc+proto"
}

/// Routes one request.
async fn handle(
    request: Request<Incoming>,
    shared: &Arc<Shared>,
    limit_key: super::limit::LimitKey,
    peer: Option<Peer>,
) -> Response<Body> {
    let sender = Sender { limit_key, peer: PeerFragment::new(peer) };
    let grpc = request.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok()).is_some_and(is_grpc);
    match (request.method(), request.uri().path()) {
        (&Method::POST, GRPC_EXPORT) if grpc => grpc_export(request, shared, sender).await,
        (&Method::POST, HTTP_EXPORT) => http_export(request, shared, sender).await,
        (_, _) if grpc => grpc_status(Code::Unimplemented, "this listener serves LogsService/Export only", false),
        (_, GRPC_EXPORT | HTTP_EXPORT) => plain(StatusCode::METHOD_NOT_ALLOWED, "POST only"),
        _ => plain(StatusCode::NOT_FOUND, "this listener serves OTLP logs: POST /v1/logs, or gRPC LogsService/Export"),
    }
}

/// Why a request body could not be taken.
enum BodyError {
    /// Larger than `max_message_size`.
    TooLarge,
    /// The export's deadline (or the drain's) passed while reading or waiting for room.
    Late,
    /// The stream broke off.
    Broken,
}

/// An Export's deadline: `export_timeout`, or sooner if the client said it gives up sooner
/// (gRPC's `grpc-timeout`, less a tenth so the answer reaches it first), and the timer behind it
/// (aborted with the Export).
struct Deadline {
    token: CancellationToken,
    _timer: tokio_util::task::AbortOnDropHandle<()>,
}

impl Deadline {
    fn new(listener: &ListenerContext, headers: &HeaderMap) -> Self {
        let client = headers.get("grpc-timeout").and_then(|value| value.to_str().ok()).and_then(grpc_timeout);
        let after = match client {
            Some(client) => listener.config.export_timeout.min(client - client / 10),
            None => listener.config.export_timeout,
        };
        let token = CancellationToken::new();
        let timer = token.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(after).await;
            timer.cancel();
        });
        Self { token, _timer: tokio_util::task::AbortOnDropHandle::new(task) }
    }
}

/// gRPC's `grpc-timeout`: digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
fn grpc_timeout(value: &str) -> Option<std::time::Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => std::time::Duration::from_secs(amount.saturating_mul(3600)),
        "M" => std::time::Duration::from_secs(amount.saturating_mul(60)),
        "S" => std::time::Duration::from_secs(amount),
        "m" => std::time::Duration::from_millis(amount),
        "u" => std::time::Duration::from_micros(amount),
        "n" => std::time::Duration::from_nanos(amount),
        _ => return None,
    })
}

/// An Export's body, read within `limit` bytes and the listener's body pool; the permits hold its
/// bytes' room until the Export is answered. A declared `Content-Length` takes its room at once
/// (no request holds part of the pool while waiting for the rest).
async fn read_body(
    request: Request<Incoming>,
    limit: usize,
    shared: &Shared,
    deadline: &CancellationToken,
) -> Result<(HeaderMap, Bytes, Option<OwnedSemaphorePermit>), BodyError> {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|declared| declared > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    let room = |bytes: usize| {
        let pool = shared.bodies.clone();
        async move {
            tokio::select! {
                biased;
                _ = shared.ingest.abandon.cancelled() => None,
                _ = deadline.cancelled() => None,
                // The pool is never closed; a request takes at most `limit` (< the pool).
                room = pool.acquire_many_owned(bytes.max(1) as u32) => room.ok(),
            }
        }
    };
    let mut held: Option<OwnedSemaphorePermit> = match declared {
        Some(declared) => Some(room(declared as usize).await.ok_or(BodyError::Late)?),
        None => None,
    };
    let (parts, mut body) = request.into_parts();
    let mut buffer = BytesMut::new();
    loop {
        let frame = tokio::select! {
            biased;
            _ = shared.ingest.abandon.cancelled() => return Err(BodyError::Late),
            _ = deadline.cancelled() => return Err(BodyError::Late),
            frame = body.frame() => frame,
        };
        let Some(frame) = frame else { break };
        let Ok(frame) = frame else { return Err(BodyError::Broken) };
        let Ok(data) = frame.into_data() else { continue };
        if buffer.len() + data.len() > limit
            || declared.is_some_and(|declared| (buffer.len() + data.len()) as u64 > declared)
        {
            return Err(BodyError::TooLarge);
        }
        if declared.is_none() {
            let more = room(data.len()).await.ok_or(BodyError::Late)?;
            match &mut held {
                Some(held) => held.merge(more),
                None => held = Some(more),
            }
        }
        buffer.extend_from_slice(&data);
    }
    Ok((parts.headers, buffer.freeze(), held))
}

/// What an Export's task came to.
enum Done {
    /// Decoded and offered: the answer.
    Answered(Answer),
    /// No export slot within the deadline (or the drain began).
    Busy,
    /// The body gives no request.
    Refused(Refusal),
}

/// An Export read whole, handed to a task of its own: from here it runs to its end — records
/// offered, counted and answered (`exports_total`) — whatever its client does meanwhile (a
/// cancel, a closed connection drops only the wait for its answer).
struct Job {
    body: Bytes,
    gzip: bool,
    json: bool,
    transport: Transport,
    sender: Sender,
    deadline: Deadline,
    /// The body's room in the pool, held until the Export ends.
    _room: Option<OwnedSemaphorePermit>,
}

impl Job {
    /// Runs the job on the listener's task tracker (the drain waits for it); its outcome.
    async fn run(self, shared: &Arc<Shared>) -> Done {
        let task = shared.tasks.spawn(self.work(shared.clone()));
        task.await.unwrap_or(Done::Busy)
    }

    async fn work(self, shared: Arc<Shared>) -> Done {
        let listener = &shared.listener;
        let limit = listener.config.max_message_bytes();
        let deadline = &self.deadline.token;
        let slot = tokio::select! {
            biased;
            _ = shared.ingest.abandon.cancelled() => None,
            _ = deadline.cancelled() => None,
            slot = shared.slots.clone().acquire_owned() => slot.ok(),
        };
        let Some(_slot) = slot else {
            shared.metrics.count(self.transport, Outcome::Retry);
            return Done::Busy;
        };

        let budget = limit * decode::DECODED_BUDGET_FACTOR;
        let (body, gzip, json) = (self.body.clone(), self.gzip, self.json);
        let work = move || match gzip {
            true => decode::inflate(&body, limit).and_then(|bytes| decode::decode(&bytes, json, budget)),
            false => decode::decode(&body, json, budget),
        };
        // A large body inflates and decodes off the runtime's workers (milliseconds per MiB).
        let decoded = if self.body.len() >= BLOCKING_DECODE {
            tokio::task::spawn_blocking(work)
                .await
                .unwrap_or_else(|error| Err(Refusal::Malformed(format!("decoding failed: {error}"))))
        } else {
            work()
        };
        let request = match decoded {
            Ok(request) => request,
            Err(refusal) => {
                match &refusal {
                    // Each record it holds, refused (the SDK does not send it again).
                    Refusal::TooLarge { records, .. } => {
                        for _ in 0..(*records).max(1) {
                            listener.metrics.rejected(Rejected::TooLarge);
                        }
                    }
                    Refusal::Malformed(_) => listener.metrics.rejected(Rejected::Malformed),
                }
                shared.metrics.count(self.transport, Outcome::Refused);
                return Done::Refused(refusal);
            }
        };
        let answer =
            export::export(request, _slot, self.body.len(), &shared.ingest, listener, self.sender, deadline).await;
        let outcome = match &answer {
            Answer::Done { rejected: 0, .. } => Outcome::Ok,
            Answer::Done { .. } => Outcome::PartialSuccess,
            Answer::Retry { .. } => Outcome::Retry,
        };
        shared.metrics.count(self.transport, outcome);
        Done::Answered(answer)
    }
}

fn response_message(rejected: u64, message: String) -> ExportLogsServiceResponse {
    ExportLogsServiceResponse {
        partial_success: (rejected > 0).then(|| ExportLogsPartialSuccess {
            rejected_log_records: i64::try_from(rejected).unwrap_or(i64::MAX),
            error_message: message,
        }),
    }
}

/// A request refused before it became a job: counted (`rejected` for its reason, and the
/// Export's outcome).
fn refused_early(shared: &Shared, transport: Transport, reason: Option<Rejected>, outcome: Outcome) {
    if let Some(reason) = reason {
        shared.listener.metrics.rejected(reason);
    }
    shared.metrics.count(transport, outcome);
}

// ---- OTLP/HTTP

async fn http_export(request: Request<Incoming>, shared: &Arc<Shared>, sender: Sender) -> Response<Body> {
    let listener = &shared.listener;
    let content_type = request.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or("");
    let json = match content_type.split(';').next().unwrap_or("").trim() {
        "application/x-protobuf" | "application/protobuf" => false,
        "application/json" => true,
        other => {
            refused_early(shared, Transport::Http, Some(Rejected::Malformed), Outcome::Refused);
            let message = format!("content type `{other}`: OTLP/HTTP is application/x-protobuf or application/json");
            return http_status(StatusCode::UNSUPPORTED_MEDIA_TYPE, Code::InvalidArgument, &message, false);
        }
    };
    let encoding = request.headers().get(CONTENT_ENCODING).and_then(|value| value.to_str().ok()).unwrap_or("identity");
    let gzip = match encoding {
        "gzip" => true,
        "identity" | "" => false,
        other => {
            refused_early(shared, Transport::Http, Some(Rejected::Malformed), Outcome::Refused);
            let message = format!("content encoding `{other}`: gzip or none");
            return http_status(StatusCode::UNSUPPORTED_MEDIA_TYPE, Code::InvalidArgument, &message, json);
        }
    };
    let deadline = Deadline::new(listener, request.headers());
    let limit = listener.config.max_message_bytes();
    let (_, body, room) = match read_body(request, limit, shared, &deadline.token).await {
        Ok(read) => read,
        Err(BodyError::TooLarge) => {
            refused_early(shared, Transport::Http, Some(Rejected::TooLarge), Outcome::Refused);
            return http_status(
                StatusCode::PAYLOAD_TOO_LARGE,
                Code::InvalidArgument,
                "larger than max_message_size",
                json,
            );
        }
        Err(BodyError::Late) => {
            refused_early(shared, Transport::Http, None, Outcome::Retry);
            return http_retry(StatusCode::SERVICE_UNAVAILABLE, late(shared), json);
        }
        Err(BodyError::Broken) => {
            refused_early(shared, Transport::Http, Some(Rejected::Truncated), Outcome::Refused);
            return http_status(StatusCode::BAD_REQUEST, Code::InvalidArgument, "the body broke off", json);
        }
    };
    let job = Job { body, gzip, json, transport: Transport::Http, sender, deadline, _room: room };
    match job.run(shared).await {
        Done::Answered(Answer::Done { rejected, message }) => {
            let response = response_message(rejected, message);
            let body = if json { serde_json::to_vec(&response).unwrap_or_default() } else { response.encode_to_vec() };
            let mut answer = Response::new(full(body));
            answer.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(media_type(json)));
            answer
        }
        Done::Answered(Answer::Retry { why, message }) => {
            let status = match why {
                RetryWhy::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                RetryWhy::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            };
            http_retry(status, &message, json)
        }
        Done::Busy => http_retry(StatusCode::SERVICE_UNAVAILABLE, "busy: no export slot within export_timeout", json),
        Done::Refused(Refusal::TooLarge { why, .. }) => {
            http_status(StatusCode::PAYLOAD_TOO_LARGE, Code::InvalidArgument, why, json)
        }
        Done::Refused(Refusal::Malformed(message)) => {
            http_status(StatusCode::BAD_REQUEST, Code::InvalidArgument, &message, json)
        }
    }
}

/// Why a body did not arrive in time: the drain, or the Export's deadline.
fn late(shared: &Shared) -> &'static str {
    if shared.ingest.stop_reading.is_cancelled() {
        "the agent is stopping"
    } else {
        "the request did not arrive within export_timeout"
    }
}

fn media_type(json: bool) -> &'static str {
    if json { "application/json" } else { "application/x-protobuf" }
}

/// An OTLP/HTTP error: `status`, and a `google.rpc.Status` body in the request's encoding.
fn http_status(status: StatusCode, code: Code, message: &str, json: bool) -> Response<Body> {
    let rpc = RpcStatus { code: code as i32, message: message.to_string(), details: Vec::new() };
    let body = if json {
        serde_json::to_vec(&serde_json::json!({"code": rpc.code, "message": rpc.message})).unwrap_or_default()
    } else {
        rpc.encode_to_vec()
    };
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(media_type(json)));
    response
}

fn http_retry(status: StatusCode, message: &str, json: bool) -> Response<Body> {
    let mut response = http_status(status, Code::Unavailable, message, json);
    response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
    response
}

fn full(bytes: Vec<u8>) -> Body {
    Full::new(Bytes::from(bytes)).boxed()
}

fn plain(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(full(format!("{message}\n").into_bytes()));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

// ---- OTLP/gRPC

/// gRPC status codes used here.
#[derive(Debug, Clone, Copy)]
enum Code {
    Ok = 0,
    InvalidArgument = 3,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Unavailable = 14,
}

async fn grpc_export(request: Request<Incoming>, shared: &Arc<Shared>, sender: Sender) -> Response<Body> {
    let listener = &shared.listener;
    let deadline = Deadline::new(listener, request.headers());
    let limit = listener.config.max_message_bytes();
    // One message: its 5-byte prefix and at most `limit` bytes.
    let (headers, body, room) = match read_body(request, limit + 5, shared, &deadline.token).await {
        Ok(read) => read,
        Err(BodyError::TooLarge) => {
            // Not RESOURCE_EXHAUSTED: some SDKs retry that whatever it says, and this Export
            // will never fit.
            refused_early(shared, Transport::Grpc, Some(Rejected::TooLarge), Outcome::Refused);
            return grpc_status(Code::InvalidArgument, "message larger than max_message_size", false);
        }
        Err(BodyError::Late) => {
            refused_early(shared, Transport::Grpc, None, Outcome::Retry);
            return grpc_status(Code::Unavailable, late(shared), true);
        }
        Err(BodyError::Broken) => {
            refused_early(shared, Transport::Grpc, Some(Rejected::Truncated), Outcome::Refused);
            return grpc_status(Code::InvalidArgument, "the request broke off", false);
        }
    };
    let (compressed, message) = match unframe(&body) {
        Ok(framed) => framed,
        Err(error) => {
            refused_early(shared, Transport::Grpc, Some(Rejected::Malformed), Outcome::Refused);
            return grpc_status(Code::InvalidArgument, error, false);
        }
    };
    if compressed && headers.get("grpc-encoding").and_then(|value| value.to_str().ok()) != Some("gzip") {
        refused_early(shared, Transport::Grpc, Some(Rejected::Malformed), Outcome::Refused);
        return grpc_status(Code::Unimplemented, "grpc-encoding: gzip or identity", false);
    }
    let message = body.slice_ref(message);
    let job =
        Job { body: message, gzip: compressed, json: false, transport: Transport::Grpc, sender, deadline, _room: room };
    match job.run(shared).await {
        Done::Answered(Answer::Done { rejected, message }) => {
            let message = response_message(rejected, message).encode_to_vec();
            let mut framed = Vec::with_capacity(message.len() + 5);
            framed.push(0);
            framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
            framed.extend_from_slice(&message);
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from(Code::Ok as i32));
            let frames = [Ok::<_, Infallible>(Frame::data(Bytes::from(framed))), Ok(Frame::trailers(trailers))];
            let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
            let mut response = Response::new(body);
            grpc_headers(response.headers_mut());
            response
        }
        Done::Answered(Answer::Retry { why, message }) => {
            let code = match why {
                RetryWhy::Unavailable => Code::Unavailable,
                RetryWhy::RateLimited => Code::ResourceExhausted,
            };
            grpc_status(code, &message, true)
        }
        Done::Busy => grpc_status(Code::Unavailable, "busy: no export slot within export_timeout", true),
        Done::Refused(Refusal::TooLarge { why, .. }) => grpc_status(Code::InvalidArgument, why, false),
        Done::Refused(Refusal::Malformed(message)) => grpc_status(Code::InvalidArgument, &message, false),
    }
}

/// The one message of a unary request: its compressed flag and bytes.
fn unframe(body: &[u8]) -> Result<(bool, &[u8]), &'static str> {
    let Some((prefix, message)) = body.split_first_chunk::<5>() else {
        return Err("no gRPC message");
    };
    let declared = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if declared != message.len() {
        return Err("a unary call carries one gRPC message, whole");
    }
    match prefix[0] {
        0 => Ok((false, message)),
        1 => Ok((true, message)),
        _ => Err("gRPC message flag is neither 0 nor 1"),
    }
}

fn grpc_headers(headers: &mut HeaderMap) {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-accept-encoding", HeaderValue::from_static("gzip,identity"));
}

/// A trailers-only gRPC answer: the status in the headers, no message; `retry` adds
/// `google.rpc.RetryInfo`, both in `grpc-status-details-bin` (Go, Java) and as
/// `google.rpc.retryinfo-bin` (Python reads that one).
fn grpc_status(code: Code, message: &str, retry: bool) -> Response<Body> {
    use base64::Engine as _;
    let mut response = Response::new(Empty::new().boxed());
    let headers = response.headers_mut();
    grpc_headers(headers);
    headers.insert("grpc-status", HeaderValue::from(code as i32));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", value);
    }
    if retry {
        let retry_info =
            RetryInfo { retry_delay: Some(ProtoDuration { seconds: RETRY_AFTER_SECONDS.into(), nanos: 0 }) }
                .encode_to_vec();
        let details = RpcStatus {
            code: code as i32,
            message: message.to_string(),
            details: vec![ProtoAny {
                type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
                value: retry_info.clone(),
            }],
        };
        let base64 = base64::engine::general_purpose::STANDARD_NO_PAD;
        if let Ok(value) = HeaderValue::from_str(&base64.encode(details.encode_to_vec())) {
            headers.insert("grpc-status-details-bin", value);
        }
        if let Ok(value) = HeaderValue::from_str(&base64.encode(retry_info)) {
            headers.insert("google.rpc.retryinfo-bin", value);
        }
    }
    response
}

/// gRPC's `grpc-message` encoding: printable ASCII as is, except `%`; the rest percent-encoded.
fn percent_encode(message: &str) -> String {
    let mut encoded = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<ProtoAny>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_shares_the_node_network_only_when_its_ip_is_the_nodes() {
        let ip = |text: &str| Some(text.to_string());
        assert_eq!(shares_node_network(ip("10.0.0.5"), ip("10.0.0.5")), ip("10.0.0.5"));
        assert_eq!(shares_node_network(ip("10.1.2.3"), ip("10.0.0.5")), None, "a pod network");
        assert_eq!(shares_node_network(None, ip("10.0.0.5")), None, "unknown: not refused (outside Kubernetes)");
        assert_eq!(shares_node_network(ip(""), ip("")), None);
    }

    #[test]
    fn a_unary_grpc_body_is_one_whole_message() {
        assert_eq!(unframe(&[0, 0, 0, 0, 2, 7, 8]), Ok((false, &[7u8, 8][..])));
        assert_eq!(unframe(&[1, 0, 0, 0, 0]), Ok((true, &[][..])));
        assert!(unframe(&[0, 0xff, 0xff, 0xff, 0xff, 1]).is_err(), "a declared length is checked, never allocated");
        assert!(unframe(&[0, 0, 0, 0, 1, 7, 8]).is_err(), "two messages, or trailing bytes");
        assert!(unframe(&[2, 0, 0, 0, 0]).is_err());
        assert!(unframe(&[0, 0]).is_err());
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(percent_encode("too_large 1, 100%"), "too_large 1, 100%25");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
    }
}
