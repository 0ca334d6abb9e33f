//! The scenarios of a run, each from start to stop with agents and persisters of its own: the
//! ceilings' shipping half, max rate, fixed rate, rsyslog, the broker outage, the persister and
//! the PostgreSQL stall.
//!
//! Owns: what each scenario measures and checks. Must not: write `results.json` or the
//! summary (the run does, in its order), or leave a process of its own running.

use std::time::Duration;

use sluice::telemetry;

use super::super::Shape;
use super::super::host::{cpu_ticks, hwm_kib, now, rss_kib, rsyslog_version};
use super::super::kafka::{self, ProducerResult};
use super::super::report::{
    FixedRate, KafkaConnectRun, MaxRate, Outage, Persist, PgStall, RowLatency, Rsyslog, RsyslogCounts, RsyslogRss,
    RunRss, Span,
};
use super::{
    Bench, RSYSLOGD, RunError, STOP_LIMIT, Sampler, alive, blocking, bucket_latency, failed, io, log, metric_sum,
    random, scrape, writers,
};
use crate::{Process, start_agent, start_persister};

impl Bench {
    /// The shipping ceiling for `records` records of `shape`: a raw producer into a fresh
    /// topic, every message counted there.
    pub(super) async fn shipping_ceiling(&self, records: u64, shape: &Shape) -> Result<ProducerResult, RunError> {
        let topic = format!("bench-ceiling-{}-{}", self.stamp, random());
        let config = self.agent_config(&topic, "memory");
        let config = sluice::config::Config::load(&config.write())?;
        let (brokers, shape, name) = (self.services.kafka.clone(), shape.clone(), topic.clone());
        let ceiling = blocking(move || {
            let ceiling = kafka::producer_ceiling(&config, &name, records, &shape)?;
            Ok((ceiling, kafka::topic_count(&brokers, &name)?))
        })
        .await?;
        let (ceiling, in_kafka) = ceiling;
        if in_kafka != records {
            return Err(failed(format!("the producer ceiling put {in_kafka} of {records} messages in {topic}")));
        }
        Ok(ceiling)
    }

    /// `sluice-bench persist`: the persister alone, `repeat` times, each into a fresh schema,
    /// draining `topic` (`records` envelopes of `shape`; filled first by the shipping ceiling's
    /// producer when `topic` is `None`). For a before/after of one change, run it once per
    /// binary (`SLUICE_BENCH_BINARY`) on the same topic. Returns a line per run.
    pub async fn persister_alone(
        &self,
        records: u64,
        topic: Option<String>,
        shape: &Shape,
        shape_label: &str,
        repeat: u32,
        (kafka_connect, columns): (bool, bool),
    ) -> Result<String, RunError> {
        let topic = match topic {
            Some(topic) => topic,
            None => {
                let topic = format!("bench-persist-{}-{}", self.stamp, random());
                let config = self.agent_config(&topic, "memory");
                let config = sluice::config::Config::load(&config.write())?;
                let (name, shape) = (topic.clone(), shape.clone());
                blocking(move || kafka::producer_ceiling(&config, &name, records, &shape)).await?;
                topic
            }
        };
        let record_bytes = match shape {
            Shape::Padded(size) => *size as f64 - 1.0,
            Shape::Sample(lines) => lines.iter().map(Vec::len).sum::<usize>() as f64 / lines.len().max(1) as f64,
        };
        let mut out = format!("topic {topic}: {records} records of {shape_label}\n");
        for _ in 0..repeat {
            let run = self.persist(&topic, records, shape_label, record_bytes, (false, false)).await?;
            if columns {
                let typed = self.persist(&topic, records, shape_label, record_bytes, (true, false)).await?;
                out.push_str(&format!(
                    "with 5 typed columns: {:.0} rows/s ({:.2}× of none), {:.3} cores per 10k rows/s, {:.0} bytes per row\n",
                    typed.rows_per_second,
                    typed.rows_per_second / run.rows_per_second,
                    typed.persister_cpu_cores_per_10k_rows_per_second,
                    typed.bytes_per_row
                ));
            }
            out.push_str(&format!(
                "{:.0} rows/s, {:.3} cores per 10k rows/s, peak RSS {:.1} MiB, {:.0} bytes per row\n",
                run.rows_per_second,
                run.persister_cpu_cores_per_10k_rows_per_second,
                run.persister_peak_rss_mib,
                run.bytes_per_row
            ));
            if kafka_connect {
                out.push_str(&match self.kafka_connect(records, shape, run.writers).await? {
                    KafkaConnectRun::Measured(peer) => format!(
                        "  {}: {:.0} rows/s, {:.3} cores per 10k rows/s, peak RSS {:.1} MiB; the persister {:.2}×\n",
                        peer.version,
                        peer.rows_per_second,
                        peer.cpu_cores_per_10k_rows_per_second,
                        peer.peak_rss_mib,
                        run.rows_per_second / peer.rows_per_second
                    ),
                    KafkaConnectRun::NotMeasured(why) => format!("  Kafka Connect: not measured ({why})\n"),
                });
            }
        }
        Ok(out)
    }

