//! `sluice-bench capacity` (issue 34, `scripts/bench-capacity`): the figures a capacity model
//! needs, measured in one run on the same records (256 B, as the main benchmark's). A topic of
//! PARTITIONS partitions is filled once with RECORDS records by the shipping ceiling's raw
//! producer (and a topic of one partition, and two topics of half as many for the two clusters,
//! the same way); then, each persister into a fresh schema, timed by its own row counter from
//! the first rows to the last:
//!
//! 1. one persister drains the topic: rows/s of one replica — the rate it catches up a backlog
//!    at —, its CPU and peak RSS, PostgreSQL's CPU, the bytes a row takes; then PostgreSQL's own
//!    `COPY` of the rows it stored (`copy_ceiling.rs`: two sessions, and one);
//! 2. one persister drains the topic of one partition: rows/s of one partition;
//! 3. 2, … REPLICAS persisters in one group drain the topic into one schema: where one primary
//!    saturates (also from the moment the group settled: every persister holding partitions);
//! 4. two persisters, groups and topics of their own, each into its own PostgreSQL cluster
//!    (`SLUICE_TEST_PG_CLUSTERS`; not measured, and said so, with fewer than two);
//! 5. the agent's cost (`pod.rs`'s phases, POD_SECONDS each): idle, 1k and 10k records/s.
//!
//! Persisters here send heartbeats every 500 ms (librdkafka's 3 s would leave a joining member
//! waiting that long for its partitions); nothing else differs from the main run's.
//!
//! Owns: the phases' order, their persisters and topics. Must not: leave a process, a schema
//! or a topic of its own behind (`Bench::cleanup` drops and deletes them, also after a failure).

use std::net::SocketAddr;
use std::time::Duration;

use sluice::telemetry;

use super::super::capacity::{
    AgentPhase, Capacity, ClustersRun, DrainRun, Header, Machine, Settings, Storage, summary,
};
use super::super::host::{
    cores, cpu_ticks, hwm_kib, machine, machine_busy_ticks, memory_gib, now, parent_pid, postmaster_cpu_ticks,
};
use super::super::{Shape, kafka};
use super::{Bench, RunError, STOP_LIMIT, blocking, connect, failed, log, random, scrape, writers};
use crate::{Process, TestConfig};

/// A drain gives up after this.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// A PostgreSQL cluster the run writes to.
struct Cluster {
    url: String,
    db: tokio_postgres::Client,
    /// Its postmaster's pid, when its processes are visible from here (the stack's are).
    postmaster: Option<i32>,
}

impl Cluster {
    async fn new(url: &str) -> Result<Self, RunError> {
        let db = connect(url, None).await?;
        let backend = db.query_one("SELECT pg_backend_pid()", &[]).await?.get::<_, i32>(0);
        Ok(Self { url: url.to_string(), db, postmaster: parent_pid(backend) })
    }

    async fn rows(&self, schema: &str) -> Result<u64, RunError> {
        let row = self.db.query_one(&format!("SELECT count(*) FROM {schema}.log_rows"), &[]).await?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }
}

/// One persister of a drain: its config, the cluster (index) and schema it writes to.
struct Member {
    config: TestConfig,
    cluster: usize,
    schema: String,
}

/// What a drain's sampler read at one moment.
#[derive(Clone)]
struct Sample {
    at: f64,
    rows: Vec<u64>,
    assigned: Vec<u64>,
    persister_ticks: u64,
    postgres_ticks: Vec<u64>,
    machine_ticks: u64,
}

impl Sample {
    fn total(&self) -> u64 {
        self.rows.iter().sum()
    }
}

/// `SLUICE_TEST_PG_CLUSTERS` (`scripts/stack env`): the clusters' URLs, separated by commas or
/// white space.
fn cluster_urls() -> Vec<String> {
    std::env::var("SLUICE_TEST_PG_CLUSTERS")
        .unwrap_or_default()
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|url| !url.is_empty())
        .map(str::to_string)
        .collect()
}

/// The first line a program prints with `args` (empty if it cannot run).
fn first_line(program: &std::path::Path, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().trim().to_string())
        .unwrap_or_default()
}

/// Starts `sluice persist` on `config` without waiting until it is ready (the drain is timed
/// from its first rows; a member of a group is ready only once it holds partitions).
async fn spawn_persister(config: &TestConfig) -> (Process, SocketAddr) {
    let path = config.write();
    let mut process = Process::spawn_with_env(
        "persist",
        &["persist", "--config", path.to_str().expect("utf-8 path")],
        config.dir.path(),
        &config.env,
    );
    let admin = process.wait_admin().await;
    config.started_persister(admin);
    (process, admin)
}

