//! Ingest: the sockets apps write to.
//!
//! Owns: binding each configured listener (creating its directory, replacing only a stale
//! socket file, setting mode and group), accepting connections within `max_connections`,
//! checking peers against the allowlist, and one task per connection (or one per datagram
//! socket) that decodes, validates and wraps records before handing them to the [`Buffer`].
//! Every listener has its own metrics, labelled `listener` and `protocol`.
//!
//! Must not: block a reader on anything but its socket, its rate limit (`throttle`) and the
//! buffer's `block` policy; hold more than one record's worth of unread bytes per connection;
//! let one connection's error reach the listener; or log record payloads.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use metrics::{Counter, Gauge};
use tokio::net::{UnixDatagram, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, info, warn};

use crate::buffer::Buffer;
use crate::buffer::ack::AckPoint;
use crate::config::{IngestConfig, KeySource, ListenerConfig, Protocol, ShipConfig, Transport};
use crate::envelope::{EnvelopeWriter, Peer, PodMetadata};
use crate::telemetry;
use crate::telemetry::outcome::{ConnectionRefused, Rejected};

pub mod connection;
pub mod datagram;
pub mod forward;
pub mod framing;
pub mod limit;
pub mod multiline;
pub mod otlp;
pub mod paced;
pub mod record;
pub mod redact;
mod replies;
pub mod session;
pub mod sink;
pub mod syslog;

#[cfg(test)]
mod tests;

/// Why a socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The socket's directory could not be created.
    #[error("cannot create socket directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Something that is not a socket sits at the path; it is never deleted.
    #[error("{path} exists and is not a socket; refusing to remove it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Another process accepts connections on the socket.
    #[error("{path} is in use by another running process")]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// Binding, or setting mode or group, failed.
    #[error("cannot bind {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A loopback address could not be bound.
    #[error("cannot bind {address}: {source}")]
    BindTcp {
        /// The address.
        address: std::net::SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// The pod shares the node's network: its loopback is the node's.
    #[error(
        "listener {listener}: this pod shares the node's network (POD_IP = HOST_IP = {ip}), so its loopback \
         addresses would reach every process on the node; set allow_host_network = true to bind them anyway, \
         or addresses = [] to serve the Unix socket only"
    )]
    HostNetwork {
        /// The listener.
        listener: String,
        /// The pod's (and node's) IP.
        ip: String,
    },
    /// A `redact` rule does not compile.
    #[error("listener {listener}: a redact rule does not compile: {error}")]
    Redact {
        /// The listener.
        listener: String,
        /// Why.
        error: String,
    },
    /// `socket_group` names no group.
    #[error("listener {listener}: no group named {group}")]
    UnknownGroup {
        /// The listener.
        listener: String,
        /// The group as configured.
        group: String,
    },
}

/// What every connection of every listener needs, shared.
pub struct IngestContext {
    /// Where records go.
    pub buffer: Buffer,
    /// Wraps records into envelopes and numbers them.
    pub envelopes: EnvelopeWriter,
    /// How the Kafka key is chosen; a config reload may change it.
    pub key: KeyRules,
    /// Each record's Kafka topic (`kafka.topic`); a config reload may change it. Shared with
    /// the shipper (an unknown topic's records go to the default topic).
    pub topics: Arc<crate::topic::Topics>,
    /// When acknowledged-mode writers (and Forward clients asking for acks) hear that a record
    /// is safe.
    pub ack_point: AckPoint,
    /// Deepest JSON nesting accepted.
    pub max_json_depth: usize,
    /// Largest Kafka message (envelope and key) a record may become
    /// ([`crate::config::Config::largest_message`]); a record whose message would be larger is
    /// refused as `too_large` (a text line dense in characters JSON must escape).
    pub max_message: usize,
    /// Cancelled when connections must stop reading during a drain (half the drain timeout):
    /// each shuts the read side of its socket (the writer's next write fails) and takes in only
    /// what is already queued there.
    pub stop_reading: CancellationToken,
    /// Cancelled when the drain deadline passes: a reader still waiting for buffer room, a rate
    /// limit or its acknowledgement writer gives up, counting its record as
    /// `reason="drain_timeout"`, instead of waiting forever.
    pub abandon: CancellationToken,
    /// Records given up at the drain deadline before they reached the buffer (also counted as
    /// `drain_timeout`), for the drain's report.
    pub abandoned: std::sync::atomic::AtomicU64,
    /// How many records acknowledged-mode connections may have unreported.
    pub acks: Arc<crate::buffer::ack::AckBudget>,
    /// The shared read pool, in [`connection::READ_UNIT`]s: room for connections to hold long
    /// records unread beyond [`connection::SMALL_READ`] each (see [`read_pool`]).
    pub read_pool: Arc<ReadPool>,
    /// Slots for compressed Forward messages held inflated ([`MAX_INFLATIONS`]).
    pub inflations: Arc<Semaphore>,
    /// Room, in bytes, for the records `multiline` listeners' connections are joining
    /// ([`multiline::MULTILINE_POOL_BYTES`]).
    pub multiline_pool: Arc<Semaphore>,
}

