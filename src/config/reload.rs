//! Config reload: on SIGHUP, or when the file's content changes. The file's folder is watched
//! with inotify (a Kubernetes ConfigMap update arrives as a swap of a `..data` symlink in it, an
//! editor writes or renames a file in it): any event there makes the watcher compare the file's
//! content with what runs. A slow poll (`SAFETY_POLL`) catches what inotify cannot see (the
//! folder itself replaced); without inotify the file is compared every `POLL_INTERVAL`. An idle
//! process so wakes once a minute for its config, not every two seconds (issue 15).
//!
//! Owns: noticing a new config, validating it (an invalid one is rejected and the old one keeps
//! running), and saying which keys changed and which of them a running process can take. Must
//! not: apply anything itself (the agent and the persister do, each for its own keys).

use std::path::PathBuf;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tracing::warn;

use super::{Config, ConfigError, Role, ShipConfig};
use crate::telemetry;
use crate::telemetry::outcome::Reload;

/// How often the file's content is compared with what is running when inotify is not available.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// How often it is compared anyway while inotify watches its folder.
const SAFETY_POLL: Duration = Duration::from_secs(60);

/// After an event in the folder, how long it must stay quiet before the file is read (an editor
/// that truncates, then writes, is read once, whole).
const SETTLE: Duration = Duration::from_millis(100);

impl Role {
    fn sections(self) -> &'static [&'static str] {
        match self {
            Role::Agent => &["log", "kafka", "agent", "ingest", "buffer", "ship"],
            Role::Persist => &["log", "kafka", "persist", "postgres"],
        }
    }

    /// Keys (or key prefixes ending in `.`) a running process of this role applies live.
    fn live(self) -> &'static [&'static str] {
        match self {
            // Ship settings and Kafka connection settings are applied by replacing the producer,
            // which hands every record it held back to the buffer: nothing is lost.
            Role::Agent => &[
                "log.level",
                "buffer.when_full",
                "buffer.block_timeout",
                "ship.",
                "kafka.brokers",
                "kafka.properties.",
                "kafka.topic",
                "kafka.default_topic",
                "kafka.max_topics",
            ],
            Role::Persist => {
                &["log.level", "persist.batch_max_records", "persist.batch_max_bytes", "persist.batch_max_wait"]
            }
        }
    }
}

/// Keys inside a live section that still need a restart: `ship.sink` (the shipper is built for
/// one sink at start).
const RESTART_ONLY: &[&str] = &["ship.sink"];

/// What a new config means for a running process.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The config to run from now on: the new values of live keys, the old values of the rest.
    pub effective: Config,
    /// Changed keys that take effect now.
    pub live: Vec<String>,
    /// Changed keys that need a restart (they keep their old values meanwhile).
    pub restart: Vec<String>,
}

/// Compares `new` with the running config for `role`.
pub fn plan(role: Role, running: &Config, new: &Config) -> Plan {
    let changed = changed_keys(running, new);
    let relevant: Vec<String> = changed
        .into_iter()
        .filter(|key| role.sections().iter().any(|section| key.split('.').next() == Some(*section)))
        .collect();
    let is_live = |key: &String| {
        !RESTART_ONLY.contains(&key.as_str())
            && role.live().iter().any(|live| if live.ends_with('.') { key.starts_with(live) } else { key == live })
    };
    let (live, restart): (Vec<String>, Vec<String>) = relevant.into_iter().partition(is_live);
    let mut effective = running.clone();
    if !live.is_empty() {
        effective.log.level = new.log.level.clone();
        match role {
            Role::Agent => {
                effective.buffer.when_full = new.buffer.when_full;
                effective.buffer.block_timeout = new.buffer.block_timeout;
                effective.ship = ShipConfig { sink: running.ship.sink, ..new.ship.clone() };
                effective.kafka.brokers = new.kafka.brokers.clone();
                effective.kafka.properties = new.kafka.properties.clone();
                effective.kafka.topic = new.kafka.topic.clone();
                effective.kafka.default_topic = new.kafka.default_topic.clone();
                effective.kafka.max_topics = new.kafka.max_topics;
            }
            Role::Persist => {
                effective.persist.batch_max_records = new.persist.batch_max_records;
                effective.persist.batch_max_bytes = new.persist.batch_max_bytes;
                effective.persist.batch_max_wait = new.persist.batch_max_wait;
            }
        }
    }
    Plan { effective, live, restart }
}