impl Bench {
    /// The whole capacity run; returns the summary.
    pub async fn capacity(&self, settings: &Settings) -> Result<String, RunError> {
        let s = settings;
        log(&format!("results in {}", self.out.display()));
        let primary = Cluster::new(&self.services.pg).await?;
        let urls = cluster_urls();
        let second = match urls.get(1) {
            Some(url) if *url != self.services.pg => Some(Cluster::new(url).await?),
            _ => None,
        };
        let partitions = i32::try_from(s.partitions).unwrap_or(i32::MAX);

        // ---- the records, once
        let topic = self.capacity_topic("all");
        log(&format!("filling {topic}: {} records of 256 B, {} partitions", s.records, s.partitions));
        self.fill(&topic, partitions, s.records).await?;
        let single = self.capacity_topic("one-partition");
        log(&format!("filling {single}: {} records of 256 B, one partition", s.records));
        self.fill(&single, 1, s.records).await?;
        let halves = match &second {
            Some(_) => {
                let (a, b) = (self.capacity_topic("cluster-1"), self.capacity_topic("cluster-2"));
                log(&format!("filling {a} and {b}: {} records each, {} partitions", s.records / 2, s.partitions));
                self.fill(&a, partitions, s.records / 2).await?;
                self.fill(&b, partitions, s.records - s.records / 2).await?;
                Some((a, b))
            }
            None => None,
        };
        let clusters: Vec<Cluster> = std::iter::once(primary).chain(second).collect();

        // ---- 1. one replica, then PostgreSQL's own COPY of its rows
        let schema = self.new_schema();
        let members = vec![self.member(&topic, &clusters, 0, &schema)];
        let one = self.drain("1 persister", members, &clusters, s.partitions, s.records).await?;
        let relation_bytes = self.relation_bytes(&schema).await?;
        let storage =
            Storage { rows: one.rows, relation_bytes, bytes_per_row: relation_bytes as f64 / one.rows.max(1) as f64 };
        let ceiling = self.copy_ceiling(&schema, one.rows, true).await?;
        self.sql(&format!("DROP SCHEMA {schema} CASCADE")).await?;

        // ---- 2. one partition
        let schema = self.new_schema();
        let members = vec![self.member(&single, &clusters, 0, &schema)];
        let one_partition = self.drain("1 persister, 1 partition", members, &clusters, 1, s.records).await?;
        self.sql(&format!("DROP SCHEMA {schema} CASCADE")).await?;

        // ---- 3. N persisters against one primary
        let mut replicas = vec![one];
        for n in 2..=s.replicas {
            let schema = self.new_schema();
            let members = (0..n).map(|_| self.member(&topic, &clusters, 0, &schema)).collect();
            replicas.push(
                self.drain(&format!("{n} persisters, one group"), members, &clusters, s.partitions, s.records).await?,
            );
            self.sql(&format!("DROP SCHEMA {schema} CASCADE")).await?;
        }

        // ---- 4. two clusters side by side
        let two_clusters = match &halves {
            Some((a, b)) => {
                let (schema_a, schema_b) = (self.new_schema(), self.new_schema_in(&clusters[1].url));
                let members = vec![self.member(a, &clusters, 0, &schema_a), self.member(b, &clusters, 1, &schema_b)];
                let run =
                    self.drain("2 persisters, 2 clusters", members, &clusters, 2 * s.partitions, s.records).await?;
                self.sql(&format!("DROP SCHEMA {schema_a} CASCADE")).await?;
                clusters[1].db.batch_execute(&format!("DROP SCHEMA {schema_b} CASCADE")).await?;
                ClustersRun::Measured(run)
            }
            None => {
                let why = format!(
                    "not measured: start the stack with SLUICE_STACK_PG_CLUSTERS=2 (SLUICE_TEST_PG_CLUSTERS lists {} cluster{} other than SLUICE_TEST_PG)",
                    urls.iter().filter(|url| **url != self.services.pg).count(),
                    if urls.iter().filter(|url| **url != self.services.pg).count() == 1 { "" } else { "s" }
                );
                log(&format!("two clusters side by side: {why}"));
                ClustersRun::NotMeasured(why)
            }
        };

        // ---- 5. the agent's cost
        let (seconds, warm_up) =
            if s.smoke { (s.pod_seconds, Duration::from_secs(1)) } else { (s.pod_seconds, super::super::pod::WARM_UP) };
        log(&format!("agent cost: one agent idle, then at 1k and 10k records/s, {seconds} s each"));
        let pod_topic = self.capacity_topic("pod");
        self.own_topic(&pod_topic);
        let agent: Vec<AgentPhase> = super::super::pod::measure_on(&self.services, &pod_topic, seconds, warm_up)
            .await?
            .iter()
            .map(AgentPhase::from)
            .collect();

        // ---- report
        let command =
            std::iter::once("scripts/bench-capacity".to_string()).chain(s.args.iter().cloned()).collect::<Vec<_>>();
        let header = Header {
            when: self.stamp.clone(),
            commit: first_line(
                std::path::Path::new("git"),
                &["-C", &self.root.display().to_string(), "rev-parse", "--short", "HEAD"],
            ),
            binary_version: first_line(&crate::process::binary(), &["--version"]),
            machine: Machine { description: machine(), cores: cores(), memory_gib: memory_gib() },
            command: command.join(" "),
            records: (s.records, 256, s.partitions),
        };
        let capacity = Capacity::new(header, (ceiling, replicas, one_partition, two_clusters), storage, agent);
        self.write_json("capacity.json", &capacity)?;
        let summary = summary(&capacity);
        self.write("summary.md", &summary)?;
        Ok(summary)
    }