/// Compressed Forward messages the agent holds inflated at once (each at most its listener's
/// `max_record_size`) while their events go to the buffer. A message that finds no slot lets
/// its inflated stream go and waits for one, so connections waiting on a full buffer hold their
/// compressed bytes, not a stream each up to `max_record_size`.
pub const MAX_INFLATIONS: usize = 4;

/// Bytes of the shared read pool: what all connections together may hold unread beyond their
/// small share. Never less than one record of the largest `max_record_size` can need.
pub const READ_POOL_BYTES: usize = 8 * 1024 * 1024;

/// The shared read pool for `config`'s listeners (see [`IngestContext::read_pool`]).
pub fn read_pool(config: &IngestConfig) -> Arc<ReadPool> {
    let largest = config.listeners.values().map(|listener| connection::read_units(listener.max_record_bytes())).max();
    let units = (READ_POOL_BYTES / connection::READ_UNIT) as u32;
    Arc::new(ReadPool {
        room: Arc::new(Semaphore::new(units.max(largest.unwrap_or(0)) as usize)),
        waiting: std::sync::atomic::AtomicUsize::new(0),
        wanted: tokio::sync::Notify::new(),
        last_cut: std::sync::Mutex::new(None),
    })
}

/// The room connections share to hold long records unread (in [`connection::READ_UNIT`]s), and
/// who waits for it. A connection that holds room for a record whose bytes stopped coming for
/// [`connection::PARTIAL_RECORD_HOLD`] gives the record up (counted `truncated`, the rest of it
/// skipped as it arrives, the connection read on) and its room back, once another connection
/// waits — one connection per [`CUT_SPACING`]: eight writers each holding an unfinished 1 MiB
/// line would otherwise make every other connection's records over ~16 KiB wait until they idle
/// out (`idle_timeout`, 10 minutes by default).
pub struct ReadPool {
    /// The room.
    pub room: Arc<Semaphore>,
    /// Connections waiting for room now.
    waiting: std::sync::atomic::AtomicUsize,
    /// Signalled when a connection starts waiting.
    wanted: tokio::sync::Notify,
    /// When a connection last gave its room back for a waiter: the next may only after
    /// [`CUT_SPACING`], so one waiter costs one partial record, not every holder's at once.
    last_cut: std::sync::Mutex<Option<tokio::time::Instant>>,
}

/// Least time between two connections giving their room back for waiters ([`ReadPool`]): room
/// given back reaches a waiter in microseconds; one still waiting after this needs more.
pub const CUT_SPACING: std::time::Duration = std::time::Duration::from_millis(500);

