//! The real `sluice` binary (or any other program) as a child process: started with its output
//! in a log file, its admin address read back from the process, waited for until ready,
//! stopped by pid (SIGTERM, then a wait), killed by pid when its handle drops.
//!
//! Owns: finding the binary, the admin address file each `agent` / `persist` child is told to
//! write (`SLUICE_AGENT__ADMIN_ADDRESS_FILE`, `SLUICE_PERSIST__ADMIN_ADDRESS_FILE`), readiness,
//! the log and its tail. Must not: stop a process by name, or leave one running when its
//! handle is gone.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::config::TestConfig;
use crate::stack::unique;
use crate::wait::WAIT;

/// How long [`http_get`] waits for an answer.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// The `sluice` binary: `SLUICE_BENCH_BINARY` (the release build the benchmark measures; a name
/// no test shell sets by habit), or the one cargo built beside the running executable (a
/// test binary in `target/<profile>/deps/`, or `sluice-bench` in `target/<profile>/`; cargo
/// builds a package's binaries before its integration tests).
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_BENCH_BINARY") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the running executable's path");
    let mut dir = exe.parent().expect("the executable's folder").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join("sluice")
}

/// A running child process; killed (by pid) when dropped.
pub struct Process {
    child: Option<Child>,
    /// Its stdout and stderr.
    pub log: PathBuf,
    /// What the test calls it (in messages and the log's name).
    pub name: &'static str,
    /// Where a `sluice agent` / `sluice persist` child writes the admin address it bound.
    admin_file: Option<PathBuf>,
    admin: OnceLock<SocketAddr>,
    /// Set once the child is known to have exited (and been reaped): its pid may then be
    /// another process's, so no signal goes to it.
    exited: OnceLock<ExitStatus>,
}

impl Process {
    /// Starts the `sluice` binary with `args`, its output in a log file in `dir`.
    pub fn spawn(name: &'static str, args: &[&str], dir: &Path) -> Self {
        Self::spawn_with_env(name, args, dir, &[])
    }

    /// Like [`Process::spawn`], with extra environment variables. An `agent` or `persist` child
    /// is told where to write the admin address it binds ([`Process::admin`]).
    pub fn spawn_with_env(name: &'static str, args: &[&str], dir: &Path, env: &[(String, String)]) -> Self {
        let mut command = Command::new(binary());
        command.args(args).envs(env.iter().map(|(k, v)| (k, v)));
        let role = match args.first() {
            Some(&"agent") => Some("AGENT"),
            Some(&"persist") => Some("PERSIST"),
            _ => None,
        };
        let admin_file = role.map(|role| {
            let file = dir.join(format!("{name}-{}.admin", unique("address")));
            command.env(format!("SLUICE_{role}__ADMIN_ADDRESS_FILE"), &file);
            file
        });
        let mut process = Self::start(name, command, dir);
        process.admin_file = admin_file;
        process
    }

