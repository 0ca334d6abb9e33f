//! The persister's schema management against the real PostgreSQL.

use chrono::{Days, Utc};
use sluice::config::PostgresConfig;
use sluice::persist::{schema, writer};

use crate::support::*;

fn postgres(services: &Services) -> PostgresConfig {
    PostgresConfig {
        url: services.pg.clone(),
        schema: unique("schema"),
        ca_file: std::env::var_os("SLUICE_TEST_PG_CA").map(Into::into),
        ..PostgresConfig::default()
    }
}

/// A fresh schema migrated to `version` (the layout an older persister left), with its
/// partitions for `days` made as that persister made them.
async fn database_at(version: i32, days: &[chrono::NaiveDate]) -> (PostgresConfig, tokio_postgres::Client) {
    let services = services();
    let config = postgres(&services);
    let mut client = writer::connect(&config).await.expect("connect");
    schema::migrate_to(&mut client, &config.schema, Some(version)).await.expect("the older layout");
    partitions_before_v3(&client, days).await;
    (config, client)
}

async fn partitions(client: &tokio_postgres::Client) -> Vec<String> {
    let rows = client
        .query(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace n ON n.oid = p.relnamespace \
             WHERE p.relname = 'log_rows' AND n.nspname = current_schema() ORDER BY 1",
            &[],
        )
        .await
        .expect("partitions");
    rows.iter().map(|row| row.get(0)).collect()
}

#[tokio::test]
async fn concurrent_migrations_from_several_replicas_apply_once() {
    let services = services();
    let config = postgres(&services);
    let mut a = writer::connect(&config).await.expect("connect");
    let mut b = writer::connect(&config).await.expect("connect");
    let (first, second) =
        tokio::join!(schema::migrate(&mut a, &config.schema), schema::migrate(&mut b, &config.schema));
    first.expect("first replica migrates");
    second.expect("second replica finds it done");
    let history = a
        .query_one("SELECT count(*), count(DISTINCT version) FROM refinery_schema_history", &[])
        .await
        .expect("history");
    let migrations = std::fs::read_dir(source_path("migrations")).expect("migrations").count();
    assert_eq!(
        (history.get::<_, i64>(0), history.get::<_, i64>(1)),
        (migrations as i64, migrations as i64),
        "each once"
    );
}

#[tokio::test]
async fn retention_drops_day_partitions_past_the_retention_period_and_keeps_the_rest() {
    let services = services();
    let config = postgres(&services);
    let mut client = writer::connect(&config).await.expect("connect");
    schema::migrate(&mut client, &config.schema).await.expect("migrate");
    let today = Utc::now().date_naive();
    let days: Vec<_> = [30, 20, 14, 13, 1, 0].iter().map(|&ago| today - Days::new(ago)).collect();
    schema::ensure_partitions(&client, &days).await.expect("partitions");
    schema::ensure_partitions(&client, &days).await.expect("creating them again is harmless");

    let dropped = schema::apply_retention(&client, today, 14).await.expect("retention");
    let name = |ago: u64| schema::partition_name(today - Days::new(ago));
    assert_eq!(dropped, vec![name(30), name(20)]);
    assert_eq!(partitions(&client).await, vec![name(14), name(13), name(1), name(0)]);
    assert!(schema::apply_retention(&client, today, 0).await.expect("keep all").is_empty());
}

