//! The command line: `sluice check-config` and start-up failures.

use std::process::Command;

use crate::support::*;

fn sluice(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).args(args).output().expect("run sluice")
}

#[test]
fn check_config_prints_the_effective_config_with_secrets_redacted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, "[postgres]\nurl = \"postgres://app:s3cret@db/logs\"\n[buffer]\nmax_bytes = \"8 MiB\"\n")
        .expect("write");
    let output = sluice(&["check-config", path.to_str().expect("path")]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("max_bytes = \"8.0 MiB\""), "{shown}");
    assert!(shown.contains("when_full = \"block\""), "defaults are shown too: {shown}");
    assert!(!shown.contains("s3cret"), "{shown}");
}

#[test]
fn check_config_exits_78_ex_config_with_one_line_naming_the_key_and_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("typo.toml");
    std::fs::write(&path, "[buffer]\nwhen_ful = \"drop_newest\"\n").expect("write");
    let output = sluice(&["check-config", path.to_str().expect("path")]);
    assert_eq!(output.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("typo.toml") && stderr.contains("buffer.when_ful"), "{stderr}");
}

/// Issue 12, item 2: this config passed, and a 450 KiB line then waited forever (librdkafka's
/// queue, a fifth of 2 MiB, could never take its envelope).
#[test]
fn check_config_refuses_a_budget_too_small_for_the_largest_record_naming_both_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("small.toml");
    std::fs::write(
        &path,
        "[buffer]\nmax_bytes = \"2 MiB\"\n[ingest.listeners.default]\nmax_record_size = \"512 KiB\"\n",
    )
    .expect("write");
    let output = sluice(&["check-config", path.to_str().expect("path")]);
    assert_eq!(output.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("buffer.max_bytes") && stderr.contains("ingest.listeners.default.max_record_size"),
        "{stderr}"
    );
}

#[test]
fn agent_with_a_bad_environment_override_exits_78_naming_the_variable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ok.toml");
    std::fs::write(&path, "").expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["agent", "--config", path.to_str().expect("path")])
        .env("SLUICE_BUFFER__WHEN_FULL", "sometimes")
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&output.stderr).contains("SLUICE_BUFFER__WHEN_FULL"));
}

/// Found trying the binary as a new user would (issue 33): `check-config FILE | head` panicked
/// on the closed pipe (exit 101 and a backtrace).
#[test]
fn check_config_into_a_pipe_closed_early_exits_quietly() {
    use std::io::Read as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ok.toml");
    std::fs::write(&path, "").expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check-config", path.to_str().expect("path")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    // A reader gone before the output comes (`| head` that has its lines): the pipe is closed
    // while the config is still being read.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("stderr");
    let status = child.wait().expect("exit");
    assert!(status.success(), "{status}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn help_lists_the_exit_codes() {
    let output = sluice(&["--help"]);
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("Exit codes:") && help.contains("78") && help.contains("EX_CONFIG"), "{help}");
}

#[test]
fn agent_refuses_to_replace_a_regular_file_at_the_socket_path() {
    let services = services();
    let config = TestConfig::new(&services, &unique("unused"));
    std::fs::write(config.socket(), "precious").expect("write");
    let path = config.write();
    let output = sluice(&["agent", "--config", path.to_str().expect("path")]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("not a socket"));
    assert_eq!(std::fs::read_to_string(config.socket()).expect("still there"), "precious");
}

#[test]
fn the_production_shaped_examples_pass_check_config_with_their_secret_set() {
    for file in ["agent-disk-sasl.toml", "persist-tls.toml"] {
        let path = source_path("config/examples").join(file).display().to_string();
        let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["check-config", &path])
            .env("SLUICE_KAFKA_SASL_PASSWORD", "hunter2")
            .output()
            .expect("run");
        assert!(output.status.success(), "{file}: {}", String::from_utf8_lossy(&output.stderr));
        let shown = String::from_utf8_lossy(&output.stdout);
        assert!(!shown.contains("hunter2"), "the secret never shows: {shown}");
        // Without the Secret's variable the config is refused, naming it.
        let output = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["check-config", &path]).output().expect("run");
        assert_eq!(output.status.code(), Some(78));
        assert!(String::from_utf8_lossy(&output.stderr).contains("SLUICE_KAFKA_SASL_PASSWORD"));
    }
}

