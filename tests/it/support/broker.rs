//! A Kafka broker of a test's own, from the stack's jars, so a test can stop and start it without
//! disturbing the tests that share the stack's broker.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{Process, Proxy, free_port};

/// A single-node KRaft broker on free loopback ports, with its data in a temp directory.
pub struct PrivateBroker {
    pub bootstrap: String,
    /// With [`PrivateBroker::start_sasl_ssl`]: the SASL_SSL listener and the CA that signed it.
    pub sasl_ssl: Option<(String, PathBuf)>,
    /// With [`PrivateBroker::start_sasl_ssl`]: a SASL_PLAINTEXT listener taking OAUTHBEARER
    /// tokens, checked by Kafka's unsecured-JWS validator (unsigned JWTs with `sub` and `exp`).
    pub oauthbearer: Option<String>,
    lib: PathBuf,
    process: Option<Process>,
    /// Last: fields drop in order, and the broker's log must outlive its process (a failing
    /// test prints it).
    dir: tempfile::TempDir,
}

impl PrivateBroker {
    /// Formats storage and starts the broker; returns once it answers a metadata request.
    pub async fn start() -> Self {
        Self::start_with(false, false).await.0
    }

    /// Like [`PrivateBroker::start`], with every client (bootstrap and the address the broker
    /// advertises) going through a [`Proxy`] the test controls: it can hold the broker's answers
    /// while its requests still arrive.
    pub async fn behind_proxy() -> (Self, Proxy) {
        let (broker, proxy) = Self::start_with(false, true).await;
        (broker, proxy.expect("a proxy"))
    }

    /// Like [`PrivateBroker::start`], with a second listener on SASL_SSL: SCRAM-SHA-512 user
    /// `sluice` (password [`SASL_PASSWORD`]) and a certificate for 127.0.0.1 signed by a CA the
    /// test generates; and a third on SASL_PLAINTEXT for OAUTHBEARER ([`PrivateBroker::oauthbearer`]).
    pub async fn start_sasl_ssl() -> Self {
        Self::start_with(true, false).await.0
    }

    async fn start_with(sasl_ssl: bool, proxied: bool) -> (Self, Option<Proxy>) {
        let lib = PathBuf::from(std::env::var("SLUICE_KAFKA_LIB").expect(
            "SLUICE_KAFKA_LIB is not set: fault tests run private brokers from the stack's jars (`scripts/stack env`)",
        ));
        let dir = tempfile::Builder::new().prefix("sluice-broker").tempdir().expect("tempdir");
        let (port, controller) = (free_port(), free_port());
        let template = std::fs::read_to_string(super::source_path("scripts/kafka/server.properties.in"))
            .expect("server.properties template");
        let properties = template
            .replace("@PORT@", &port.to_string())
            .replace("@CONTROLLER_PORT@", &controller.to_string())
            .replace("@DATA_DIR@", &dir.path().join("data").display().to_string());
        let mut properties = properties;
        let mut proxy = None;
        let mut bootstrap = format!("127.0.0.1:{port}");
        if proxied {
            let started = Proxy::start(([127, 0, 0, 1], port).into()).await;
            bootstrap = started.address.to_string();
            // Later keys override earlier ones when Java reads the file.
            properties.push_str(&format!("advertised.listeners=PLAINTEXT://{bootstrap}\n"));
            proxy = Some(started);
        }
        let mut secured = None;
        if sasl_ssl {
            let (sasl_port, oauth_port) = (free_port(), free_port());
            let ca = certificates(dir.path());
            // Later keys override earlier ones when Java reads the file. The OAUTH listener has
            // no server callback handler: Kafka's unsecured-JWS validator checks its tokens.
            properties.push_str(&format!(
                "listeners=PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl_port},OAUTH://127.0.0.1:{oauth_port},CONTROLLER://127.0.0.1:{controller}\n\
                 advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl_port},OAUTH://127.0.0.1:{oauth_port}\n\
                 listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,OAUTH:SASL_PLAINTEXT\n\
                 sasl.enabled.mechanisms=SCRAM-SHA-512,OAUTHBEARER\n\
                 listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512\n\
                 listener.name.oauth.sasl.enabled.mechanisms=OAUTHBEARER\n\
                 listener.name.oauth.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;\n\
                 listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
                 ssl.keystore.type=PEM\n\
                 ssl.keystore.location={}\n",
                dir.path().join("server.pem").display()
            ));
            secured = Some((format!("127.0.0.1:{sasl_port}"), ca, format!("127.0.0.1:{oauth_port}")));
        }
        std::fs::write(dir.path().join("server.properties"), properties).expect("write properties");
        let mut format = Command::new("java");
        format
            .arg("-cp")
            .arg(lib.join("*"))
            .args(["kafka.tools.StorageTool", "format", "--standalone", "--cluster-id", "c2x1aWNlLXRlc3QtYnJva2Vy"])
            .arg("--config")
            .arg(dir.path().join("server.properties"))
            .stdout(std::process::Stdio::null());
        if sasl_ssl {
            format.args(["--add-scram", &format!("SCRAM-SHA-512=[name=sluice,password={SASL_PASSWORD}]")]);
        }
        let status = format.status().expect("run kafka StorageTool");
        assert!(status.success(), "kafka storage format failed");
        let (sasl_ssl, oauthbearer) = match secured {
            Some((sasl, ca, oauth)) => (Some((sasl, ca)), Some(oauth)),
            None => (None, None),
        };
        let mut broker = Self { bootstrap, sasl_ssl, oauthbearer, dir, lib, process: None };
        broker.resume().await;
        (broker, proxy)
    }

    /// Starts the broker again after [`PrivateBroker::stop`].
    pub async fn resume(&mut self) {
        let mut command = Command::new("java");
        command
            .args(["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC"])
            .arg(format!("-Dlog4j2.configurationFile={}", super::source_path("scripts/kafka/log4j2.yaml").display()))
            .arg("-cp")
            .arg(self.lib.join("*"))
            .arg("kafka.Kafka")
            .arg(self.dir.path().join("server.properties"));
        self.process = Some(Process::start("kafka", command, self.dir.path()));
        self.wait_ready().await;
    }

    /// Freezes the broker (SIGSTOP): its connections stay open and nothing answers, as behind a
    /// network partition. Dropping the broker still kills it.
    pub fn freeze(&self) {
        if let Some(process) = &self.process {
            process.signal("STOP");
        }
    }

    /// Kills the broker (SIGKILL): a crash. [`PrivateBroker::resume`] starts it again on the same
    /// data.
    pub fn crash(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
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
}

/// The SCRAM password of the private broker's `sluice` user.
pub const SASL_PASSWORD: &str = "sluice-scram-secret";

/// A CA and a server certificate for 127.0.0.1 signed by it (openssl, PEM; the key in PKCS#8 as
/// Kafka's PEM keystore wants it). Returns the CA's path.
fn certificates(dir: &std::path::Path) -> PathBuf {
    let run = |args: &[&str]| {
        let status = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
        assert!(status.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&status.stderr));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "30",
        "-subj",
        "/CN=sluice test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").expect("write");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
    ]);
    run(&["pkcs8", "-topk8", "-nocrypt", "-in", "server.key", "-out", "server.pk8"]);
    let pem = std::fs::read_to_string(dir.join("server.pk8")).expect("key")
        + &std::fs::read_to_string(dir.join("server.crt")).expect("cert");
    std::fs::write(dir.join("server.pem"), pem).expect("write");
    dir.join("ca.pem")
}

impl PrivateBroker {
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
