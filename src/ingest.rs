//! Ingest: the Unix stream socket apps write to.
//!
//! Owns: binding the socket (creating its directory, replacing only a stale socket file, setting
//! its mode), accepting connections, and one task per connection that frames, validates and
//! wraps records before handing them to the [`Buffer`]. Must not: block a reader on anything but
//! the buffer's `block` policy, hold more than one record's worth of unread bytes per
//! connection, let one connection's error reach the listener, or log record payloads.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, warn};

use crate::buffer::Buffer;
use crate::config::{IngestConfig, KeySource, ShipConfig};
use crate::envelope::{EnvelopeWriter, PodMetadata};
use crate::telemetry;

pub mod connection;
pub mod framing;

/// Why the socket could not be set up.
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
    /// Binding or setting the mode failed.
    #[error("cannot bind {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// What every connection task needs, shared.
pub struct IngestContext {
    /// Where records go.
    pub buffer: Buffer,
    /// Wraps lines into envelopes and numbers them.
    pub envelopes: EnvelopeWriter,
    /// Longest record accepted.
    pub max_record_size: usize,
    /// How the Kafka key is chosen; a config reload may change it.
    pub key: std::sync::RwLock<KeyRule>,
    /// When acknowledged-mode writers hear that a record is safe.
    pub ack_point: crate::buffer::ack::AckPoint,
    /// Cancelled when the drain deadline passes: a reader still waiting for buffer room gives
    /// up its record (counted as `reason="drain_timeout"`) instead of waiting forever.
    pub abandon: CancellationToken,
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
        }
    }
}

/// A bound ingest socket, ready to accept.
pub struct Listener {
    listener: UnixListener,
    path: PathBuf,
}

impl Listener {
    /// Binds the socket at `config.socket`: creates the directory, removes a stale socket left by
    /// a previous run (never a regular file, never a socket someone still listens on), binds, and
    /// sets the mode.
    pub fn bind(config: &IngestConfig) -> Result<Self, IngestError> {
        let path = config.socket.clone();
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|source| IngestError::CreateDir { path: dir.to_path_buf(), source })?;
        }
        remove_stale_socket(&path)?;
        let listener = UnixListener::bind(&path).map_err(|source| IngestError::Bind { path: path.clone(), source })?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(config.socket_mode_bits()))
            .map_err(|source| IngestError::Bind { path: path.clone(), source })?;
        info!(socket = %path.display(), mode = %config.socket_mode, "ingest socket listening");
        Ok(Self { listener, path })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts connections until `stop` is cancelled, spawning one task per connection on
    /// `tracker`. Connection tasks get `stop` too and drain their socket before closing.
    pub async fn serve(self, context: Arc<IngestContext>, tracker: TaskTracker, stop: CancellationToken) {
        let connections = metrics::counter!(telemetry::INGEST_CONNECTIONS);
        let mut next_id: u64 = 0;
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = self.listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, _)) => {
                    next_id += 1;
                    connections.increment(1);
                    let span = tracing::info_span!("connection", id = next_id);
                    tracker.spawn(connection::serve(stream, context.clone(), stop.clone()).instrument(span));
                }
                Err(error) => {
                    // EMFILE and friends: back off instead of spinning; the listener survives.
                    warn!(%error, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
        drop(self.listener);
        if let Err(error) = std::fs::remove_file(&self.path) {
            debug!(%error, "could not remove the socket file");
        }
        info!("ingest socket closed");
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
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(IngestError::InUse { path: path.to_path_buf() });
    }
    info!(socket = %path.display(), "removing stale socket from a previous run");
    std::fs::remove_file(path).map_err(|source| IngestError::Bind { path: path.to_path_buf(), source })
}
