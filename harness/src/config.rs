//! The config file a child process reads, kept as a TOML table a test (or the benchmark) may
//! change before and between starts.
//!
//! Owns: the tests' config wired to the stack ([`TestConfig::new`]), an empty one for the
//! benchmark's own ([`TestConfig::empty`]), writing it to a file, and the admin addresses of
//! the processes started from it (every `admin_listen` is port 0). Must not: validate (the
//! binary does, as in production) or start anything but through [`crate::process`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::process::Process;
use crate::stack::{Services, unique};
use crate::wait::eventually;

/// The config both processes of a test read, as a TOML table tests may change.
pub struct TestConfig {
    /// The config.
    pub table: toml::Table,
    /// The test's folder: sockets, spool, config files, logs.
    pub dir: tempfile::TempDir,
    /// Environment for the processes started with this config (secrets, say).
    pub env: Vec<(String, String)>,
    /// What the agent and the persister last started from this config bound.
    admins: Mutex<Admins>,
}

#[derive(Default)]
struct Admins {
    agent: Option<SocketAddr>,
    persist: Option<SocketAddr>,
}

impl TestConfig {
    /// Agent and persister wired to the stack, on a fresh topic, schema, group and socket, their
    /// admin servers on ports the kernel picks.
    pub fn new(services: &Services, topic: &str) -> Self {
        let mut config = Self::empty("sluice-it");
        let text = format!(
            r#"
            [log]
            level = "info,librdkafka=warn"
            [kafka]
            brokers = "{kafka}"
            topic = "{topic}"
            [agent]
            admin_listen = "127.0.0.1:0"
            drain_timeout = "15s"
            [ingest.listeners.default]
            socket = "{socket}"
            [persist]
            admin_listen = "127.0.0.1:0"
            group_id = "{group}"
            batch_max_wait = "100ms"
            [persist.properties]
            "session.timeout.ms" = "6000"
            "heartbeat.interval.ms" = "500"
            [postgres]
            url = "{pg}"
            schema = "{schema}"
            "#,
            kafka = services.kafka,
            pg = services.pg,
            socket = config.dir.path().join("sluice.sock").display(),
            group = unique("group"),
            schema = unique("t"),
        );
        config.table = text.parse().expect("test config parses");
        // The stack's PostgreSQL offers TLS with its own CA: persisters use it, verified.
        if let Ok(ca) = std::env::var("SLUICE_TEST_PG_CA") {
            config.set("postgres", "ca_file", ca);
        }
        config
    }

    /// Nothing set yet, in a fresh folder named `prefix…` under the temp dir.
    pub fn empty(prefix: &str) -> Self {
        Self::empty_in(&std::env::temp_dir(), prefix)
    }

    /// Nothing set yet, in a fresh folder named `prefix…` in `parent`.
    pub fn empty_in(parent: &Path, prefix: &str) -> Self {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir_in(parent).expect("tempdir");
        Self { table: toml::Table::new(), dir, env: Vec::new(), admins: Mutex::default() }
    }

    /// Sets `section.key` to `value`.
    pub fn set(&mut self, section: &str, key: &str, value: impl Into<toml::Value>) -> &mut Self {
        let entry = self.table.entry(section).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        entry.as_table_mut().expect("section is a table").insert(key.to_string(), value.into());
        self
    }

    fn get(&self, section: &str, key: &str) -> &str {
        self.table[section][key].as_str().expect("string key")
    }

    /// Adds librdkafka property `key` to the persister's consumer (`[persist.properties]`),
    /// keeping the others (the test config's short session timeout among them).
    pub fn persist_property(&mut self, key: &str, value: &str) -> &mut Self {
        let persist = self.table.entry("persist").or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let persist = persist.as_table_mut().expect("persist is a table");
        let properties = persist.entry("properties").or_insert_with(|| toml::Value::Table(toml::Table::new()));
        properties.as_table_mut().expect("persist.properties is a table").insert(key.to_string(), value.into());
        self
    }

    /// Sets `key` of listener `name` (`[ingest.listeners.NAME]`), creating the listener.
    pub fn listener(&mut self, name: &str, key: &str, value: impl Into<toml::Value>) -> &mut Self {
        let ingest = self.table.entry("ingest").or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let ingest = ingest.as_table_mut().expect("ingest is a table");
        let listeners = ingest.entry("listeners").or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let listeners = listeners.as_table_mut().expect("listeners is a table");
        let entry = listeners.entry(name).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        entry.as_table_mut().expect("listener is a table").insert(key.to_string(), value.into());
        self
    }

    /// Adds listener `name` speaking `protocol` on a new socket in the test's directory; returns
    /// the socket path.
    pub fn add_listener(&mut self, name: &str, protocol: &str) -> PathBuf {
        let socket = self.dir.path().join(format!("{name}.sock"));
        self.listener(name, "protocol", protocol).listener(name, "socket", socket.display().to_string());
        socket
    }

    /// The default listener's socket.
    pub fn socket(&self) -> PathBuf {
        self.listener_socket("default")
    }

    /// Listener `name`'s socket.
    pub fn listener_socket(&self, name: &str) -> PathBuf {
        PathBuf::from(self.table["ingest"]["listeners"][name]["socket"].as_str().expect("socket path"))
    }

    fn listener_sockets(&self) -> Vec<PathBuf> {
        let listeners = self.table["ingest"]["listeners"].as_table().expect("listeners");
        listeners.keys().map(|name| self.listener_socket(name)).collect()
    }

    /// The admin address of the agent last started from this config ([`crate::start_agent`],
    /// [`TestConfig::spawn_agent_at`]). An agent started otherwise knows its own:
    /// [`Process::admin`].
    pub fn agent_admin(&self) -> SocketAddr {
        self.admins.lock().expect("admins").agent.expect("no agent started from this config yet: ask its Process")
    }

    /// The admin address of the persister last started from this config
    /// ([`crate::start_persister`]).
    pub fn persist_admin(&self) -> SocketAddr {
        self.admins.lock().expect("admins").persist.expect("no persister started from this config yet: ask its Process")
    }

    /// Records where the agent started from this config listens (done by the starters here; a
    /// test that runs the role in its own runtime, on a listener it bound, says it itself).
    pub fn started_agent(&self, admin: SocketAddr) {
        self.admins.lock().expect("admins").agent = Some(admin);
    }

    /// Records where the persister started from this config listens; see [`Self::started_agent`].
    pub fn started_persister(&self, admin: SocketAddr) {
        self.admins.lock().expect("admins").persist = Some(admin);
    }

    /// The PostgreSQL schema.
    pub fn schema(&self) -> String {
        self.get("postgres", "schema").to_string()
    }

    /// Writes the config to a new file in the test's directory.
    pub fn write(&self) -> PathBuf {
        let path = self.dir.path().join(format!("sluice-{}.toml", unique("cfg")));
        self.write_to(&path);
        path
    }

    /// Writes the config to `path` (replacing it).
    pub fn write_to(&self, path: &Path) {
        std::fs::write(path, toml::to_string(&self.table).expect("serialise config")).expect("write config");
    }

    /// Starts `sluice agent` on the config file at `path` (which a test may change later) and
    /// waits until it is listening on every socket.
    pub async fn spawn_agent_at(&self, path: &Path) -> Process {
        let args = ["agent", "--config", path.to_str().expect("utf-8 path")];
        let mut agent = Process::spawn_with_env("agent", &args, self.dir.path(), &self.env);
        self.started_agent(agent.wait_admin().await);
        for socket in self.listener_sockets() {
            eventually("socket", || async { socket.exists().then_some(()) }).await;
        }
        agent
    }
}
