//! `summary.md`: a run's table and sentences, the page a reader compares across runs.
//!
//! Owns: the summary's wording and rounding (one decimal, thousands as `k`, whole percentages),
//! as it has read since the first benchmark. Must not: compute a figure the results lack.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::LoadResult;
use super::report::{KafkaConnectRun, Results};
use super::targets::{Goal, Target, Unit};

/// Rounded to one decimal (and printed without a trailing `.0`).
pub(super) fn r(value: f64) -> String {
    format!("{}", (value * 10.0).round() / 10.0)
}

/// Thousands, one decimal: `12.3k`.
pub(super) fn k(value: f64) -> String {
    format!("{}k", r(value / 1000.0))
}

/// Rounded to `places` decimals.
pub(super) fn round_to(value: f64, places: i32) -> String {
    let scale = 10f64.powi(places);
    format!("{}", (value * scale).round() / scale)
}

/// A whole percentage.
fn percent(ratio: f64) -> String {
    format!("{}", (ratio * 100.0).round())
}

fn latency(load: &LoadResult) -> String {
    let l = &load.write_latency;
    format!("{} / {} / {} / {}", r(l.p50_us), r(l.p99_us), r(l.p999_us), r(l.max_us))
}

/// A figure as its unit reads.
fn figure(value: f64, unit: Unit) -> String {
    match unit {
        Unit::Ratio => format!("{}×", round_to(value, 2)),
        Unit::Cores => format!("{} cores", round_to(value, 4)),
        Unit::CoresPer10k => format!("{} cores per 10k/s", round_to(value, 3)),
        Unit::Mib => format!("{} MiB", r(value)),
        Unit::RowsPerSecond => format!("{} rows/s", k(value)),
        Unit::BytesPerRow => format!("{} B", value.round()),
    }
}

/// The targets' table: figure, limit, figure / limit, and met or missed.
fn targets(line: &mut impl FnMut(String), targets: &[Target]) {
    let met = targets.iter().filter(|target| target.met == Some(true)).count();
    let measured = targets.iter().filter(|target| target.met.is_some()).count();
    line(format!(
        "## Targets (issues 15 and 34): {met} of {} met, {} not measured\n",
        targets.len(),
        targets.len() - measured
    ));
    line("| target | figure | limit | figure / limit | verdict | from |".into());
    line("| --- | --- | --- | --- | --- | --- |".into());
    for target in targets {
        let limit = match target.goal {
            Goal::AtLeast => format!("≥ {}", figure(target.limit, target.unit)),
            Goal::AtMost => format!("≤ {}", figure(target.limit, target.unit)),
        };
        let verdict = match target.met {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "not measured",
        };
        line(format!(
            "| {} | {} | {limit} | {} | {verdict} | {} |",
            target.target,
            target.figure.map_or("—".into(), |value| figure(value, target.unit)),
            target.ratio_to_limit.map_or("—".into(), |ratio| round_to(ratio, 2)),
            target.how
        ));
    }
    line(String::new());
}

