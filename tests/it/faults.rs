//! Fault tests: break the real broker, the real database and the real processes under load, then
//! check PostgreSQL for exactly the expected records — each once, and `sent = rows + counted
//! drops` where the policy allows drops.
//!
//! Outages last `SLUICE_FAULT_SECONDS` (default 30). Tests that stop Kafka run a private broker;
//! the test that stops PostgreSQL cuts a proxy in front of it: the shared services keep serving
//! the other tests.
//!
//! One file over the usual size (~700 lines): each test is a whole fault scenario (set up, load,
//! break, heal, account) and they share the accounting helpers at the top; split by fault they
//! would each need those helpers from a third file and read less like one specification.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::*;
use sluice::telemetry;

fn outage() -> Duration {
    Duration::from_secs(std::env::var("SLUICE_FAULT_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(30))
}

/// Waits until `logs` holds `n` rows and nothing more can arrive (a late duplicate would show
/// by then), then returns the stored numbers.
async fn wait_for_numbers(config: &TestConfig, db: &tokio_postgres::Client, tag: &str, n: u64) -> Vec<u64> {
    until_rows_within(db, n as i64, Duration::from_secs(240)).await;
    until_nothing_left(config).await;
    stored_numbers(db, tag).await
}

/// Waits until Kafka has acknowledged a second's load (`rate` records) more than when asked:
/// the load flows end to end.
async fn ships_a_second_more(admin: std::net::SocketAddr, rate: u64) {
    let delivered = scrape(admin).await.count(telemetry::SHIP_DELIVERED, &[]);
    until_metric_at_least(admin, telemetry::SHIP_DELIVERED, &[], delivered + rate as f64).await;
}

impl BrokerPipeline {
    /// Waits until `logs` holds `n` rows. If it does not within 235 s, fails saying which
    /// numbers are missing and what the agent and the persister counted (their logs print too).
    async fn wait_for_rows_or_explain(&self, n: u64) {
        let waited = tokio::time::timeout(
            Duration::from_secs(235),
            until_rows_within(&self.db, n as i64, Duration::from_secs(240)),
        )
        .await;
        if waited.is_ok() {
            return;
        }
        let stored: BTreeSet<u64> = stored_numbers(&self.db, &self.tag).await.into_iter().collect();
        let top = stored.iter().next_back().copied().unwrap_or(0);
        let missing: Vec<u64> = (0..=top).filter(|k| !stored.contains(k)).take(20).collect();
        // Where the missing ones are: not in Kafka (the agent's side) or in Kafka and not in
        // PostgreSQL (the persister's side).
        let topic = read_topic(&self.broker.bootstrap, &self.tag).await;
        let in_kafka: BTreeSet<u64> = numbers_in(&self.tag, &topic.payloads).into_iter().collect();
        let not_in_kafka: Vec<u64> = (0..n).filter(|k| !in_kafka.contains(k)).take(20).collect();
        let not_stored: Vec<u64> = in_kafka.difference(&stored).take(20).copied().collect();
        let agent = scrape(self.config.agent_admin()).await;
        let persister = scrape(self.config.persist_admin()).await;
        let log = self.persister.log_text();
        let group: Vec<&str> = log.lines().filter(|line| line.contains("librdkafka")).collect();
        let group = group[group.len().saturating_sub(120)..].join("\n");
        panic!(
            "{} of {n} rows; highest number {top}; missing below it (first 20): {missing:?}\n\
             kafka: {} messages, {} distinct numbers; not in kafka (first 20): {not_in_kafka:?}; \
             in kafka but not stored (first 20): {not_stored:?}\n\
             agent metrics:\n{}\npersister metrics:\n{}\npersister's last librdkafka lines:\n{group}",
            stored.len(),
            topic.messages,
            in_kafka.len(),
            nonzero(&agent),
            nonzero(&persister)
        );
    }
}

/// Agent and persister on a private broker that the test may stop.
struct BrokerPipeline {
    broker: PrivateBroker,
    agent: Process,
    persister: Process,
    db: tokio_postgres::Client,
    tag: String,
    /// Last: its directory holds the processes' logs, printed when a test fails.
    config: TestConfig,
}

/// A two-partition topic on a private broker, the agent's delivery timeout 5 s, and what
/// `scenario` adds; persister and agent started and ready. The persister logs librdkafka's
/// consumer-group debugging, which [`BrokerPipeline::wait_for_rows_or_explain`] shows: once in
/// a clean-clone CI run the persister lost its partitions with the broker and was not given them
/// back within four minutes of its return (its commits failing `WaitingForCoordinator`), and
/// nothing here has reproduced it since.
async fn broker_pipeline(scenario: impl FnOnce(Scenario) -> Scenario) -> BrokerPipeline {
    let broker = PrivateBroker::start().await;
    let setup = scenario(
        Scenario::new("run")
            .partitions(2)
            .on(&broker)
            .set("ship", "delivery_timeout", "5s")
            // Only the persister's consumer is asked for debugging; the agent's log is as before.
            .with(|config| {
                config.persist_property("debug", "cgrp");
            })
            .set("log", "level", "info,librdkafka=warn,librdkafka::debug=debug"),
    )
    .build()
    .await;
    let persister = setup.persister().await;
    let agent = setup.agent().await;
    let db = setup.db().await;
    let Setup { topic: tag, config, .. } = setup;
    BrokerPipeline { broker, config, agent, persister, db, tag }
}

/// A disk buffer with the default policy (`block`, `block_timeout = "1s"`). A writer held longer
/// than that has its record dropped and counted (`block_timeout`): under full CI load, right after
/// the broker returns, this happened (issue 12, item 15: 3,538 of 114,400, exactly the records
/// missing from Kafka) — counted, so the tests check `sent = rows + drops`, not zero drops.
fn disk(scenario: Scenario) -> Scenario {
    scenario.disk_buffer().set("buffer", "max_bytes", "2 MiB").set("buffer", "max_disk_bytes", "256 MiB").listener(
        "default",
        "max_record_size",
        "64 KiB",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_outage_under_load_with_a_disk_spool_loses_nothing_and_duplicates_nothing() {
    // The default delivery timeout (longer than the outage): librdkafka's own retries are
    // idempotent, so a duplicate in the topic can only be the agent's.
    let mut p = broker_pipeline(|scenario| disk(scenario).set("ship", "delivery_timeout", "2m")).await;
    let admin = p.config.agent_admin();
    let load = Load::start(&p.config.socket(), &p.tag, 2000, 2);
    ships_a_second_more(admin, 2000).await;
    p.broker.stop().await;
    let lines_before = p.agent.log_text().lines().count();
    // The time is the point: the outage lasts SLUICE_FAULT_SECONDS, and the oldest record's age
    // is checked against it.
    tokio::time::sleep(outage()).await;
    // Issue 30, item 3: one line when Kafka goes and one per kind of client error (librdkafka's
    // repeats every few tens of milliseconds are counted, one line a minute).
    let log = p.agent.log_text();
    let lines: Vec<&str> = log.lines().skip(lines_before).collect();
    let allowed = 8 + 4 * outage().as_secs() as usize / 60;
    assert!(lines.len() <= allowed, "{} lines in a {:?} outage:\n{}", lines.len(), outage(), lines.join("\n"));
    let during = scrape(admin).await;
    assert!(
        during.count(telemetry::BUFFER_OLDEST_AGE, &[]) >= outage().as_secs_f64() - 5.0,
        "the oldest record has waited about as long as the outage:\n{}",
        during.0
    );
    let (status, body) = http_get(p.config.agent_admin(), "/readyz").await.expect("readyz");
    assert_eq!((status, body.trim()), (200, "ready (accepting records; kafka unreachable; records are buffered)"));
    let (status, body) = http_get(p.config.agent_admin(), "/healthz/kafka").await.expect("healthz/kafka");
    assert_eq!((status, body.trim()), (503, "kafka unreachable; records are buffered"));
    p.broker.resume().await;
    // The load goes on across the broker's return, until Kafka takes records again.
    ships_a_second_more(admin, 2000).await;
    let sent = load.stop().await;

    // Every record written is a row, or was dropped and counted (a writer held past
    // block_timeout under load): `sent = rows + drops`, each row once.
    let metrics = until_metric(admin, telemetry::INGEST_RECORDS, &[], sent as f64).await;
    let dropped = metrics.count(telemetry::BUFFER_DROPPED, &[]) as u64;
    let rows = sent - dropped;
    p.wait_for_rows_or_explain(rows).await;
    let numbers = wait_for_numbers(&p.config, &p.db, &p.tag, rows).await;
    let distinct: BTreeSet<u64> = numbers.iter().copied().collect();
    assert_eq!((numbers.len() as u64, distinct.len() as u64), (rows, rows), "sent {sent} = rows + {dropped} dropped");
    assert!(distinct.iter().all(|n| *n < sent));
    if dropped > 0 {
        eprintln!("{dropped} of {sent} records dropped and counted (block_timeout) under this machine's load");
    }
    assert!(during.count(telemetry::SPOOL_RECORDS, &[]) > 1000.0, "the spool held the outage's records");
    until_scrape(admin, "depth and age fall back once Kafka is back", |after| {
        after.count(telemetry::SPOOL_RECORDS, &[]) < 100.0 && after.count(telemetry::BUFFER_OLDEST_AGE, &[]) < 5.0
    })
    .await;
    let after = scrape(admin).await;
    for reason in ["drop_newest", "drop_oldest", "corrupt"] {
        assert_eq!(after.count(telemetry::BUFFER_DROPPED, &[("reason", reason)]), 0.0, "{reason}");
    }
    assert_topic_holds_each_once(&p, rows, &after, false).await;
}

/// Issue 12, item 6: after an outage the topic held ~5% more messages than records (the backlog
/// re-sent records already in flight) and the delivered counter claimed them all. Every other
/// consumer of the topic sees what is in Kafka, so: distinct ids = `records` = the agent's
/// delivered counter, and messages = `records` too — unless a send timed out
/// (`ship.delivery_timeout` shorter than the outage): a timed-out record may have reached Kafka
/// and is sent again (at least once; the persister stores one row), each such resend counted
/// in `sluice_ship_records_retried_total`. With `retries_allowed = false` none may happen.
async fn assert_topic_holds_each_once(p: &BrokerPipeline, records: u64, agent: &Metrics, retries_allowed: bool) {
    let topic = read_topic(&p.broker.bootstrap, &p.tag).await;
    let retried = agent.count(telemetry::SHIP_RETRIED, &[]) as u64;
    let delivered = agent.count(telemetry::SHIP_DELIVERED, &[]) as u64;
    assert_eq!(topic.distinct_ids() as u64, records, "distinct ids in the topic");
    assert_eq!(delivered, records, "the delivered counter counts each record once");
    if retries_allowed {
        assert!(
            topic.messages - records <= retried,
            "{} messages for {records} records, {retried} resent",
            topic.messages
        );
    } else {
        assert_eq!((topic.messages, retried), (records, 0), "messages in the topic, records resent");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_outage_under_load_with_memory_and_drop_newest_counts_every_drop_exactly() {
    let mut p = broker_pipeline(|scenario| {
        scenario.set("buffer", "max_bytes", "1 MiB").set("buffer", "when_full", "drop_newest").listener(
            "default",
            "max_record_size",
            "64 KiB",
        )
    })
    .await;
    let admin = p.config.agent_admin();
    let load = Load::start(&p.config.socket(), &p.tag, 2000, 2);
    ships_a_second_more(admin, 2000).await;
    p.broker.stop().await;
    // The time is the point: the outage lasts SLUICE_FAULT_SECONDS (far more than 1 MiB holds).
    tokio::time::sleep(outage()).await;
    p.broker.resume().await;
    // The load goes on across the broker's return, until Kafka takes records again.
    ships_a_second_more(admin, 2000).await;
    let sent = load.stop().await;

    let metrics = until_metric(admin, telemetry::INGEST_RECORDS, &[], sent as f64).await;
    let (ingested, dropped) = (
        metrics.count(telemetry::INGEST_RECORDS, &[]),
        metrics.count(telemetry::BUFFER_DROPPED, &[("reason", "drop_newest")]),
    );
    assert!(dropped > 0.0, "a 1 MiB buffer cannot hold a {}s outage", outage().as_secs());
    let rows = (ingested - dropped) as u64;
    p.wait_for_rows_or_explain(rows).await;
    let numbers = wait_for_numbers(&p.config, &p.db, &p.tag, rows).await;
    assert_eq!(numbers.len() as u64, rows, "sent {sent} = rows {} + dropped {dropped}", numbers.len());
    let distinct: BTreeSet<u64> = numbers.iter().copied().collect();
    assert_eq!(distinct.len(), numbers.len(), "duplicate rows");
    assert!(distinct.iter().all(|n| *n < sent));
    let after = scrape(admin).await;
    assert_eq!(after.count(telemetry::SHIP_FAILED, &[("reason", "drain_timeout")]), 0.0);
    assert_topic_holds_each_once(&p, rows, &after, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_record_survives_three_agent_kills_with_a_synced_spool() {
    let setup = disk(Scenario::new("killed").partitions(2)).set("buffer", "fsync", "always").build().await;
    let (config, topic) = (&setup.config, &setup.topic);
    let _persister = setup.persister().await;
    let db = setup.db().await;
    let mut agent = setup.agent().await;
    let sender = AckedSender::start(&config.socket(), topic, 1000);
    // Each agent is killed with a second's acknowledged load behind it (its own count: a new
    // process starts at zero), and the last one takes a second's load too.
    let a_seconds_load = || until_metric_at_least(config.agent_admin(), telemetry::INGEST_RECORDS, &[], 1000.0);
    for _ in 0..3 {
        a_seconds_load().await;
        agent.kill();
        agent = setup.agent().await;
    }
    a_seconds_load().await;
    let sent = sender.sent();
    let (acked, refused) = sender.stop(Duration::from_secs(10)).await;
    assert!(acked.len() > 1000, "only {} of {sent} records acknowledged", acked.len());
    assert!(refused.is_empty(), "refused {refused:?}");

    let tag = topic.clone();
    let numbers = until("every acknowledged record stored", || async {
        let numbers = stored_numbers(&db, &tag).await;
        let stored: BTreeSet<u64> = numbers.iter().copied().collect();
        let missing = acked.difference(&stored).count();
        if missing == 0 { Ok(numbers) } else { Err(format!("{missing} of {} missing", acked.len())) }
    })
    .await;
    let distinct: BTreeSet<u64> = numbers.iter().copied().collect();
    assert_eq!(distinct.len(), numbers.len(), "duplicate rows");
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_spooled_when_the_agent_stops_during_an_outage_are_delivered_after_restart() {
    let mut p = broker_pipeline(|scenario| disk(scenario).set("agent", "drain_timeout", "2s")).await;
    let admin = p.config.agent_admin();
    let load = Load::start(&p.config.socket(), &p.tag, 1000, 2);
    ships_a_second_more(admin, 1000).await;
    p.broker.stop().await;
    // A second's load waits in the spool while Kafka is away.
    until_metric_at_least(admin, telemetry::SPOOL_RECORDS, &[], 1000.0).await;
    let sent = load.stop().await;
    p.agent.signal("TERM");
    let status = p.agent.wait(Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}\n{}", p.agent.log_text());
    assert!(p.agent.log_text().contains("stay in the spool for the next start"), "{}", p.agent.log_text());

    let first_log = p.agent.log_text();
    p.broker.resume().await;
    let second = start_agent(&p.config).await;
    // Within 60 s, or the assertion below says which records are missing.
    let all_rows = until_rows_within(&p.db, sent as i64, Duration::from_secs(90));
    let _ = tokio::time::timeout(Duration::from_secs(60), all_rows).await;
    let numbers = stored_numbers(&p.db, &p.tag).await;
    let stored: BTreeSet<u64> = numbers.iter().copied().collect();
    let missing: Vec<u64> = (0..sent).filter(|n| !stored.contains(n)).take(5).collect();
    assert!(
        missing.is_empty(),
        "missing {missing:?} of {sent}\nfirst run:\n{}\nsecond run:\n{}",
        first_log.lines().filter(|l| !l.contains("kafka client error")).collect::<Vec<_>>().join("\n"),
        second.log_text().lines().filter(|l| !l.contains("kafka client error")).take(30).collect::<Vec<_>>().join("\n")
    );
    assert_each_once(&numbers, 0..sent);
}

/// Runs an agent on `setup`'s config (its Kafka unreachable) until `n` records numbered with
/// `tag` are in its spool, then stops it.
async fn spool_and_stop(setup: &Setup, tag: &str, n: u64) {
    let (_, mut agent) = setup.listening_agent().await;
    let lines: Vec<Vec<u8>> = (0..n).map(|i| numbered(tag, i).into_bytes()).collect();
    send_lines(&setup.config.socket(), &lines).await;
    until_metric(setup.config.agent_admin(), telemetry::SPOOL_RECORDS, &[], n as f64).await;
    agent.signal("TERM");
    assert!(agent.wait(Duration::from_secs(20)).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_spool_segment_is_quarantined_and_the_intact_records_are_shipped() {
    let mut setup = disk(Scenario::new("corrupt")).set("buffer", "max_disk_bytes", "4 MiB").build().await;
    let topic = setup.topic.clone();

    // First run: Kafka unreachable, so everything stays in the spool.
    let (brokers, drain_timeout) =
        (setup.config.table["kafka"]["brokers"].clone(), setup.config.table["agent"]["drain_timeout"].clone());
    setup.config.set("kafka", "brokers", setup.unreachable_kafka()).set("agent", "drain_timeout", "1s");
    spool_and_stop(&setup, &topic, 300).await;
    setup.config.set("kafka", "brokers", brokers).set("agent", "drain_timeout", drain_timeout);

    // Flip bytes in the middle of the first segment.
    let spool = setup.spool();
    let mut segments: Vec<_> = std::fs::read_dir(&spool)
        .expect("spool dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segments.sort();
    let mut data = std::fs::read(&segments[0]).expect("segment");
    let middle = data.len() / 2;
    for byte in &mut data[middle..middle + 16] {
        *byte ^= 0xA5;
    }
    std::fs::write(&segments[0], &data).expect("write");

    // Second run: starts, counts, quarantines, ships the rest.
    let config = &setup.config;
    let _persister = setup.persister().await;
    let _agent = setup.agent().await;
    let db = setup.db().await;
    let metrics = scrape(config.agent_admin()).await;
    let corrupt = metrics.count(telemetry::BUFFER_DROPPED, &[("reason", "corrupt")]);
    assert!(corrupt >= 1.0, "{}", metrics.0);
    let recovered = metrics.count(telemetry::SPOOL_RECOVERED, &[]) as i64;
    assert!((250..300).contains(&recovered), "recovered {recovered}");
    assert!(std::fs::read_dir(spool.join("quarantine")).expect("quarantine dir").count() >= 1);
    until_rows(&db, recovered).await;
    let numbers = stored_numbers(&db, &topic).await;
    let distinct: BTreeSet<u64> = numbers.iter().copied().collect();
    assert_eq!(distinct.len() as i64, recovered);
    assert!(distinct.iter().all(|n| *n < 300));
}

/// A proxy in front of the stack's PostgreSQL, and the URL of its database through the proxy.
async fn postgres_behind_proxy() -> (Proxy, String) {
    let pg_config: tokio_postgres::Config = services().pg.parse().expect("pg url");
    let port = pg_config.get_ports().first().copied().unwrap_or(5432);
    let proxy = Proxy::start(([127, 0, 0, 1], port).into()).await;
    let user = pg_config.get_user().unwrap_or("postgres");
    let database = pg_config.get_dbname().unwrap_or("sluice");
    let url = format!("postgres://{user}@{}/{database}", proxy.address);
    (proxy, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_outage_under_load_loses_nothing_duplicates_nothing_and_keeps_persister_memory_bounded() {
    let (proxy, url) = postgres_behind_proxy().await;
    let setup = Scenario::new("pgdown").partitions(2).set("postgres", "url", url.as_str()).build().await;
    let (config, topic) = (&setup.config, &setup.topic);
    let persister = setup.persister().await;
    let _agent = setup.agent().await;
    let db = setup.db().await;

    let load = Load::start(&config.socket(), topic, 2000, 2);
    // Rows flow through the proxy before it is cut.
    until_rows(&db, 1000).await;
    proxy.cut();
    let lines_before = persister.log_text().lines().count();
    // The time is the point: the outage lasts SLUICE_FAULT_SECONDS, the persister's memory
    // sampled every 500 ms through it.
    let mut peak_rss = 0;
    let until = tokio::time::Instant::now() + outage();
    while tokio::time::Instant::now() < until {
        peak_rss = peak_rss.max(rss_kib(persister.pid()));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Issue 30, item 2: ready while PostgreSQL is away (every replica unready would make the
    // PodDisruptionBudget block node drains); its state is reported apart.
    let (status, body) = http_get(config.persist_admin(), "/readyz").await.expect("readyz");
    assert_eq!((status, body.trim()), (200, "ready (postgres unreachable, retrying)"));
    let (status, _) = http_get(config.persist_admin(), "/healthz/postgres").await.expect("healthz/postgres");
    assert_eq!(status, 503);
    let away = scrape(config.persist_admin()).await;
    assert_eq!(away.count(telemetry::PERSIST_POSTGRES_REACHABLE, &[]), 0.0);
    // Issue 30, item 3: a failed write every few seconds is one line a minute.
    let log = persister.log_text();
    let lines: Vec<&str> = log.lines().skip(lines_before).collect();
    // PostgreSQL shutting down may still accept one connection: the persister then says it is
    // reachable, and the next failures start a new minute's line. Each such flap allows one more
    // burst (seen once in CI: 9 lines, 3 of them after a flap at the outage's first 300 ms).
    let flaps = lines.iter().filter(|line| line.contains("\"postgres reachable\"")).count();
    let allowed = (6 + 3 * outage().as_secs() as usize / 60) * (1 + flaps);
    assert!(lines.len() <= allowed, "{} lines in a {:?} outage:\n{}", lines.len(), outage(), lines.join("\n"));
    let lagging = scrape(config.persist_admin()).await;
    let lag: f64 = ["0", "1"].iter().map(|p| lagging.count(telemetry::PERSIST_LAG_RECORDS, &[("partition", p)])).sum();
    assert!(lag > 1000.0, "consumer lag rises while postgres is away:\n{}", lagging.0);
    proxy.restore();
    // The load goes on across the database's return, until the persister writes again.
    let rows = row_count(&db).await;
    until_rows(&db, rows + 1000).await;
    let sent = load.stop().await;

    let numbers = wait_for_numbers(config, &db, topic, sent).await;
    assert_each_once(&numbers, 0..sent);
    assert!(peak_rss < 200 * 1024, "persister RSS peaked at {peak_rss} KiB during the outage");
    until_scrape(config.persist_admin(), "lag falls back to 0", |metrics| {
        ["0", "1"].iter().map(|p| metrics.count(telemetry::PERSIST_LAG_RECORDS, &[("partition", p)])).sum::<f64>()
            == 0.0
    })
    .await;
    let metrics = scrape(config.persist_admin()).await;
    assert!(metrics.count(telemetry::PERSIST_WRITE_ERRORS, &[]) > 0.0);
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| line.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_one_of_three_persisters_under_load_hands_its_partitions_over_without_loss_or_duplicates() {
    let setup = Scenario::new("group").partitions(6).build().await;
    let (config, topic) = (&setup.config, &setup.topic);
    // Three members of one group, each with an admin port of its own (on one config they
    // shared it, and the second and third exited at once: the port was taken).
    let (second_config, third_config) = (setup.group_member(), setup.group_member());
    let _first = setup.persister().await;
    let mut second = start_persister(&second_config).await;
    let _third = start_persister(&third_config).await;
    let _agent = setup.agent().await;
    let db = setup.db().await;

    let load = Load::start(&config.socket(), topic, 2000, 2);
    // Every member has partitions and has stored rows of the load when one is killed.
    for member in [config, &second_config, &third_config] {
        until_scrape(member.persist_admin(), "a member with partitions that stores rows", |metrics| {
            metrics.count(telemetry::PERSIST_ASSIGNED_PARTITIONS, &[]) >= 1.0
                && metrics.count(telemetry::PERSIST_ROWS, &[]) >= 1.0
        })
        .await;
    }
    second.kill();
    // The survivors take its partitions over (once its session times out) and store the load.
    let assigned = |metrics: &Metrics| metrics.count(telemetry::PERSIST_ASSIGNED_PARTITIONS, &[]);
    until("the survivors to hold all six partitions", || async {
        let held =
            assigned(&scrape(config.persist_admin()).await) + assigned(&scrape(third_config.persist_admin()).await);
        if held == 6.0 { Ok(()) } else { Err(format!("{held} partitions")) }
    })
    .await;
    let rows = row_count(&db).await;
    until_rows(&db, rows + 2000).await;
    let sent = load.stop().await;
    let numbers = wait_for_numbers(config, &db, topic, sent).await;
    assert_each_once(&numbers, 0..sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_record_goes_to_dead_letters_and_the_records_after_it_arrive() {
    let pipeline = Scenario::new("poison").pipeline().await;
    let (config, db) = (&pipeline.config, &pipeline.db);
    // The agent refuses NUL at the socket, raw or escaped (issue 30): a producer other than the
    // agent is what puts an escaped one on the topic, valid JSON PostgreSQL cannot store.
    send_lines(&config.socket(), &[b"before".to_vec()]).await;
    until_rows(db, 1).await;
    let poison = envelope("other-1", &now_rfc3339(), r#"{"msg":"nul \u0000 inside"}"#);
    produce(&services().kafka, &pipeline.topic, &[poison]).await;
    send_lines(&config.socket(), &[b"after".to_vec()]).await;
    until_rows(db, 2).await;
    let letter = until("a dead letter", || db.query_one("SELECT reason, kafka_offset FROM dead_letters", &[])).await;
    assert_eq!(letter.get::<_, String>(0), "contains_nul");
    assert_eq!(letter.get::<_, i64>(1), 1);
    let payloads: Vec<String> =
        column(db, "SELECT coalesce(record::text, message) FROM logs ORDER BY kafka_offset").await;
    assert_eq!(payloads, vec!["before", "after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_postgres_rejects_goes_to_dead_letters_and_its_batch_neighbours_are_stored() {
    let pipeline = Scenario::new("rejected").set("persist", "batch_max_wait", "1s").pipeline().await;
    let (config, db) = (&pipeline.config, &pipeline.db);
    // A constraint this record breaks, as a schema change by a DBA might.
    db.batch_execute("ALTER TABLE log_rows ADD CONSTRAINT no_boom CHECK (message IS DISTINCT FROM 'boom')")
        .await
        .expect("constraint");
    send_lines(&config.socket(), &[b"before".to_vec(), b"boom".to_vec(), b"after".to_vec()]).await;
    until_rows(db, 2).await;
    let letter = until("a dead letter", || db.query_one("SELECT reason, error, payload FROM dead_letters", &[])).await;
    assert_eq!(letter.get::<_, String>(0), "rejected_by_postgres");
    assert!(letter.get::<_, String>(1).contains("no_boom"), "{}", letter.get::<_, String>(1));
    // The row as its JSON envelope (issue 33): replayable once the table takes it again.
    let envelope: serde_json::Value = serde_json::from_slice(&letter.get::<_, Vec<u8>>(2)).expect("an envelope");
    assert_eq!((envelope["format"].as_str(), envelope["record"]["message"].as_str()), (Some("text"), Some("boom")));
    assert!(envelope["id"].as_str().is_some_and(|id| id.ends_with("-1")), "{envelope}");
    let payloads: Vec<String> =
        column(db, "SELECT coalesce(record::text, message) FROM logs ORDER BY kafka_offset").await;
    assert_eq!(payloads, vec!["before", "after"]);
    let rejected = [("reason", "rejected_by_postgres")];
    until_metric(config.persist_admin(), telemetry::PERSIST_DEAD_LETTERS, &rejected, 1.0).await;
}

/// An agent whose Kafka never answers, with a 1 MiB spool: only the cap's policy decides.
async fn full_spool(when_full: &str) -> (Setup, Process) {
    let setup = disk(Scenario::new("full").kafka_unreachable())
        .set("buffer", "max_disk_bytes", "1 MiB")
        // More memory than disk: whatever the spool writer's pace, the cap is what fills first.
        .set("buffer", "max_bytes", "8 MiB")
        .set("buffer", "when_full", when_full)
        .listener("default", "max_record_size", "8 KiB")
        .set("agent", "drain_timeout", "1s")
        .build()
        .await;
    let (_, agent) = setup.listening_agent().await;
    (setup, agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_under_drop_newest_keeps_reading_and_accounts_for_every_record() {
    let (setup, _agent) = full_spool("drop_newest").await;
    let config = &setup.config;
    let lines: Vec<Vec<u8>> = (0..20_000).map(|n| numbered("full", n).into_bytes()).collect();
    within(Duration::from_secs(30), "the writer is never held", send_lines(&config.socket(), &lines)).await;
    let admin = config.agent_admin();
    let metrics = every_record_spooled_or_dropped(admin, 20_000.0).await;
    // About 330 bytes a frame: a 1 MiB spool holds some 3,000 of them, minus what a partly filled
    // last segment wastes. Regression: a batch that did not fit whole was dropped whole.
    let spooled = metrics.count(telemetry::SPOOL_RECORDS, &[]);
    assert!(spooled > 2500.0 && spooled < 20_000.0, "spooled {spooled}");
    assert!(metrics.count(telemetry::SPOOL_BYTES, &[]) <= (1024 * 1024) as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_under_drop_oldest_keeps_reading_and_drops_the_oldest_segments() {
    let (setup, _agent) = full_spool("drop_oldest").await;
    let config = &setup.config;
    let lines: Vec<Vec<u8>> = (0..20_000).map(|n| numbered("full", n).into_bytes()).collect();
    within(Duration::from_secs(30), "the writer is never held", send_lines(&config.socket(), &lines)).await;
    let admin = config.agent_admin();
    let metrics = until_scrape(admin, "oldest dropped", |metrics| {
        metrics.count(telemetry::INGEST_RECORDS, &[]) == 20_000.0
            && metrics.count(telemetry::BUFFER_DROPPED, &[("reason", "drop_oldest")]) > 0.0
    })
    .await;
    assert!(metrics.count(telemetry::SPOOL_BYTES, &[]) <= (1024 * 1024) as f64);
    assert_eq!(metrics.count(telemetry::BUFFER_DROPPED, &[("reason", "drop_newest")]), 0.0);
}

/// Waits until the agent has read `n` records and each is either in the spool or dropped by
/// `drop_newest`; the scrape that showed it.
async fn every_record_spooled_or_dropped(admin: std::net::SocketAddr, n: f64) -> Metrics {
    until_scrape(admin, "all records accounted", |metrics| {
        metrics.count(telemetry::INGEST_RECORDS, &[]) == n
            && metrics.count(telemetry::SPOOL_RECORDS, &[])
                + metrics.count(telemetry::BUFFER_DROPPED, &[("reason", "drop_newest")])
                == n
    })
    .await
}

/// A tiny tmpfs, unmounted when dropped.
struct TinyFilesystem {
    path: std::path::PathBuf,
}

impl TinyFilesystem {
    fn mount(path: std::path::PathBuf, size: &str) -> Self {
        std::fs::create_dir_all(&path).expect("mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .status()
            .expect("run mount");
        assert!(status.success(), "this test mounts a tmpfs to fill a disk for real; it needs root");
        Self { path }
    }
}

impl Drop for TinyFilesystem {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_counted_and_falls_back_to_the_policy_without_stopping_the_agent() {
    let setup = disk(Scenario::new("enospc").kafka_unreachable())
        .set("buffer", "max_disk_bytes", "64 MiB") // the cap is not what stops it: the disk is
        .set("buffer", "max_bytes", "8 MiB") // more memory than disk, so the disk fills first
        .set("buffer", "when_full", "drop_newest")
        .listener("default", "max_record_size", "8 KiB")
        .set("agent", "drain_timeout", "1s")
        .build()
        .await;
    let filesystem = TinyFilesystem::mount(setup.spool(), "1m");
    let config = &setup.config;
    let (_, mut agent) = setup.listening_agent().await;
    let lines: Vec<Vec<u8>> = (0..20_000).map(|n| numbered("enospc", n).into_bytes()).collect();
    within(Duration::from_secs(30), "the writer is never held", send_lines(&config.socket(), &lines)).await;
    let admin = config.agent_admin();
    let metrics = every_record_spooled_or_dropped(admin, 20_000.0).await;
    assert!(metrics.count(telemetry::SPOOL_ERRORS, &[("op", "write")]) >= 1.0, "{}", metrics.0);
    assert!(metrics.count(telemetry::SPOOL_RECORDS, &[]) > 1000.0);
    assert!(agent.running(), "a full disk must not stop the agent");
    assert_eq!(http_get(admin, "/healthz").await.expect("healthz").0, 200);
    agent.signal("TERM");
    assert!(agent.wait(Duration::from_secs(20)).await.success());
    drop(filesystem);
}

/// Writes a file into `dir` until the disk it is on has no room left.
fn fill_disk(dir: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("filler");
    let block = vec![0xEE; 64 * 1024];
    while file.write_all(&block).is_ok() {}
    let mut byte = [0xEE];
    while file.write_all(&byte).is_ok() {
        byte[0] = 0xEE;
    }
    path
}

/// Issue 13 (found by the soak): the agent exited with `cannot open the spool … No space left on
/// device` when it was started on a full spool disk, and kept exiting until there was room — a
/// crash loop with the app's socket gone. It must come up, recover what the disk holds (a
/// damaged segment it cannot repair for lack of room is read as it is), apply `when_full` to
/// new records while the disk stays full, and spool again once there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_started_on_a_full_spool_disk_comes_up_and_applies_when_full_until_there_is_room() {
    let setup = disk(Scenario::new("fullstart").kafka_unreachable())
        .set("buffer", "max_disk_bytes", "64 MiB") // the cap is not what stops it: the disk is
        .set("buffer", "when_full", "drop_newest")
        .set("agent", "drain_timeout", "1s")
        .build()
        .await;
    let (config, spool) = (&setup.config, setup.spool());
    let filesystem = TinyFilesystem::mount(spool.clone(), "1m");

    // First run: Kafka unreachable, so 300 records stay in the spool.
    spool_and_stop(&setup, "fullstart", 300).await;

    // Damage the segment in its middle (a repair needs room for a copy), then fill the disk.
    let segment = std::fs::read_dir(&spool)
        .expect("spool dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .expect("a segment");
    let mut data = std::fs::read(&segment).expect("segment");
    let middle = data.len() / 2;
    for byte in &mut data[middle..middle + 16] {
        *byte ^= 0xA5;
    }
    std::fs::write(&segment, &data).expect("write");
    let filler = fill_disk(&spool);

    // Second run, on the full disk: it comes up and serves.
    let (_, mut agent) = setup.listening_agent().await;
    let admin = agent.admin();
    let recovered =
        until_metric_at_least(admin, telemetry::SPOOL_RECOVERED, &[], 1.0).await.count(telemetry::SPOOL_RECOVERED, &[]);
    assert!((250.0..300.0).contains(&recovered), "recovered {recovered}");
    assert_eq!(http_get(admin, "/healthz").await.expect("healthz").0, 200);
    assert!(agent.running(), "a full disk at start must not stop the agent");
    let log = std::fs::read_to_string(&agent.log).expect("agent log");
    assert!(log.contains("cannot be repaired"), "the operator is told the damage stays: {log}");
    assert!(log.contains("disk is full"), "the operator is told why no segment is made: {log}");

    // New records meet the full disk: `when_full` decides, and counts.
    let more: Vec<Vec<u8>> = (300..500).map(|n| numbered("fullstart", n).into_bytes()).collect();
    send_lines(&config.socket(), &more).await;
    let metrics = until_metric(admin, telemetry::BUFFER_DROPPED, &[("reason", "drop_newest")], 200.0).await;
    assert!(metrics.count(telemetry::SPOOL_ERRORS, &[("op", "write")]) >= 1.0, "{}", metrics.0);

    // Room again: records are spooled again.
    std::fs::remove_file(&filler).expect("free the disk");
    let last: Vec<Vec<u8>> = (500..700).map(|n| numbered("fullstart", n).into_bytes()).collect();
    send_lines(&config.socket(), &last).await;
    // Spooled, or counted as `corrupt` (records the backlog reader gave up behind damage it met;
    // the damage recovery found is read around, so none are expected).
    let held = |metrics: &Metrics| {
        metrics.count(telemetry::SPOOL_RECORDS, &[])
            + metrics.count(telemetry::BUFFER_DROPPED, &[("reason", "corrupt")])
    };
    let held_before = held(&metrics);
    until_scrape(admin, "spooled again", |metrics| {
        held(metrics) >= held_before + 200.0
            && metrics.count(telemetry::BUFFER_DROPPED, &[("reason", "drop_newest")]) == 200.0
    })
    .await;
    assert!(agent.running());
    agent.signal("TERM");
    assert!(agent.wait(Duration::from_secs(20)).await.success());
    drop(filesystem);
}

/// Found by the cold review of issue 34: a primary whose node is lost (no RST, no FIN: its
/// answers simply stop) left a batch write waiting on the socket for as long as the kernel
/// retransmits, with the consumer unpolled meanwhile. Each write is now bounded by
/// `postgres.write_timeout`: the stuck connection is dropped and the batch written again on a
/// new one, every record stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_that_stops_answering_mid_write_is_left_after_write_timeout_and_nothing_is_lost() {
    let (proxy, url) = postgres_behind_proxy().await;
    let setup = Scenario::new("pgsilent")
        .set("postgres", "url", url.as_str())
        .set("postgres", "write_timeout", "2s")
        .build()
        .await;
    let (_persister, _agent, db) = flowing_with_a_hundred_stored(&setup).await;
    // Every connection open now goes silent; connections made later answer.
    proxy.hold_answers();
    send_lines(&setup.config.socket(), &numbered_lines(&setup.topic, 100..200)).await;
    until_rows_within(&db, 200, Duration::from_secs(60)).await;
    until_nothing_left(&setup.config).await;
    assert_each_once(&stored_numbers(&db, &setup.topic).await, 0..200);
    let metrics = scrape(setup.config.persist_admin()).await;
    assert!(metrics.count(telemetry::PERSIST_WRITE_ERRORS, &[]) >= 1.0, "{}", nonzero(&metrics));
}

/// Found by the second cold review of issue 34: a write given up on after `write_timeout` left
/// its session on the server, still waiting (on a lock, a synchronous standby), while the retry
/// opened another: one more session per lane every timeout, until `max_connections`. The
/// statement of a write given up on is now cancelled, and its connection closes. Here a lock on
/// today's partition holds every write for 12 s at a write timeout of 1 s (connecting and
/// preparing a writer still work): the sessions waiting on it stay at one per lane, and once the
/// lock goes every record is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_given_up_on_are_cancelled_so_their_sessions_do_not_pile_up() {
    let setup = Scenario::new("pileup").partitions(2).set("postgres", "write_timeout", "1s").build().await;
    let (_persister, _agent, db) = flowing_with_a_hundred_stored(&setup).await;

    let partition = format!("logs_{}", chrono::Utc::now().format("%Y%m%d"));
    let mut locker = setup.db().await;
    let lock = locker.transaction().await.expect("begin");
    lock.batch_execute(&format!("LOCK TABLE {partition} IN ACCESS EXCLUSIVE MODE")).await.expect("lock");
    send_lines(&setup.config.socket(), &numbered_lines(&setup.topic, 100..200)).await;
    let waiting_sql = format!("SELECT count(*) FROM pg_locks WHERE relation = '{partition}'::regclass AND NOT granted");
    let mut most_waiting = 0;
    let until = tokio::time::Instant::now() + Duration::from_secs(12);
    while tokio::time::Instant::now() < until {
        let waiting: i64 = db.query_one(&waiting_sql, &[]).await.expect("pg_locks").get(0);
        most_waiting = most_waiting.max(waiting);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    lock.rollback().await.expect("unlock");
    assert!(most_waiting >= 1, "the writes waited on the lock");
    // Two lanes; each has one write (or one reconnect's partition check) waiting at a time.
    assert!(most_waiting <= 2, "sessions waiting on the lock: {most_waiting}");

    until_rows_within(&db, 200, Duration::from_secs(60)).await;
    until_nothing_left(&setup.config).await;
    assert_each_once(&stored_numbers(&db, &setup.topic).await, 0..200);
    let metrics = scrape(setup.config.persist_admin()).await;
    assert!(metrics.count(telemetry::PERSIST_WRITE_ERRORS, &[]) >= 2.0, "{}", nonzero(&metrics));
}

/// Starts `setup`'s persister and agent, and stores records 0..100 of its topic: the pipeline
/// flowing before a test breaks PostgreSQL. The processes stop when dropped.
async fn flowing_with_a_hundred_stored(setup: &Setup) -> (Process, Process, tokio_postgres::Client) {
    let persister = setup.persister().await;
    let agent = setup.agent().await;
    let db = setup.db().await;
    send_lines(&setup.config.socket(), &numbered_lines(&setup.topic, 0..100)).await;
    until_rows(&db, 100).await;
    (persister, agent, db)
}