    /// `sluice-bench max-rate`: Sluice at max rate, then rsyslog, `repeat` times (the two rows
    /// of the benchmark's delivered / rsyslog target, without the rest of the run), for a
    /// before/after of one change: run it once per binary (`SLUICE_BENCH_BINARY`), alternating.
    /// Returns a line per round.
    pub async fn max_rate_against_rsyslog(&self, repeat: u32) -> Result<String, RunError> {
        let s = &self.settings;
        let shape = Shape::Padded(usize::try_from(s.size).unwrap_or(usize::MAX));
        let mut out = format!(
            "{} records of {} B over {} connections, {}\n",
            s.records,
            s.size,
            s.connections,
            crate::process::binary().display()
        );
        for _ in 0..repeat {
            let topic = format!("bench-maxrate-{}-{}", self.stamp, random());
            log(&format!("sluice, max rate: {} records into {topic}", s.records));
            let sluice = self.max_rate_run(&topic, s.records, &shape).await?;
            if let Err(error) = kafka::delete_topic(&self.services.kafka, &topic).await {
                log(&format!("could not delete {topic}: {error}"));
            }
            let rsyslog = self.rsyslog(&shape).await?;
            let per_record = |cpu: f64| cpu * 1e6 / s.records as f64;
            out.push_str(&format!(
                "sluice {:.0} delivered/s, {:.2} µs CPU per record; rsyslog {:.0}/s, {:.2} µs; sluice / rsyslog {:.2}×\n",
                sluice.delivered_records_per_second,
                per_record(sluice.agent_cpu_seconds),
                rsyslog.delivered_records_per_second,
                per_record(rsyslog.cpu_seconds),
                sluice.delivered_records_per_second / rsyslog.delivered_records_per_second,
            ));
        }
        Ok(out)
    }

    /// Sluice at max rate: a fresh agent on `topic`, `records` records of `shape`; delivered
    /// rate (until every record is settled), agent CPU and RSS (idle, steady = median of 0.2 s
    /// samples, peak), ingest → ack latency, counts.
    pub(super) async fn max_rate_run(&self, topic: &str, records: u64, shape: &Shape) -> Result<MaxRate, RunError> {
        let config = self.agent_config(topic, "memory");
        let mut agent = start_agent(&config).await;
        let (pid, admin) = (agent.pid(), agent.admin());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle_rss = rss_kib(pid);
        let cpu_before = cpu_ticks(pid);
        let rss = Sampler::start(Duration::from_millis(200), move || async move { alive(pid).then(|| rss_kib(pid)) });
        let started = now();
        let load = Self::load(config.socket(), self.load_options(records, 0, shape)).await?;
        let settled_at = Self::wait_settled(admin, records, Duration::from_secs(300)).await?;
        let mut samples = rss.finish().await;
        let cpu_after = cpu_ticks(pid);
        let peak_rss = hwm_kib(pid);
        samples.sort_unstable();
        let steady_rss = if samples.is_empty() { 0 } else { samples[samples.len().div_ceil(2) - 1] };
        let counts = self.verify(admin, topic, records).await?;
        let latency = bucket_latency(admin, telemetry::SHIP_DELIVERY_LATENCY).await?;
        let bytes = metric_sum(admin, &[telemetry::SHIP_DELIVERED_BYTES]).await;
        agent.stop(STOP_LIMIT).await;
        let seconds = settled_at - started;
        let cpu = (cpu_after - cpu_before) as f64 / self.ticks as f64;
        Ok(MaxRate {
            load,
            counts,
            ingest_to_kafka_ack: latency,
            delivered_records_per_second: records as f64 / seconds,
            delivered_seconds: seconds,
            delivered_mib_per_second: bytes as f64 / seconds / 1_048_576.0,
            agent_cpu_seconds: cpu,
            agent_cpu_cores_per_10k_records_per_second: (cpu / seconds) / ((records as f64 / seconds) / 10_000.0),
            agent_rss_mib: RunRss {
                idle: idle_rss as f64 / 1024.0,
                steady: steady_rss as f64 / 1024.0,
                peak: peak_rss as f64 / 1024.0,
            },
        })
    }