/// `summary.md` (without the plots, which come after them).
pub fn summary(results: &Results) -> String {
    let (header, x) = (results, &results.scenarios);
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!("# Sluice benchmark, {}\n", header.when));
    line(format!(
        "Machine: {}. Command: `{}`. {} records of {} B over {} connections.\n",
        header.machine, header.command, header.records, header.size, header.connections
    ));
    targets(&mut line, &results.targets);
    line("| run | records/s | MiB/s | write p50 / p99 / p99.9 / max (µs) |".into());
    line("| --- | --- | --- | --- |".into());
    let ingest = &x.ceilings.ingest;
    let at_rate = &x.ceilings.ingest_at_rate;
    line(format!(
        "| ingest ceiling at {} records/s (socket, reader discards) | {} | {} | {} |",
        x.fixed_rate.rate,
        k(at_rate.records_per_second),
        r(at_rate.mib_per_second),
        latency(at_rate)
    ));
    line(format!(
        "| ingest ceiling (socket, reader discards) | {} | {} | {} |",
        k(ingest.records_per_second),
        r(ingest.mib_per_second),
        latency(ingest)
    ));
    let shipping = &x.ceilings.shipping;
    line(format!(
        "| shipping ceiling (raw librdkafka, acked) | {} | {} | — |",
        k(shipping.records_per_second),
        r(shipping.mib_per_second)
    ));
    let steady = &x.steady;
    line(format!(
        "| sluice ingest, max rate | {} | {} | {} |",
        k(steady.load.records_per_second),
        r(steady.load.mib_per_second),
        latency(&steady.load)
    ));
    line(format!(
        "| sluice delivered (Kafka-acked, envelopes), max rate | {} | {} | |",
        k(steady.delivered_records_per_second),
        r(steady.delivered_mib_per_second)
    ));
    let rsyslog = &x.rsyslog;
    line(format!(
        "| rsyslog ingest, max rate | {} | {} | {} |",
        k(rsyslog.load.records_per_second),
        r(rsyslog.load.mib_per_second),
        latency(&rsyslog.load)
    ));
    line(format!("| rsyslog delivered (in Kafka), max rate | {} | | |", k(rsyslog.delivered_records_per_second)));
    let outage = &x.outage;
    line(format!(
        "| sluice at {} records/s, broker down {} s (disk buffer) | {} | {} | {} |",
        outage.rate,
        (outage.outage.to_s - outage.outage.from_s).round(),
        k(outage.load.records_per_second),
        r(outage.load.mib_per_second),
        latency(&outage.load)
    ));
    let fixed = &x.fixed_rate;
    line(format!(
        "| sluice at {} records/s | {} | {} | {} |",
        fixed.rate,
        k(fixed.load.records_per_second),
        r(fixed.load.mib_per_second),
        latency(&fixed.load)
    ));
    let stall = &x.pg_stall;
    line(format!(
        "| sluice + persister at {} records/s, PostgreSQL stalled {} s | {} | {} | {} |",
        stall.rate,
        (stall.stall.to_s - stall.stall.from_s).round(),
        k(stall.load.records_per_second),
        r(stall.load.mib_per_second),
        latency(&stall.load)
    ));
    line(format!("| persister, draining the max-rate topic (rows committed) | {} | | |", k(x.persist.rows_per_second)));
    if let Some(ceiling) = &x.persist.postgres_copy_ceiling {
        line(format!(
            "| PostgreSQL's own COPY of the same rows (binary files, {} sessions) | {} | | |",
            ceiling.two_sessions.sessions,
            k(ceiling.two_sessions.rows_per_second)
        ));
    }
    if let KafkaConnectRun::Measured(peer) = &x.kafka_connect {
        line(format!(
            "| Kafka Connect + JDBC sink, the same records (rows committed) | {} | | |",
            k(peer.rows_per_second)
        ));
    }
    line(String::new());
    line(format!(
        "- Ingest vs its ceiling: {}%; delivered vs the shipping ceiling: {}%.",
        percent(results.ratios.ingest_to_ingest_ceiling),
        percent(results.ratios.delivered_to_shipping_ceiling)
    ));
    line(format!(
        "- Sluice vs rsyslog ({}): delivered {}×; CPU per record {}× (rsyslog {} cores per 10k records/s, RSS idle {} / peak {} MiB).",
        rsyslog.version,
        round_to(results.ratios.delivered_to_rsyslog, 2),
        round_to(results.ratios.cpu_per_record_to_rsyslog, 2),
        round_to(rsyslog.cpu_cores_per_10k_records_per_second, 3),
        r(rsyslog.rss_mib.idle),
        r(rsyslog.rss_mib.peak)
    ));
    let (a, b) = (&steady.ingest_to_kafka_ack, &fixed.ingest_to_kafka_ack);
    line(format!(
        "- Ingest → Kafka ack (agent histogram, bucket bounds): max rate p50 ≤ {} s, p99 ≤ {} s, p99.9 ≤ {} s; at {}/s p50 ≤ {} s, p99 ≤ {} s, p99.9 ≤ {} s.",
        a.p50_le_s, a.p99_le_s, a.p999_le_s, fixed.rate, b.p50_le_s, b.p99_le_s, b.p999_le_s
    ));
    line(format!(
        "- Agent CPU: {} cores per 10k records/s at max rate; {} at {} records/s.",
        round_to(steady.agent_cpu_cores_per_10k_records_per_second, 3),
        round_to(fixed.agent_cpu_cores_per_10k_records_per_second, 3),
        fixed.rate
    ));
    line(format!(
        "- Agent RSS: idle {} MiB, steady {} MiB, peak {} MiB (buffer budget 64 MiB).",
        r(steady.agent_rss_mib.idle),
        r(steady.agent_rss_mib.steady),
        r(steady.agent_rss_mib.peak)
    ));
    let shapes: Vec<String> = x
        .shapes
        .iter()
        .map(|s| {
            format!(
                "{} (mean {} B): ingest {}/s {} MiB/s, delivered {}/s {} MiB/s of envelopes = {}% of {}/s",
                s.shape,
                s.mean_record_bytes.round(),
                k(s.run.load.records_per_second),
                r(s.run.load.mib_per_second),
                k(s.run.delivered_records_per_second),
                r(s.run.delivered_mib_per_second),
                percent(s.delivered_to_shipping_ceiling),
                k(s.shipping_ceiling.records_per_second)
            )
        })
        .collect();
    line(format!(
        "- Record shapes at max rate (delivered vs the shipping ceiling for the same records): {}.",
        shapes.join("; ")
    ));
    let persist = &x.persist;
    let ceiling = match (&persist.postgres_copy_ceiling, results.ratios.persister_to_copy_ceiling) {
        (Some(ceiling), Some(ratio)) => format!(
            " Persister / PostgreSQL's COPY of the same rows: {}× ({:.0} against {:.0} rows/s: the rows it stored, loaded from COPY binary files into a fresh schema by {} sessions in {} s).",
            round_to(ratio, 2),
            persist.rows_per_second,
            ceiling.two_sessions.rows_per_second,
            ceiling.two_sessions.sessions,
            r(ceiling.two_sessions.seconds)
        ),
        _ => String::new(),
    };
    line(format!(
        "- Persister ({} writers): {} rows/s into PostgreSQL ({} rows in {} s), {} persister cores per 10k rows/s, peak RSS {} MiB.{ceiling}",
        persist.writers,
        k(persist.rows_per_second),
        persist.rows_in_postgres,
        r(persist.seconds),
        round_to(persist.persister_cpu_cores_per_10k_rows_per_second, 3),
        r(persist.persister_peak_rss_mib)
    ));
    line(match &x.kafka_connect {
        KafkaConnectRun::Measured(peer) => format!(
            "- Its peer, {} ({} tasks, upsert on the same key, batch.size = max.poll.records = {}; the same records as JsonConverter JSON of {} B with the schema in each, on a topic of its own: it cannot read Sluice's): {} rows/s ({} rows in {} s), {} cores per 10k rows/s, peak RSS {} MiB; the persister {}×.",
            peer.version,
            peer.tasks,
            peer.batch_size,
            peer.message_bytes.round(),
            k(peer.rows_per_second),
            peer.rows_in_postgres,
            r(peer.seconds),
            round_to(peer.cpu_cores_per_10k_rows_per_second, 3),
            r(peer.peak_rss_mib),
            results.ratios.persister_to_kafka_connect.map_or("—".into(), |ratio| round_to(ratio, 2))
        ),
        KafkaConnectRun::NotMeasured(why) => {
            format!("- Its peer, Kafka Connect with a JDBC sink: not measured ({why}).")
        }
    });
    let sample = &x.persist_sample;
    line(format!(
        "- PostgreSQL bytes per row (heap + TOAST + indexes): {} B for {} records (mean {} B), {} B for sample records (mean {} B; {} rows/s).",
        persist.bytes_per_row.round(),
        persist.shape,
        persist.record_bytes.round(),
        sample.bytes_per_row.round(),
        sample.record_bytes.round(),
        k(sample.rows_per_second)
    ));
    let phases: Vec<String> = x
        .pod
        .iter()
        .map(|phase| {
            let load = if phase.rate == 0 { "idle".to_string() } else { format!("{} records/s", k(phase.rate as f64)) };
            format!("{load} {} cores, {} MiB", round_to(phase.cpu_cores, 4), r(phase.rss_mib))
        })
        .collect();
    line(format!(
        "- Cost per pod (one agent, one connection writing 256 B records, {} s per phase; `scripts/bench-pod` measures the same): {}.",
        x.pod.first().map_or(0.0, |phase| phase.seconds).round(),
        phases.join("; ")
    ));
    let (before, overall) = (&stall.socket_to_postgres_row.before_stall, &stall.socket_to_postgres_row.overall);
    line(format!(
        "- PostgreSQL stalled {} s at {} records/s: socket → PostgreSQL row p50 ≤ {} s, p99 ≤ {} s before the stall (p99 ≤ {} s over the whole run); persister backlog up to {} records, every row in {} s after the stall ended; {} written = {} in Kafka = {} rows.",
        (stall.stall.to_s - stall.stall.from_s).round(),
        stall.rate,
        before.p50_le_s,
        before.p99_le_s,
        overall.p99_le_s,
        stall.max_persister_backlog_records,
        r(stall.caught_up_s - stall.stall.to_s),
        stall.counts.written,
        stall.counts.in_kafka,
        stall.counts.rows_in_postgres.unwrap_or_default()
    ));
    line(format!(
        "- Broker outage: every record delivered {} s after the broker was told to start (its start-up included); agent peak RSS {} MiB; {} written = {} distinct in Kafka + {} dropped ({} sent twice: at least once into Kafka, one row per id in PostgreSQL).",
        r(outage.settled_s - outage.outage.to_s),
        r(outage.agent_peak_rss_mib),
        outage.counts.written,
        outage.counts.in_kafka,
        outage.counts.dropped,
        outage.counts.duplicates
    ));
    line(format!(
        "- Counts verified: max rate {} written = {} in Kafka + {} dropped + {} failed; fixed rate {} = {} + {} + {}.",
        steady.counts.written,
        steady.counts.in_kafka,
        steady.counts.dropped,
        steady.counts.failed,
        fixed.counts.written,
        fixed.counts.in_kafka,
        fixed.counts.dropped,
        fixed.counts.failed
    ));
    let mut by_reason: BTreeMap<&str, u64> = BTreeMap::new();
    let scenarios = [&steady.counts, &fixed.counts, &outage.counts, &stall.counts];
    for counts in scenarios.into_iter().chain(x.shapes.iter().map(|s| &s.run.counts)) {
        for (series, count) in &counts.by_reason {
            *by_reason.entry(series).or_default() += count;
        }
    }
    let mut reasons = String::new();
    for (series, count) in &by_reason {
        if !reasons.is_empty() {
            reasons.push_str(", ");
        }
        let _ = write!(reasons, "{series} {count}");
    }
    line(format!(
        "- Drops, give-ups and rejections by reason (every scenario): {}.",
        if reasons.is_empty() { "none" } else { &reasons }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_round_as_the_summary_always_has() {
        assert_eq!(r(12.34), "12.3");
        assert_eq!(r(12.0), "12");
        assert_eq!(r(0.05), "0.1");
        assert_eq!(k(315_098.8), "315.1k");
        assert_eq!(k(2000.0), "2k");
        assert_eq!(round_to(0.038_51, 3), "0.039");
        assert_eq!(percent(0.2980), "30");
    }
}
