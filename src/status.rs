//! `sluice status`: a compact live view of an agent or a persister, read from its admin port,
//! for `kubectl exec … -- sluice status`.
//!
//! Owns: reading two scrapes a moment apart and turning them into a few lines an operator can
//! read at a glance (rates, depth, age, drops, lag). Must not: need anything but the admin port
//! (no Prometheus server), or print more than fits a terminal.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::telemetry;
use crate::telemetry::outcome::Reload;
use crate::telemetry::scrape::Scrape;

/// How long one read of the admin port may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the status could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The admin port did not answer.
    #[error("cannot read {address}{path}: {source}")]
    Http {
        /// The admin address.
        address: SocketAddr,
        /// The path asked for.
        path: &'static str,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The scrape is not from sluice.
    #[error("{0} does not look like a sluice admin port (no sluice_build_info)")]
    NotSluice(SocketAddr),
}

/// Reads `path` from the admin server at `address` (its body, whatever the status: `/readyz`
/// says why it is not ready in a 503's body).
pub async fn fetch(address: SocketAddr, path: &'static str) -> Result<String, StatusError> {
    crate::admin::client::get(address, path, FETCH_TIMEOUT)
        .await
        .map(|response| response.body)
        .map_err(|source| StatusError::Http { address, path, source })
}

/// Takes two scrapes `interval` apart and renders the view.
pub async fn status(address: SocketAddr, interval: Duration) -> Result<String, StatusError> {
    let first = Scrape::parse(&fetch(address, "/metrics").await?);
    let started = Instant::now();
    tokio::time::sleep(interval).await;
    let second = Scrape::parse(&fetch(address, "/metrics").await?);
    let ready = fetch(address, "/readyz").await.unwrap_or_default();
    if second.sum(telemetry::BUILD_INFO, &[]) == 0.0 {
        return Err(StatusError::NotSluice(address));
    }
    Ok(render(&first, &second, started.elapsed(), ready.trim()))
}