impl ReadPool {
    /// Whether a connection waits for room now.
    pub fn wanted(&self) -> bool {
        self.waiting.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// Waits until a connection waits for room.
    pub async fn until_wanted(&self) {
        loop {
            let wanted = self.wanted.notified();
            if self.wanted() {
                return;
            }
            wanted.await;
        }
    }

    /// Whether the caller may give its room back for a waiter now (and so claims the turn):
    /// someone waits, and no other connection did so within [`CUT_SPACING`].
    pub fn claim_cut(&self) -> bool {
        let now = tokio::time::Instant::now();
        let mut last = self.last_cut.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !self.wanted() || last.is_some_and(|at| now.duration_since(at) < CUT_SPACING) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// A connection waits for room until the guard is dropped.
    fn waiting(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.wanted.notify_waiters();
        Waiting(self)
    }
}

/// One connection waiting for read room (see [`ReadPool::waiting`]).
struct Waiting<'a>(&'a ReadPool);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The Kafka key rule, resolved once from `ship.key`.
#[derive(Debug, Clone)]
pub enum KeyRule {
    /// No key.
    None,
    /// The same key for every record (the pod name).
    Fixed(Bytes),
    /// A top-level field of JSON records.
    Field(String),
    /// A template over the pod and the record (`ship.key_template`).
    Template(Arc<crate::template::Template>, Arc<PodMetadata>),
}

impl KeyRule {
    /// Resolves the rule from config and the pod's metadata.
    pub fn new(ship: &ShipConfig, pod: &PodMetadata) -> Self {
        match ship.key {
            KeySource::None => KeyRule::None,
            KeySource::PodName => match &pod.name {
                Some(name) => KeyRule::Fixed(Bytes::from(name.clone())),
                None => {
                    warn!("ship.key = \"pod_name\" but POD_NAME is not set; records are sent without a key");
                    KeyRule::None
                }
            },
            KeySource::Field => KeyRule::Field(ship.key_field.clone().unwrap_or_default()),
            KeySource::Template => {
                match ship.key_template.as_deref().map(crate::template::Template::parse) {
                    // The same for every record: rendered once.
                    Some(Ok(template)) if !template.reads_records() => {
                        let mut key = String::new();
                        if template.render(pod, "", &mut key) {
                            KeyRule::Fixed(Bytes::from(key))
                        } else {
                            warn!(template = %template, "ship.key_template names a pod field the Downward API does not give; records are sent without a key");
                            KeyRule::None
                        }
                    }
                    Some(Ok(template)) => KeyRule::Template(Arc::new(template), Arc::new(pod.clone())),
                    // Validated at load: not reached.
                    _ => KeyRule::None,
                }
            }
        }
    }
}

/// The key rule in force, which a config reload may replace, read by every connection for every
/// record: each keeps a copy and takes the lock only when the generation says it changed.
#[derive(Debug)]
pub struct KeyRules {
    rule: std::sync::RwLock<KeyRule>,
    generation: std::sync::atomic::AtomicU64,
}

impl KeyRules {
    /// Starts with `rule`.
    pub fn new(rule: KeyRule) -> Self {
        Self { rule: std::sync::RwLock::new(rule), generation: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Replaces the rule (a config reload); records offered after this use the new one.
    pub fn set(&self, rule: KeyRule) {
        *self.rule.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = rule;
        self.generation.fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// The rule in force, from `cached` unless it changed since it was read.
    pub fn current<'a>(&self, cached: &'a mut Option<(u64, KeyRule)>) -> &'a KeyRule {
        let generation = self.generation.load(std::sync::atomic::Ordering::Acquire);
        match cached {
            Some((read_at, _)) if *read_at == generation => {}
            _ => {
                let rule = self.rule.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
                *cached = Some((generation, rule));
            }
        }
        &cached.as_ref().expect("just set").1
    }
}

/// One listener's settings and metrics, shared by its connections.
pub struct ListenerContext {
    /// The listener's name (the `listener` label).
    pub name: String,
    /// What it speaks.
    pub protocol: Protocol,
    /// Its settings.
    pub config: ListenerConfig,
    /// Its metrics.
    pub metrics: ListenerMetrics,
    /// Its rate limits, if any.
    pub limits: Option<limit::Limits>,
    /// Its multiline rule, compiled.
    pub multiline: Option<Arc<multiline::Rule>>,
    /// Masking (`redact`: the listener's, or `ingest.redact`), if any.
    pub redact: Option<redact::Redactor>,
}

impl ListenerContext {
    fn new(name: &str, config: &ListenerConfig) -> Result<Self, IngestError> {
        let metrics = ListenerMetrics::new(name, config.protocol);
        // Validated at load; a rule that does not compile here stops the agent: records are
        // never shipped unmasked.
        let redact = match config.redact.as_ref().filter(|redact| !redact.rules.is_empty()) {
            Some(redact) => Some(
                redact::Redactor::new(redact, name)
                    .map_err(|error| IngestError::Redact { listener: name.to_string(), error: error.to_string() })?,
            ),
            None => None,
        };
        Ok(Self {
            name: name.to_string(),
            protocol: config.protocol,
            config: config.clone(),
            limits: config.rate_limit.as_ref().map(limit::Limits::new),
            multiline: config.multiline.as_ref().and_then(|multiline| {
                match multiline::Rule::new(multiline, config.max_record_size) {
                    Ok(rule) => Some(Arc::new(rule)),
                    // Validated at load: not reached.
                    Err(error) => {
                        warn!(%error, listener = name, "multiline rule does not compile; lines are not joined");
                        None
                    }
                }
            }),
            redact,
            metrics,
        })
    }

