//! Hot reload: SIGHUP and a changed file apply what can change live; an invalid file is
//! rejected and the old config keeps running; nothing is lost or duplicated across a reload.

use std::time::Duration;

use crate::support::*;
use sluice::telemetry;

/// An agent whose Kafka never answers, with a 64 KiB buffer: every record beyond a few hundred
/// is dropped, with the policy's name — an observable the reload changes.
fn offline(services: &Services) -> TestConfig {
    let mut config = TestConfig::new(services, &unique("reload"));
    config
        .set("kafka", "brokers", NO_BROKER)
        .set("buffer", "max_bytes", "64 KiB")
        .set("buffer", "when_full", "drop_newest")
        .listener("default", "max_record_size", "1 KiB")
        .set("agent", "drain_timeout", "1s");
    config
}

async fn send_numbered(config: &TestConfig, from: u64, count: u64) {
    let lines: Vec<Vec<u8>> = (from..from + count).map(|n| numbered("reload", n).into_bytes()).collect();
    send_lines(&config.socket(), &lines).await;
}

async fn wait_for_count(
    config: &TestConfig,
    name: &'static str,
    labels: &'static [(&'static str, &'static str)],
    at_least: f64,
) -> Metrics {
    let admin = config.agent_admin();
    eventually(name, || async {
        let metrics = scrape(admin).await;
        (metrics.count(name, labels) >= at_least).then_some(metrics)
    })
    .await
}

async fn running_config(config: &TestConfig) -> String {
    let (status, body) = http_get(config.agent_admin(), "/config").await.expect("/config");
    assert_eq!(status, 200);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_policy_rejects_an_invalid_file_and_keeps_restart_only_keys() {
    let services = services();
    let mut config = offline(&services);
    let path = config.dir.path().join("agent.toml");
    config.write_to(&path);
    let agent = config.spawn_agent_at(&path).await;

    send_numbered(&config, 0, 2000).await;
    wait_for_count(&config, telemetry::BUFFER_DROPPED, &[("reason", "drop_newest")], 1000.0).await;

    // A live key and a restart-only key change together.
    config.set("buffer", "when_full", "drop_oldest").listener("default", "socket_mode", "0600");
    config.write_to(&path);
    agent.signal("HUP");
    wait_for_count(&config, telemetry::CONFIG_RELOADS, &[("result", "applied")], 1.0).await;
    let shown = running_config(&config).await;
    assert!(shown.contains("when_full = \"drop_oldest\""), "{shown}");
    assert!(shown.contains("socket_mode = \"0660\""), "restart-only keys keep their running value:\n{shown}");
    assert!(agent.log_text().contains("ingest.listeners.default.socket_mode"), "the log names what needs a restart");

    let before = scrape(config.agent_admin()).await.count(telemetry::BUFFER_DROPPED, &[("reason", "drop_newest")]);
    send_numbered(&config, 2000, 2000).await;
    let after = wait_for_count(&config, telemetry::BUFFER_DROPPED, &[("reason", "drop_oldest")], 1000.0).await;
    assert_eq!(after.count(telemetry::BUFFER_DROPPED, &[("reason", "drop_newest")]), before, "the new policy rules");

    // An invalid file is rejected; the running config stays.
    std::fs::write(&path, "[buffer]\nwhen_full = \"sometimes\"\n").expect("write");
    agent.signal("HUP");
    wait_for_count(&config, telemetry::CONFIG_RELOADS, &[("result", "rejected")], 1.0).await;
    assert!(running_config(&config).await.contains("when_full = \"drop_oldest\""));
    let hash = after.0.lines().find(|l| l.starts_with("sluice_config_info{") && l.ends_with(" 1")).map(str::to_owned);
    let now = scrape(config.agent_admin()).await;
    assert_eq!(
        now.0.lines().find(|l| l.starts_with("sluice_config_info{") && l.ends_with(" 1")).map(str::to_owned),
        hash
    );
    assert!(agent.log_text().contains("config reload rejected"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_style_symlink_swap_is_applied_without_a_signal() {
    let services = services();
    let mut config = offline(&services);
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

    wait_for_count(&config, telemetry::CONFIG_RELOADS, &[("result", "applied")], 1.0).await;
    assert!(running_config(&config).await.contains("when_full = \"drop_oldest\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloading_producer_settings_under_load_loses_and_duplicates_nothing() {
    let services = services();
    let topic = unique("reloadload");
    create_topic(&services.kafka, &topic, 2).await;
    let mut config = TestConfig::new(&services, &topic);
    let path = config.dir.path().join("agent.toml");
    config.write_to(&path);
    let _persister = start_persister(&config).await;
    let mut agent = config.spawn_agent_at(&path).await;
    wait_ready(&mut agent, config.agent_admin()).await;
    let db = pg(&services, &config.schema()).await;

    let load = Load::start(&config.socket(), &topic, 2000, 2);
    for (round, linger) in ["20ms", "1ms", "50ms"].into_iter().enumerate() {
        tokio::time::sleep(Duration::from_secs(2)).await;
        config.set("ship", "linger", linger).set("ship", "compression", if round % 2 == 0 { "lz4" } else { "zstd" });
        config.write_to(&path);
        agent.signal("HUP");
        wait_for_count(&config, telemetry::CONFIG_RELOADS, &[("result", "applied")], (round + 1) as f64).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sent = load.stop().await;

    wait_for_rows(&db, sent as i64, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rows = db.query("SELECT payload FROM logs", &[]).await.expect("rows");
    let payloads: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    let mut numbers = numbers_in(&topic, &payloads);
    numbers.sort_unstable();
    assert_eq!(numbers, (0..sent).collect::<Vec<_>>(), "every record once across three producer replacements");
    assert!(agent.log_text().contains("kafka producer replaced with new settings"));
}
