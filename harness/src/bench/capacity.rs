//! `sluice-bench capacity` (issue 34): the measured figures docs/CAPACITY.md's model is built
//! from, all from one run on the same records — what that run writes (`capacity.json`, every
//! figure's unit in its key) and its `summary.md`.
//!
//! Owns: the command line's settings, the shape of `capacity.json`, the model's inputs picked
//! out of the phases, and the summary's wording. Must not: measure anything
//! (`run/capacity.rs` does) or hide a phase that did not run (it says why instead).

use serde::Serialize;

use super::pod::Phase;
use super::run::CopyCeiling;
use super::summary::{k, r, round_to};

/// The command line: `[--smoke] [--records N] [--partitions P] [--replicas N] [--pod-seconds S]`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Tiny counts, results in a temp dir.
    pub smoke: bool,
    /// Records in the topic every drain reads (500,000; smoke 4,000).
    pub records: u64,
    /// Its partitions (4).
    pub partitions: u32,
    /// The most persisters in one group against one primary (3): 1, 2, … this many.
    pub replicas: u32,
    /// Seconds per phase of the agent's cost (20; smoke 2).
    pub pod_seconds: u64,
    /// The arguments as given, for `capacity.json`'s `command`.
    pub args: Vec<String>,
}

impl Settings {
    /// The defaults for `smoke`, overridden by what was given.
    pub fn new(
        smoke: bool,
        (records, partitions, replicas, pod_seconds): (Option<u64>, Option<u32>, Option<u32>, Option<u64>),
        args: Vec<String>,
    ) -> Self {
        Self {
            smoke,
            records: records.unwrap_or(if smoke { 4_000 } else { 500_000 }),
            partitions: partitions.unwrap_or(4).max(1),
            replicas: replicas.unwrap_or(3).max(1),
            pod_seconds: pod_seconds.unwrap_or(if smoke { 2 } else { 20 }),
            args,
        }
    }
}

/// The machine the run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// "2 cores, 23 GiB, Linux 6.1.0".
    pub description: String,
    /// Cores (`nproc`), shared by Kafka, PostgreSQL, the persisters and the harness.
    pub cores: u64,
    /// Memory, GiB.
    pub memory_gib: f64,
}

/// Persisters draining topics into PostgreSQL, timed by their own row counters (read every
/// 50 ms) from the first rows to the last.
#[derive(Debug, Clone, Serialize)]
pub struct DrainRun {
    /// What drained.
    pub label: String,
    /// Persister processes.
    pub persisters: u32,
    /// Partitions over every topic read.
    pub partitions: u32,
    /// PostgreSQL clusters written to.
    pub postgres_clusters: u32,
    /// `persist.writers` of each persister, as its `/config` says.
    pub writers_per_persister: u64,
    /// Rows counted in PostgreSQL afterwards (= records in the topics).
    pub rows: u64,
    /// From the first rows to the last.
    pub seconds: f64,
    /// Rows per second over that span (the start's rebalances included).
    pub rows_per_second: f64,
    /// Rows per second from the moment every persister held partitions (the group settled) to
    /// the last row; none when less than a tenth of the rows was left by then.
    pub settled_rows_per_second: Option<f64>,
    /// That span.
    pub settled_seconds: Option<f64>,
    /// Rows each persister wrote.
    pub rows_per_persister: Vec<u64>,
    /// Partitions each held once the group settled (or at the end, if it never did).
    pub partitions_per_persister: Vec<u64>,
    /// Every persister's CPU over the span, in cores (CPU seconds per second), summed.
    pub persister_cpu_cores: f64,
    /// That per 10k rows/s.
    pub persister_cpu_cores_per_10k_rows_per_second: f64,
    /// The largest persister's high-water mark, MiB.
    pub persister_peak_rss_mib: f64,
    /// Each cluster's PostgreSQL (postmaster, backends, background processes) over the span, in
    /// cores; none where its processes are not visible from here.
    pub postgres_cpu_cores_per_cluster: Vec<Option<f64>>,
    /// Every cluster's PostgreSQL CPU per 10k rows/s (none unless every cluster's was read).
    pub postgres_cpu_cores_per_10k_rows_per_second: Option<f64>,
    /// The machine's busy cores over the span (everyone's: Kafka, PostgreSQL, the persisters, the
    /// harness, and whatever else ran).
    pub machine_busy_cores: f64,
}

