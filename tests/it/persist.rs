//! The persister against messages that cannot become rows as they are: each becomes a row, a dead
//! letter or a counted loss, and the partition always moves on — nothing is retried unchanged
//! forever. Messages are produced to the topic directly, as a misbehaving producer would.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{Days, Utc};

use crate::support::*;
use sluice::persist::row::RecordKey;
use sluice::telemetry;

/// A persister on a fresh one-partition topic (started, ready) and a client on its schema.
async fn persister(scenario: Scenario) -> (Setup, Process, tokio_postgres::Client) {
    let setup = scenario.build().await;
    let persister = setup.persister().await;
    let db = setup.db().await;
    (setup, persister, db)
}

/// The test's scenario: a topic `persist_…`.
fn topic() -> Scenario {
    Scenario::new("persist")
}

/// Produces `messages` to the setup's topic, as a producer other than the agent would.
async fn produce_to(setup: &Setup, messages: &[Vec<u8>]) {
    produce(&setup.bootstrap, &setup.topic, messages).await;
}

async fn dead_letters(db: &tokio_postgres::Client) -> Vec<(i64, String, String)> {
    db.query("SELECT kafka_offset, reason, error FROM dead_letters ORDER BY kafka_offset", &[])
        .await
        .map(|rows| rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect())
        .unwrap_or_default()
}

/// The key of each stored row, in offset order, as [`keys`] spells them.
async fn stored_keys(db: &tokio_postgres::Client) -> Vec<String> {
    column(db, "SELECT agent::text || '/' || seq FROM logs ORDER BY kafka_offset").await
}

