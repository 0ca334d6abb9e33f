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

async fn partitions(client: &tokio_postgres::Client) -> Vec<String> {
    let rows = client
        .query(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace n ON n.oid = p.relnamespace \
             WHERE p.relname = 'logs' AND n.nspname = current_schema() ORDER BY 1",
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
    let migrations = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations")).expect("migrations").count();
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

#[tokio::test]
async fn the_v2_upgrade_rewrites_each_row_once_under_any_statement_timeout_and_gives_every_partition_lz4() {
    // Found by the cold review of the V2 table: the upgrade updated every row and then rewrote
    // the table, keeping the dropped columns' bytes in every old row; a role's statement_timeout
    // cancelled it (and it started over at every start); lz4 reached `logs` but no partition.
    let services = services();
    let config = postgres(&services);
    let mut client = writer::connect(&config).await.expect("connect");
    schema::migrate_to(&mut client, &config.schema, Some(1)).await.expect("the V1 layout");
    let today = Utc::now().date_naive();
    schema::ensure_partitions(&client, &[today, today + Days::new(1)]).await.expect("partitions");
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
            "SELECT count(*) FROM pg_partition_tree('logs') JOIN pg_attribute ON attrelid = relid \
             WHERE attname IN ('record', 'message') AND attcompression IS DISTINCT FROM 'l'"
        )
        .await,
        0,
        "logs and every partition compress record and message with lz4"
    );
    let size = "SELECT sum(pg_table_size(relid))::int8 FROM pg_partition_tree('logs')";
    let upgraded = count(size).await;
    client.batch_execute("VACUUM FULL logs").await.expect("vacuum full");
    let compact = count(size).await;
    assert!(
        upgraded * 10 <= compact * 11,
        "the upgraded table ({upgraded} B) is larger than the same rows rewritten by VACUUM FULL ({compact} B): \
         dead row versions or dropped columns' bytes were left behind"
    );
}
