//! A PostgreSQL server of a test's own (the stack's binaries, a temp data directory, a free
//! loopback port), so the soak can stop it with `pg_ctl stop -m immediate` — a crash — without
//! disturbing the tests that share the stack's server; and a streaming-replication standby of
//! one, which a test can promote (a primary switch, as Patroni or pg_auto_failover make one).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::free_port;

pub struct PrivatePostgres {
    pub port: u16,
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    dir: tempfile::TempDir,
}

/// The newest installed server's binaries (`scripts/stack` installs them).
fn bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("/usr/lib/postgresql: scripts/stack up installs PostgreSQL")
        .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
        .filter(|dir| dir.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|dir| dir.parent().and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok()).unwrap_or(0));
    dirs.pop().expect("an installed PostgreSQL")
}

/// PostgreSQL refuses to run as root: as root, its commands run as the `postgres` user, from `/`.
fn as_postgres(program: &Path) -> Command {
    let root = running_as_root();
    let mut command = if root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    };
    command.current_dir("/");
    command
}

/// A temp directory the server's user owns (as root: the `postgres` user).
fn owned_tempdir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("sluice-pg").tempdir().expect("tempdir");
    if running_as_root() {
        let status = Command::new("chown").args(["-R", "postgres:"]).arg(dir.path()).status().expect("chown");
        assert!(status.success(), "chown the postgres directory");
    }
    dir
}

fn running_as_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|out| out.stdout.starts_with(b"0\n"))
}

impl PrivatePostgres {
    /// Creates a cluster (`track_commit_timestamp` on, so a row's commit time can be read) and
    /// starts it with database `sluice`.
    pub async fn start() -> Self {
        let server = Self::made_by(
            "initdb",
            &["-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync"],
        );
        server.resume().await;
        server.admin().await.batch_execute("CREATE DATABASE sluice").await.expect("create database");
        server
    }

    /// A hot standby of `primary` (`pg_basebackup -R`: streaming replication), started, and made
    /// the primary's synchronous standby: from here on a commit the primary acknowledges is on
    /// the standby too, so promoting it loses no acknowledged write.
    pub async fn standby_of(primary: &PrivatePostgres) -> Self {
        let port = primary.port.to_string();
        let standby = Self::made_by(
            "pg_basebackup",
            &["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-R", "-X", "stream", "-c", "fast", "--no-sync"],
        );
        standby.resume().await;
        let admin = primary.admin().await;
        // Two statements: ALTER SYSTEM refuses to run in the implicit transaction of a batch.
        admin
            .batch_execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            .await
            .expect("make the standby synchronous");
        admin.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
        let deadline = Instant::now() + Duration::from_secs(60);
        while admin
            .query("SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'", &[])
            .await
            .expect("pg_stat_replication")
            .is_empty()
        {
            assert!(Instant::now() < deadline, "the standby never became synchronous; log:\n{}", standby.log_tail());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        standby
    }

    /// A cluster (not started) whose data directory `tool` (`initdb`, `pg_basebackup`) makes with
    /// `-D <data>` and `args`, in a temp directory of its own, on a free port.
    fn made_by(tool: &str, args: &[&str]) -> Self {
        let (dir, bin) = (owned_tempdir(), bin());
        let (data, log) = (dir.path().join("data"), dir.path().join("postgres.log"));
        let output = as_postgres(&bin.join(tool)).arg("-D").arg(&data).args(args).output().expect(tool);
        assert!(output.status.success(), "{tool}: {}", String::from_utf8_lossy(&output.stderr));
        Self { port: free_port(), bin, data, log, dir }
    }

    /// `pg_ctl promote`: the standby leaves recovery and takes writes.
    pub fn promote(&self) {
        let output = as_postgres(&self.bin.join("pg_ctl"))
            .arg("promote")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "60"])
            .output()
            .expect("pg_ctl promote");
        assert!(
            output.status.success(),
            "pg_ctl promote: {}\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.log_tail()
        );
    }

    /// A session in database `postgres`.
    async fn admin(&self) -> tokio_postgres::Client {
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port);
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(connection);
        client
    }

    /// The URL of database `sluice`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/sluice", self.port)
    }

    pub fn address(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// Starts the server (again) and waits until it answers. `synchronous_commit` stays on: with
    /// it off, a crash loses the last commits PostgreSQL already acknowledged (the first soak
    /// run found ACKed records missing that way). `fsync` may be off: a crash of the server's
    /// processes keeps the kernel's page cache.
    pub async fn resume(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=100 -c fsync=off \
             -c full_page_writes=off -c track_commit_timestamp=on",
            self.port,
            self.dir.path().display()
        );
        let status = as_postgres(&self.bin.join("pg_ctl"))
            .arg("start")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", "120", "-o", &options])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("pg_ctl start");
        assert!(status.success(), "pg_ctl start; log:\n{}", self.log_tail());
        let deadline = Instant::now() + Duration::from_secs(120);
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port);
        while tokio_postgres::connect(&url, tokio_postgres::NoTls).await.is_err() {
            assert!(Instant::now() < deadline, "postgres does not answer; log:\n{}", self.log_tail());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `pg_ctl stop -m immediate`: every backend is killed, recovery runs at the next start.
    pub fn crash(&self) {
        let _ = as_postgres(&self.bin.join("pg_ctl"))
            .arg("stop")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().rev().take(30).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.crash();
    }
}