/// Issue 33: a config checked in CI, away from its secrets and from the shell's overrides.
#[test]
fn check_config_no_env_checks_the_file_alone_without_its_secrets() {
    let path = source_path("config/examples/agent-disk-sasl.toml").display().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check-config", "--no-env", &path])
        .env_remove("SLUICE_KAFKA_SASL_PASSWORD")
        .env("SLUICE_BUFFER__WHEN_FULL", "sometimes")
        .output()
        .expect("run");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.starts_with("# environment: not read (--no-env)"), "{shown}");
    assert!(!shown.contains("sometimes"), "the override is not applied: {shown}");
    // The file's own mistakes are still found.
    let dir = tempfile::tempdir().expect("tempdir");
    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "[buffer]\nwhen_ful = \"drop_newest\"\n").expect("write");
    let output = sluice(&["check-config", "--no-env", typo.to_str().expect("path")]);
    assert_eq!(output.status.code(), Some(78));
}

#[test]
fn check_config_says_which_postgres_tls_is_in_effect_and_stays_valid_toml() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (postgres, expected) in [
        (
            "url = \"postgres://app@db/logs\"\nca_file = \"/etc/ca.crt\"\n",
            "# postgres TLS: required (ca_file is set and the URL sets no sslmode): certificate and host name \
             verified against the system's CAs and ca_file /etc/ca.crt\n",
        ),
        ("url = \"postgres://app@db/logs\"\n", "# postgres TLS: prefer (the URL sets no sslmode): "),
    ] {
        let path = dir.path().join("persist.toml");
        std::fs::write(&path, format!("[postgres]\n{postgres}")).expect("write");
        let output = sluice(&["check-config", path.to_str().expect("path")]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let shown = String::from_utf8_lossy(&output.stdout);
        assert!(shown.starts_with(expected), "{shown}");
        let again: toml::Table = toml::from_str(&shown).unwrap_or_else(|error| panic!("{error}: {shown}"));
        assert!(again.contains_key("postgres"), "{shown}");
    }
    // What the persister subscribes to, derived from a templated topic.
    let path = dir.path().join("topics.toml");
    std::fs::write(&path, "[kafka]\ntopic = \"logs.{record.app}\"\ndefault_topic = \"logs.other\"\n").expect("write");
    let output = sluice(&["check-config", path.to_str().expect("path")]);
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("# persister subscribes to: ^logs\\..*$, logs.other\n"), "{shown}");
}