    /// A connection's read buffer changed by `delta` bytes. The gauge is moved by the delta, not
    /// set to a total summed beside it: two connections reporting at once could set their totals
    /// in the other order, and the gauge kept the older until the next change (a test saw it
    /// stay one connection's 17 KiB short for a minute).
    pub fn buffered(&self, delta: i64) {
        if delta != 0 {
            self.metrics.read_buffer_bytes.increment(delta as f64);
        }
    }

    /// True if the peer may write here (`allow_uids`/`allow_gids`).
    pub fn admits(&self, peer: &Peer) -> bool {
        let uids = &self.config.allow_uids;
        let gids = &self.config.allow_gids;
        (uids.is_empty() || uids.contains(&peer.uid)) && (gids.is_empty() || gids.contains(&peer.gid))
    }
}

/// A listener's metric handles, labelled `listener` and `protocol`.
pub struct ListenerMetrics {
    labels: [(&'static str, String); 2],
    /// Connections accepted.
    pub accepted: Counter,
    /// Connections open.
    pub open: Gauge,
    /// Records accepted.
    pub records: Counter,
    /// Bytes of accepted records.
    pub bytes: Counter,
    /// Records that waited for their rate limit (`throttle`).
    pub throttled: Counter,
    /// Bytes held unread in read buffers.
    pub read_buffer_bytes: Gauge,
    /// Lines joined to the record before them (`multiline`).
    pub lines_joined: Counter,
}

impl ListenerMetrics {
    fn new(name: &str, protocol: Protocol) -> Self {
        let labels = [("listener", name.to_string()), ("protocol", protocol.as_str().to_string())];
        for reason in Rejected::ALL {
            metrics::counter!(telemetry::INGEST_REJECTED, &with_reason(&labels, reason.as_str())).increment(0);
        }
        for reason in ConnectionRefused::ALL {
            metrics::counter!(telemetry::INGEST_REFUSED, &with_reason(&labels, reason.as_str())).increment(0);
        }
        metrics::counter!(telemetry::INGEST_IDLE_CLOSED, &labels).increment(0);
        if protocol == Protocol::Lines {
            for split in multiline::Split::ALL {
                metrics::counter!(telemetry::INGEST_RECORDS_SPLIT, &with_reason(&labels, split.as_str())).increment(0);
            }
            metrics::counter!(telemetry::INGEST_LINES_JOINED, &labels).increment(0);
        }
        Self {
            accepted: metrics::counter!(telemetry::INGEST_CONNECTIONS, &labels),
            open: metrics::gauge!(telemetry::INGEST_CONNECTIONS_OPEN, &labels),
            records: metrics::counter!(telemetry::INGEST_RECORDS, &labels),
            bytes: metrics::counter!(telemetry::INGEST_BYTES, &labels),
            throttled: metrics::counter!(telemetry::INGEST_THROTTLED, &labels),
            read_buffer_bytes: metrics::gauge!(telemetry::INGEST_READ_BUFFER_BYTES, &labels),
            lines_joined: metrics::counter!(telemetry::INGEST_LINES_JOINED, &labels),
            labels,
        }
    }

    /// Counts a refused record.
    pub fn rejected(&self, reason: Rejected) {
        metrics::counter!(telemetry::INGEST_REJECTED, &with_reason(&self.labels, reason.as_str())).increment(1);
    }

    /// Counts a record a multiline limit split.
    pub fn split(&self, split: multiline::Split) {
        metrics::counter!(telemetry::INGEST_RECORDS_SPLIT, &with_reason(&self.labels, split.as_str())).increment(1);
    }

    /// Counts a refused connection.
    pub fn refused(&self, reason: ConnectionRefused) {
        metrics::counter!(telemetry::INGEST_REFUSED, &with_reason(&self.labels, reason.as_str())).increment(1);
    }

    /// Counts a connection closed for idling.
    pub fn idle_closed(&self) {
        metrics::counter!(telemetry::INGEST_IDLE_CLOSED, &self.labels).increment(1);
    }
}

fn with_reason(labels: &[(&'static str, String); 2], reason: &'static str) -> [(&'static str, String); 3] {
    [labels[0].clone(), labels[1].clone(), (telemetry::REASON, reason.to_string())]
}

enum Socket {
    Stream(UnixListener),
    Datagram(UnixDatagram),
    /// `otlp`: the Unix socket and the loopback addresses.
    Otlp(UnixListener, Vec<tokio::net::TcpListener>),
}

/// A bound listener, ready to serve.
pub struct Listener {
    socket: Socket,
    path: PathBuf,
    context: Arc<ListenerContext>,
}

/// Who is on the other end of a Unix stream connection (`SO_PEERCRED`); nobody's (uid 0, no
/// pid) where the kernel does not say.
pub fn peer_of(stream: &tokio::net::UnixStream) -> Peer {
    match stream.peer_cred() {
        Ok(cred) => Peer { pid: cred.pid(), uid: cred.uid(), gid: cred.gid() },
        Err(error) => {
            debug!(%error, "no peer credentials");
            Peer::default()
        }
    }
}

/// Binds every configured listener (all or none: a conflict fails start-up).
pub fn bind_all(config: &IngestConfig) -> Result<Vec<Listener>, IngestError> {
    config
        .listeners
        .iter()
        .map(|(name, listener)| {
            // A listener's own masking, or the section's.
            let mut listener = listener.clone();
            listener.redact = listener.redact.or_else(|| config.redact.clone());
            Listener::bind(name, &listener)
        })
        .collect()
}

impl Listener {
    /// Binds the socket: creates the directory, removes a stale socket left by a previous run
    /// (never a regular file, never a socket someone still listens on), binds, sets mode and
    /// group — in that order, but out of sight until it is done (see `bind_private`).
    pub fn bind(name: &str, config: &ListenerConfig) -> Result<Self, IngestError> {
        let path = config.socket.clone();
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|source| IngestError::CreateDir { path: dir.to_path_buf(), source })?;
        }
        // An unknown group fails before anything is bound.
        let gid = match &config.socket_group {
            Some(group) => Some(
                group_id(group)
                    .ok_or_else(|| IngestError::UnknownGroup { listener: name.to_string(), group: group.clone() })?,
            ),
            None => None,
        };
        remove_stale_socket(&path)?;
        let bind_error = |source| IngestError::Bind { path: path.clone(), source };
        let mode = config.socket_mode_bits();
        // Loopback addresses first: a conflict there leaves no socket file behind.
        let tcp = otlp::bind_tcp(name, config)?;
        let socket = match config.transport() {
            Transport::Stream if config.protocol == Protocol::Otlp => {
                Socket::Otlp(bind_private(&path, mode, gid, |at| UnixListener::bind(at)).map_err(bind_error)?, tcp)
            }
            Transport::Stream => {
                Socket::Stream(bind_private(&path, mode, gid, |at| UnixListener::bind(at)).map_err(bind_error)?)
            }
            Transport::Datagram => {
                Socket::Datagram(bind_private(&path, mode, gid, |at| UnixDatagram::bind(at)).map_err(bind_error)?)
            }
        };
        info!(
            listener = name,
            protocol = config.protocol.as_str(),
            socket = %path.display(),
            mode = %config.socket_mode,
            "listening"
        );
        Ok(Self { socket, path, context: Arc::new(ListenerContext::new(name, config)?) })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves until `stop` is cancelled. Stream listeners spawn one task per connection on
    /// `tracker` (each gets `stop` and drains its socket before closing); a datagram listener
    /// reads in this task.
    pub async fn serve(self, ingest: Arc<IngestContext>, tracker: TaskTracker, stop: CancellationToken) {
        let Listener { socket, path, context } = self;
        if context.limits.is_some() {
            tracker.spawn(forget_idle_buckets(context.clone(), stop.clone()));
        }
        // Each kind removes its socket file once, at the stop, while it still listens: removed
        // later, the path might already be another agent's (a replacement that bound it
        // meanwhile, taking the dead socket for a stale one).
        match socket {
            Socket::Datagram(socket) => datagram::serve(socket, &path, context.clone(), ingest, stop).await,
            Socket::Stream(listener) => accept(listener, &path, context.clone(), ingest, tracker, stop).await,
            Socket::Otlp(unix, tcp) => otlp::serve(unix, &path, tcp, context.clone(), ingest, tracker, stop).await,
        }
        info!(listener = %context.name, "listener closed");
    }
}

async fn accept(
    listener: UnixListener,
    path: &Path,
    context: Arc<ListenerContext>,
    ingest: Arc<IngestContext>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(context.config.max_connections as usize));
    let mut next_id: u64 = 0;
    let mut serve = |stream: UnixStream, slot| {
        next_id += 1;
        let span = tracing::info_span!("connection", listener = %context.name, id = next_id);
        let task = connection::serve(stream, next_id, slot, context.clone(), ingest.clone(), stop.clone());
        tracker.spawn(crate::lifecycle::contain("connection", task).instrument(span));
    };
    if crate::lifecycle::fail_point_holds("accept") {
        stop.cancelled().await;
    }
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => match slots.clone().try_acquire_owned() {
                Ok(slot) => serve(stream, slot),
                Err(_) => {
                    // Accept, then close at once: the writer sees the connection end instead of
                    // hanging in the kernel's backlog.
                    context.metrics.refused(ConnectionRefused::MaxConnections);
                    drop(stream);
                }
            },
            Err(error) => {
                // EMFILE and friends: back off instead of spinning; the listener survives.
                warn!(%error, listener = %context.name, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
    // Connections the kernel completed before the stop wait in the backlog, and their writers
    // saw their writes succeed: each is served like a connection open at the stop (it reads
    // what is in its socket, then closes) instead of being dropped, unread, with the listener.
    // The path goes first, so no writer joins the backlog now: it is finite.
    remove_socket_file(path);
    let listener = match listener.into_std() {
        Ok(listener) => listener,
        Err(error) => return error!(%error, listener = %context.name, "could not take the backlog at the stop"),
    };
    // Until the agent stops reading (T/2), a connection waits for one of the `max_connections`
    // slots (open ones drain and free theirs). From then on a connection only takes in what is
    // already in its socket, so as many again may run beside them; they wait until the drain
    // deadline (`abandon`), when whatever is left cannot be read, let alone counted by record.
    let past_stop_reading = Arc::new(Semaphore::new(context.config.max_connections as usize));
    let (mut taken, mut unread): (u64, u64) = (0, 0);
    loop {
        taken += 1;
        if taken.is_multiple_of(64) {
            tokio::task::yield_now().await;
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) => {
                // Out of descriptors, most likely: the connections draining free some.
                warn!(%error, listener = %context.name, "could not take a connection from the backlog");
                tokio::select! {
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    _ = ingest.abandon.cancelled() => {
                        error!(listener = %context.name, "connections left in the backlog at the drain deadline, out of descriptors: not counted");
                        break;
                    }
                }
            }
        };
        let Some(slot) = backlog_slot(&slots, &past_stop_reading, &ingest).await else {
            context.metrics.refused(ConnectionRefused::MaxConnections);
            unread += 1;
            if unread >= UNREAD_MOST {
                // Only a socket with a second name (a hard link) keeps a backlog coming now.
                break;
            }
            continue;
        };
        match stream.set_nonblocking(true).and_then(|()| UnixStream::from_std(stream)) {
            Ok(stream) => serve(stream, slot),
            Err(error) => {
                warn!(%error, listener = %context.name, "could not take a connection from the backlog");
                context.metrics.refused(ConnectionRefused::MaxConnections);
                unread += 1;
            }
        }
    }
    if unread > 0 {
        // Never read, so their records cannot be counted one by one: the connections are
        // (`refused`, `max_connections`).
        error!(listener = %context.name, connections = unread, "connections left unread in the backlog at the drain deadline");
    }
}

/// A slot for a connection taken from the backlog at the stop: one of the listener's own while
/// the agent reads, or, once it has stopped reading, one of as many again (`past_stop_reading`);
/// none at the drain deadline.
async fn backlog_slot(
    slots: &Arc<Semaphore>,
    past_stop_reading: &Arc<Semaphore>,
    ingest: &IngestContext,
) -> Option<OwnedSemaphorePermit> {
    if ingest.abandon.is_cancelled() {
        return None;
    }
    if let Ok(slot) = slots.clone().try_acquire_owned() {
        return Some(slot);
    }
    tokio::select! {
        biased;
        _ = ingest.abandon.cancelled() => return None,
        slot = slots.clone().acquire_owned() => return slot.ok(),
        _ = ingest.stop_reading.cancelled() => {}
    }
    tokio::select! {
        biased;
        _ = ingest.abandon.cancelled() => None,
        slot = slots.clone().acquire_owned() => slot.ok(),
        slot = past_stop_reading.clone().acquire_owned() => slot.ok(),
    }
}

/// Most backlog connections refused after the drain deadline: above any listener's backlog
/// (`somaxconn` is at most 65535 in a pod).
const UNREAD_MOST: u64 = 1 << 17;

/// How long the accept loop waits after a failed accept (EMFILE and friends) before the next.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// Removes a listener's socket file, so no writer can connect to it any more.
fn remove_socket_file(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => debug!(%error, "could not remove the socket file"),
    }
}

/// How often the buckets of connections and peers that stopped writing are freed.
const FORGET_IDLE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

async fn forget_idle_buckets(context: Arc<ListenerContext>, stop: CancellationToken) {
    let mut every = tokio::time::interval(FORGET_IDLE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.cancelled() => return,
        }
        if let Some(limits) = &context.limits {
            limits.forget_idle();
        }
    }
}

fn remove_stale_socket(path: &Path) -> Result<(), IngestError> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(IngestError::Bind { path: path.to_path_buf(), source }),
    };
    if !metadata.file_type().is_socket() {
        return Err(IngestError::NotASocket { path: path.to_path_buf() });
    }
    // A stream socket someone listens on accepts a connection; a datagram socket someone reads
    // accepts a zero-length datagram. Either means "in use".
    let in_use = std::os::unix::net::UnixStream::connect(path).is_ok()
        || std::os::unix::net::UnixDatagram::unbound().and_then(|probe| probe.send_to(&[], path)).is_ok();
    if in_use {
        return Err(IngestError::InUse { path: path.to_path_buf() });
    }
    info!(socket = %path.display(), "removing stale socket from a previous run");
    std::fs::remove_file(path).map_err(|source| IngestError::Bind { path: path.to_path_buf(), source })
}

/// Binds a socket so that it appears at `path` only with its final mode and group.
///
/// `bind()` creates the socket file with the permissions the process umask leaves, and chmod and
/// chown can only follow; done in place, that leaves a moment in which the socket can be
/// connected to by whoever the umask let in (with a umask of 000 or 002, other users or any
/// group), before `socket_mode` and `socket_group` apply. So the socket is bound inside a new
/// directory only this process can enter (0700, created beside `path`, so on the same
/// filesystem), given its mode and group there, and then linked into place: a writer finds
/// either no socket or the finished one.
///
/// Why not the umask: setting it around `bind()` would be simpler, but the umask belongs to the
/// whole process, and a file any other thread created meanwhile (a spool segment) would get it
/// too. Why a hard link rather than `rename()`: both are atomic, but `rename()` silently replaces
/// whatever reached `path` since [`remove_stale_socket`] looked (a regular file, another agent's
/// live socket), and `link()` fails instead, as `bind()` in place would have.
///
/// The directory is `.sluice-bind-<pid>-<n>`; one left by a crash of an earlier start with the
/// same pid (pid 1 in a container) is removed first. `mkdir` fails if the name exists, so the
/// socket is never bound in a directory this call did not create. The bound path is ~20 bytes
/// longer than `path`: a `path` close to the 107 bytes a socket address holds may fail to bind.
fn bind_private<S>(
    path: &Path,
    mode: u32,
    gid: Option<u32>,
    bind: impl FnOnce(&Path) -> io::Result<S>,
) -> io::Result<S> {
    use std::os::unix::fs::DirBuilderExt;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let private = dir.join(format!(".sluice-bind-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    match std::fs::remove_dir_all(&private) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    // A short name: the socket address holds at most 107 bytes of path.
    let temporary = private.join("s");
    let bound = bind(&temporary).and_then(|socket| {
        std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode))?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(&temporary, None, Some(gid))?;
        }
        std::fs::hard_link(&temporary, path)?;
        Ok(socket)
    });
    // The socket stays reachable through `path` (or was never bound): the private name goes.
    if let Err(error) = std::fs::remove_file(&temporary)
        && error.kind() != io::ErrorKind::NotFound
    {
        warn!(%error, socket = %temporary.display(), "could not remove the private name of a socket");
    }
    if let Err(error) = std::fs::remove_dir(&private) {
        warn!(%error, directory = %private.display(), "could not remove the directory the socket was bound in");
    }
    bound
}

/// A group given by number or by name (looked up in `/etc/group`: no libc call needed).
fn group_id(group: &str) -> Option<u32> {
    if let Ok(gid) = group.parse() {
        return Some(gid);
    }
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let gid = fields.nth(1)?;
        (name == group).then(|| gid.parse().ok()).flatten()
    })
}