/// Two clusters side by side, or why the run has none.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClustersRun {
    /// It ran.
    Measured(DrainRun),
    /// It did not: why.
    NotMeasured(String),
}

/// What a row takes in PostgreSQL.
#[derive(Debug, Clone, Serialize)]
pub struct Storage {
    /// Rows of the one-replica drain.
    pub rows: u64,
    /// `pg_total_relation_size` (heap, TOAST, indexes) summed over the partitions of `log_rows`.
    pub relation_bytes: u64,
    /// Per row.
    pub bytes_per_row: f64,
}

/// One phase of the agent's cost (`sluice-bench pod`'s).
#[derive(Debug, Clone, Serialize)]
pub struct AgentPhase {
    /// Records per second written, one connection, one write call each (0: idle).
    pub records_per_second: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// CPU seconds per second.
    pub cpu_cores: f64,
    /// That per 10k records/s (idle included; none when idle).
    pub cpu_cores_per_10k_records_per_second: Option<f64>,
    /// Resident memory at the phase's end, MiB.
    pub rss_mib: f64,
    /// Threads at the phase's end.
    pub threads: u64,
    /// Context switches of all its threads per second.
    pub context_switches_per_second: f64,
}

impl From<&Phase> for AgentPhase {
    fn from(phase: &Phase) -> Self {
        Self {
            records_per_second: phase.rate,
            seconds: phase.seconds,
            cpu_cores: phase.cpu_cores,
            cpu_cores_per_10k_records_per_second: (phase.rate > 0)
                .then(|| phase.cpu_cores / (phase.rate as f64 / 10_000.0)),
            rss_mib: phase.rss_mib,
            threads: phase.threads,
            context_switches_per_second: phase.context_switches as f64 / phase.seconds,
        }
    }
}

/// The model's inputs, picked out of the phases below them in `capacity.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Inputs {
    /// PostgreSQL's own `COPY` of the persister's rows, two sessions.
    pub postgres_copy_ceiling_rows_per_second: f64,
    /// The same, one session.
    pub postgres_copy_ceiling_one_session_rows_per_second: Option<f64>,
    /// One persister replica draining every partition of the topic.
    pub persister_rows_per_second_per_replica: f64,
    /// One persister draining a topic of one partition.
    pub persister_rows_per_second_per_partition: f64,
    /// The rate one replica catches up a backlog at: the one-replica drain (a topic filled
    /// before it started is a backlog).
    pub drain_rows_per_second: f64,
    /// One replica over the COPY ceiling.
    pub persister_to_copy_ceiling: f64,
    /// 1, 2, … persisters in one group against one primary, first row to last (index 0: one).
    pub rows_per_second_by_persisters: Vec<f64>,
    /// The same from the group settled to the last row.
    pub settled_rows_per_second_by_persisters: Vec<Option<f64>>,
    /// Two persisters, each into its own cluster, together; none when not measured.
    pub two_clusters_rows_per_second: Option<f64>,
    /// The one replica's CPU per 10k rows/s.
    pub persister_cpu_cores_per_10k_rows_per_second: f64,
    /// Its high-water mark.
    pub persister_peak_rss_mib: f64,
    /// PostgreSQL's CPU per 10k rows/s during the one-replica drain.
    pub postgres_cpu_cores_per_10k_rows_per_second: Option<f64>,
    /// Heap + TOAST + indexes per row.
    pub bytes_per_row: f64,
    /// An agent without records.
    pub agent_idle_cpu_cores: f64,
    /// Its memory then.
    pub agent_idle_rss_mib: f64,
    /// An agent writing 1,000 records/s: CPU (idle included).
    pub agent_cpu_cores_at_1k_records_per_second: Option<f64>,
    /// Its memory then.
    pub agent_rss_mib_at_1k_records_per_second: Option<f64>,
    /// An agent writing 10,000 records/s: CPU (idle included).
    pub agent_cpu_cores_at_10k_records_per_second: Option<f64>,
    /// Its memory then.
    pub agent_rss_mib_at_10k_records_per_second: Option<f64>,
}