/// Issue 33: dead letters had no retention; now those received more than
/// `dead_letter_retention_days` ago go, in chunks, and the rest stay (`0` keeps them all).
#[tokio::test]
async fn dead_letter_retention_deletes_those_past_it_and_keeps_the_rest() {
    let services = services();
    let config = postgres(&services);
    let mut client = writer::connect(&config).await.expect("connect");
    schema::migrate(&mut client, &config.schema).await.expect("migrate");
    client
        .batch_execute(
            "INSERT INTO dead_letters (kafka_topic, kafka_partition, kafka_offset, received_at, reason, error) \
             SELECT 't', 0, n, now() - make_interval(days => (n % 3) * 20), 'expired', 'x' \
             FROM generate_series(0, 35999) n",
        )
        .await
        .expect("dead letters received 0, 20 and 40 days ago");
    assert_eq!(schema::apply_dead_letter_retention(&client, 0).await.expect("keep all"), 0);
    assert_eq!(schema::apply_dead_letter_retention(&client, 30).await.expect("retention"), 12_000);
    assert_eq!(schema::apply_dead_letter_retention(&client, 10).await.expect("retention"), 12_000);
    let left: i64 = client.query_one("SELECT count(*) FROM dead_letters", &[]).await.expect("count").get(0);
    assert_eq!(left, 12_000, "more than a chunk each time");
}

#[tokio::test]
async fn the_v2_upgrade_rewrites_each_row_once_under_any_statement_timeout_and_gives_every_partition_lz4() {
    // Found by the cold review of the V2 table: the upgrade updated every row and then rewrote
    // the table, keeping the dropped columns' bytes in every old row; a role's statement_timeout
    // cancelled it (and it started over at every start); lz4 reached `logs` but no partition.
    let today = Utc::now().date_naive();
    let (config, mut client) = database_at(1, &[today, today + Days::new(1)]).await;
    // V1 rows: JSON records (the text twice) and text records whose payload is the line; some
    // text rows' message differs from it (the line is the payload).
    client
        .batch_execute(
            "INSERT INTO logs (record_id, ingest_time, format, record, payload, message, kafka_topic, kafka_partition, kafka_offset) \
             SELECT 'web-' || i, now() + (i % 2) * interval '1 day', CASE WHEN i % 2 = 0 THEN 'json' ELSE 'text' END, \
                    CASE WHEN i % 2 = 0 THEN jsonb_build_object('msg', body) ELSE jsonb_build_object('message', 'line ' || body) END, \
                    CASE WHEN i % 2 = 0 THEN json_build_object('msg', body)::text ELSE 'line ' || body END, \
                    CASE WHEN i % 2 = 0 THEN NULL WHEN i % 3 = 0 THEN 'stale' ELSE 'line ' || body END, 't', 0, i \
             FROM generate_series(1, 20000) AS i, \
                  LATERAL (SELECT string_agg(md5(i::text || '/' || g::text), '') FROM generate_series(1, 20) AS g) AS b(body)",
        )
        .await
        .expect("V1 rows");

    client.batch_execute("SET statement_timeout = '100ms'").await.expect("a role's timeout");
    schema::migrate(&mut client, &config.schema).await.expect("the upgrade runs whatever the session's timeout");
    client.batch_execute("RESET statement_timeout").await.expect("reset");

    let count = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[]).await.expect(sql).get::<_, i64>(0) }
    };
    assert_eq!(count("SELECT count(*) FROM logs").await, 20000);
    assert_eq!(
        count("SELECT count(*) FROM logs WHERE format = 'text' AND (record IS NOT NULL OR message NOT LIKE 'line %')")
            .await,
        0,
        "a text record's line is its V1 payload, kept as message"
    );
    schema::ensure_partitions(&client, &[today + Days::new(2)]).await.expect("a partition made after the upgrade");
    assert_eq!(
        count(
            "SELECT count(*) FROM pg_partition_tree('log_rows') JOIN pg_attribute ON attrelid = relid \
             WHERE attname IN ('record', 'message') AND attcompression IS DISTINCT FROM 'l'"
        )
        .await,
        0,
        "logs and every partition compress record and message with lz4"
    );
    let size = "SELECT sum(pg_table_size(relid))::int8 FROM pg_partition_tree('log_rows')";
    let upgraded = count(size).await;
    client.batch_execute("VACUUM FULL log_rows").await.expect("vacuum full");
    let compact = count(size).await;
    assert!(
        upgraded * 10 <= compact * 11,
        "the upgraded table ({upgraded} B) is larger than the same rows rewritten by VACUUM FULL ({compact} B): \
         dead row versions or dropped columns' bytes were left behind"
    );
}