/// Dotted keys whose values differ between two configs.
pub fn changed_keys(old: &Config, new: &Config) -> Vec<String> {
    let (Ok(old), Ok(new)) = (toml::Value::try_from(old), toml::Value::try_from(new)) else {
        return vec!["<config>".into()];
    };
    let mut keys = Vec::new();
    diff("", &old, &new, &mut keys);
    keys
}

fn diff(prefix: &str, old: &toml::Value, new: &toml::Value, keys: &mut Vec<String>) {
    match (old, new) {
        (toml::Value::Table(old), toml::Value::Table(new)) => {
            let names: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
            for name in names {
                let key = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
                match (old.get(name), new.get(name)) {
                    (Some(a), Some(b)) => diff(&key, a, b, keys),
                    _ => keys.push(key),
                }
            }
        }
        (old, new) if old != new => keys.push(prefix.to_string()),
        _ => {}
    }
}

/// A short, stable fingerprint of a config (CRC-32C of its canonical TOML), for
/// `sluice_config_info{hash}` and logs.
pub fn fingerprint(config: &Config) -> String {
    let text = toml::to_string(config).unwrap_or_default();
    format!("{:08x}", crc32c::crc32c(text.as_bytes()))
}

/// Publishes the running config's fingerprint (and retires the previous one).
pub fn publish(previous: Option<&str>, current: &str) {
    if let Some(previous) = previous.filter(|previous| *previous != current) {
        metrics::gauge!(telemetry::CONFIG_INFO, "hash" => previous.to_string()).set(0.0);
    }
    metrics::gauge!(telemetry::CONFIG_INFO, "hash" => current.to_string()).set(1.0);
}

/// What `main` hands a subcommand so it can reload: the config file and the log filter.
pub struct Reloading {
    /// The config file to watch.
    pub path: PathBuf,
    /// Changes the log level; `None` when logging was set up by someone else (tests).
    pub log: Option<telemetry::LogHandle>,
    /// `sluice agent --dry-run`: every config read from the file is a dry run's too
    /// ([`Config::dry_run`]), whatever the file says.
    pub dry_run: bool,
}

impl Reloading {
    /// `event` with what the command line fixed applied, as at start.
    pub(crate) fn as_started(&self, event: Event) -> Event {
        match event {
            Event::Valid(mut config) if self.dry_run => {
                config.dry_run();
                Event::Valid(config)
            }
            other => other,
        }
    }
}

/// Counts one reload attempt by its result.
pub fn count(result: Reload) {
    metrics::counter!(telemetry::CONFIG_RELOADS, "result" => result.as_str()).increment(1);
}

/// Decides what to do with a watcher event: `None` when there is nothing to apply (rejected or
/// unchanged, already logged and counted), otherwise the plan.
fn judge(role: Role, running: &Config, event: Event) -> Option<Plan> {
    let new = match event {
        Event::Valid(new) => new,
        Event::Invalid(error) => {
            tracing::error!(%error, "config reload rejected; the running config stays");
            count(Reload::Rejected);
            return None;
        }
    };
    let plan = plan(role, running, &new);
    if !plan.restart.is_empty() {
        warn!(keys = ?plan.restart, "these settings change only with a restart; they keep their running values");
    }
    if plan.live.is_empty() {
        tracing::info!("config reloaded; nothing that runs changed");
        count(Reload::Unchanged);
        return None;
    }
    Some(plan)
}

/// Records an applied plan: the running config, its fingerprint, the log line and the count.
fn applied(previous: &Config, plan: Plan, running: &std::sync::RwLock<Config>) {
    let (before, after) = (fingerprint(previous), fingerprint(&plan.effective));
    publish(Some(&before), &after);
    tracing::info!(keys = ?plan.live, hash = %after, "config reloaded");
    *running.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = plan.effective;
    count(Reload::Applied);
}

