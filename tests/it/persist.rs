//! The persister against messages that cannot become rows as they are: each becomes a row, a dead
//! letter or a counted loss, and the partition always moves on — nothing is retried unchanged
//! forever. Messages are produced to the topic directly, as a misbehaving producer would.

use std::time::Duration;

use chrono::{Days, Utc};

use crate::support::*;
use sluice::telemetry;

/// A persister on a fresh one-partition topic (started, ready) and a client on its schema.
async fn persister(configure: impl FnOnce(&mut TestConfig)) -> (TestConfig, Process, tokio_postgres::Client) {
    let services = services();
    let topic = unique("persist");
    create_topic(&services.kafka, &topic, 1).await;
    let mut config = TestConfig::new(&services, &topic);
    configure(&mut config);
    let persister = start_persister(&config).await;
    let db = pg(&services, &config.schema()).await;
    (config, persister, db)
}

fn topic(config: &TestConfig) -> String {
    config.table["kafka"]["topic"].as_str().expect("topic").to_string()
}

/// Waits until the persister has committed the offset after the first `produced` messages of
/// partition 0: every one of them is a row, a dead letter or counted, and the partition moved on.
async fn wait_until_caught_up(config: &TestConfig, produced: i64) {
    let group = config.table["persist"]["group_id"].as_str().expect("group").to_string();
    let (kafka, topic) = (services().kafka, topic(config));
    eventually("the group's offset moves past every message", || async {
        (committed_offset(&kafka, &group, &topic, 0).await >= Some(produced)).then_some(())
    })
    .await;
}

async fn dead_letters(db: &tokio_postgres::Client) -> Vec<(i64, String, String)> {
    db.query("SELECT kafka_offset, reason, error FROM dead_letters ORDER BY kafka_offset", &[])
        .await
        .map(|rows| rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect())
        .unwrap_or_default()
}

