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