fn rate(first: &Scrape, second: &Scrape, name: &str, labels: &[(&str, &str)], seconds: f64) -> f64 {
    ((second.sum(name, labels) - first.sum(name, labels)) / seconds).max(0.0)
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

/// The view, from two scrapes `elapsed` apart.
pub fn render(first: &Scrape, second: &Scrape, elapsed: Duration, ready: &str) -> String {
    let seconds = elapsed.as_secs_f64().max(0.001);
    let role = second.label(telemetry::BUILD_INFO, "role").unwrap_or_else(|| "?".into());
    let version = second.label(telemetry::BUILD_INFO, "version").unwrap_or_default();
    let sha = second.label(telemetry::BUILD_INFO, "git_sha").unwrap_or_default();
    let mut out =
        format!("sluice {role} {version} ({sha}) — {}\n", if ready.is_empty() { "no /readyz answer" } else { ready });
    let reasons = |name: &str| {
        let counts = second.by_label(name, "reason");
        let parts: Vec<String> = counts
            .iter()
            .filter(|(_, count)| **count > 0.0)
            .map(|(reason, count)| format!("{reason} {count}"))
            .collect();
        if parts.is_empty() { "none".to_string() } else { parts.join(", ") }
    };
    if role == "agent" {
        let _ = writeln!(
            out,
            "records   in {:.0}/s   out {:.0}/s   total in {} out {}",
            rate(first, second, telemetry::INGEST_RECORDS, &[], seconds),
            rate(first, second, telemetry::SHIP_DELIVERED, &[], seconds),
            second.sum(telemetry::INGEST_RECORDS, &[]),
            second.sum(telemetry::SHIP_DELIVERED, &[]),
        );
        let held = second.sum(telemetry::BUFFER_BYTES, &[]);
        let capacity = second.sum(telemetry::BUFFER_CAPACITY_BYTES, &[]).max(1.0);
        let _ = writeln!(
            out,
            "buffer    {} records, {} of {} ({:.0}%)   oldest waiting {:.1} s",
            second.sum(telemetry::BUFFER_RECORDS, &[]),
            mib(held),
            mib(capacity),
            100.0 * held / capacity,
            second.sum(telemetry::BUFFER_OLDEST_AGE, &[]),
        );
        if second.sum(telemetry::SPOOL_CAPACITY_BYTES, &[]) > 0.0 {
            let _ = writeln!(
                out,
                "spool     {} records, {} of {}   write errors {}",
                second.sum(telemetry::SPOOL_RECORDS, &[]),
                mib(second.sum(telemetry::SPOOL_BYTES, &[])),
                mib(second.sum(telemetry::SPOOL_CAPACITY_BYTES, &[])),
                second.sum(telemetry::SPOOL_ERRORS, &[]),
            );
        }
        let p99 = second.quantile(telemetry::SHIP_DELIVERY_LATENCY, 0.99);
        let _ = writeln!(
            out,
            "kafka     {}   in flight {}   delivery errors {:.1}/s   p99 ingest→ack {}",
            if second.sum(telemetry::KAFKA_REACHABLE, &[]) > 0.0 { "reachable" } else { "UNREACHABLE" },
            second.sum(telemetry::librdkafka::REQUESTS_IN_FLIGHT, &[]),
            rate(first, second, telemetry::SHIP_DELIVERY_ERRORS, &[], seconds),
            p99.map_or("-".into(), |p| format!("{:.0} ms", p * 1000.0)),
        );
        let _ = writeln!(out, "dropped   {}", reasons(telemetry::BUFFER_DROPPED));
        let _ = writeln!(out, "rejected  {}", reasons(telemetry::INGEST_REJECTED));
        let _ = writeln!(out, "given up  {}", reasons(telemetry::SHIP_FAILED));
    } else {
        let p99 = second.quantile(telemetry::PERSIST_BATCH_SECONDS, 0.99);
        let _ = writeln!(
            out,
            "rows      {:.0}/s   batches {:.1}/s   p99 batch {}   write errors {}",
            rate(first, second, telemetry::PERSIST_ROWS, &[], seconds),
            rate(first, second, telemetry::PERSIST_BATCHES, &[], seconds),
            p99.map_or("-".into(), |p| format!("{:.0} ms", p * 1000.0)),
            second.sum(telemetry::PERSIST_WRITE_ERRORS, &[]),
        );
        let lag = second.by_label(telemetry::PERSIST_LAG_RECORDS, "partition");
        let behind = second.by_label(telemetry::PERSIST_LAG_SECONDS, "partition").into_values().fold(0.0, f64::max);
        let parts: Vec<String> = lag.iter().map(|(partition, records)| format!("p{partition} {records}")).collect();
        let _ = writeln!(
            out,
            "lag       {} records ({})   {:.1} s behind   partitions held {}",
            lag.values().sum::<f64>() + 0.0,
            if parts.is_empty() { "none assigned".into() } else { parts.join(", ") },
            behind,
            second.sum(telemetry::PERSIST_ASSIGNED_PARTITIONS, &[]),
        );
        let _ = writeln!(
            out,
            "postgres  {}",
            if second.sum(telemetry::PERSIST_POSTGRES_REACHABLE, &[]) > 0.0 { "reachable" } else { "UNREACHABLE" }
        );
        let _ = writeln!(out, "dead      {}", reasons(telemetry::PERSIST_DEAD_LETTERS));
    }
    let _ = writeln!(
        out,
        "config    {}   reloads applied {} rejected {}",
        second
            .by_label(telemetry::CONFIG_INFO, "hash")
            .into_iter()
            .find(|(_, value)| *value > 0.0)
            .map_or("-".into(), |(hash, _)| hash),
        second.sum(telemetry::CONFIG_RELOADS, &[("result", Reload::Applied.as_str())]),
        second.sum(telemetry::CONFIG_RELOADS, &[("result", Reload::Rejected.as_str())]),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = r#"
# TYPE sluice_build_info gauge
sluice_build_info{version="0.1.0",git_sha="abc",role="agent"} 1
sluice_ingest_records_total 100
sluice_ship_records_delivered_total 90
sluice_buffer_records 10
sluice_buffer_bytes 1048576
sluice_buffer_capacity_bytes 4194304
sluice_buffer_oldest_record_age_seconds 2.5
sluice_kafka_reachable 1
sluice_buffer_records_dropped_total{reason="drop_newest"} 3
sluice_buffer_records_dropped_total{reason="corrupt"} 0
sluice_ship_delivery_latency_seconds_bucket{le="0.01"} 50
sluice_ship_delivery_latency_seconds_bucket{le="0.1"} 100
sluice_ship_delivery_latency_seconds_bucket{le="+Inf"} 100
sluice_config_info{hash="deadbeef"} 1
"#;

    #[test]
    fn the_agent_view_shows_rates_depth_age_and_drops() {
        let first = Scrape::parse(AGENT);
        let second = Scrape::parse(&AGENT.replace("_ingest_records_total 100", "_ingest_records_total 300"));
        let view = render(&first, &second, Duration::from_secs(2), "ready");
        assert!(view.starts_with("sluice agent 0.1.0 (abc) — ready"), "{view}");
        assert!(view.contains("in 100/s"), "{view}");
        assert!(view.contains("1.0 MiB of 4.0 MiB (25%)   oldest waiting 2.5 s"), "{view}");
        assert!(view.contains("dropped   drop_newest 3"), "{view}");
        assert!(view.contains("p99 ingest→ack 98 ms"), "{view}");
        assert!(view.contains("config    deadbeef"), "{view}");
    }

    #[test]
    fn quantiles_interpolate_within_a_bucket() {
        let scrape = Scrape::parse(AGENT);
        let p50 = scrape.quantile(telemetry::SHIP_DELIVERY_LATENCY, 0.5).expect("p50");
        assert!((p50 - 0.01).abs() < 1e-9, "{p50}");
        assert_eq!(scrape.quantile("no_such_metric", 0.5), None);
    }

    #[test]
    fn the_persister_view_shows_lag_per_partition() {
        let text = r#"
sluice_build_info{version="0.1.0",git_sha="abc",role="persist"} 1
sluice_persist_lag_records{partition="0"} 5
sluice_persist_lag_records{partition="1"} 7
sluice_persist_lag_seconds{partition="1"} 3.5
sluice_persist_postgres_reachable 0
"#;
        let scrape = Scrape::parse(text);
        let view = render(&scrape, &scrape, Duration::from_secs(1), "ready (postgres unreachable, retrying)");
        assert!(view.contains("lag       12 records (p0 5, p1 7)   3.5 s behind"), "{view}");
        assert!(view.contains("postgres  UNREACHABLE"), "{view}");
    }
}