async fn stored_ids(db: &tokio_postgres::Client) -> Vec<String> {
    let rows = db.query("SELECT record_id FROM logs ORDER BY kafka_offset", &[]).await.expect("rows");
    rows.iter().map(|row| row.get(0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_envelope_whose_error_echoes_a_nul_becomes_a_dead_letter_and_the_partition_moves_on() {
    let (config, _persister, db) = persister(|_| {}).await;
    let now = now_rfc3339();
    // serde's error for an unknown `format` quotes the value: a NUL in the error text, which a
    // PostgreSQL text column refuses (22021).
    let poison = format!(r#"{{"v":1,"id":"a-2","ingest_time":"{now}","format":"\u0000","record":{{}}}}"#);
    let messages = vec![envelope("a-1", &now, r#"{"n":1}"#), poison.into_bytes(), envelope("a-3", &now, r#"{"n":3}"#)];
    produce(&services().kafka, &topic(&config), &messages).await;

    let letters = eventually("the poison message in dead_letters", || async {
        let letters = dead_letters(&db).await;
        (!letters.is_empty()).then_some(letters)
    })
    .await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let (offset, reason, error) = &letters[0];
    assert_eq!((*offset, reason.as_str()), (1, "malformed_envelope"));
    assert!(error.contains("\\u0000"), "the NUL is shown escaped: {error}");
    wait_until_caught_up(&config, 3).await;
    assert_eq!(stored_ids(&db).await, vec!["a-1", "a-3"]);
    let metrics = scrape(config.persist_admin()).await;
    assert_eq!(metrics.count(telemetry::PERSIST_WRITE_ERRORS, &[]), 0.0, "nothing was retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_postgres_refuses_is_counted_as_lost_and_the_partition_moves_on() {
    let (config, _persister, db) = persister(|_| {}).await;
    // A DBA's constraint that refuses one kind of dead letter.
    eventually("dead_letters exists", || async {
        db.batch_execute("ALTER TABLE dead_letters ADD CONSTRAINT no_malformed CHECK (reason <> 'malformed_envelope')")
            .await
            .ok()
    })
    .await;
    let now = now_rfc3339();
    let messages = vec![envelope("b-1", &now, "{}"), b"not an envelope".to_vec(), envelope("b-3", &now, "{}")];
    produce(&services().kafka, &topic(&config), &messages).await;

    wait_until_caught_up(&config, 3).await;
    assert_eq!(stored_ids(&db).await, vec!["b-1", "b-3"]);
    assert!(dead_letters(&db).await.is_empty());
    let metrics = scrape(config.persist_admin()).await;
    assert_eq!(metrics.count(telemetry::PERSIST_LOST, &[("reason", "dead_letter_rejected")]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_time_far_in_the_future_is_a_dead_letter_and_creates_no_partition() {
    let (config, _persister, db) = persister(|_| {}).await;
    let now = now_rfc3339();
    let messages = vec![
        envelope("c-1", &now, "{}"),
        envelope("c-2", "9999-12-31T23:59:59.000000Z", "{}"),
        envelope("c-3", &now, "{}"),
    ];
    produce(&services().kafka, &topic(&config), &messages).await;

    wait_until_caught_up(&config, 3).await;
    assert_eq!(stored_ids(&db).await, vec!["c-1", "c-3"]);
    let letters = dead_letters(&db).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!((letters[0].0, letters[0].1.as_str()), (1, "ingest_time_in_future"));
    let far: i64 = db
        .query_one("SELECT count(*) FROM pg_class WHERE relname = 'logs_99991231'", &[])
        .await
        .expect("catalog")
        .get(0);
    assert_eq!(far, 0, "no partition for a wrong clock's year");
    // The session is usable afterwards: a later record is stored.
    produce(&services().kafka, &topic(&config), &[envelope("c-4", &now_rfc3339(), "{}")]).await;
    wait_until_caught_up(&config, 4).await;
    assert_eq!(stored_ids(&db).await, vec!["c-1", "c-3", "c-4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_ddl_error_does_not_leave_the_session_in_an_aborted_transaction() {
    let (config, _persister, db) = persister(|config| _ = config.set("persist", "max_clock_skew", "2d")).await;
    // A DBA made tomorrow's partition with other bounds: creating sluice's day partition for it
    // fails (overlap), inside the DDL transaction.
    let tomorrow = Utc::now().date_naive() + Days::new(1);
    eventually("logs exists", || async {
        db.batch_execute(&format!(
            "DROP TABLE IF EXISTS logs_{t}; CREATE TABLE dba_tomorrow PARTITION OF logs FOR VALUES FROM \
             ('{tomorrow} 00:00:00+00') TO ('{tomorrow} 23:00:00+00')",
            t = tomorrow.format("%Y%m%d")
        ))
        .await
        .ok()
    })
    .await;
    let now = now_rfc3339();
    let tomorrow_time = format!("{tomorrow}T01:00:00.000000Z");
    let messages =
        vec![envelope("d-1", &now, "{}"), envelope("d-2", &tomorrow_time, "{}"), envelope("d-3", &now, "{}")];
    produce(&services().kafka, &topic(&config), &messages).await;
    wait_until_caught_up(&config, 3).await;
    assert_eq!(stored_ids(&db).await, vec!["d-1", "d-2", "d-3"], "the DBA's partition holds d-2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_older_than_retention_is_a_dead_letter_named_expired_not_a_row_that_vanishes() {
    let (config, _persister, db) = persister(|config| _ = config.set("persist", "retention_days", 14)).await;
    let now = now_rfc3339();
    let old = (Utc::now() - Days::new(30)).to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let messages = vec![envelope("e-1", &now, "{}"), envelope("e-2", &old, "{}"), envelope("e-3", &now, "{}")];
    produce(&services().kafka, &topic(&config), &messages).await;

    wait_until_caught_up(&config, 3).await;
    assert_eq!(stored_ids(&db).await, vec!["e-1", "e-3"]);
    let letters = dead_letters(&db).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!((letters[0].0, letters[0].1.as_str()), (1, "expired"));
    wait_for_count(config.persist_admin(), telemetry::PERSIST_DEAD_LETTERS, &[("reason", "expired")], 1.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_several_rows_postgres_rejects_is_split_until_each_is_isolated() {
    let (config, _persister, db) = persister(|config| {
        config.set("persist", "batch_max_wait", "2s").set("persist", "batch_max_records", 1000);
    })
    .await;
    eventually("logs exists", || async {
        db.batch_execute("ALTER TABLE logs ADD CONSTRAINT no_boom CHECK (record->>'m' IS DISTINCT FROM 'boom')")
            .await
            .ok()
    })
    .await;
    let now = now_rfc3339();
    let messages: Vec<Vec<u8>> = (0..1000)
        .map(|n| {
            let m = if [17, 500, 501, 998].contains(&n) { "boom" } else { "fine" };
            envelope(&format!("f-{n}"), &now, &format!(r#"{{"m":"{m}","n":{n}}}"#))
        })
        .collect();
    produce(&services().kafka, &topic(&config), &messages).await;

    within(Duration::from_secs(120), "caught up", wait_until_caught_up(&config, 1000)).await;
    assert_eq!(stored_ids(&db).await.len(), 996);
    let offsets: Vec<i64> = dead_letters(&db).await.iter().map(|(offset, ..)| *offset).collect();
    assert_eq!(offsets, vec![17, 500, 501, 998]);
    wait_for_count(config.persist_admin(), telemetry::PERSIST_DEAD_LETTERS, &[("reason", "rejected_by_postgres")], 4.0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_dead_letter_already_stored_is_not_counted_again() {
    let (config, first, db) = persister(|_| {}).await;
    let now = now_rfc3339();
    let messages = vec![envelope("g-1", &now, "{}"), b"not an envelope".to_vec()];
    produce(&services().kafka, &topic(&config), &messages).await;
    wait_until_caught_up(&config, 2).await;
    drop(first);
    // A persister of another group on the same schema reads the topic again from the start: a
    // redelivery of both messages, as after a crash before the offset commit.
    let mut again = TestConfig::new(&services(), &topic(&config));
    again.set("postgres", "schema", config.schema());
    let _again = start_persister(&again).await;
    wait_until_caught_up(&again, 2).await;

    assert_eq!(dead_letters(&db).await.len(), 1);
    let metrics = scrape(again.persist_admin()).await;
    assert_eq!(metrics.count(telemetry::PERSIST_DUPLICATES, &[]), 1.0);
    assert_eq!(metrics.count(telemetry::PERSIST_ROWS, &[]), 0.0);
    assert_eq!(
        metrics.count(telemetry::PERSIST_DEAD_LETTERS, &[("reason", "malformed_envelope")]),
        0.0,
        "the dead letter was already stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_isolation_committed_before_a_transient_error_is_counted_once() {
    let (config, _persister, db) = persister(|config| {
        config.set("persist", "batch_max_wait", "2s").set("persist", "batch_max_records", 200);
    })
    .await;
    // Rows with m = boom are refused (isolation begins); the dead letter of offset 190 fails once
    // with an error that is not about the data (the batch is retried) — after the isolation has
    // committed the other rows and the dead letter of offset 17. A sequence is not rolled back.
    eventually("logs and dead_letters exist", || async {
        db.batch_execute(
            "ALTER TABLE logs ADD CONSTRAINT no_boom CHECK (record->>'m' IS DISTINCT FROM 'boom');
             CREATE SEQUENCE fail_once;
             CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.kafka_offset = 190 AND nextval('fail_once') = 1 THEN
                 RAISE EXCEPTION 'a transient failure' USING ERRCODE = '40001';
               END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER fail_once BEFORE INSERT ON dead_letters FOR EACH ROW EXECUTE FUNCTION fail_once();",
        )
        .await
        .ok()
    })
    .await;
    let now = now_rfc3339();
    let messages: Vec<Vec<u8>> = (0..200)
        .map(|n| {
            let m = if [17, 190].contains(&n) { "boom" } else { "fine" };
            envelope(&format!("h-{n}"), &now, &format!(r#"{{"m":"{m}","n":{n}}}"#))
        })
        .collect();
    produce(&services().kafka, &topic(&config), &messages).await;

    within(Duration::from_secs(120), "caught up", wait_until_caught_up(&config, 200)).await;
    assert_eq!(stored_ids(&db).await.len(), 198);
    let offsets: Vec<i64> = dead_letters(&db).await.iter().map(|(offset, ..)| *offset).collect();
    assert_eq!(offsets, vec![17, 190]);
    let metrics = wait_for_count(
        config.persist_admin(),
        telemetry::PERSIST_DEAD_LETTERS,
        &[("reason", "rejected_by_postgres")],
        2.0,
    )
    .await;
    assert!(metrics.count(telemetry::PERSIST_WRITE_ERRORS, &[]) >= 1.0, "the transient error was retried");
    assert_eq!(metrics.count(telemetry::PERSIST_ROWS, &[]), 198.0);
    assert_eq!(metrics.count(telemetry::PERSIST_DUPLICATES, &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_broker_does_not_hold_the_persisters_shutdown() {
    let broker = PrivateBroker::start().await;
    let topic = unique("persist");
    create_topic(&broker.bootstrap, &topic, 1).await;
    let mut config = TestConfig::new(&services(), &topic);
    // The batch in hand is written in the drain, after the broker stopped answering: its offset
    // is stored but cannot be committed.
    config.set("kafka", "brokers", broker.bootstrap.clone()).set("persist", "drain_timeout", "2s").set(
        "persist",
        "batch_max_wait",
        "20s",
    );
    let mut persister = start_persister(&config).await;
    produce(&broker.bootstrap, &topic, &[envelope("i-1", &now_rfc3339(), "{}")]).await;
    eventually("the message consumed", || async {
        (scrape(config.persist_admin()).await.count(telemetry::PERSIST_CONSUMED, &[]) >= 1.0).then_some(())
    })
    .await;
    broker.freeze();
    persister.signal("TERM");
    let started = std::time::Instant::now();
    let status = persister.wait(Duration::from_secs(40)).await;
    let took = started.elapsed();
    let db = pg(&services(), &config.schema()).await;
    assert_eq!(stored_ids(&db).await, vec!["i-1"], "the batch in hand was written in the drain");
    // drain_timeout (2 s) + the final commit's and close's bound + the runtime's shutdown bound.
    assert!(took < Duration::from_secs(15), "shutdown took {took:?}; log:\n{}", persister.log_text());
    assert!(status.success(), "{status:?}; log:\n{}", persister.log_text());
    assert!(persister.log_text().contains("not committed"), "what was not committed is logged");
}