/// Follows the config file at `path` until `stop`: each new config is judged for `role` against
/// `running`; an accepted plan is handed to `apply(current, effective)` for the keys the role
/// applies itself, then recorded as the running config. `apply` may refuse the plan whole, saying
/// why, before it changes anything (the agent does when librdkafka would not make a producer of
/// it): then it is counted rejected and the running config stays. The one reload loop of both
/// roles.
pub async fn follow(
    reloading: &Reloading,
    role: Role,
    running: &std::sync::RwLock<Config>,
    stop: tokio_util::sync::CancellationToken,
    mut apply: impl FnMut(&Config, &Config) -> Result<(), String>,
) {
    let mut watcher = match Watcher::new(reloading.path.clone()) {
        Ok(watcher) => watcher,
        Err(error) => return warn!(%error, "config reload disabled"),
    };
    // The watcher's first look at the file comes after the start's load: a change in between (a
    // ConfigMap updated as the pod starts) would otherwise pass for what runs. Apply it if so.
    if let Some(event) = watcher.load().await {
        let event = reloading.as_started(event);
        let current = running.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let unchanged = matches!(&event, Event::Valid(config) if **config == current);
        if !unchanged && let Some(plan) = judge(role, &current, event) {
            apply_or_refuse(&current, plan, running, &mut apply);
        }
    }
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => break,
            event = watcher.next() => reloading.as_started(event),
        };
        let current = running.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let Some(plan) = judge(role, &current, event) else { continue };
        apply_or_refuse(&current, plan, running, &mut apply);
    }
}

/// Hands `plan` to the role's `apply`; records it as running, or counts it rejected if `apply`
/// refused it.
fn apply_or_refuse(
    current: &Config,
    plan: Plan,
    running: &std::sync::RwLock<Config>,
    apply: &mut impl FnMut(&Config, &Config) -> Result<(), String>,
) {
    match apply(current, &plan.effective) {
        Ok(()) => applied(current, plan, running),
        Err(error) => {
            tracing::error!(%error, keys = ?plan.live, "config reload rejected; the running config stays");
            count(Reload::Rejected);
        }
    }
}

/// What the watcher saw.
#[derive(Debug)]
pub enum Event {
    /// A new, valid config.
    Valid(Box<Config>),
    /// A new config that does not validate; the old one keeps running.
    Invalid(ConfigError),
}

/// An inotify stream of the events in `path`'s folder that can change what `path` reads: a file
/// written, created, moved in or out, deleted (a symlink swap is a move).
fn watch_folder(path: &std::path::Path) -> std::io::Result<inotify::EventStream<Vec<u8>>> {
    use inotify::{Inotify, WatchMask};
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let inotify = Inotify::init()?;
    inotify.watches().add(
        &folder,
        WatchMask::CLOSE_WRITE
            | WatchMask::MODIFY
            | WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::ATTRIB
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF,
    )?;
    inotify.into_event_stream(vec![0u8; 4096])
}

/// Notices new configs: SIGHUP, or the file's content changing.
pub struct Watcher {
    path: PathBuf,
    last: Option<u32>,
    hangup: tokio::signal::unix::Signal,
    /// Events in the file's folder; `None`: inotify is not available, the file is polled.
    folder: Option<inotify::EventStream<Vec<u8>>>,
    /// The file's name in that folder: only events about it (or a ConfigMap's `..data` swap)
    /// count.
    name: std::ffi::OsString,
}

/// Whether an event in the config file's folder, about the entry `entry` (none: the folder
/// itself), can have changed the file: the file itself, or a Kubernetes ConfigMap's `..data`
/// symlink and `..<timestamp>` folders (the file is a symlink through them). Other files there —
/// a log the process writes every few milliseconds, say — kept the folder from ever being quiet
/// for `SETTLE`, and the file was then read at any moment, also between an editor's truncate
/// and its write (an empty file is a valid config: every key at its default).
pub fn concerns_the_file(entry: Option<&std::ffi::OsStr>, name: &std::ffi::OsStr) -> bool {
    entry.is_none_or(|entry| entry == name || entry.as_encoded_bytes().starts_with(b".."))
}