    /// 3. Fixed rate.
    pub(super) async fn fixed_rate(&self, shape: &Shape) -> Result<FixedRate, RunError> {
        let s = &self.settings;
        let topic = format!("bench-fixed-{}-{}", self.stamp, random());
        let records = s.rate * s.seconds;
        log(&format!("sluice, fixed rate: {} records/s for {} s into {topic}", s.rate, s.seconds));
        let config = self.agent_config(&topic, "memory");
        let mut agent = start_agent(&config).await;
        let (pid, admin) = (agent.pid(), agent.admin());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cpu_before = cpu_ticks(pid);
        let started = now();
        let load = Self::load(config.socket(), self.load_options(records, s.rate, shape)).await?;
        let settled_at = Self::wait_settled(admin, records, Duration::from_secs(120)).await?;
        let cpu_after = cpu_ticks(pid);
        let peak_rss = hwm_kib(pid);
        let counts = self.verify(admin, &topic, records).await?;
        let latency = bucket_latency(admin, telemetry::SHIP_DELIVERY_LATENCY).await?;
        agent.stop(STOP_LIMIT).await;
        let seconds = settled_at - started;
        let cpu = (cpu_after - cpu_before) as f64 / self.ticks as f64;
        Ok(FixedRate {
            load,
            counts,
            ingest_to_kafka_ack: latency,
            rate: s.rate,
            seconds,
            agent_cpu_seconds: cpu,
            agent_cpu_cores_per_10k_records_per_second: (cpu / seconds) / (s.rate as f64 / 10_000.0),
            agent_peak_rss_mib: peak_rss as f64 / 1024.0,
        })
    }