    /// A topic name of this run's (deleted at its end).
    fn capacity_topic(&self, what: &str) -> String {
        format!("bench-capacity-{what}-{}-{}", self.stamp, random())
    }

    /// Creates `topic` with `partitions` partitions and fills it with `records` records of
    /// 256 B by the shipping ceiling's producer (the agent's settings and envelopes).
    async fn fill(&self, topic: &str, partitions: i32, records: u64) -> Result<(), RunError> {
        self.own_topic(topic);
        kafka::create_topic(&self.services.kafka, topic, partitions).await?;
        let config = self.agent_config(topic, "memory");
        let config = sluice::config::Config::load(&config.write())?;
        let (brokers, name) = (self.services.kafka.clone(), topic.to_string());
        let in_kafka = blocking(move || {
            kafka::producer_ceiling(&config, &name, records, &Shape::Padded(256))?;
            kafka::topic_count(&brokers, &name)
        })
        .await?;
        if in_kafka != records {
            return Err(failed(format!("{topic} holds {in_kafka} messages for {records} records")));
        }
        Ok(())
    }

    /// A persister reading `topic` into `schema` of cluster `cluster` (the group: the schema's
    /// name), heartbeats every 500 ms.
    fn member(&self, topic: &str, clusters: &[Cluster], cluster: usize, schema: &str) -> Member {
        let mut config = self.persister_config(topic, schema, false);
        config.set("postgres", "url", clusters[cluster].url.as_str());
        config.persist_property("heartbeat.interval.ms", "500");
        Member { config, cluster, schema: schema.to_string() }
    }

    /// Reads every persister's counters, CPU, and every cluster's and the machine's CPU.
    async fn sample(
        &self,
        processes: &[(Process, SocketAddr)],
        clusters: &[&Cluster],
        last: Option<&Sample>,
    ) -> Sample {
        let (mut rows, mut assigned) = (Vec::new(), Vec::new());
        for (index, (_, admin)) in processes.iter().enumerate() {
            match scrape(*admin).await {
                Ok(metrics) => {
                    rows.push(metrics.sum(telemetry::PERSIST_ROWS, &[]).round() as u64);
                    assigned.push(metrics.sum(telemetry::PERSIST_ASSIGNED_PARTITIONS, &[]).round() as u64);
                }
                // A scrape that fails keeps what the last one read (the counter only grows).
                Err(_) => {
                    rows.push(last.map_or(0, |last| last.rows[index]));
                    assigned.push(last.map_or(0, |last| last.assigned[index]));
                }
            }
        }
        Sample {
            at: now(),
            rows,
            assigned,
            persister_ticks: processes.iter().map(|(process, _)| cpu_ticks(process.pid())).sum(),
            postgres_ticks: clusters.iter().map(|cluster| cluster.postmaster.map_or(0, postmaster_cpu_ticks)).collect(),
            machine_ticks: machine_busy_ticks(),
        }
    }

