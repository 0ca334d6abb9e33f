//! What SREs see: real scrapes checked by promtool, and the dashboard and alert rules checked
//! against the metrics a real run exposes.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use crate::support::*;
use sluice::telemetry;

/// Every `sluice_*` and `process_*` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for prefix in [telemetry::PREFIX, "process_"] {
        let mut rest = text;
        while let Some(start) = rest.find(prefix) {
            let (before, tail) = rest.split_at(start);
            let end =
                tail.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
            // A name, not the end of a longer word.
            if !before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') && !tail[..end].ends_with('_') {
                names.insert(tail[..end].to_string());
            }
            rest = &tail[end..];
        }
    }
    names
}

fn promtool_check_metrics(scrape: &str) -> String {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package `prometheus`; scripts/test installs it)");
    child.stdin.take().expect("stdin").write_all(scrape.as_bytes()).expect("write scrape");
    let output = child.wait_with_output().expect("promtool");
    assert!(output.status.success(), "promtool check metrics failed");
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_scrapes_pass_promtool_and_name_every_metric_the_dashboard_and_alerts_use() {
    let pipeline = Scenario::new("observe")
        .partitions(2)
        .disk_buffer()
        .with(|config| {
            // Its series exist only where an `otlp` listener does; Unix socket only.
            config.add_listener("otlp", "otlp");
            config.listener("otlp", "addresses", toml::Value::Array(Vec::new()));
            // Masking and a typed column, whose series exist only when configured.
            let redact: toml::Table =
                toml::from_str(r#"rules = [{ name = "email", preset = "email" }]"#).expect("redact");
            config.set("ingest", "redact", toml::Value::Table(redact));
            let columns: toml::Table = toml::from_str(r#"n = { pointer = "/n", type = "bigint" }"#).expect("columns");
            config.set("persist", "columns", toml::Value::Table(columns));
        })
        .pipeline()
        .await;
    let (config, db) = (&pipeline.config, &pipeline.db);
    let lines: Vec<Vec<u8>> = (0..500).map(|n| numbered("observe", n).into_bytes()).collect();
    send_lines(&config.socket(), &lines).await;
    // Rejections and a dead letter, so those series carry values too: the agent refuses an
    // escaped U+0000 and a byte that is not UTF-8; another producer's message that is no envelope
    // is a dead letter.
    send_lines(&config.socket(), &[br#"{"nul":"\u0000 here"}"#.to_vec(), vec![0xff]]).await;
    produce(&services().kafka, &pipeline.topic, &[b"not an envelope".to_vec()]).await;
    until_rows(db, 500).await;
    // librdkafka's statistics arrive every 5 seconds.
    let (agent, persister) = until("statistics in both scrapes", || async {
        let agent = scrape(config.agent_admin()).await;
        let persister = scrape(config.persist_admin()).await;
        let (rtt, lag) = (agent.has(telemetry::librdkafka::BROKER_RTT), persister.has(telemetry::PERSIST_LAG_RECORDS));
        // A count follows what it counts by a moment (a delivery is counted after Kafka's answer,
        // which may come after the row).
        let delivered = agent.count(telemetry::SHIP_DELIVERED, &[]);
        let timed = agent.count(&format!("{}_count", telemetry::SHIP_DELIVERY_LATENCY), &[]);
        let refused = agent.count(telemetry::INGEST_REJECTED, &[("reason", "contains_nul")]);
        let settled = delivered == 500.0 && timed == 500.0 && refused == 1.0;
        if rtt && lag && settled {
            Ok((agent, persister))
        } else {
            Err(format!("broker rtt: {rtt}, lag: {lag}, delivered {delivered}, timed {timed}, refused {refused}"))
        }
    })
    .await;

    for scrape in [&agent.0, &persister.0] {
        let lint = promtool_check_metrics(scrape);
        assert!(lint.trim().is_empty(), "promtool has remarks:\n{lint}");
    }

    let exposed: BTreeSet<String> = metric_names(&agent.0).union(&metric_names(&persister.0)).cloned().collect();
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../monitoring/grafana/sluice-dashboard.json"))
            .expect("the dashboard is JSON");
    assert_eq!(dashboard["title"], "Sluice");
    let panels = dashboard["panels"].as_array().expect("a Grafana dashboard has panels");
    let mut queries = String::new();
    for panel in panels.iter().filter(|panel| panel["type"] != "row") {
        let targets = panel["targets"].as_array().unwrap_or_else(|| panic!("panel {} has no targets", panel["title"]));
        assert!(!targets.is_empty(), "panel {} has no queries", panel["title"]);
        for target in targets {
            queries.push_str(target["expr"].as_str().expect("every target has an expr"));
            queries.push('\n');
        }
    }
    let rules = include_str!("../../monitoring/alerts.yml");
    for (source, text) in [("dashboard", queries.as_str()), ("alerts", rules)] {
        let used = metric_names(text);
        assert!(used.len() > 5, "{source} names only {used:?}");
        let missing: Vec<_> = used.difference(&exposed).collect();
        assert!(missing.is_empty(), "{source} uses metrics no real scrape exposes: {missing:?}");
    }

    // Every metric a real scrape exposes is documented, and docs/METRICS.md names no other.
    let documented = metric_names(include_str!("../../docs/METRICS.md"));
    let base = |name: &String| {
        ["_bucket", "_sum", "_count"].iter().find_map(|suffix| name.strip_suffix(suffix)).unwrap_or(name).to_string()
    };
    let exposed_base: BTreeSet<String> = exposed.iter().map(base).collect();
    let undocumented: Vec<_> = exposed_base.difference(&documented).collect();
    assert!(undocumented.is_empty(), "docs/METRICS.md lacks {undocumented:?}");
    // Absent where the address space has no limit (most hosts), so not in every scrape.
    let stale: Vec<_> =
        documented.difference(&exposed_base).filter(|name| *name != "process_virtual_memory_max_bytes").collect();
    assert!(stale.is_empty(), "docs/METRICS.md names metrics no scrape exposes: {stale:?}");

    // Plausible values, not just names.
    assert_eq!(agent.count(telemetry::INGEST_RECORDS, &[]), 500.0);
    assert_eq!(agent.count(telemetry::INGEST_REJECTED, &[("reason", "contains_nul")]), 1.0);
    assert_eq!(agent.count(telemetry::SHIP_DELIVERED, &[]), 500.0);
    assert_eq!(agent.count(&format!("{}_count", telemetry::SHIP_DELIVERY_LATENCY), &[]), 500.0);
    assert!(agent.count(telemetry::SPOOL_CAPACITY_BYTES, &[]) > 0.0);
    let dead = until_scrape(config.persist_admin(), "the dead letter counted", |metrics| {
        metrics.count(telemetry::PERSIST_DEAD_LETTERS, &[("reason", "malformed_envelope")]) == 1.0
    })
    .await;
    assert_eq!(dead.count(telemetry::PERSIST_DEAD_LETTERS, &[]), 1.0);
    let _ = persister;
    let build =
        agent.0.lines().find(|line| line.starts_with(&format!("{}{{", telemetry::BUILD_INFO))).expect("build info");
    assert!(build.contains("role=\"agent\"") && build.contains("git_sha=\""), "{build}");
}