    /// 4. The peer: rsyslog at max rate.
    pub(super) async fn rsyslog(&self, shape: &Shape) -> Result<Rsyslog, RunError> {
        let s = &self.settings;
        let topic = format!("bench-rsyslog-{}-{}", self.stamp, random());
        let version = rsyslog_version(RSYSLOGD);
        log(&format!("rsyslog {version} (Debian's librdkafka), max rate: {} records into {topic}", s.records));
        let dir = self.work.path().join("rsyslog");
        std::fs::create_dir_all(&dir).map_err(io("making rsyslog's work dir"))?;
        let socket = self.work.path().join("rsyslog.sock");
        let conf = self.work.path().join("rsyslog.conf");
        let text = format!(
            r#"global(workDirectory="{dir}" maxMessageSize="64k")
module(load="imptcp")
module(load="omkafka")
template(name="raw" type="string" string="%rawmsg%")
input(type="imptcp" path="{socket}" unlink="on" ruleset="tokafka")
# A memory queue as large as the agent's record budget, batches like the agent's.
ruleset(name="tokafka" queue.type="LinkedList" queue.size="200000" queue.dequeueBatchSize="1024") {{
  action(type="omkafka" broker=["{kafka}"] topic="{topic}" template="raw"
         confParam=["acks=all", "enable.idempotence=true", "compression.codec=zstd", "linger.ms={linger}",
                    "batch.size=1000000"]
         resubmitOnFailure="on")
}}
"#,
            dir = dir.display(),
            socket = socket.display(),
            linger = sluice::config::DEFAULT_LINGER.as_millis(),
            kafka = self.services.kafka,
        );
        std::fs::write(&conf, text).map_err(io("writing rsyslog.conf"))?;
        let (brokers, name) = (self.services.kafka.clone(), topic.clone());
        blocking(move || kafka::ensure_topic(&brokers, &name)).await?;
        let mut command = std::process::Command::new(RSYSLOGD);
        command.arg("-n").arg("-f").arg(&conf).arg("-i").arg(self.work.path().join("rsyslog.pid"));
        let mut rsyslog = Process::start("rsyslog", command, self.work.path());
        for _ in 0..100 {
            if socket.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !socket.exists() {
            return Err(failed(format!("rsyslog did not start\n{}", rsyslog.log_text())));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let pid = rsyslog.pid();
        let idle_rss = rss_kib(pid);
        let cpu_before = cpu_ticks(pid);
        let started = now();
        let load = Self::load(socket, self.load_options(s.records, 0, shape)).await?;
        let deadline = now() + 300.0;
        let in_kafka = loop {
            let (brokers, name) = (self.services.kafka.clone(), topic.clone());
            let in_kafka = blocking(move || kafka::topic_count(&brokers, &name)).await?;
            if in_kafka >= s.records {
                break in_kafka;
            }
            if now() > deadline {
                return Err(failed(format!(
                    "rsyslog delivered {in_kafka} of {} records within 300 s (it counts no drops)",
                    s.records
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let settled_at = now();
        if in_kafka != s.records {
            return Err(failed(format!("rsyslog put {in_kafka} messages in Kafka for {} records", s.records)));
        }
        let cpu_after = cpu_ticks(pid);
        let peak_rss = hwm_kib(pid);
        rsyslog.stop(STOP_LIMIT).await;
        let seconds = settled_at - started;
        let cpu = (cpu_after - cpu_before) as f64 / self.ticks as f64;
        Ok(Rsyslog {
            version: format!("rsyslog {version}"),
            load,
            counts: RsyslogCounts { written: s.records, in_kafka },
            delivered_records_per_second: s.records as f64 / seconds,
            delivered_seconds: seconds,
            cpu_seconds: cpu,
            cpu_cores_per_10k_records_per_second: (cpu / seconds) / ((s.records as f64 / seconds) / 10_000.0),
            rss_mib: RsyslogRss { idle: idle_rss as f64 / 1024.0, peak: peak_rss as f64 / 1024.0 },
        })
    }

    /// 5. Broker outage under a disk buffer.
    pub(super) async fn outage(&self, shape: &Shape) -> Result<Outage, RunError> {
        let s = &self.settings;
        let topic = format!("bench-outage-{}-{}", self.stamp, random());
        let records = s.rate * (2 * s.around + s.outage);
        log(&format!(
            "sluice, broker outage: {} records/s, disk buffer, broker stopped {}s after {}s",
            s.rate, s.outage, s.around
        ));
        let config = self.agent_config(&topic, "disk");
        let mut agent = start_agent(&config).await;
        let (pid, admin) = (agent.pid(), agent.admin());
        let t0 = now();
        // t, ingested, delivered, spooled, rss_kib
        let sampler = Sampler::start(Duration::from_millis(500), move || async move {
            if !alive(pid) {
                return None;
            }
            let metrics = scrape(admin).await.ok()?;
            let sum = |name| metrics.sum(name, &[]).round() as u64;
            Some((
                now(),
                sum(telemetry::INGEST_RECORDS),
                sum(telemetry::SHIP_DELIVERED),
                sum(telemetry::SPOOL_RECORDS),
                rss_kib(pid),
            ))
        });
        let load = tokio::spawn(Self::load(config.socket(), self.load_options(records, s.rate, shape)));
        tokio::time::sleep(Duration::from_secs(s.around)).await;
        let from = now();
        self.stack("kafka-stop")?;
        tokio::time::sleep(Duration::from_secs(s.outage)).await;
        let to = now();
        self.stack("kafka-start")?;
        let load = load.await.map_err(|error| failed(format!("the load panicked: {error}")))??;
        let settled_at = Self::wait_settled(admin, records, Duration::from_secs(300)).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let samples = sampler.finish().await;
        let peak_rss = hwm_kib(pid);
        let counts = self.verify(admin, &topic, records).await?;
        agent.stop(STOP_LIMIT).await;
        let mut csv = String::from("seconds,ingested,delivered,spooled,rss_mib\n");
        for (t, ingested, delivered, spooled, rss) in samples {
            csv.push_str(&format!("{:.2},{ingested},{delivered},{spooled},{:.1}\n", t - t0, rss as f64 / 1024.0));
        }
        self.write("outage_timeseries.csv", &csv)?;
        Ok(Outage {
            load,
            counts,
            rate: s.rate,
            outage: Span { from_s: from - t0, to_s: to - t0 },
            settled_s: settled_at - t0,
            agent_peak_rss_mib: peak_rss as f64 / 1024.0,
        })
    }

    /// The persister (scenario 6) drains `topic` — `records` records of `shape`, `record_bytes`
    /// each on average as written — into PostgreSQL: rows/s, CPU, RSS, bytes per row; with
    /// `columns` into five typed columns too; with `ceiling`, then PostgreSQL's own `COPY` of the
    /// rows it stored (`copy_ceiling.rs`, two sessions), the persister's rate beside it.
    pub(super) async fn persist(
        &self,
        topic: &str,
        records: u64,
        shape: &str,
        record_bytes: f64,
        (columns, ceiling): (bool, bool),
    ) -> Result<Persist, RunError> {
        let schema = self.new_schema();
        log(&format!("persister: {records} records from {topic} into PostgreSQL schema {schema}"));
        let config = self.persister_config(topic, &schema, columns);
        let started = now();
        let mut persister = start_persister(&config).await;
        let drain = Self::wait_rows(&mut persister, records, Duration::from_secs(600)).await?;
        let pid = persister.pid();
        let figures = drain.figures(records, started, cpu_ticks(pid), self.ticks);
        let peak_rss = hwm_kib(pid);
        let writers = writers(persister.admin()).await?;
        persister.stop(STOP_LIMIT).await;
        let in_pg = self.rows(&schema).await?;
        if in_pg != records {
            return Err(failed(format!("the persister stored {in_pg} rows for {records} records")));
        }
        let relation_bytes = self.relation_bytes(&schema).await?;
        let copy_ceiling = match ceiling {
            true => Some(self.copy_ceiling(&schema, in_pg, false).await?),
            false => None,
        };
        self.sql(&format!("DROP SCHEMA {schema} CASCADE")).await?;
        Ok(Persist {
            records,
            rows_in_postgres: in_pg,
            writers,
            rows_per_second: figures.rows_per_second,
            seconds: figures.seconds,
            persister_cpu_seconds: figures.cpu_seconds,
            persister_cpu_cores_per_10k_rows_per_second: figures.cores_per_10k_rows_per_second,
            persister_peak_rss_mib: peak_rss as f64 / 1024.0,
            shape: shape.to_string(),
            record_bytes,
            relation_bytes,
            bytes_per_row: relation_bytes as f64 / in_pg.max(1) as f64,
            postgres_copy_ceiling: copy_ceiling,
        })
    }

    /// What `schema.log_rows` (the table under the view `logs`) takes on disk: `pg_total_relation_size` (heap, TOAST, indexes, every
    /// fork) of each of its partitions, summed.
    pub(super) async fn relation_bytes(&self, schema: &str) -> Result<u64, RunError> {
        let row = self
            .db
            .query_one(
                &format!(
                    "SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0)::bigint FROM pg_inherits \
                     WHERE inhparent = '{schema}.log_rows'::regclass"
                ),
                &[],
            )
            .await?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }

    /// 7. PostgreSQL stalled under agent + persister.
    pub(super) async fn pg_stall(&self, shape: &Shape) -> Result<PgStall, RunError> {
        let s = &self.settings;
        let topic = format!("bench-pgstall-{}-{}", self.stamp, random());
        let schema = self.new_schema();
        let records = s.rate * (2 * s.around + s.outage);
        log(&format!(
            "sluice + persister at {} records/s; PostgreSQL inserts stalled for {}s after {}s",
            s.rate, s.outage, s.around
        ));
        let (brokers, name) = (self.services.kafka.clone(), topic.clone());
        blocking(move || kafka::ensure_topic(&brokers, &name)).await?;
        let config = self.agent_config(&topic, "memory");
        let mut agent = start_agent(&config).await;
        let persister_config = self.persister_config(&topic, &schema, false);
        let mut persister = start_persister(&persister_config).await;
        let (agent_pid, admin) = (agent.pid(), agent.admin());
        let (persister_pid, persister_admin) = (persister.pid(), persister.admin());
        let t0 = now();
        // t, ingested, delivered, rows
        let sampler = Sampler::start(Duration::from_millis(500), move || async move {
            if !alive(agent_pid) || !alive(persister_pid) {
                return None;
            }
            let t = now();
            let ingested = metric_sum(admin, &[telemetry::INGEST_RECORDS]).await;
            let delivered = metric_sum(admin, &[telemetry::SHIP_DELIVERED]).await;
            let rows = metric_sum(persister_admin, &[telemetry::PERSIST_ROWS]).await;
            Some((t, ingested, delivered, rows))
        });
        let load = tokio::spawn(Self::load(config.socket(), self.load_options(records, s.rate, shape)));
        tokio::time::sleep(Duration::from_secs(s.around)).await;
        let before = bucket_latency(persister_admin, telemetry::PERSIST_ROW_LATENCY).await?;
        let from = now();
        self.sql(&format!(
            "CREATE TABLE {schema}.bench_stall (held boolean);
             INSERT INTO {schema}.bench_stall VALUES (true);
             CREATE FUNCTION {schema}.bench_stall() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN
                 WHILE EXISTS (SELECT 1 FROM {schema}.bench_stall) LOOP PERFORM pg_sleep(0.1); END LOOP;
                 RETURN NULL;
               END $$;
             CREATE TRIGGER bench_stall BEFORE INSERT ON {schema}.log_rows FOR EACH STATEMENT EXECUTE FUNCTION {schema}.bench_stall();"
        ))
        .await?;
        tokio::time::sleep(Duration::from_secs(s.outage)).await;
        let to = now();
        self.sql(&format!("DELETE FROM {schema}.bench_stall")).await?;
        self.sql(&format!("DROP TRIGGER bench_stall ON {schema}.log_rows")).await?;
        let load = load.await.map_err(|error| failed(format!("the load panicked: {error}")))??;
        Self::wait_settled(admin, records, Duration::from_secs(300)).await?;
        let caught_up = Self::wait_rows(&mut persister, records, Duration::from_secs(300)).await?.last_at;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let samples = sampler.finish().await;
        let mut counts = self.verify(admin, &topic, records).await?;
        let in_pg = self.rows(&schema).await?;
        if in_pg != counts.in_kafka {
            return Err(failed(format!("PostgreSQL holds {in_pg} rows for {} records in Kafka", counts.in_kafka)));
        }
        counts.rows_in_postgres = Some(in_pg);
        let overall = bucket_latency(persister_admin, telemetry::PERSIST_ROW_LATENCY).await?;
        let latency = bucket_latency(admin, telemetry::SHIP_DELIVERY_LATENCY).await?;
        persister.stop(STOP_LIMIT).await;
        agent.stop(STOP_LIMIT).await;
        self.sql(&format!("DROP SCHEMA {schema} CASCADE")).await?;
        let mut csv = String::from("seconds,ingested,delivered,rows\n");
        let mut backlog = 0;
        for (t, ingested, delivered, rows) in samples {
            csv.push_str(&format!("{:.2},{ingested},{delivered},{rows}\n", t - t0));
            backlog = backlog.max(delivered.saturating_sub(rows));
        }
        self.write("pg_stall_timeseries.csv", &csv)?;
        Ok(PgStall {
            load,
            counts,
            rate: s.rate,
            stall: Span { from_s: from - t0, to_s: to - t0 },
            caught_up_s: caught_up - t0,
            max_persister_backlog_records: backlog,
            ingest_to_kafka_ack: latency,
            socket_to_postgres_row: RowLatency { before_stall: before, overall },
        })
    }
}
