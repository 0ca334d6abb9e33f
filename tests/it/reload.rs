//! Hot reload: SIGHUP and a changed file apply what can change live; an invalid file is
//! rejected and the old config keeps running; nothing is lost or duplicated across a reload.

use std::time::Duration;

use crate::support::*;
use sluice::telemetry;

/// An agent whose Kafka never answers, with a 64 KiB buffer: every record beyond a few hundred
/// is dropped, with the policy's name — an observable the reload changes.
async fn offline() -> Setup {
    Scenario::new("reload")
        .kafka_unreachable()
        .set("buffer", "max_bytes", "64 KiB")
        .set("buffer", "when_full", "drop_newest")
        .listener("default", "max_record_size", "1 KiB")
        .set("agent", "drain_timeout", "1s")
        .build()
        .await
}

async fn send_numbered(config: &TestConfig, from: u64, count: u64) {
    let lines: Vec<Vec<u8>> = (from..from + count).map(|n| numbered("reload", n).into_bytes()).collect();
    send_lines(&config.socket(), &lines).await;
}

async fn running_config(config: &TestConfig) -> String {
    let (status, body) = http_get(config.agent_admin(), "/config").await.expect("/config");
    assert_eq!(status, 200);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_policy_rejects_an_invalid_file_and_keeps_restart_only_keys() {
    let mut setup = offline().await;
    let config = &mut setup.config;
    let path = config.dir.path().join("agent.toml");
    config.write_to(&path);
    let agent = config.spawn_agent_at(&path).await;
    let admin = config.agent_admin();

    send_numbered(config, 0, 2000).await;
    until_metric_at_least(admin, telemetry::BUFFER_DROPPED, &[("reason", "drop_newest")], 1000.0).await;

    // A live key and a restart-only key change together.
    config.set("buffer", "when_full", "drop_oldest").listener("default", "socket_mode", "0600");
    config.write_to(&path);
    agent.signal("HUP");
    until_metric_at_least(admin, telemetry::CONFIG_RELOADS, &[("result", "applied")], 1.0).await;
    let shown = running_config(config).await;
    assert!(shown.contains("when_full = \"drop_oldest\""), "{shown}");
    assert!(shown.contains("socket_mode = \"0660\""), "restart-only keys keep their running value:\n{shown}");
    assert!(agent.log_text().contains("ingest.listeners.default.socket_mode"), "the log names what needs a restart");

    let before = scrape(config.agent_admin()).await.count(telemetry::BUFFER_DROPPED, &[("reason", "drop_newest")]);
    send_numbered(config, 2000, 2000).await;
    let after = until_metric_at_least(admin, telemetry::BUFFER_DROPPED, &[("reason", "drop_oldest")], 1000.0).await;
    assert_eq!(after.count(telemetry::BUFFER_DROPPED, &[("reason", "drop_newest")]), before, "the new policy rules");

    // An invalid file is rejected; the running config stays.
    std::fs::write(&path, "[buffer]\nwhen_full = \"sometimes\"\n").expect("write");
    agent.signal("HUP");
    until_metric_at_least(admin, telemetry::CONFIG_RELOADS, &[("result", "rejected")], 1.0).await;
    assert!(running_config(config).await.contains("when_full = \"drop_oldest\""));
    let hash = after
        .0
        .lines()
        .find(|l| l.starts_with(&format!("{}{{", telemetry::CONFIG_INFO)) && l.ends_with(" 1"))
        .map(str::to_owned);
    let now = scrape(config.agent_admin()).await;
    assert_eq!(
        now.0
            .lines()
            .find(|l| l.starts_with(&format!("{}{{", telemetry::CONFIG_INFO)) && l.ends_with(" 1"))
            .map(str::to_owned),
        hash
    );
    assert!(agent.log_text().contains("config reload rejected"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_style_symlink_swap_is_applied_without_a_signal() {
    let mut setup = offline().await;
    let config = &mut setup.config;
    // What a ConfigMap volume looks like: agent.toml -> ..data/agent.toml, ..data -> ..v1.
    let root = config.dir.path().join("configmap");
    std::fs::create_dir_all(root.join("..v1")).expect("dir");
    config.write_to(&root.join("..v1/agent.toml"));
    std::os::unix::fs::symlink("..v1", root.join("..data")).expect("symlink");
    std::os::unix::fs::symlink("..data/agent.toml", root.join("agent.toml")).expect("symlink");
    let _agent = config.spawn_agent_at(&root.join("agent.toml")).await;

    config.set("buffer", "when_full", "drop_oldest");
    std::fs::create_dir_all(root.join("..v2")).expect("dir");
    config.write_to(&root.join("..v2/agent.toml"));
    std::os::unix::fs::symlink("..v2", root.join("..data_tmp")).expect("symlink");
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).expect("atomic swap");

    until_metric_at_least(config.agent_admin(), telemetry::CONFIG_RELOADS, &[("result", "applied")], 1.0).await;
    assert!(running_config(config).await.contains("when_full = \"drop_oldest\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloading_producer_settings_under_load_loses_and_duplicates_nothing() {
    let mut setup = Scenario::new("reloadload").partitions(2).build().await;
    let _persister = setup.persister().await;
    let (path, mut agent) = setup.listening_agent().await;
    let admin = setup.config.agent_admin();
    wait_ready(&mut agent, admin).await;
    let db = setup.db().await;

    let load = Load::start(&setup.config.socket(), &setup.topic, 2000, 2);
    for (round, linger) in ["10ms", "1ms", "50ms"].into_iter().enumerate() {
        // Each producer ships load before it is replaced.
        ships_a_second_more(admin).await;
        let compression = if round % 2 == 0 { "lz4" } else { "zstd" };
        setup.config.set("ship", "linger", linger).set("ship", "compression", compression);
        setup.config.write_to(&path);
        agent.signal("HUP");
        until_metric_at_least(admin, telemetry::CONFIG_RELOADS, &[("result", "applied")], (round + 1) as f64).await;
    }
    ships_a_second_more(admin).await;
    let sent = load.stop().await;

    until_rows_within(&db, sent as i64, Duration::from_secs(120)).await;
    until_nothing_left(&setup.config).await;
    let payloads: Vec<String> = column(&db, "SELECT coalesce(record::text, message) FROM logs").await;
    let mut numbers = numbers_in(&setup.topic, &payloads);
    numbers.sort_unstable();
    assert_eq!(numbers, (0..sent).collect::<Vec<_>>(), "every record once across three producer replacements");
    assert!(agent.log_text().contains("kafka producer replaced with new settings"));
}

/// Issue 30, item 8 (cold review): a reload librdkafka refuses only across properties
/// (`max.in.flight = 6` with idempotence) was reported applied; every producer made from it then
/// failed, the shipper retried once a second and shipping collapsed for ever. It is refused whole:
/// the running producer keeps shipping. At start the same config is a config error (exit 78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_librdkafka_would_refuse_across_properties_is_refused_whole_and_shipping_goes_on() {
    let mut setup = Scenario::new("reloadrefused").build().await;
    let (path, mut agent) = setup.listening_agent().await;
    let admin = setup.config.agent_admin();
    wait_ready(&mut agent, admin).await;
    setup.config.set("ship", "properties", toml::Value::Table(toml::toml! { "max.in.flight" = "6" }));
    setup.config.write_to(&path);
    agent.signal("HUP");
    until_metric_at_least(admin, telemetry::CONFIG_RELOADS, &[("result", "rejected")], 1.0).await;
    let metrics = scrape(admin).await;
    assert_eq!(metrics.count(telemetry::CONFIG_RELOADS, &[("result", "applied")]), 0.0);
    assert!(agent.log_text().contains("librdkafka refuses the producer"), "{}", agent.log_text());
    send_lines(&setup.config.socket(), &[b"still shipping".to_vec()]).await;
    until_metric_at_least(admin, telemetry::SHIP_DELIVERED, &[], 1.0).await;
    assert!(!agent.log_text().contains("replacement producer"), "no producer was made from it");

    let started =
        Process::spawn("agent", &["agent", "--config", path.to_str().expect("utf-8")], setup.config.dir.path())
            .wait(Duration::from_secs(30))
            .await;
    assert_eq!(started.code(), Some(78), "at start it is a config error");
}

/// Waits until Kafka has acknowledged a second's load (2,000 records) more than when asked.
async fn ships_a_second_more(admin: std::net::SocketAddr) {
    let delivered = scrape(admin).await.count(telemetry::SHIP_DELIVERED, &[]);
    until_metric_at_least(admin, telemetry::SHIP_DELIVERED, &[], delivered + 2000.0).await;
}
