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
        Scenario::new("pipeline").partitions(4).set("persist", "batch_max_records", 2000).pipeline().await;
    let (config, db) = (&pipeline.config, &pipeline.db);

    // First half, then kill the persister while it is writing.
    send_range(&config.socket(), 0..PER_CONNECTION / 2).await;
    until_rows(db, 10_000).await;
    pipeline.persister.kill();
    let rows_at_kill = row_count(db).await;

    // Second half arrives while no persister runs; a new one picks up from the last commit.
    send_range(&config.socket(), PER_CONNECTION / 2..PER_CONNECTION).await;
    let restarted = start_persister(config).await;
    let total = (CONNECTIONS * PER_CONNECTION) as i64;
    until_rows_within(db, total, Duration::from_secs(180)).await;
    // Late duplicates would show once nothing is left to arrive.
    until_nothing_left(config).await;

    let row = db.query_one("SELECT count(*), count(DISTINCT (agent, seq)) FROM logs", &[]).await.expect("count");
    let (count, distinct): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(count, total, "rows (at kill: {rows_at_kill})");
    assert_eq!(distinct, total, "distinct record ids");

    let expected: HashSet<String> =
        (0..CONNECTIONS).flat_map(|c| (0..PER_CONNECTION).map(move |i| line(c, i))).collect();
    let stored: HashSet<String> =
        column(db, "SELECT coalesce(record::text, message) FROM logs").await.into_iter().collect();
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
        .query_one("SELECT count(*) FROM logs WHERE format = 'text' AND record IS NULL AND message IS NOT NULL", &[])
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
    let pipeline = Scenario::new("envelope").pipeline().await;
    let (config, db, topic) = (&pipeline.config, &pipeline.db, &pipeline.topic);

    let line = r#"{"time":"2026-03-04T05:06:07.5Z","severity":"WARN","message":"disk at 91%","user":"ann"}"#;
    send_lines(&config.socket(), &[line.as_bytes().to_vec()]).await;
    until_rows(db, 1).await;

    let row = db
        .query_one(
            "SELECT seq, event_time = '2026-03-04T05:06:07.5Z'::timestamptz, level, message, peer_uid, peer_pid, \
             ingest_time > now() - interval '5 minutes', record->>'user', record::text, kafka_topic FROM logs",
            &[],
        )
        .await
        .expect("row");
    assert_eq!(row.get::<_, i64>(0), 0, "the agent's first record");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_in_either_envelope_become_the_same_rows_through_one_persister() {
    let mut pipeline = Scenario::new("envelopes").pipeline().await;
    let lines: Vec<Vec<u8>> = [
        r#"{"time":"2026-03-04T05:06:07.5Z","severity":"WARN","message":"disk at 91%","n":1.50}"#,
        "plain \"text\" ü \\ tab\there {not json}",
        r#"{ "a" : 1, "a": [2e3] }"#,
    ]
    .iter()
    .map(|line| line.as_bytes().to_vec())
    .collect();
    // The default agent writes binary envelopes; then one told `ship.envelope = "json"`, as an
    // agent upgraded before its persisters is.
    send_lines(&pipeline.config.socket(), &lines).await;
    until_rows(&pipeline.db, 3).await;
    pipeline.agent.stop(Duration::from_secs(30)).await;
    pipeline.config.set("ship", "envelope", "json");
    let _json_agent = start_agent(&pipeline.config).await;
    send_lines(&pipeline.config.socket(), &lines).await;
    until_rows(&pipeline.db, 6).await;

    let brokers = pipeline.config.table["kafka"]["brokers"].as_str().expect("brokers").to_owned();
    let encodings = read_topic(&brokers, &pipeline.topic).await.first_bytes;
    assert_eq!(encodings, [2, 2, 2, b'{', b'{', b'{'], "three binary envelopes, then three JSON ones");
    let rows: Vec<Vec<Option<String>>> = pipeline
        .db
        .query(
            "SELECT format, coalesce(record::text, message), level, event_time::text, peer_uid::text, \
             peer_pid::text, ingest_time::text FROM logs ORDER BY ingest_time, seq",
            &[],
        )
        .await
        .expect("rows")
        .iter()
        .map(|row| (0..7).map(|column| row.get::<_, Option<String>>(column)).collect())
        .collect();
    let without_time = |row: &Vec<Option<String>>| row[..6].to_vec();
    let (binary, json) = rows.split_at(3);
    assert_eq!(binary.iter().map(without_time).collect::<Vec<_>>(), json.iter().map(without_time).collect::<Vec<_>>());
    let written: Vec<String> = binary.iter().map(|row| row[1].clone().unwrap_or_default()).collect();
    assert_eq!(written, lines.iter().map(|line| String::from_utf8_lossy(line).into_owned()).collect::<Vec<_>>());
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
    let setup = Scenario::new("dead").build().await;
    let _persister = setup.persister().await;
    let producer: FutureProducer =
        rdkafka::ClientConfig::new().set("bootstrap.servers", &setup.bootstrap).create().expect("producer");
    within(WAIT, "produce", producer.send(FutureRecord::<(), _>::to(&setup.topic).payload("not an envelope"), WAIT))
        .await
        .expect("delivered");

    let db = setup.db().await;
    let row = until("a dead letter row", || db.query_one("SELECT reason, payload FROM dead_letters", &[])).await;
    assert_eq!(row.get::<_, String>(0), "malformed_envelope");
    assert_eq!(row.get::<_, Vec<u8>>(1), b"not an envelope");
    // Counted once the transaction that stored it committed: a moment after the row is visible.
    let dead = [("reason", "malformed_envelope")];
    until_metric(setup.config.persist_admin(), telemetry::PERSIST_DEAD_LETTERS, &dead, 1.0).await;
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
    let pipeline = Scenario::new("largest")
        .set("buffer", "max_bytes", SMALLEST_BUDGET_FOR_256_KIB)
        .listener("default", "max_record_size", "256 KiB")
        .pipeline()
        .await;
    let big = largest_line(256 * 1024);
    send_lines(&pipeline.config.socket(), &[big.clone(), b"small after".to_vec()]).await;
    until_rows(&pipeline.db, 2).await;
    let rows = pipeline
        .db
        .query("SELECT coalesce(record::text, message) FROM logs ORDER BY kafka_offset", &[])
        .await
        .expect("rows");
    let payloads: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(payloads, vec![String::from_utf8(big).expect("utf-8"), "small after".to_string()]);
}