#[tokio::test]
async fn the_v3_upgrade_keeps_every_stored_row_as_it_was_and_rewrites_none() {
    // A V2 database holds JSON rows with their message stored twice (as the V2 persister wrote
    // them) and text rows. After V3 `logs` is a view: the same rows, the same messages, and the
    // table under it (`log_rows`) was renamed, not rewritten; partitions and retention go on.
    let today = Utc::now().date_naive();
    let old = today - Days::new(20);
    let (config, mut client) = database_at(2, &[old, today]).await;
    client
        .batch_execute(&format!(
            "INSERT INTO logs (agent, seq, ingest_time, format, record, message, kafka_topic, kafka_partition, kafka_offset) \
             SELECT gen_random_uuid(), i, CASE WHEN i = 1 THEN '{old}'::timestamptz ELSE now() END, \
                    CASE WHEN i % 2 = 0 THEN 'json' ELSE 'text' END, \
                    CASE WHEN i % 2 = 0 THEN json_build_object('msg', 'json ' || i, 'n', i) END, \
                    CASE WHEN i % 2 = 0 THEN 'json ' || i ELSE 'line ' || i END, 't', 0, i \
             FROM generate_series(1, 1000) AS i"
        ))
        .await
        .expect("V2 rows");
    // JSON rows whose message a V2 persister did not store (none, or not a string), and one
    // stored without it as V3 stores them: the view derives the last, and finds none where V2
    // found none.
    client
        .batch_execute(
            r#"INSERT INTO logs (agent, seq, ingest_time, format, record, message, kafka_topic, kafka_partition, kafka_offset)
               VALUES (gen_random_uuid(), 2001, now(), 'json', '{"n":1}', NULL, 't', 0, 2001),
                      (gen_random_uuid(), 2002, now(), 'json', '{"message":7,"msg":"not this"}', NULL, 't', 0, 2002),
                      (gen_random_uuid(), 2003, now(), 'json', '["msg"]', NULL, 't', 0, 2003),
                      (gen_random_uuid(), 2004, now(), 'json', '{"msg":"json 2004"}', NULL, 't', 0, 2004)"#,
        )
        .await
        .expect("V2 rows without a message");
    // A role that could read the table before the upgrade (a dashboard's).
    let reader = Reader::create(&client, &config.schema, "logs").await;
    let relfilenodes = "SELECT string_agg(relfilenode::text, ',' ORDER BY relname) FROM pg_class \
                        WHERE relname LIKE 'logs_20%' AND relnamespace = current_schema()::regnamespace";
    let before: String = client.query_one(relfilenodes, &[]).await.expect("files").get(0);

    schema::migrate(&mut client, &config.schema).await.expect("the upgrade");

    let after: String = client.query_one(relfilenodes, &[]).await.expect("files").get(0);
    assert_eq!(after, before, "no partition was rewritten");
    let wrong: i64 = client
        .query_one(
            "SELECT count(*) FROM logs WHERE message IS DISTINCT FROM \
             CASE WHEN seq BETWEEN 2001 AND 2003 THEN NULL WHEN format = 'json' THEN 'json ' || seq ELSE 'line ' || seq END",
            &[],
        )
        .await
        .expect("messages")
        .get(0);
    assert_eq!(wrong, 0, "every row shows the message it had");
    let relkind: String = client
        .query_one("SELECT relkind::text FROM pg_class WHERE oid = 'logs'::regclass", &[])
        .await
        .expect("logs")
        .get(0);
    assert_eq!(relkind, "v", "logs is the view");
    reader
        .query_then_drop(&client, "SELECT count(*) FROM logs")
        .await
        .expect("a role that read the table reads the view");
    assert_eq!(partitions(&client).await, vec![schema::partition_name(old), schema::partition_name(today)]);
    let dropped = schema::apply_retention(&client, today, 14).await.expect("retention after the upgrade");
    assert_eq!(dropped, vec![schema::partition_name(old)]);
    let rows: i64 = client.query_one("SELECT count(*) FROM logs", &[]).await.expect("count").get(0);
    assert_eq!(rows, 1003, "the old day's row went with its partition");
}