/// The keys of `ids` in `logs` (see `RecordKey`).
fn keys(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| RecordKey::of(id).to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_envelope_whose_error_echoes_a_nul_becomes_a_dead_letter_and_the_partition_moves_on() {
    let (setup, _persister, db) = persister(topic()).await;
    let now = now_rfc3339();
    // serde's error for an unknown `format` quotes the value: a NUL in the error text, which a
    // PostgreSQL text column refuses (22021).
    let poison = format!(r#"{{"v":1,"id":"a-2","ingest_time":"{now}","format":"\u0000","record":{{}}}}"#);
    let messages = vec![envelope("a-1", &now, r#"{"n":1}"#), poison.into_bytes(), envelope("a-3", &now, r#"{"n":3}"#)];
    produce_to(&setup, &messages).await;

    let letters = until("the poison message in dead_letters", || async {
        let letters = dead_letters(&db).await;
        if letters.is_empty() { Err("none") } else { Ok(letters) }
    })
    .await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let (offset, reason, error) = &letters[0];
    assert_eq!((*offset, reason.as_str()), (1, "malformed_envelope"));
    assert!(error.contains("\\u0000"), "the NUL is shown escaped: {error}");
    until_caught_up(&setup.config).await;
    assert_eq!(stored_keys(&db).await, keys(&["a-1", "a-3"]));
    let metrics = scrape(setup.config.persist_admin()).await;
    assert_eq!(metrics.count(telemetry::PERSIST_WRITE_ERRORS, &[]), 0.0, "nothing was retried");
}

/// Issue 30, item 11 (cold review): each dead letter was an INSERT and a round trip of its own,
/// so one buggy producer's messages slowed their partitions' lanes for every pod. A batch's dead
/// letters are one statement; each is stored and counted once, also when the batch is read
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_dead_letters_of_one_batch_are_each_stored_and_counted_once() {
    let (setup, mut persister, db) = persister(topic()).await;
    let now = now_rfc3339();
    let messages: Vec<Vec<u8>> = (0..500)
        .map(|n| {
            if n % 2 == 0 {
                envelope(&format!("a-{n}"), &now, r#"{"msg":"nul \u0000"}"#)
            } else {
                envelope(&format!("a-{n}"), &now, &format!(r#"{{"n":{n}}}"#))
            }
        })
        .collect();
    produce_to(&setup, &messages).await;
    until_rows(&db, 250).await;
    let letters = until("250 dead letters", || async {
        let letters = dead_letters(&db).await;
        if letters.len() == 250 { Ok(letters) } else { Err(format!("{} so far", letters.len())) }
    })
    .await;
    assert!(letters.iter().all(|(offset, reason, _)| offset % 2 == 0 && reason == "contains_nul"), "{letters:?}");
    until_metric(setup.config.persist_admin(), telemetry::PERSIST_DEAD_LETTERS, &[("reason", "contains_nul")], 250.0)
        .await;
    // Read again from the start (offsets not committed: SIGKILL), nothing is stored twice.
    persister.kill();
    let again = setup.persister().await;
    until_caught_up(&setup.config).await;
    assert_eq!(dead_letters(&db).await.len(), 250);
    assert_eq!(row_count(&db).await, 250);
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_postgres_refuses_is_counted_as_lost_and_the_partition_moves_on() {
    let (setup, _persister, db) = persister(topic()).await;
    // A DBA's constraint that refuses one kind of dead letter.
    until("dead_letters exists", || {
        db.batch_execute("ALTER TABLE dead_letters ADD CONSTRAINT no_malformed CHECK (reason <> 'malformed_envelope')")
    })
    .await;
    let now = now_rfc3339();
    let messages = vec![envelope("b-1", &now, "{}"), b"not an envelope".to_vec(), envelope("b-3", &now, "{}")];
    produce_to(&setup, &messages).await;

    until_caught_up(&setup.config).await;
    assert_eq!(stored_keys(&db).await, keys(&["b-1", "b-3"]));
    assert!(dead_letters(&db).await.is_empty());
    let metrics = scrape(setup.config.persist_admin()).await;
    assert_eq!(metrics.count(telemetry::PERSIST_LOST, &[("reason", "dead_letter_rejected")]), 1.0);
}

/// Issue 30, item 12 (cold review): a binary envelope with a negative year (another producer on
/// the topic) under `retention_days = 0` made the persister create `logs_-00010101`, which
/// PostgreSQL refuses (42601): retried for ever, the partition wedged — and then the next
/// replica it moved to. The window has a floor, the Unix epoch; below it is a dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_time_before_the_epoch_is_a_dead_letter_and_the_partition_moves_on() {
    let (setup, _persister, db) = persister(topic().set("persist", "retention_days", 0)).await;
    let before_year_one = chrono::DateTime::from_timestamp_micros(-62_200_000_000_000_000).expect("a time");
    let writer = sluice::envelope::EnvelopeWriter::with_instance(
        &sluice::envelope::PodMetadata::default(),
        uuid::Uuid::now_v7(),
        sluice::config::EnvelopeKind::Binary,
    );
    let mut ancient = bytes::BytesMut::new();
    writer.write("from year -1", &sluice::envelope::PeerFragment::new(None), before_year_one, &mut ancient);
    let now = now_rfc3339();
    produce_to(&setup, &[envelope("e-1", &now, "{}"), ancient.to_vec(), envelope("e-3", &now, "{}")]).await;

    until_caught_up(&setup.config).await;
    assert_eq!(stored_keys(&db).await, keys(&["e-1", "e-3"]));
    let letters = dead_letters(&db).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!((letters[0].0, letters[0].1.as_str()), (1, "ingest_time_before_epoch"));
    let metrics = scrape(setup.config.persist_admin()).await;
    assert_eq!(metrics.count(telemetry::PERSIST_WRITE_ERRORS, &[]), 0.0, "nothing was retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_time_far_in_the_future_is_a_dead_letter_and_creates_no_partition() {
    let (setup, _persister, db) = persister(topic()).await;
    let now = now_rfc3339();
    let messages = vec![
        envelope("c-1", &now, "{}"),
        envelope("c-2", "9999-12-31T23:59:59.000000Z", "{}"),
        envelope("c-3", &now, "{}"),
    ];
    produce_to(&setup, &messages).await;

    until_caught_up(&setup.config).await;
    assert_eq!(stored_keys(&db).await, keys(&["c-1", "c-3"]));
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
    produce_to(&setup, &[envelope("c-4", &now_rfc3339(), "{}")]).await;
    until_caught_up(&setup.config).await;
    assert_eq!(stored_keys(&db).await, keys(&["c-1", "c-3", "c-4"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_ddl_error_does_not_leave_the_session_in_an_aborted_transaction() {
    let (setup, _persister, db) = persister(topic().set("persist", "max_clock_skew", "2d")).await;
    // A DBA made tomorrow's partition with other bounds: creating sluice's day partition for it
    // fails (overlap), inside the DDL transaction.
    let tomorrow = Utc::now().date_naive() + Days::new(1);
    let ddl = format!(
        "DROP TABLE IF EXISTS logs_{t}; CREATE TABLE dba_tomorrow PARTITION OF log_rows FOR VALUES FROM \
         ('{tomorrow} 00:00:00+00') TO ('{tomorrow} 23:00:00+00')",
        t = tomorrow.format("%Y%m%d")
    );
    until("logs exists", || db.batch_execute(&ddl)).await;
    let now = now_rfc3339();
    let tomorrow_time = format!("{tomorrow}T01:00:00.000000Z");
    let messages =
        vec![envelope("d-1", &now, "{}"), envelope("d-2", &tomorrow_time, "{}"), envelope("d-3", &now, "{}")];
    produce_to(&setup, &messages).await;
    until_caught_up(&setup.config).await;
    assert_eq!(stored_keys(&db).await, keys(&["d-1", "d-2", "d-3"]), "the DBA's partition holds d-2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_older_than_retention_is_a_dead_letter_named_expired_not_a_row_that_vanishes() {
    let (setup, _persister, db) = persister(topic().set("persist", "retention_days", 14)).await;
    let now = now_rfc3339();
    let old = (Utc::now() - Days::new(30)).to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let messages = vec![envelope("e-1", &now, "{}"), envelope("e-2", &old, "{}"), envelope("e-3", &now, "{}")];
    produce_to(&setup, &messages).await;

    until_caught_up(&setup.config).await;
    assert_eq!(stored_keys(&db).await, keys(&["e-1", "e-3"]));
    let letters = dead_letters(&db).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!((letters[0].0, letters[0].1.as_str()), (1, "expired"));
    until_metric(setup.config.persist_admin(), telemetry::PERSIST_DEAD_LETTERS, &[("reason", "expired")], 1.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_several_rows_postgres_rejects_is_split_until_each_is_isolated() {
    let scenario = topic().set("persist", "batch_max_wait", "2s").set("persist", "batch_max_records", 1000);
    let (setup, _persister, db) = persister(scenario).await;
    until("logs exists", || {
        db.batch_execute("ALTER TABLE log_rows ADD CONSTRAINT no_boom CHECK (record->>'m' IS DISTINCT FROM 'boom')")
    })
    .await;
    let now = now_rfc3339();
    let messages: Vec<Vec<u8>> = (0..1000)
        .map(|n| {
            let m = if [17, 500, 501, 998].contains(&n) { "boom" } else { "fine" };
            envelope(&format!("f-{n}"), &now, &format!(r#"{{"m":"{m}","n":{n}}}"#))
        })
        .collect();
    produce_to(&setup, &messages).await;

    within(Duration::from_secs(120), "caught up", until_caught_up(&setup.config)).await;
    assert_eq!(stored_keys(&db).await.len(), 996);
    let offsets: Vec<i64> = dead_letters(&db).await.iter().map(|(offset, ..)| *offset).collect();
    assert_eq!(offsets, vec![17, 500, 501, 998]);
    let rejected = [("reason", "rejected_by_postgres")];
    until_metric(setup.config.persist_admin(), telemetry::PERSIST_DEAD_LETTERS, &rejected, 4.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_dead_letter_already_stored_is_not_counted_again() {
    let (setup, first, db) = persister(topic()).await;
    let now = now_rfc3339();
    let messages = vec![envelope("g-1", &now, "{}"), b"not an envelope".to_vec()];
    produce_to(&setup, &messages).await;
    until_caught_up(&setup.config).await;
    drop(first);
    // A persister of another group on the same schema reads the topic again from the start: a
    // redelivery of both messages, as after a crash before the offset commit.
    let mut again = TestConfig::new(&setup.services, &setup.topic);
    again.set("postgres", "schema", setup.config.schema());
    let _again = start_persister(&again).await;
    until_caught_up(&again).await;

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
    let scenario = topic().set("persist", "batch_max_wait", "2s").set("persist", "batch_max_records", 200);
    let (setup, _persister, db) = persister(scenario).await;
    // Rows with m = boom are refused (isolation begins); the dead letter of offset 190 fails once
    // with an error that is not about the data (the batch is retried) — after the isolation has
    // committed the other rows and the dead letter of offset 17. A sequence is not rolled back.
    until("logs and dead_letters exist", || {
        db.batch_execute(
            "ALTER TABLE log_rows ADD CONSTRAINT no_boom CHECK (record->>'m' IS DISTINCT FROM 'boom');
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
    })
    .await;
    let now = now_rfc3339();
    let messages: Vec<Vec<u8>> = (0..200)
        .map(|n| {
            let m = if [17, 190].contains(&n) { "boom" } else { "fine" };
            envelope(&format!("h-{n}"), &now, &format!(r#"{{"m":"{m}","n":{n}}}"#))
        })
        .collect();
    produce_to(&setup, &messages).await;

    within(Duration::from_secs(120), "caught up", until_caught_up(&setup.config)).await;
    assert_eq!(stored_keys(&db).await.len(), 198);
    let offsets: Vec<i64> = dead_letters(&db).await.iter().map(|(offset, ..)| *offset).collect();
    assert_eq!(offsets, vec![17, 190]);
    let metrics = until_metric(
        setup.config.persist_admin(),
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
    // The batch in hand is written in the drain, after the broker stopped answering: its offset
    // is stored but cannot be committed.
    let setup =
        topic().on(&broker).set("persist", "drain_timeout", "2s").set("persist", "batch_max_wait", "20s").build().await;
    let config = &setup.config;
    let mut persister = setup.persister().await;
    produce_to(&setup, &[envelope("i-1", &now_rfc3339(), "{}")]).await;
    until_metric_at_least(config.persist_admin(), telemetry::PERSIST_CONSUMED, &[], 1.0).await;
    broker.freeze();
    persister.signal("TERM");
    let started = std::time::Instant::now();
    let status = persister.wait(Duration::from_secs(40)).await;
    let took = started.elapsed();
    let db = setup.db().await;
    assert_eq!(stored_keys(&db).await, keys(&["i-1"]), "the batch in hand was written in the drain");
    // drain_timeout (2 s) + the final commit's and close's bound + the runtime's shutdown bound.
    // About 9 s: a margin for a busy machine, well below the wait (40 s) a held shutdown reaches.
    assert!(took < Duration::from_secs(25), "shutdown took {took:?}; log:\n{}", persister.log_text());
    assert!(status.success(), "{status:?}; log:\n{}", persister.log_text());
    assert!(persister.log_text().contains("not committed"), "what was not committed is logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_records_message_is_stored_once_in_the_record_and_the_view_logs_derives_it() {
    let (setup, _persister, db) = persister(topic()).await;
    let now = now_rfc3339();
    // (record, the message `logs` shows): the rule the persister applied in Rust before V3.
    let cases: &[(&str, Option<&str>)] = &[
        (r#"{"msg":"boom"}"#, Some("boom")),
        (r#"{"message":"first name wins","msg":"b"}"#, Some("first name wins")),
        (r#"{"msg":"b","message":"in any order"}"#, Some("in any order")),
        (r#"{"message":42,"msg":"a number is no message, and msg is not looked at"}"#, None),
        (r#"{"message":null,"msg":"b"}"#, None),
        (r#"{"msg":"x","msg":"the last of a name given twice"}"#, Some("the last of a name given twice")),
        (r#"{"message":"a","message":5}"#, None),
        // The one difference from the Rust rule (migration V3): a number serde_json cannot read
        // made `message` absent there, so `msg` was used; it is a number, so no message.
        (r#"{"message":1e400,"msg":"x"}"#, None),
        (r#"{"m\u0073g":"an escaped name"}"#, Some("an escaped name")),
        (r#"{"msg":"caf\u00e9 \"q\"\n"}"#, Some("café \"q\"\n")),
        (r#"{"nested":{"msg":"not top-level"}}"#, None),
        (r#"["a",{"msg":"b"}]"#, None),
        (r#""just a string""#, None),
    ];
    let mut messages: Vec<Vec<u8>> =
        cases.iter().enumerate().map(|(n, (record, _))| envelope(&format!("m-{n}"), &now, record)).collect();
    messages.push(
        format!(
            r#"{{"v":1,"id":"m-text","ingest_time":"{now}","format":"text","record":{{"message":"a text line"}}}}"#
        )
        .into_bytes(),
    );
    produce_to(&setup, &messages).await;
    until_caught_up(&setup.config).await;

    let shown = pairs(&db, "SELECT coalesce(record::text, message), message FROM logs ORDER BY kafka_offset").await;
    let mut expected: Vec<(String, Option<String>)> =
        cases.iter().map(|(record, message)| (record.to_string(), message.map(str::to_string))).collect();
    expected.push(("a text line".into(), Some("a text line".into())));
    assert_eq!(shown, expected, "logs shows every record as written with its message");
    let stored = pairs(&db, "SELECT format, message FROM log_rows ORDER BY kafka_offset").await;
    let mut once: Vec<(String, Option<String>)> = cases.iter().map(|_| ("json".to_string(), None)).collect();
    once.push(("text".into(), Some("a text line".into())));
    assert_eq!(
        stored, once,
        "a JSON record's message is stored once, in the record; a text record's line once, as message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_in_the_v1_layout_is_upgraded_in_place_and_an_old_record_redelivered_stays_one_row() {
    let setup = topic().build().await;
    let mut db = setup.db().await;
    let schema = setup.config.schema();
    sluice::persist::schema::migrate_to(&mut db, &schema, Some(1)).await.expect("the V1 layout");
    let day = Utc::now().date_naive();
    partitions_before_v3(&db, &[day]).await;
    // Rows as a V1 persister stored them: the record twice, the id as text.
    let now = now_rfc3339();
    let agent = "0192f0a1b2c3d4e5a60718293a4b5c6d";
    let json_record = r#"{"n": 1,  "m":"old"}"#;
    db.execute(
        "INSERT INTO logs (record_id, ingest_time, format, record, payload, message, kafka_topic, kafka_partition, kafka_offset) \
         VALUES ($1, $3::text::timestamptz, 'json', $2::text::jsonb, $2, NULL, 'old', 0, 100), \
                ('r0-5', now(), 'text', '{\"message\":\"an old line\"}', 'an old line', 'an old line', 'old', 0, 101), \
                ('legacy', now(), 'text', '{\"message\":\"no sequence\"}', 'no sequence', 'no sequence', 'old', 0, 102)",
        &[&format!("{agent}-7"), &json_record, &now],
    )
    .await
    .expect("V1 rows");

    let _persister = setup.persister().await;
    // The agent's record 7 again (a redelivery across the upgrade: the same envelope, so the
    // same ingest time), then its record 8.
    produce_to(
        &setup,
        &[envelope(&format!("{agent}-7"), &now, json_record), envelope(&format!("{agent}-8"), &now, "{}")],
    )
    .await;
    until_caught_up(&setup.config).await;

    let rows = db
        .query("SELECT agent::text || '/' || seq, coalesce(record::text, message), format FROM logs", &[])
        .await
        .expect("rows");
    let mut rows: Vec<(String, String, String)> = rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect();
    rows.sort();
    let row =
        |id: &str, written: &str, format: &str| (RecordKey::of(id).to_string(), written.to_string(), format.into());
    assert_eq!(
        rows,
        BTreeSet::from([
            row(&format!("{agent}-8"), "{}", "json"),
            row(&format!("{agent}-7"), json_record, "json"),
            row("r0-5", "an old line", "text"),
            row("legacy", "no sequence", "text"),
        ])
        .into_iter()
        .collect::<Vec<_>>(),
        "old rows keep their records as written, under the key the persister computes"
    );
    let metrics = scrape(setup.config.persist_admin()).await;
    assert_eq!(metrics.count(telemetry::PERSIST_DUPLICATES, &[]), 1.0, "record 7 was stored before the upgrade");
    let columns: Vec<String> = db
        .query(
            "SELECT attname || ' ' || format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = 'log_rows'::regclass AND attnum > 0 AND NOT attisdropped \
             AND attname IN ('agent', 'seq', 'record', 'payload', 'record_id') ORDER BY attname",
            &[],
        )
        .await
        .expect("columns")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(columns, ["agent uuid", "record json", "seq bigint"]);
    let indexes: Vec<String> = db
        .query(
            "SELECT indexname || ' ' || substring(indexdef FROM 'USING (.*)$') FROM pg_indexes              WHERE schemaname = current_schema() AND tablename = 'log_rows' ORDER BY 1",
            &[],
        )
        .await
        .expect("indexes")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        indexes,
        [
            "logs_ingest_time brin (ingest_time)",
            "logs_pkey btree (agent, seq, ingest_time)",
            "logs_pod btree (pod_namespace, pod_name)"
        ]
    );
}

/// Issue 30, item 2: a persister with no partitions — a spare, as KEDA scales up to more
/// replicas than the topic has partitions — was never ready and paged `SluicePersisterNotReady`
/// as critical. It is ready (a rebalance may give it partitions at any time) and says it holds
/// none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_persister_with_no_partitions_is_ready_and_says_it_holds_none() {
    let setup = Scenario::new("spare").build().await;
    let _first = setup.persister().await;
    let member = setup.group_member();
    let path = member.write();
    let mut second = Process::spawn_with_env(
        "persist",
        &["persist", "--config", path.to_str().expect("utf-8 path")],
        member.dir.path(),
        &member.env,
    );
    let admins = [setup.config.persist_admin(), second.wait_admin().await];
    // The one partition goes to either member at the rebalance: the other is the spare.
    let spare = until("both ready, one of them holding no partitions", || async {
        let mut bodies = Vec::new();
        for admin in admins {
            match http_get(admin, "/readyz").await {
                Ok((200, body)) => bodies.push(body.trim().to_string()),
                other => return Err(format!("{admin}: {other:?}")),
            }
        }
        match bodies.iter().position(|body| body == "ready (no partitions assigned)") {
            Some(spare) if bodies[1 - spare] == "ready" => Ok(admins[spare]),
            _ => Err(format!("{bodies:?}")),
        }
    })
    .await;
    let metrics = until_metric(spare, telemetry::PERSIST_POSTGRES_REACHABLE, &[], 1.0).await;
    assert_eq!(metrics.count(telemetry::PERSIST_ASSIGNED_PARTITIONS, &[]), 0.0);
    assert_eq!(http_get(spare, "/healthz/postgres").await.expect("healthz/postgres").0, 200);
}

/// Typed columns on a database that already holds rows: added at start (to the table and the
/// view), filled from each JSON record by pointer, NULL and counted where a value does not
/// convert (never a dead letter); rows stored before keep NULL. A column that exists with another
/// type stops the persister, naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_columns_are_added_beside_stored_rows_and_filled_or_left_null_and_counted() {
    let (mut setup, mut first, db) = persister(topic()).await;
    let now = now_rfc3339();
    produce_to(&setup, &[envelope("00000000000000000000000000000001-1", &now, r#"{"user":{"id":1}}"#)]).await;
    until_rows(&db, 1).await;
    first.stop(Duration::from_secs(20)).await;

    let columns: toml::Value = toml::from_str::<toml::Table>(
        r#"
        user_id = { pointer = "/user/id", type = "bigint", index = true }
        latency = { pointer = "/latency_ms", type = "double precision" }
        ok = { pointer = "/ok", type = "boolean" }
        at = { pointer = "/at", type = "timestamptz" }
        tags = { pointer = "/tags", type = "jsonb" }
        route = { pointer = "/http/route", type = "text" }
        "#,
    )
    .expect("columns")
    .into();
    setup.config.set("persist", "columns", columns.clone());
    let second = setup.persister().await;
    produce_to(
        &setup,
        &[
            envelope(
                "00000000000000000000000000000001-2",
                &now,
                r#"{"user":{"id":2},"latency_ms":"12.5","ok":true,"at":"2026-12-06T10:00:00Z","tags":["a",1],"http":{"route":"/cart"}}"#,
            ),
            envelope("00000000000000000000000000000001-3", &now, r#"{"user":{"id":"three"},"ok":"maybe","latency_ms":4}"#),
            envelope("00000000000000000000000000000001-4", &now, r#"{"n":4}"#),
        ],
    )
    .await;
    until_rows(&db, 4).await;
    let rows = db
        .query("SELECT seq, user_id, latency, ok, at::text, tags::text, route FROM logs ORDER BY seq", &[])
        .await
        .expect("typed columns in the view");
    let row = |i: usize| {
        let r = &rows[i];
        (
            r.get::<_, i64>(0),
            r.get::<_, Option<i64>>(1),
            r.get::<_, Option<f64>>(2),
            r.get::<_, Option<bool>>(3),
            r.get::<_, Option<String>>(4),
            r.get::<_, Option<String>>(5),
            r.get::<_, Option<String>>(6),
        )
    };
    assert_eq!(row(0), (1, None, None, None, None, None, None), "stored before: NULL");
    assert_eq!(
        row(1),
        (
            2,
            Some(2),
            Some(12.5),
            Some(true),
            Some("2026-12-06 10:00:00+00".into()),
            Some(r#"["a", 1]"#.into()),
            Some("/cart".into())
        )
    );
    assert_eq!(row(2), (3, None, Some(4.0), None, None, None, None), "what does not convert is NULL");
    assert_eq!(row(3), (4, None, None, None, None, None, None));
    assert!(dead_letters(&db).await.is_empty(), "never a dead letter for a column");
    let metrics = scrape(setup.config.persist_admin()).await;
    assert_eq!(metrics.count(telemetry::PERSIST_UNCONVERTIBLE, &[("column", "user_id")]), 1.0);
    assert_eq!(metrics.count(telemetry::PERSIST_UNCONVERTIBLE, &[("column", "ok")]), 1.0);
    assert_eq!(metrics.count(telemetry::PERSIST_UNCONVERTIBLE, &[("column", "latency")]), 0.0);
    let indexed: i64 = db
        .query_one("SELECT count(*) FROM pg_indexes WHERE indexname = 'log_rows_user_id_idx' AND schemaname = current_schema()", &[])
        .await
        .expect("index")
        .get(0);
    assert_eq!(indexed, 1);
    drop(second);

    // A persister that starts (or reconnects) while a VACUUM holds the table finds the column and
    // its index there, and writes: it does not queue for a lock behind the VACUUM, with every
    // COPY behind it.
    let vacuum = setup.db().await;
    vacuum.batch_execute("BEGIN; LOCK TABLE log_rows IN SHARE UPDATE EXCLUSIVE MODE").await.expect("a VACUUM's lock");
    let third = setup.persister().await;
    produce_to(&setup, &[envelope("00000000000000000000000000000001-5", &now, r#"{"user":{"id":5}}"#)]).await;
    until_rows(&db, 5).await;
    vacuum.batch_execute("COMMIT").await.expect("the VACUUM ends");
    drop(third);

    // The same name with another type: the persister stops and says which key.
    let mut columns = columns.as_table().expect("table").clone();
    columns.insert(
        "ok".into(),
        toml::from_str::<toml::Table>(
            r#"pointer = "/ok"
type = "text""#,
        )
        .expect("column")
        .into(),
    );
    setup.config.set("persist", "columns", toml::Value::Table(columns));
    let path = setup.config.write();
    let mut wrong =
        Process::spawn("persist", &["persist", "--config", path.to_str().expect("path")], setup.config.dir.path());
    let status = wrong.wait(Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(wrong.log_text().contains("persist.columns.ok"), "{}", wrong.log_text());
}

/// `sluice replay` with the persister's config; its stdout and stderr.
fn replay(config: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(sluice_harness::binary())
        .args(["replay", "--config", config.to_str().expect("path")])
        .args(args)
        .output()
        .expect("run sluice replay");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

/// Issue 33: dead letters replayed once their cause is fixed become rows — one each, however
/// often they are replayed — and are marked; those of another reason stay as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_dead_letters_become_one_row_each_once_the_cause_is_fixed_and_are_marked() {
    let (mut setup, mut persister, db) = persister(topic().set("persist", "max_clock_skew", "1h")).await;
    let ahead = (Utc::now() + chrono::Duration::hours(3)).to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let messages = vec![envelope("r-1", &ahead, "{}"), b"not an envelope".to_vec(), envelope("r-2", &ahead, "{}")];
    produce_to(&setup, &messages).await;
    until("three dead letters", || async {
        let letters = dead_letters(&db).await;
        if letters.len() == 3 { Ok(()) } else { Err(format!("{letters:?}")) }
    })
    .await;

    // The cause fixed: persisters that allow a day of clock skew.
    assert!(persister.stop(WAIT).await.success());
    setup.config.set("persist", "max_clock_skew", "1d");
    let _persister = setup.persister().await;
    let config = setup.config.write();

    let (ok, listed, _) = replay(&config, &["--reason", "ingest_time_in_future", "--dry-run"]);
    assert!(ok);
    assert_eq!(listed.lines().count(), 2, "{listed}");
    assert!(listed.lines().all(|line| line.contains("ingest_time_in_future")), "{listed}");
    let (ok, sent, summary) = replay(&config, &["--reason", "ingest_time_in_future"]);
    assert!(ok, "{summary}");
    assert!(summary.contains("replayed 2 dead letters (ingest_time_in_future: 2)"), "{summary}");
    assert_eq!(sent.lines().filter(|line| line.ends_with(" replayed")).count(), 2, "{sent}");
    until("the replayed records stored", || async {
        let stored = stored_keys(&db).await;
        if stored == keys(&["r-1", "r-2"]) { Ok(()) } else { Err(format!("{stored:?}")) }
    })
    .await;
    let marked: Vec<(String, bool)> =
        pairs(&db, "SELECT reason, replayed_at IS NOT NULL FROM dead_letters ORDER BY kafka_offset").await;
    let marked: Vec<(&str, bool)> = marked.iter().map(|(reason, marked)| (reason.as_str(), *marked)).collect();
    assert_eq!(
        marked,
        [("ingest_time_in_future", true), ("malformed_envelope", false), ("ingest_time_in_future", true)]
    );

    // Again: nothing is chosen. Forced: sent again, and still one row each, no new dead letter.
    let (ok, _, summary) = replay(&config, &["--reason", "ingest_time_in_future"]);
    assert!(ok && summary.contains("replayed 0 dead letters (none chosen)"), "{summary}");
    let (ok, _, summary) = replay(&config, &["--again", "--id", &format!("{}/0/0", setup.topic)]);
    assert!(ok && summary.contains("replayed 1 dead letters"), "{summary}");
    until_caught_up(&setup.config).await;
    assert_eq!(stored_keys(&db).await, keys(&["r-1", "r-2"]));
    assert_eq!(dead_letters(&db).await.len(), 3);

    // Found by the cold review: a letter that fails again comes back as a new dead letter while
    // the run pages on, and the run chose it again (with enough of them, for ever). A run now
    // chooses only what was received before it began: a letter received later (here, stamped
    // an hour ahead, as one arriving mid-run would be) is left to the next run.
    db.batch_execute(&format!(
        "INSERT INTO dead_letters (kafka_topic, kafka_partition, kafka_offset, received_at, reason, error, payload) \
         VALUES ('{}', 0, 999, now() + interval '1 hour', 'malformed_envelope', 'x', 'not one either')",
        setup.topic
    ))
    .await
    .expect("a dead letter received after the run began");
    let (ok, _, summary) = replay(&config, &["--reason", "malformed_envelope"]);
    assert!(ok && summary.contains("replayed 1 dead letters (malformed_envelope: 1)"), "{summary}");
    until("the replayed malformed message a dead letter again", || async {
        let letters = dead_letters(&db).await;
        if letters.len() == 5 { Ok(()) } else { Err(format!("{letters:?}")) }
    })
    .await;

    // A reason no persister writes is refused, naming the ones there are.
    let (ok, _, refusal) = replay(&config, &["--reason", "ingest_time_in_futur"]);
    assert!(!ok && refusal.contains("ingest_time_in_future"), "{refusal}");
}