    /// Starts `members` at once, waits until they wrote `records` rows together, stops them
    /// and counts the rows in their schemas. `partitions`: of every topic they read together.
    async fn drain(
        &self,
        label: &str,
        members: Vec<Member>,
        clusters: &[Cluster],
        partitions: u32,
        records: u64,
    ) -> Result<DrainRun, RunError> {
        log(&format!("{label}: {records} rows, {partitions} partition{}", if partitions == 1 { "" } else { "s" }));
        let mut used: Vec<usize> = members.iter().map(|member| member.cluster).collect();
        used.sort_unstable();
        used.dedup();
        let watched: Vec<&Cluster> = used.iter().map(|index| &clusters[*index]).collect();
        let mut processes = Vec::new();
        for member in &members {
            processes.push(spawn_persister(&member.config).await);
        }
        let start = self.sample(&processes, &watched, None).await;
        let (mut first, mut settled, mut previous) = (None::<Sample>, None::<Sample>, start.clone());
        let deadline = now() + DRAIN_LIMIT.as_secs_f64();
        let last = loop {
            let sample = self.sample(&processes, &watched, Some(&previous)).await;
            if first.is_none() && sample.total() > 0 {
                first = Some(sample.clone());
            }
            let each = processes.len() as u64 > u64::from(partitions) || sample.assigned.iter().all(|held| *held > 0);
            if settled.is_none() && each && sample.assigned.iter().sum::<u64>() == u64::from(partitions) {
                settled = Some(sample.clone());
            }
            if sample.total() >= records {
                break sample;
            }
            if sample.at > deadline {
                return Err(failed(format!(
                    "{label}: only {} of {records} rows written within {} s\n{}",
                    sample.total(),
                    DRAIN_LIMIT.as_secs(),
                    processes[0].0.log_tail(5)
                )));
            }
            for (process, _) in &mut processes {
                if !process.running() {
                    return Err(failed(format!("{label}: a persister exited\n{}", process.log_tail(5))));
                }
            }
            previous = sample;
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let peak_rss = processes.iter().map(|(process, _)| hwm_kib(process.pid())).max().unwrap_or(0);
        let writers = writers(processes[0].1).await?;
        for (process, _) in &mut processes {
            process.stop(STOP_LIMIT).await;
        }
        let mut rows = 0;
        let mut counted = Vec::new();
        for member in &members {
            if !counted.contains(&(member.cluster, &member.schema)) {
                counted.push((member.cluster, &member.schema));
                rows += clusters[member.cluster].rows(&member.schema).await?;
            }
        }
        if rows != records {
            return Err(failed(format!("{label}: PostgreSQL holds {rows} rows for {records} records")));
        }
        Ok(self.figures(
            label,
            (&start, first.as_ref(), settled.as_ref(), &last),
            members.len(),
            partitions,
            records,
            (writers, peak_rss),
        ))
    }

    /// A drain's figures from its samples: the start, the first with rows, the one where the
    /// group settled, the last.
    fn figures(
        &self,
        label: &str,
        (start, first, settled, last): (&Sample, Option<&Sample>, Option<&Sample>, &Sample),
        persisters: usize,
        partitions: u32,
        records: u64,
        (writers, peak_rss_kib): (u64, u64),
    ) -> DrainRun {
        // From the first rows seen; when every row was in the first count (a smoke run's few),
        // from the start, which understates the rate rather than give none.
        let from = first.filter(|first| first.total() < records && last.at > first.at).unwrap_or(start);
        let seconds = last.at - from.at;
        let rows_per_second = (records - from.total().min(records)) as f64 / seconds;
        let ticks = self.ticks as f64;
        let cores = |before: u64, after: u64| after.saturating_sub(before) as f64 / ticks / seconds;
        let persister_cpu_cores = cores(from.persister_ticks, last.persister_ticks);
        let postgres: Vec<Option<f64>> = (0..last.postgres_ticks.len())
            .map(|index| {
                (last.postgres_ticks[index] > 0).then(|| cores(from.postgres_ticks[index], last.postgres_ticks[index]))
            })
            .collect();
        let per_10k = |cores: f64| cores / (rows_per_second / 10_000.0);
        let postgres_total: Option<f64> = postgres.iter().copied().sum();
        let settled_span = settled
            .filter(|settled| records.saturating_sub(settled.total()) >= records / 10 && last.at > settled.at)
            .map(|settled| (last.at - settled.at, (records - settled.total()) as f64 / (last.at - settled.at)));
        DrainRun {
            label: label.to_string(),
            persisters: u32::try_from(persisters).unwrap_or(u32::MAX),
            partitions,
            postgres_clusters: u32::try_from(last.postgres_ticks.len()).unwrap_or(u32::MAX),
            writers_per_persister: writers,
            rows: records,
            seconds,
            rows_per_second,
            settled_rows_per_second: settled_span.map(|(_, rate)| rate),
            settled_seconds: settled_span.map(|(seconds, _)| seconds),
            rows_per_persister: last.rows.clone(),
            partitions_per_persister: settled.unwrap_or(last).assigned.clone(),
            persister_cpu_cores,
            persister_cpu_cores_per_10k_rows_per_second: per_10k(persister_cpu_cores),
            persister_peak_rss_mib: peak_rss_kib as f64 / 1024.0,
            postgres_cpu_cores_per_cluster: postgres,
            postgres_cpu_cores_per_10k_rows_per_second: postgres_total.map(per_10k),
            machine_busy_cores: cores(from.machine_ticks, last.machine_ticks),
        }
    }
}