#[tokio::test]
async fn the_v4_upgrade_adds_pod_labels_beside_rows_already_stored_and_rewrites_none() {
    // A V3 database holding rows: after V4 they read as before, with no labels; a reader of the
    // view still reads it; new rows carry labels and annotations as jsonb.
    let today = Utc::now().date_naive();
    let (config, mut client) = database_at(3, &[]).await;
    schema::ensure_partitions(&client, &[today]).await.expect("a V3 partition");
    client
        .batch_execute(
            "INSERT INTO log_rows (agent, seq, ingest_time, format, record, kafka_topic, kafka_partition, kafka_offset) \
             SELECT gen_random_uuid(), i, now(), 'json', json_build_object('msg', 'old ' || i), 't', 0, i \
             FROM generate_series(1, 500) AS i",
        )
        .await
        .expect("V3 rows");
    let reader = Reader::create(&client, &config.schema, "logs, log_rows").await;
    let relfilenodes = "SELECT string_agg(relfilenode::text, ',' ORDER BY relname) FROM pg_class \
                        WHERE relname LIKE 'logs_20%' AND relnamespace = current_schema()::regnamespace";
    let before: String = client.query_one(relfilenodes, &[]).await.expect("files").get(0);

    schema::migrate(&mut client, &config.schema).await.expect("the upgrade");

    let after: String = client.query_one(relfilenodes, &[]).await.expect("files").get(0);
    assert_eq!(after, before, "no partition was rewritten");
    let old = client
        .query_one("SELECT count(*), count(pod_labels), count(*) FILTER (WHERE message LIKE 'old %') FROM logs", &[])
        .await
        .expect("old rows");
    assert_eq!((old.get::<_, i64>(0), old.get::<_, i64>(1), old.get::<_, i64>(2)), (500, 0, 500));
    client
        .batch_execute(
            r#"INSERT INTO log_rows (agent, seq, ingest_time, format, record, kafka_topic, kafka_partition, kafka_offset, pod_labels, pod_annotations)
               VALUES (gen_random_uuid(), 501, now(), 'json', '{"msg":"new"}', 't', 0, 501, '{"app":"web"}', '{"team":"payments"}')"#,
        )
        .await
        .expect("a new row");
    reader
        .query_then_drop(&client, r#"SELECT pod_labels->>'app' FROM logs WHERE pod_labels @> '{"app":"web"}'"#)
        .await
        .expect("a role that read the view reads its new columns");
}

/// A role that only reads (a dashboard's), granted SELECT on `tables` of the test's schema before
/// an upgrade: what it could read, it must still read after.
struct Reader(String);

impl Reader {
    async fn create(client: &tokio_postgres::Client, schema: &str, tables: &str) -> Self {
        let reader = format!("{schema}_reader");
        client
            .batch_execute(&format!(
                "CREATE ROLE {reader}; GRANT USAGE ON SCHEMA {schema} TO {reader}; GRANT SELECT ON {tables} TO {reader}"
            ))
            .await
            .expect("a reader");
        Self(reader)
    }

    /// Runs `query` as the reader, then drops the role whatever the query gave.
    async fn query_then_drop(self, client: &tokio_postgres::Client, query: &str) -> Result<(), tokio_postgres::Error> {
        let reader = self.0;
        let read = client.batch_execute(&format!("SET ROLE {reader}; {query}; RESET ROLE")).await;
        client
            .batch_execute(&format!("RESET ROLE; DROP OWNED BY {reader}; DROP ROLE {reader}"))
            .await
            .expect("drop the reader");
        read
    }
}
