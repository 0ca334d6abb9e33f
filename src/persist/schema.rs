//! The database schema: versioned migrations embedded in the binary, and day partitions of
//! `logs` created ahead of time and dropped after the retention period.
//!
//! Owns: every DDL statement sluice runs. Must not: run DDL concurrently with another persister
//! replica (each step takes a PostgreSQL advisory lock), or build SQL from config text (the
//! schema name is validated as a plain identifier and quoted; partition bounds come from dates).

use chrono::{Days, NaiveDate};
use tokio_postgres::Client;
use tracing::info;

use super::PersistError;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Advisory lock key serialising sluice's DDL across replicas ("sluice" in ASCII).
const DDL_LOCK: i64 = 0x736c_7569_6365;

/// Creates the schema if missing and applies pending migrations. Runs on a connection whose
/// `search_path` is the schema, so the migrations name no schema.
pub async fn migrate(client: &mut Client, schema: &str) -> Result<(), PersistError> {
    client.execute("SELECT pg_advisory_lock($1)", &[&DDL_LOCK]).await.map_err(PersistError::Postgres)?;
    let result = async {
        client
            .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {}", quote_identifier(schema)))
            .await
            .map_err(PersistError::Postgres)?;
        let report = embedded::migrations::runner()
            .run_async(client)
            .await
            .map_err(|error| PersistError::Migration(error.to_string()))?;
        for migration in report.applied_migrations() {
            info!(version = migration.version(), name = migration.name(), "applied migration");
        }
        Ok(())
    }
    .await;
    client.execute("SELECT pg_advisory_unlock($1)", &[&DDL_LOCK]).await.map_err(PersistError::Postgres)?;
    result
}

/// The partition of `logs` holding `day`.
pub fn partition_name(day: NaiveDate) -> String {
    format!("logs_{}", day.format("%Y%m%d"))
}

/// Today (UTC) and the `ahead` days after it.
pub fn days_ahead(ahead: u32) -> Vec<NaiveDate> {
    let today = chrono::Utc::now().date_naive();
    (0..=ahead).filter_map(|days| today.checked_add_days(Days::new(u64::from(days)))).collect()
}

/// Creates the day partitions for `days` that do not exist yet.
pub async fn ensure_partitions(client: &Client, days: &[NaiveDate]) -> Result<(), PersistError> {
    if days.is_empty() {
        return Ok(());
    }
    let mut statements = String::from("BEGIN; SELECT pg_advisory_xact_lock(");
    statements.push_str(&DDL_LOCK.to_string());
    statements.push_str(");\n");
    for day in days {
        let next = day.checked_add_days(Days::new(1)).unwrap_or(*day);
        statements.push_str(&format!(
            "CREATE TABLE IF NOT EXISTS {} PARTITION OF logs FOR VALUES FROM ('{} 00:00:00+00') TO ('{} 00:00:00+00');\n",
            partition_name(*day),
            day.format("%Y-%m-%d"),
            next.format("%Y-%m-%d"),
        ));
    }
    statements.push_str("COMMIT;");
    client.batch_execute(&statements).await.map_err(PersistError::Postgres)
}

/// Drops day partitions that ended more than `retention_days` before `today`. Returns their
/// names. `retention_days = 0` keeps everything.
pub async fn apply_retention(
    client: &Client,
    today: NaiveDate,
    retention_days: u32,
) -> Result<Vec<String>, PersistError> {
    if retention_days == 0 {
        return Ok(Vec::new());
    }
    let cutoff = today.checked_sub_days(Days::new(u64::from(retention_days))).unwrap_or(today);
    let rows = client
        .query(
            "SELECT c.relname FROM pg_inherits i \
             JOIN pg_class c ON c.oid = i.inhrelid \
             JOIN pg_class p ON p.oid = i.inhparent \
             JOIN pg_namespace n ON n.oid = p.relnamespace \
             WHERE p.relname = 'logs' AND n.nspname = current_schema() ORDER BY c.relname",
            &[],
        )
        .await
        .map_err(PersistError::Postgres)?;
    let mut dropped = Vec::new();
    for row in rows {
        let name: String = row.get(0);
        let Some(day) = name.strip_prefix("logs_").and_then(|date| NaiveDate::parse_from_str(date, "%Y%m%d").ok())
        else {
            continue;
        };
        if day < cutoff {
            client
                .batch_execute(&format!(
                    "BEGIN; SELECT pg_advisory_xact_lock({DDL_LOCK}); DROP TABLE IF EXISTS {}; COMMIT;",
                    partition_name(day)
                ))
                .await
                .map_err(PersistError::Postgres)?;
            info!(partition = %name, "dropped partition past retention");
            dropped.push(name);
        }
    }
    Ok(dropped)
}

/// `"name"` with embedded quotes doubled. Names reaching here are validated identifiers; the
/// quoting is a second guard, not the first.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
