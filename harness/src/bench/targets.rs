//! Issue 15's targets (and issue 34's: the persister beside PostgreSQL's own `COPY` of the same
//! rows): each figure of a run next to its limit, or to its peer measured in the same run, and
//! whether it is met — or by how much it is missed.
//!
//! Owns: the list of targets, their limits and which way is better. Must not: measure anything
//! (every figure comes from the run's scenarios) or round (the summary does).

use serde::Serialize;

use super::report::{KafkaConnectRun, Ratios, Scenarios};

/// Which way a figure must go.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    /// Met when the figure is at least the limit.
    AtLeast,
    /// Met when the figure is at most the limit.
    AtMost,
}

/// How a figure reads.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// A ratio to a ceiling or a peer (`0.55×`).
    Ratio,
    /// Cores (CPU seconds per second).
    Cores,
    /// Cores per 10k records/s.
    CoresPer10k,
    /// MiB.
    Mib,
    /// Rows per second.
    RowsPerSecond,
    /// Bytes per stored row.
    BytesPerRow,
}

/// One target of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is measured.
    pub target: String,
    /// The run's figure; `None` when the run does not measure it yet.
    pub figure: Option<f64>,
    /// The limit it is held to.
    pub limit: f64,
    /// Which way is better.
    pub goal: Goal,
    /// How `figure` and `limit` read.
    pub unit: Unit,
    /// `figure / limit`.
    pub ratio_to_limit: Option<f64>,
    /// Whether the target is met; `None` when not measured.
    pub met: Option<bool>,
    /// Where the figure comes from (or why there is none).
    pub how: String,
}

impl Target {
    fn new(target: impl Into<String>, figure: Option<f64>, goal: Goal, limit: f64, unit: Unit, how: String) -> Self {
        let figure = figure.filter(|figure| figure.is_finite());
        Self {
            target: target.into(),
            figure,
            limit,
            goal,
            unit,
            ratio_to_limit: figure.map(|figure| figure / limit),
            met: figure.map(|figure| match goal {
                Goal::AtLeast => figure >= limit,
                Goal::AtMost => figure <= limit,
            }),
            how,
        }
    }
}

/// The targets of issue 15 for a run's `scenarios`.
pub fn targets(x: &Scenarios, ratios: &Ratios) -> Vec<Target> {
    use Goal::{AtLeast, AtMost};
    let idle = x.pod.iter().find(|phase| phase.rate == 0);
    let at_rate = x.ceilings.ingest_at_rate.write_latency.p999_us;
    let sluice_at_rate = x.fixed_rate.load.write_latency.p999_us;
    let mut targets = vec![
        Target::new(
            "delivered / raw-librdkafka ceiling (same messages, max rate)",
            Some(ratios.delivered_to_shipping_ceiling),
            AtLeast,
            0.9,
            Unit::Ratio,
            format!(
                "{:.0} of {:.0} records/s",
                x.steady.delivered_records_per_second, x.ceilings.shipping.records_per_second
            ),
        ),
        Target::new(
            "delivered / rsyslog delivered (max rate)",
            Some(ratios.delivered_to_rsyslog),
            AtLeast,
            1.25,
            Unit::Ratio,
            format!(
                "{:.0} against {:.0} records/s",
                x.steady.delivered_records_per_second, x.rsyslog.delivered_records_per_second
            ),
        ),
        Target::new(
            format!("agent CPU at a steady {} records/s", x.fixed_rate.rate),
            Some(x.fixed_rate.agent_cpu_cores_per_10k_records_per_second),
            AtMost,
            0.05,
            Unit::CoresPer10k,
            "the fixed-rate run".into(),
        ),
        Target::new(
            "agent idle RSS",
            idle.map(|phase| phase.rss_mib),
            AtMost,
            10.0,
            Unit::Mib,
            "the pod-cost agent after its idle phase".into(),
        ),
        Target::new(
            "agent idle CPU",
            idle.map(|phase| phase.cpu_cores),
            AtMost,
            0.001,
            Unit::Cores,
            idle.map_or("no idle phase".into(), |phase| {
                format!("{} ticks in {:.0} s without records", phase.cpu_ticks, phase.seconds)
            }),
        ),
        Target::new(
            format!("write-call p99.9 at {} records/s / a raw socket's at that rate", x.fixed_rate.rate),
            (at_rate > 0.0).then(|| sluice_at_rate / at_rate),
            AtMost,
            1.2,
            Unit::Ratio,
            format!("{sluice_at_rate:.1} µs against {at_rate:.1} µs"),
        ),
        Target::new(
            "persister rows/s into PostgreSQL (idempotent path)",
            Some(x.persist.rows_per_second),
            AtLeast,
            100_000.0,
            Unit::RowsPerSecond,
            format!("{} writers, {} rows", x.persist.writers, x.persist.rows_in_postgres),
        ),
        Target::new(
            "persister / Kafka Connect with a JDBC sink (same records, rows/s)",
            ratios.persister_to_kafka_connect,
            AtLeast,
            10.0,
            Unit::Ratio,
            match &x.kafka_connect {
                KafkaConnectRun::Measured(peer) => format!(
                    "{:.0} against {:.0} rows/s ({}, {} tasks, upsert)",
                    x.persist.rows_per_second, peer.rows_per_second, peer.version, peer.tasks
                ),
                KafkaConnectRun::NotMeasured(why) => format!("not measured: {why}"),
            },
        ),
        Target::new(
            "persister / PostgreSQL's COPY of the same rows (rows/s)",
            ratios.persister_to_copy_ceiling,
            AtLeast,
            0.8,
            Unit::Ratio,
            match &x.persist.postgres_copy_ceiling {
                Some(ceiling) => format!(
                    "{:.0} against {:.0} rows/s (COPY binary files, {} sessions, a fresh schema)",
                    x.persist.rows_per_second, ceiling.two_sessions.rows_per_second, ceiling.two_sessions.sessions
                ),
                None => "not measured".into(),
            },
        ),
    ];
    for persist in [&x.persist, &x.persist_sample] {
        targets.push(Target::new(
            format!("PostgreSQL bytes per row, {} records (mean {:.0} B)", persist.shape, persist.record_bytes),
            Some(persist.bytes_per_row),
            AtMost,
            2.0 * persist.record_bytes + 100.0,
            Unit::BytesPerRow,
            format!("{} B over {} rows: heap, TOAST and indexes", persist.relation_bytes, persist.rows_in_postgres),
        ));
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_met_on_its_side_of_the_limit_and_the_limit_itself_counts_as_met() {
        let at_least = |figure| Target::new("t", Some(figure), Goal::AtLeast, 2.0, Unit::Ratio, String::new());
        let at_most = |figure| Target::new("t", Some(figure), Goal::AtMost, 2.0, Unit::Ratio, String::new());
        assert_eq!(at_least(2.0).met, Some(true));
        assert_eq!(at_least(1.0).met, Some(false));
        assert_eq!(at_least(1.0).ratio_to_limit, Some(0.5));
        assert_eq!(at_most(2.0).met, Some(true));
        assert_eq!(at_most(3.0).met, Some(false));
        assert_eq!(at_most(3.0).ratio_to_limit, Some(1.5));
    }

    #[test]
    fn a_figure_not_measured_or_not_finite_is_neither_met_nor_missed() {
        for figure in [None, Some(f64::NAN), Some(f64::INFINITY)] {
            let target = Target::new("t", figure, Goal::AtLeast, 1.0, Unit::Ratio, String::new());
            assert_eq!((target.figure, target.met, target.ratio_to_limit), (None, None, None));
        }
    }
}