    /// Starts any command, its output in a log file in `dir`.
    pub fn start(name: &'static str, mut command: Command, dir: &Path) -> Self {
        let log = dir.join(format!("{name}-{}.log", unique("log")));
        let file = std::fs::File::create(&log).expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|error| panic!("start {name}: {error}"));
        Self { child: Some(child), log, name, admin_file: None, admin: OnceLock::new(), exited: OnceLock::new() }
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(Ok(Some(status))) => {
                let _ = self.exited.set(status);
                false
            }
            _ => false,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).expect("running")
    }

    /// Sends `signal` (`TERM`, `HUP`, `STOP`…) to its pid; nothing once it is known to have
    /// exited (the pid is no longer ours: it may be reused).
    pub fn signal(&self, signal: &str) {
        if self.exited.get().is_some() {
            return;
        }
        let status =
            Command::new("kill").args([&format!("-{signal}"), &self.pid().to_string()]).status().expect("kill");
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// Waits for the process to exit by itself.
    pub async fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {limit:?}; log:\n{}",
                self.name,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then waits up to `limit` for the exit.
    pub async fn stop(&mut self, limit: Duration) -> ExitStatus {
        self.signal("TERM");
        self.wait(limit).await
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Everything it wrote so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log_text();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The admin address this `sluice agent` / `sluice persist` bound (its config says port 0),
    /// as a client reaches it (a wildcard address becomes loopback). Panics if the process has
    /// not written it yet: [`start_agent`], [`start_persister`] and
    /// [`TestConfig::spawn_agent_at`] return only once it has; else [`Process::wait_admin`].
    pub fn admin(&self) -> SocketAddr {
        self.bound_admin()
            .unwrap_or_else(|| panic!("{} has not written its admin address yet; log:\n{}", self.name, self.log_text()))
    }

    /// The admin address, once the process has written it.
    pub fn bound_admin(&self) -> Option<SocketAddr> {
        if let Some(address) = self.admin.get() {
            return Some(*address);
        }
        let address = read_address(self.admin_file.as_ref()?)?;
        Some(*self.admin.get_or_init(|| address))
    }

    /// Waits until the process has bound its admin server (bounded by [`WAIT`]); its address.
    pub async fn wait_admin(&mut self) -> SocketAddr {
        assert!(self.admin_file.is_some(), "{} is not a sluice agent or persister", self.name);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(address) = self.bound_admin() {
                return address;
            }
            assert!(self.running(), "{} exited before it bound its admin server; log:\n{}", self.name, self.log_text());
            assert!(
                Instant::now() < deadline,
                "{} bound no admin server within {WAIT:?}; log:\n{}",
                self.name,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The address in an admin address file (written whole: the process renames it into place).
fn read_address(file: &Path) -> Option<SocketAddr> {
    let mut address: SocketAddr = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    if address.ip().is_unspecified() {
        address.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    Some(address)
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        // A failing test shows what its processes said: the harness prints this with the failure.
        if std::thread::panicking() {
            eprintln!("--- last lines of {} ({}):", self.name, self.log.display());
            eprintln!("{}", self.log_tail(25));
        }
    }
}

/// Starts `sluice agent` on `config` and waits until it works ([`wait_ready`]: Kafka answers).
pub async fn start_agent(config: &TestConfig) -> Process {
    start_role("agent", config, TestConfig::started_agent).await
}

/// Starts `sluice persist` on `config` and waits until it works ([`wait_ready`]: PostgreSQL
/// answers, partitions assigned).
pub async fn start_persister(config: &TestConfig) -> Process {
    start_role("persist", config, TestConfig::started_persister).await
}

/// Starts the `role` subcommand on `config`, tells `config` where it listens, waits until ready.
async fn start_role(role: &'static str, config: &TestConfig, started: fn(&TestConfig, SocketAddr)) -> Process {
    let path = config.write();
    let mut process = Process::spawn_with_env(
        role,
        &[role, "--config", path.to_str().expect("utf-8 path")],
        config.dir.path(),
        &config.env,
    );
    let admin = process.wait_admin().await;
    started(config, admin);
    wait_ready(&mut process, admin).await;
    process
}

/// Waits until `/readyz` at `admin` answers 200 with a plain `ready`: the process is ready and
/// what it works with answers (a ready agent whose Kafka has not answered says so in the same
/// line, as does a persister with no partitions or PostgreSQL away: both are ready, and neither
/// does its work yet). Fails if `process` exits or [`WAIT`] passes.
pub async fn wait_ready(process: &mut Process, admin: SocketAddr) {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok((200, body)) = http_get(admin, "/readyz").await
            && body.trim() == "ready"
        {
            return;
        }
        assert!(process.running(), "{} exited; log:\n{}", process.name, process.log_text());
        assert!(Instant::now() < deadline, "{} not ready within {WAIT:?}; log:\n{}", process.name, process.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET path` from an admin server: status and body (`sluice::admin::client::get`, 10 s).
pub async fn http_get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    sluice::admin::client::get(address, path, HTTP_TIMEOUT).await.map(|response| (response.status, response.body))
}
