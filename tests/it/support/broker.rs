//! A Kafka broker of a test's own, from the stack's jars, so a test can stop and start it without
//! disturbing the tests that share the stack's broker.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{Process, free_port};

/// A single-node KRaft broker on free loopback ports, with its data in a temp directory.
pub struct PrivateBroker {
    pub bootstrap: String,
    dir: tempfile::TempDir,
    lib: PathBuf,
    process: Option<Process>,
}

impl PrivateBroker {
    /// Formats storage and starts the broker; returns once it answers a metadata request.
    pub async fn start() -> Self {
        let lib = PathBuf::from(std::env::var("SLUICE_KAFKA_LIB").expect(
            "SLUICE_KAFKA_LIB is not set: fault tests run private brokers from the stack's jars (`scripts/stack env`)",
        ));
        let dir = tempfile::Builder::new().prefix("sluice-broker").tempdir().expect("tempdir");
        let (port, controller) = (free_port(), free_port());
        let template =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka/server.properties.in"))
                .expect("server.properties template");
        let properties = template
            .replace("@PORT@", &port.to_string())
            .replace("@CONTROLLER_PORT@", &controller.to_string())
            .replace("@DATA_DIR@", &dir.path().join("data").display().to_string());
        std::fs::write(dir.path().join("server.properties"), properties).expect("write properties");
        let status = Command::new("java")
            .arg("-cp")
            .arg(lib.join("*"))
            .args(["kafka.tools.StorageTool", "format", "--standalone", "--cluster-id", "c2x1aWNlLXRlc3QtYnJva2Vy"])
            .arg("--config")
            .arg(dir.path().join("server.properties"))
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run kafka StorageTool");
        assert!(status.success(), "kafka storage format failed");
        let mut broker = Self { bootstrap: format!("127.0.0.1:{port}"), dir, lib, process: None };
        broker.resume().await;
        broker
    }

    /// Starts the broker again after [`PrivateBroker::stop`].
    pub async fn resume(&mut self) {
        let mut command = Command::new("java");
        command
            .args(["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC"])
            .arg(format!("-Dlog4j2.configurationFile={}/scripts/kafka/log4j2.yaml", env!("CARGO_MANIFEST_DIR")))
            .arg("-cp")
            .arg(self.lib.join("*"))
            .arg("kafka.Kafka")
            .arg(self.dir.path().join("server.properties"));
        self.process = Some(Process::start("kafka", command, self.dir.path()));
        self.wait_ready().await;
    }

    /// Stops the broker (SIGTERM, then SIGKILL after 30 s).
    pub async fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal("TERM");
            let deadline = Instant::now() + Duration::from_secs(30);
            while process.running() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            process.kill();
        }
    }

    async fn wait_ready(&mut self) {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", "sluice-test-probe")
            .create()
            .expect("probe client");
        // Generous: on two cores shared with several JVMs and agents a broker start can crawl.
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let probe = tokio::task::block_in_place(|| consumer.fetch_metadata(None, Duration::from_secs(2)));
            if probe.is_ok_and(|metadata| !metadata.brokers().is_empty()) {
                return;
            }
            if Instant::now() >= deadline {
                let log = self.process.as_ref().map(Process::log_text).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(60).collect();
                panic!(
                    "private kafka did not start; last log lines:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}