impl Watcher {
    /// Watches `path`, whose current content is what runs.
    pub fn new(path: PathBuf) -> std::io::Result<Self> {
        let last = std::fs::read(&path).ok().map(|bytes| crc32c::crc32c(&bytes));
        let folder = match watch_folder(&path) {
            Ok(stream) => Some(stream),
            Err(error) => {
                warn!(%error, path = %path.display(), "cannot watch the config file's folder with inotify; polling it every 2 s");
                None
            }
        };
        let name = path.file_name().map(std::ffi::OsStr::to_os_string).unwrap_or_default();
        Ok(Self { path, last, hangup: signal(SignalKind::hangup())?, folder, name })
    }

    /// Waits until the file may have changed: an event in its folder (then until the folder is
    /// quiet for `SETTLE`), or the poll's interval passed. True on SIGHUP.
    async fn wait(&mut self) -> bool {
        use futures_util::StreamExt;
        let Some(folder) = &mut self.folder else {
            return tokio::select! {
                _ = self.hangup.recv() => true,
                _ = tokio::time::sleep(POLL_INTERVAL) => false,
            };
        };
        let safety_poll = tokio::time::sleep(SAFETY_POLL);
        tokio::pin!(safety_poll);
        let event = loop {
            let event = tokio::select! {
                _ = self.hangup.recv() => return true,
                _ = &mut safety_poll => return false,
                event = folder.next() => event,
            };
            match &event {
                Some(Ok(event)) if !concerns_the_file(event.name.as_deref(), &self.name) => {}
                _ => break event,
            }
        };
        match event {
            Some(Ok(_)) => {
                // Until the file has been left alone for SETTLE.
                let mut quiet_until = tokio::time::Instant::now() + SETTLE;
                while let Ok(Some(Ok(event))) = tokio::time::timeout_at(quiet_until, folder.next()).await {
                    if concerns_the_file(event.name.as_deref(), &self.name) {
                        quiet_until = tokio::time::Instant::now() + SETTLE;
                    }
                }
            }
            Some(Err(error)) => {
                warn!(%error, "inotify failed; polling the config file every 2 s from now on");
                self.folder = None;
            }
            None => self.folder = None,
        }
        false
    }

    /// The config the file holds now (the bytes the watcher compares against), `None` if it
    /// cannot be read.
    async fn load(&mut self) -> Option<Event> {
        let bytes = tokio::fs::read(&self.path).await.ok()?;
        self.last = Some(crc32c::crc32c(&bytes));
        let path = self.path.clone();
        match tokio::task::spawn_blocking(move || Config::load(&path)).await {
            Ok(Ok(config)) => Some(Event::Valid(Box::new(config))),
            Ok(Err(error)) => Some(Event::Invalid(error)),
            Err(_) => None,
        }
    }

    /// Waits for the next new config. SIGHUP always reloads; otherwise only a change of the
    /// file's bytes does.
    pub async fn next(&mut self) -> Event {
        loop {
            let forced = self.wait().await;
            let bytes = match tokio::fs::read(&self.path).await {
                Ok(bytes) => bytes,
                Err(error) => {
                    if forced {
                        warn!(%error, path = %self.path.display(), "cannot read the config file to reload it");
                    }
                    continue;
                }
            };
            let checksum = crc32c::crc32c(&bytes);
            if !forced && self.last == Some(checksum) {
                continue;
            }
            self.last = Some(checksum);
            let path = self.path.clone();
            return match tokio::task::spawn_blocking(move || Config::load(&path)).await {
                Ok(Ok(config)) => Event::Valid(Box::new(config)),
                Ok(Err(error)) => Event::Invalid(error),
                Err(error) => Event::Invalid(ConfigError::Parse {
                    file: self.path.display().to_string(),
                    message: error.to_string(),
                }),
            };
        }
    }
}