/// `capacity.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    /// The run's UTC time stamp (its folder's name after `capacity-`).
    pub when: String,
    /// `git rev-parse --short HEAD` of the checkout (other files may differ from it).
    pub commit: String,
    /// The measured binary's `--version`.
    pub binary_version: String,
    /// Cores, memory, kernel.
    pub machine: Machine,
    /// The command line.
    pub command: String,
    /// Records in the topic every drain of one topic reads (the two clusters: half each).
    pub records: u64,
    /// Bytes per record as the benchmark writes them, newline included (the record: one less).
    pub record_size_bytes: u64,
    /// The topic's partitions.
    pub partitions: u32,
    /// The model's inputs.
    pub inputs: Inputs,
    /// PostgreSQL's own `COPY` of the rows the one replica stored.
    pub postgres_copy_ceiling: CopyCeiling,
    /// 1, 2, … persisters in one group on the topic into one schema (the first
    /// is the one-replica drain: rows/s of a replica, the catch-up rate, CPU and RSS).
    pub replicas: Vec<DrainRun>,
    /// One persister, a topic of one partition.
    pub one_partition: DrainRun,
    /// Two clusters side by side.
    pub two_clusters: ClustersRun,
    /// Bytes per row of the one-replica drain.
    pub storage: Storage,
    /// The agent idle, at 1k and at 10k records/s.
    pub agent: Vec<AgentPhase>,
}

/// What [`Capacity::new`] is given: the run's header.
pub struct Header {
    /// Time stamp.
    pub when: String,
    /// Commit.
    pub commit: String,
    /// The binary's version line.
    pub binary_version: String,
    /// The machine.
    pub machine: Machine,
    /// Command line.
    pub command: String,
    /// Records, record size, partitions.
    pub records: (u64, u64, u32),
}

impl Capacity {
    /// The run put together, its inputs picked out.
    pub fn new(
        header: Header,
        (postgres_copy_ceiling, replicas, one_partition, two_clusters): (
            CopyCeiling,
            Vec<DrainRun>,
            DrainRun,
            ClustersRun,
        ),
        storage: Storage,
        agent: Vec<AgentPhase>,
    ) -> Self {
        let one = &replicas[0];
        let at = |rate: u64| agent.iter().find(|phase| phase.records_per_second == rate);
        let idle = at(0);
        let inputs = Inputs {
            postgres_copy_ceiling_rows_per_second: postgres_copy_ceiling.two_sessions.rows_per_second,
            postgres_copy_ceiling_one_session_rows_per_second: postgres_copy_ceiling
                .one_session
                .as_ref()
                .map(|load| load.rows_per_second),
            persister_rows_per_second_per_replica: one.rows_per_second,
            persister_rows_per_second_per_partition: one_partition.rows_per_second,
            drain_rows_per_second: one.rows_per_second,
            persister_to_copy_ceiling: one.rows_per_second / postgres_copy_ceiling.two_sessions.rows_per_second,
            rows_per_second_by_persisters: replicas.iter().map(|run| run.rows_per_second).collect(),
            settled_rows_per_second_by_persisters: replicas.iter().map(|run| run.settled_rows_per_second).collect(),
            two_clusters_rows_per_second: match &two_clusters {
                ClustersRun::Measured(run) => Some(run.rows_per_second),
                ClustersRun::NotMeasured(_) => None,
            },
            persister_cpu_cores_per_10k_rows_per_second: one.persister_cpu_cores_per_10k_rows_per_second,
            persister_peak_rss_mib: one.persister_peak_rss_mib,
            postgres_cpu_cores_per_10k_rows_per_second: one.postgres_cpu_cores_per_10k_rows_per_second,
            bytes_per_row: storage.bytes_per_row,
            agent_idle_cpu_cores: idle.map_or(0.0, |phase| phase.cpu_cores),
            agent_idle_rss_mib: idle.map_or(0.0, |phase| phase.rss_mib),
            agent_cpu_cores_at_1k_records_per_second: at(1_000).map(|phase| phase.cpu_cores),
            agent_rss_mib_at_1k_records_per_second: at(1_000).map(|phase| phase.rss_mib),
            agent_cpu_cores_at_10k_records_per_second: at(10_000).map(|phase| phase.cpu_cores),
            agent_rss_mib_at_10k_records_per_second: at(10_000).map(|phase| phase.rss_mib),
        };
        let (records, record_size_bytes, partitions) = header.records;
        Self {
            when: header.when,
            commit: header.commit,
            binary_version: header.binary_version,
            machine: header.machine,
            command: header.command,
            records,
            record_size_bytes,
            partitions,
            inputs,
            postgres_copy_ceiling,
            replicas,
            one_partition,
            two_clusters,
            storage,
            agent,
        }
    }
}