/// Issue 33: a platform team sees what a config would ship — the topic its template picks, the
/// masking, a multiline join — with no Kafka at all (`kafka.brokers` names a closed port).
#[tokio::test]
async fn dry_run_prints_each_record_as_shipped_without_kafka_and_counts_it_delivered() {
    let mut config = TestConfig::empty("sluice-dry-run");
    config
        .set("kafka", "brokers", sluice_harness::NO_BROKER)
        .set("kafka", "topic", "logs.{record.service}")
        .set("kafka", "default_topic", "logs.other")
        .set("agent", "admin_listen", "127.0.0.1:0");
    let socket = config.add_listener("default", "lines");
    let mut multiline = toml::Table::new();
    multiline.insert("preset".into(), "java".into());
    multiline.insert("flush_timeout".into(), "200ms".into());
    config.listener("default", "multiline", toml::Value::Table(multiline));
    let rules: toml::Table = toml::from_str(r#"rules = [{ name = "email", preset = "email" }]"#).expect("rules");
    config.set("ingest", "redact", toml::Value::Table(rules));
    let path = config.write();
    let mut agent =
        Process::spawn("agent", &["agent", "--config", path.to_str().expect("path"), "--dry-run"], config.dir.path());
    agent.wait_admin().await;
    send_lines(
        &socket,
        &[
            b"ERROR payment failed".to_vec(),
            b"java.lang.IllegalStateException: no".to_vec(),
            b"\tat shop.Cart.pay(Cart.java:42)".to_vec(),
            br#"{"service":"billing","message":"sent to ada@example.com"}"#.to_vec(),
        ],
    )
    .await;
    let printed = sluice_harness::eventually("two records printed", || {
        let lines: Vec<serde_json::Value> = agent
            .log_text()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            // A printed record's envelope is an object ("agent starting" names its kind too).
            .filter(|line| line["envelope"].is_object())
            .collect();
        std::future::ready((lines.len() >= 2).then_some(lines))
    })
    .await;
    // In whichever order the multiline stage lets them go.
    let by_topic = |topic: &str| printed.iter().find(|line| line["topic"] == topic).expect(topic).clone();
    let (trace, billing) = (by_topic("logs.other"), by_topic("logs.billing"));
    assert_eq!(billing["topic"], "logs.billing", "{billing}");
    assert_eq!(billing["envelope"]["format"], "json", "{billing}");
    let message = billing["envelope"]["record"]["message"].as_str().expect("message");
    assert!(!message.contains("ada@example.com"), "masked before it is shipped: {message}");
    assert_eq!(trace["topic"], "logs.other", "no service field: the default topic: {trace}");
    assert_eq!(
        trace["envelope"]["record"]["message"],
        "ERROR payment failed\njava.lang.IllegalStateException: no\n\tat shop.Cart.pay(Cart.java:42)",
        "the stack trace joined into one record: {trace}"
    );
    // The line is printed before the delivery is counted.
    until_metric(agent.admin(), sluice::telemetry::SHIP_DELIVERED, &[], 2.0).await;
    assert!(agent.stop(WAIT).await.success(), "{}", agent.log_tail(20));
    let log = agent.log_text();
    assert!(!log.contains("kafka reachable") && !log.contains("127.0.0.1:1"), "Kafka was never asked: {log}");
    assert!(!log.contains("change only with a restart"), "{log}");
}

/// Found by the cold review (issue 33): `sluice agent --dry-run | head` — once the reader is
/// gone, each record was put back and printed again for ever, the buffer filled, the app was
/// held up and the agent never exited. Now it drains and exits non-zero, the record counted.
#[tokio::test]
async fn dry_run_into_a_closed_pipe_drains_and_exits_non_zero_counting_the_record() {
    let mut config = TestConfig::empty("sluice-dry-run-pipe");
    config.set("kafka", "brokers", sluice_harness::NO_BROKER).set(
        "agent",
        "admin_listen",
        format!("127.0.0.1:{}", free_port()),
    );
    let socket = config.add_listener("default", "lines");
    let path = config.write();
    let stderr = std::fs::File::create(config.dir.path().join("agent.log")).expect("log");
    let mut agent = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["agent", "--config", path.to_str().expect("path"), "--dry-run"])
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("run");
    drop(agent.stdout.take());
    sluice_harness::eventually("the socket", || std::future::ready(socket.exists().then_some(()))).await;
    send_lines(&socket, &[b"nobody reads this".to_vec()]).await;
    let waited = std::time::Instant::now();
    let status = loop {
        if let Some(status) = agent.try_wait().expect("wait") {
            break status;
        }
        if waited.elapsed() > WAIT {
            agent.kill().expect("kill the agent (by its pid)");
            panic!("the agent did not exit by itself");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let log = std::fs::read_to_string(config.dir.path().join("agent.log")).expect("log");
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("cannot print records to stdout"), "{log}");
    assert_eq!(final_count(&log, sluice::telemetry::SHIP_FAILED, &[("reason", "drain_timeout")]), 1.0, "{log}");
}