/// The same record from the spool's backlog after a restart: the backlog reader's chunk was a
/// sixteenth of the budget, too small for it, and it was put back forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_record_is_delivered_from_the_spool_backlog_after_a_restart() {
    let mut setup = Scenario::new("largest_spool")
        .disk_buffer()
        .set("buffer", "max_bytes", SMALLEST_DISK_BUDGET_FOR_256_KIB)
        .set("agent", "drain_timeout", "1s")
        .listener("default", "max_record_size", "256 KiB")
        .build()
        .await;
    // First run: Kafka unreachable, both records stay in the spool.
    let brokers = setup.config.table["kafka"]["brokers"].clone();
    setup.config.set("kafka", "brokers", setup.unreachable_kafka());
    let (_, mut agent) = setup.listening_agent().await;
    let big = largest_line(256 * 1024);
    send_lines(&setup.config.socket(), &[big.clone(), b"small after".to_vec()]).await;
    until_metric(setup.config.agent_admin(), telemetry::SPOOL_RECORDS, &[], 2.0).await;
    agent.signal("TERM");
    assert!(agent.wait(Duration::from_secs(20)).await.success());

    setup.config.set("kafka", "brokers", brokers);
    let _persister = setup.persister().await;
    let _agent = setup.agent().await;
    let db = setup.db().await;
    until_rows(&db, 2).await;
    let payloads: Vec<String> =
        column(&db, "SELECT coalesce(record::text, message) FROM logs ORDER BY kafka_offset").await;
    assert_eq!(payloads, vec![String::from_utf8(big).expect("utf-8"), "small after".to_string()]);
}

/// librdkafka's default `message.max.bytes` (1,000,000) is below the default `max_record_size`
/// (1 MiB) once enveloped: a maximum-size record was given up as `message_size_too_large`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_of_the_default_maximum_size_is_delivered() {
    let pipeline = Scenario::new("default_largest").pipeline().await;
    let big = largest_line(1024 * 1024);
    send_lines(&pipeline.config.socket(), std::slice::from_ref(&big)).await;
    until_rows(&pipeline.db, 1).await;
    let metrics = scrape(pipeline.config.agent_admin()).await;
    assert_eq!(metrics.count(telemetry::SHIP_FAILED, &[]), 0.0);
    let row =
        pipeline.db.query_one("SELECT length(coalesce(record::text, message)) FROM logs", &[]).await.expect("row");
    assert_eq!(row.get::<_, i32>(0) as usize, big.len());
}