/// "0.9 cores" or "—".
fn cores(value: Option<f64>) -> String {
    value.map_or("—".into(), |cores| format!("{} cores", round_to(cores, 2)))
}

/// One drain's row of the persisters' table.
fn drain_row(run: &DrainRun) -> String {
    let pg: Vec<String> =
        run.postgres_cpu_cores_per_cluster.iter().map(|cores| cores.map_or("—".into(), |c| round_to(c, 2))).collect();
    format!(
        "| {} | {} | {} | {} ({} s) | {} | {} | {} | {} | {} |",
        run.label,
        run.persisters,
        run.partitions_per_persister.iter().map(u64::to_string).collect::<Vec<_>>().join(" / "),
        k(run.rows_per_second),
        r(run.seconds),
        run.settled_rows_per_second.map_or("—".into(), k),
        round_to(run.persister_cpu_cores, 2),
        pg.join(" + "),
        round_to(run.machine_busy_cores, 2),
        round_to(run.persister_cpu_cores_per_10k_rows_per_second, 3),
    )
}

/// `summary.md`.
pub fn summary(c: &Capacity) -> String {
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    let x = &c.inputs;
    let one = &c.replicas[0];
    line(format!("# Sluice capacity inputs, {}\n", c.when));
    line(format!(
        "Machine: {} (Kafka, PostgreSQL, the persisters and the harness share its cores). Commit {} ({}). Command: `{}`. {} records of {} B (newline included), a topic of {} partitions filled once by a raw producer with the agent's settings (and a topic of one partition, and for the two clusters two topics of half as many each, filled the same way); every drain into a fresh schema.\n",
        c.machine.description, c.commit, c.binary_version, c.command, c.records, c.record_size_bytes, c.partitions
    ));
    line("## The model's inputs\n".into());
    line("| input | figure | how |".into());
    line("| --- | --- | --- |".into());
    let ceiling = &c.postgres_copy_ceiling;
    line(format!(
        "| PostgreSQL's own COPY of the persister's rows | {} rows/s (one session {}) | the one replica's {} rows written by the server to COPY binary files ({} MiB), loaded into a fresh migrated schema with `COPY log_rows FROM` by two sessions side by side in {} s; PostgreSQL {}, the machine busy {} cores |",
        k(x.postgres_copy_ceiling_rows_per_second),
        x.postgres_copy_ceiling_one_session_rows_per_second.map_or("—".into(), |rate| format!("{} rows/s", k(rate))),
        ceiling.rows,
        r(ceiling.file_bytes as f64 / 1_048_576.0),
        round_to(ceiling.two_sessions.seconds, 2),
        cores(ceiling.two_sessions.postgres_cpu_cores),
        round_to(ceiling.two_sessions.machine_busy_cores, 2)
    ));
    line(format!(
        "| persister rows/s per replica (= drain rows/s: the catch-up rate of a backlog) | {} rows/s | one persister ({} writers), {} partitions, {} rows in {} s, first row to last |",
        k(x.persister_rows_per_second_per_replica),
        one.writers_per_persister,
        one.partitions,
        one.rows,
        r(one.seconds)
    ));
    line(format!(
        "| persister rows/s per partition | {} rows/s | one persister, a topic of one partition (one lane: one writer busy) |",
        k(x.persister_rows_per_second_per_partition)
    ));
    line(format!(
        "| persister / PostgreSQL's COPY of the same rows | {}× | {:.0} against {:.0} rows/s |",
        round_to(x.persister_to_copy_ceiling, 2),
        x.persister_rows_per_second_per_replica,
        x.postgres_copy_ceiling_rows_per_second
    ));
    let by: Vec<String> = c
        .replicas
        .iter()
        .map(|run| {
            format!(
                "{}: {}{}",
                run.persisters,
                k(run.rows_per_second),
                run.settled_rows_per_second.map_or(String::new(), |rate| format!(" (settled {})", k(rate)))
            )
        })
        .collect();
    line(format!("| persisters in one group against one primary | {} rows/s | below |", by.join("; ")));
    line(format!(
        "| two clusters side by side | {} | below |",
        x.two_clusters_rows_per_second.map_or("not measured".into(), |rate| format!("{} rows/s", k(rate)))
    ));
    line(format!(
        "| persister CPU | {} cores per 10k rows/s | the one replica, first row to last |",
        round_to(x.persister_cpu_cores_per_10k_rows_per_second, 3)
    ));
    line(format!("| persister peak RSS | {} MiB | the one replica |", r(x.persister_peak_rss_mib)));
    line(format!(
        "| PostgreSQL CPU | {} | the one replica's drain: postmaster and every backend and background process |",
        x.postgres_cpu_cores_per_10k_rows_per_second
            .map_or("not visible from here".into(), |cores| format!("{} cores per 10k rows/s", round_to(cores, 3)))
    ));
    line(format!(
        "| PostgreSQL bytes per row | {} B | heap + TOAST + indexes, {} B over {} rows |",
        x.bytes_per_row.round(),
        c.storage.relation_bytes,
        c.storage.rows
    ));
    let agent: Vec<String> = c
        .agent
        .iter()
        .map(|phase| {
            let load = if phase.records_per_second == 0 {
                "idle".to_string()
            } else {
                format!("{} records/s", k(phase.records_per_second as f64))
            };
            format!("{load} {} cores, {} MiB", round_to(phase.cpu_cores, 4), r(phase.rss_mib))
        })
        .collect();
    line(format!(
        "| agent cost | {} | one agent, one connection writing 256 B records one call each, {} s per phase |",
        agent.join("; "),
        c.agent.first().map_or(0.0, |phase| phase.seconds).round()
    ));
    line(String::new());
    line("## Persisters against PostgreSQL\n".into());
    line("| drain | persisters | partitions each | rows/s, first row to last | rows/s, group settled to last | persister cores | PostgreSQL cores per cluster | machine busy cores | persister cores per 10k rows/s |".into());
    line("| --- | --- | --- | --- | --- | --- | --- | --- | --- |".into());
    for run in c.replicas.iter().chain(std::iter::once(&c.one_partition)) {
        line(drain_row(run));
    }
    if let ClustersRun::Measured(run) = &c.two_clusters {
        line(drain_row(run));
    }
    line(String::new());
    if let ClustersRun::NotMeasured(why) = &c.two_clusters {
        line(format!("- Two clusters side by side: {why}."));
    }
    line(format!(
        "- The machine has {} cores: every process above shares them, so a second persister or a second cluster here adds no CPU; the figures show where this machine saturates, not where a primary of its own would.",
        c.machine.cores
    ));
    line(format!(
        "- PostgreSQL during the one replica's drain: {}; the machine was busy {} of its {} cores.",
        cores(one.postgres_cpu_cores_per_cluster.first().copied().flatten()),
        round_to(one.machine_busy_cores, 2),
        c.machine.cores
    ));
    out
}
