//! End to end: app → socket → agent → Kafka → persister → PostgreSQL.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::*;
use sluice::telemetry;

const CONNECTIONS: usize = 8;
const PER_CONNECTION: usize = 12_500;

/// The `i`-th line of connection `c`: every third one plain text, the rest JSON, all distinct,
/// with characters that a careless pipeline would change (escapes, non-ASCII, number formats).
fn line(c: usize, i: usize) -> String {
    if i.is_multiple_of(3) {
        format!("text {c}-{i}: \"quoted\" \\ tab\there café ✓ {{not json}}")
    } else {
        format!(r#"{{"conn":{c},"seq":{i},"level":"INFO","msg":"héllo \"w\"","n":1.50,"nested":{{"a":[1,2e3]}}}}"#)
    }
}

async fn send_range(socket: &std::path::Path, range: std::ops::Range<usize>) {
    let mut tasks = Vec::new();
    for c in 0..CONNECTIONS {
        let socket = socket.to_path_buf();
        let range = range.clone();
        tasks.push(tokio::spawn(async move {
            let lines: Vec<Vec<u8>> = range.map(|i| line(c, i).into_bytes()).collect();
            send_lines(&socket, &lines).await;
        }));
    }
    for task in tasks {
        task.await.expect("sender task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delivers_every_record_exactly_once_byte_identical_across_a_persister_kill() {
    let mut pipeline =
        start_pipeline("pipeline", 4, |config| _ = config.set("persist", "batch_max_records", 2000)).await;
    let (config, db) = (&pipeline.config, &pipeline.db);

    // First half, then kill the persister while it is writing.
    send_range(&config.socket(), 0..PER_CONNECTION / 2).await;
    wait_for_rows(db, 10_000, WAIT).await;
    pipeline.persister.kill();
    let rows_at_kill = row_count(db).await;

    // Second half arrives while no persister runs; a new one picks up from the last commit.
    send_range(&config.socket(), PER_CONNECTION / 2..PER_CONNECTION).await;
    let restarted = start_persister(config).await;
    let total = (CONNECTIONS * PER_CONNECTION) as i64;
    wait_for_rows(db, total, Duration::from_secs(180)).await;
    // Give late duplicates a chance to show up before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let row = db.query_one("SELECT count(*), count(DISTINCT record_id) FROM logs", &[]).await.expect("count");
    let (count, distinct): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(count, total, "rows (at kill: {rows_at_kill})");
    assert_eq!(distinct, total, "distinct record ids");

    let expected: HashSet<String> =
        (0..CONNECTIONS).flat_map(|c| (0..PER_CONNECTION).map(move |i| line(c, i))).collect();
    let stored: HashSet<String> =
        db.query("SELECT payload FROM logs", &[]).await.expect("payloads").iter().map(|r| r.get(0)).collect();
    assert_eq!(stored.len(), expected.len());
    let missing: Vec<_> = expected.difference(&stored).take(3).collect();
    assert!(missing.is_empty(), "payloads missing or altered, e.g. {missing:?}");

    // JSON records are queryable as JSON, text records as messages.
    let json: i64 = db
        .query_one(
            "SELECT count(*) FROM logs WHERE format = 'json' AND (record->>'seq')::int >= 0 AND level = 'info'",
            &[],
        )
        .await
        .expect("json query")
        .get(0);
    assert_eq!(json, (CONNECTIONS * (PER_CONNECTION - PER_CONNECTION.div_ceil(3))) as i64);
    let text: i64 = db
        .query_one("SELECT count(*) FROM logs WHERE format = 'text' AND message = payload AND record ? 'message'", &[])
        .await
        .expect("text query")
        .get(0);
    assert_eq!(text, (CONNECTIONS * PER_CONNECTION.div_ceil(3)) as i64);

    let metrics = scrape(config.persist_admin()).await;
    assert!(metrics.count(telemetry::PERSIST_ROWS, &[]) > 0.0);
    drop(restarted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_carry_the_envelope_metadata_into_their_row() {
    let pipeline = start_pipeline("envelope", 1, |_| {}).await;
    let (config, db, topic) = (&pipeline.config, &pipeline.db, &pipeline.topic);

    let line = r#"{"time":"2026-03-04T05:06:07.5Z","severity":"WARN","message":"disk at 91%","user":"ann"}"#;
    send_lines(&config.socket(), &[line.as_bytes().to_vec()]).await;
    wait_for_rows(db, 1, WAIT).await;

    let row = db
        .query_one(
            "SELECT record_id, event_time = '2026-03-04T05:06:07.5Z'::timestamptz, level, message, peer_uid, peer_pid, \
             ingest_time > now() - interval '5 minutes', record->>'user', payload, kafka_topic FROM logs",
            &[],
        )
        .await
        .expect("row");
    let record_id: String = row.get(0);
    assert!(record_id.ends_with("-0"), "{record_id}");
    assert!(row.get::<_, bool>(1), "event time from the record's time field");
    assert_eq!(row.get::<_, Option<String>>(2).as_deref(), Some("warn"));
    assert_eq!(row.get::<_, Option<String>>(3).as_deref(), Some("disk at 91%"));
    // SAFETY of the assumption: the test process is the peer.
    assert_eq!(row.get::<_, Option<i64>>(4), Some(i64::from(unsafe_free_uid())));
    assert_eq!(row.get::<_, Option<i32>>(5), Some(std::process::id() as i32));
    assert!(row.get::<_, bool>(6));
    assert_eq!(row.get::<_, Option<String>>(7).as_deref(), Some("ann"));
    assert_eq!(row.get::<_, String>(8), line);
    assert_eq!(&row.get::<_, String>(9), topic);
}

/// The uid of this process, read from /proc (the crate forbids unsafe code, so no libc call).
fn unsafe_free_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
        .expect("Uid line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_is_not_an_envelope_is_kept_in_dead_letters_and_counted() {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let services = services();
    let topic = unique("dead");
    create_topic(&services.kafka, &topic, 1).await;
    let config = TestConfig::new(&services, &topic);
    let _persister = start_persister(&config).await;
    let producer: FutureProducer =
        rdkafka::ClientConfig::new().set("bootstrap.servers", &services.kafka).create().expect("producer");
    within(WAIT, "produce", producer.send(FutureRecord::<(), _>::to(&topic).payload("not an envelope"), WAIT))
        .await
        .expect("delivered");

    let db = pg(&services, &config.schema()).await;
    let row = eventually("a dead letter row", || async {
        db.query_one("SELECT reason, payload FROM dead_letters", &[]).await.ok()
    })
    .await;
    assert_eq!(row.get::<_, String>(0), "malformed_envelope");
    assert_eq!(row.get::<_, Vec<u8>>(1), b"not an envelope");
    // Counted once the transaction that stored it committed: a moment after the row is visible.
    let admin = config.persist_admin();
    eventually("the dead letter counted", || async {
        let counted = scrape(admin).await.count(telemetry::PERSIST_DEAD_LETTERS, &[("reason", "malformed_envelope")]);
        (counted == 1.0).then_some(())
    })
    .await;
    assert_eq!(row_count(&db).await, 0);
}

/// The largest record `max_record_size` lets through, as one JSON line (newline excluded).
fn largest_line(max_record_size: usize) -> Vec<u8> {
    let prefix = br#"{"big":""#;
    let mut line = prefix.to_vec();
    line.resize(max_record_size - 2, b'x');
    line.extend_from_slice(br#""}"#);
    line
}

/// The smallest `buffer.max_bytes` validation allows for 256 KiB records: twice the largest
/// message (2 x 256 KiB + 4 KiB).
const SMALLEST_BUDGET_FOR_256_KIB: &str = "1032 KiB";

/// The same with a disk buffer: three largest messages and 1 KiB (librdkafka's queue, the
/// backlog's reserve, the readers).
const SMALLEST_DISK_BUDGET_FOR_256_KIB: &str = "1549 KiB";

/// Issue 12, item 2: a record within `max_record_size` never reached Kafka under a small budget
/// (QUEUE_FULL forever: librdkafka's queue was a fifth of the budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_record_a_listener_accepts_is_delivered_under_the_smallest_budget_it_allows() {
    let pipeline = start_pipeline("largest", 1, |config| {
        config.set("buffer", "max_bytes", SMALLEST_BUDGET_FOR_256_KIB).listener(
            "default",
            "max_record_size",
            "256 KiB",
        );
    })
    .await;
    let big = largest_line(256 * 1024);
    send_lines(&pipeline.config.socket(), &[big.clone(), b"small after".to_vec()]).await;
    wait_for_rows(&pipeline.db, 2, WAIT).await;
    let rows = pipeline.db.query("SELECT payload FROM logs ORDER BY kafka_offset", &[]).await.expect("rows");
    let payloads: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(payloads, vec![String::from_utf8(big).expect("utf-8"), "small after".to_string()]);
}

/// The same record from the spool's backlog after a restart: the backlog reader's chunk was a
/// sixteenth of the budget, too small for it, and it was put back forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_record_is_delivered_from_the_spool_backlog_after_a_restart() {
    let services = services();
    let topic = unique("largest_spool");
    create_topic(&services.kafka, &topic, 1).await;
    let mut config = TestConfig::new(&services, &topic);
    let spool = config.dir.path().join("spool").display().to_string();
    config
        .set("buffer", "type", "disk")
        .set("buffer", "path", spool)
        .set("buffer", "max_bytes", SMALLEST_DISK_BUDGET_FOR_256_KIB)
        .set("agent", "drain_timeout", "1s")
        .listener("default", "max_record_size", "256 KiB");
    // First run: Kafka unreachable, both records stay in the spool.
    let mut offline = TestConfig::new(&services, &topic);
    offline.table = config.table.clone();
    offline.set("kafka", "brokers", NO_BROKER);
    let path = offline.write();
    let mut agent = offline.spawn_agent_at(&path).await;
    let big = largest_line(256 * 1024);
    send_lines(&config.socket(), &[big.clone(), b"small after".to_vec()]).await;
    let admin = offline.agent_admin();
    eventually("both spooled", || async {
        (scrape(admin).await.count(telemetry::SPOOL_RECORDS, &[]) == 2.0).then_some(())
    })
    .await;
    agent.signal("TERM");
    assert!(agent.wait(Duration::from_secs(20)).await.success());

    let _persister = start_persister(&config).await;
    let _agent = start_agent(&config).await;
    let db = pg(&services, &config.schema()).await;
    wait_for_rows(&db, 2, WAIT).await;
    let rows = db.query("SELECT payload FROM logs ORDER BY kafka_offset", &[]).await.expect("rows");
    let payloads: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(payloads, vec![String::from_utf8(big).expect("utf-8"), "small after".to_string()]);
}

/// librdkafka's default `message.max.bytes` (1,000,000) is below the default `max_record_size`
/// (1 MiB) once enveloped: a maximum-size record was given up as `message_size_too_large`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_of_the_default_maximum_size_is_delivered() {
    let pipeline = start_pipeline("default_largest", 1, |_| {}).await;
    let big = largest_line(1024 * 1024);
    send_lines(&pipeline.config.socket(), std::slice::from_ref(&big)).await;
    wait_for_rows(&pipeline.db, 1, WAIT).await;
    let metrics = scrape(pipeline.config.agent_admin()).await;
    assert_eq!(metrics.count(telemetry::SHIP_FAILED, &[]), 0.0);
    let row = pipeline.db.query_one("SELECT length(payload) FROM logs", &[]).await.expect("row");
    assert_eq!(row.get::<_, i32>(0) as usize, big.len());
}
