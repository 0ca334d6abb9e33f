//! The database schema: versioned migrations embedded in the binary, and day partitions of
//! `log_rows` (the table under the view `logs`) created ahead of time and dropped after the
//! retention period.
//!
//! Owns: every DDL statement sluice runs. Must not: run DDL concurrently with another persister
//! replica (each step takes a PostgreSQL advisory lock), or build SQL from config text (the
//! schema name is validated as a plain identifier and quoted; partition bounds come from dates).

use chrono::{Days, NaiveDate};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tracing::{info, warn};

use super::PersistError;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// The partitioned table rows are written to (migration V3); queries read the view `logs`.
pub const TABLE: &str = "log_rows";

/// Advisory lock key serialising sluice's DDL across replicas ("sluice" in ASCII).
const DDL_LOCK: i64 = 0x736c_7569_6365;

/// Creates the schema if missing and applies pending migrations. Runs on a connection whose
/// `search_path` is the schema, so the migrations name no schema.
pub async fn migrate(client: &mut Client, schema: &str) -> Result<(), PersistError> {
    migrate_to(client, schema, None).await
}

/// [`migrate`], stopping after migration `version` (`None`: the latest). Tests build a database
/// in an old layout with it.
#[doc(hidden)]
pub async fn migrate_to(client: &mut Client, schema: &str, version: Option<i32>) -> Result<(), PersistError> {
    client.execute("SELECT pg_advisory_lock($1)", &[&DDL_LOCK]).await.map_err(PersistError::Postgres)?;
    let result = async {
        client
            .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {}", quote_identifier(schema)))
            .await
            .map_err(PersistError::Postgres)?;
        let mut runner = embedded::migrations::runner();
        if let Some(version) = version {
            runner = runner.set_target(refinery::Target::Version(version));
        }
        let report = runner.run_async(client).await.map_err(|error| PersistError::Migration(error.to_string()))?;
        for migration in report.applied_migrations() {
            info!(version = migration.version(), name = migration.name(), "applied migration");
        }
        Ok(())
    }
    .await;
    client.execute("SELECT pg_advisory_unlock($1)", &[&DDL_LOCK]).await.map_err(PersistError::Postgres)?;
    result
}

/// Adds the typed columns (`[persist.columns]`) `log_rows` lacks, their indexes, and every column
/// `log_rows` has beyond the base ones to the view `logs` (at its end: `CREATE OR REPLACE VIEW`
/// can only add). Under the DDL lock, like the migrations. A column that exists with another type
/// is an error naming the key (`PersistError::Migration`: the persister stops, it would fail
/// every batch); a column no longer configured stays (nothing is dropped).
pub async fn ensure_columns(client: &Client, columns: &super::columns::Columns) -> Result<(), PersistError> {
    if columns.is_empty() {
        return Ok(());
    }
    ensure_columns_locked(client, columns).await.map_err(|error| match error {
        // Not a passing condition (no privilege, an index that cannot be built, a name or type
        // PostgreSQL refuses): retrying would fail for ever while Kafka's retention runs; the
        // persister stops, saying why. A lock wait that timed out (55P03) is retried.
        PersistError::Postgres(error)
            if error.code().is_some_and(|code| code.code().starts_with("42") || code.code().starts_with("54")) =>
        {
            PersistError::Migration(format!("persist.columns: {error}"))
        }
        other => other,
    })
}

async fn ensure_columns_locked(client: &Client, columns: &super::columns::Columns) -> Result<(), PersistError> {
    client.execute("SELECT pg_advisory_lock($1)", &[&DDL_LOCK]).await.map_err(PersistError::Postgres)?;
    let result = async {
        let existing = table_columns(client).await?;
        let mut added = false;
        for column in &columns.0 {
            let quoted = quote_identifier(&column.name);
            match existing.iter().find(|(name, _)| *name == column.name) {
                Some((_, kind)) if kind != column.config.kind.sql() => {
                    return Err(PersistError::Migration(format!(
                        "persist.columns.{}: {TABLE}.{} is {kind}, configured {}; rename the column in the config, or change it in the database",
                        column.name,
                        column.name,
                        column.config.kind.sql()
                    )));
                }
                Some(_) => {}
                None => {
                    // Behind a long query's lock, every write to the table would queue behind this
                    // one: give up after 30 s (the connect is retried).
                    ddl(
                        client,
                        &format!(
                            "SET LOCAL lock_timeout = '30s'; ALTER TABLE {TABLE} ADD COLUMN {quoted} {}",
                            column.config.kind.sql()
                        ),
                    )
                    .await?;
                    info!(column = column.name, kind = column.config.kind.sql(), "typed column added");
                    added = true;
                }
            }
            if column.config.index {
                let index = quote_identifier(&format!("{TABLE}_{}_idx", column.name));
                // Looked up first: `CREATE INDEX IF NOT EXISTS` locks the table and every
                // partition before it finds the index, and this runs on every writer's connect —
                // behind a VACUUM's lock it would wait, and every COPY behind it. A missing index
                // gives up after 30 s, like the column.
                let exists: bool = client
                    .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&index])
                    .await
                    .map_err(PersistError::Postgres)?
                    .get(0);
                if !exists {
                    ddl(
                        client,
                        &format!("SET LOCAL lock_timeout = '30s'; CREATE INDEX IF NOT EXISTS {index} ON {TABLE} ({quoted})"),
                    )
                    .await?;
                }
            }
        }
        // Rebuilt whenever a column of the table is missing from the view (also after a start
        // that added the column and stopped before the view).
        let viewed: Vec<String> = client
            .query(
                "SELECT attname::text FROM pg_attribute WHERE attrelid = 'logs'::regclass AND attnum > 0 AND NOT attisdropped",
                &[],
            )
            .await
            .map_err(PersistError::Postgres)?
            .iter()
            .map(|row| row.get(0))
            .collect();
        if added || columns.0.iter().any(|column| !viewed.contains(&column.name)) {
            let extra = table_columns(client)
                .await?
                .into_iter()
                .filter(|(name, _)| !crate::config::BASE_COLUMNS.contains(&name.as_str()))
                .map(|(name, _)| quote_identifier(&name));
            ddl(client, &format!("CREATE OR REPLACE VIEW logs AS SELECT {} FROM {TABLE}", view_select_list(extra).join(", "))).await?;
            if client.query_one("SHOW server_version_num", &[]).await.map_err(PersistError::Postgres)?.get::<_, String>(0).parse::<i32>().unwrap_or(0) >= 150000 {
                ddl(client, "ALTER VIEW logs SET (security_invoker = true)").await?;
            }
        }
        Ok(())
    }
    .await;
    client.execute("SELECT pg_advisory_unlock($1)", &[&DDL_LOCK]).await.map_err(PersistError::Postgres)?;
    result
}

/// The view `logs`'s select list: the base columns in the order the migrations gave them (the
/// message read from the record when the row does not store it, migration V3), then `extra`.
fn view_select_list(extra: impl Iterator<Item = String>) -> Vec<String> {
    crate::config::BASE_COLUMNS
        .iter()
        .map(|&name| match name {
            "message" => "coalesce(message, log_message(record)) AS message".to_string(),
            name => name.to_string(),
        })
        .chain(extra)
        .collect()
}

/// `log_rows`'s columns in order, each with its type as `format_type` writes it.
async fn table_columns(client: &Client) -> Result<Vec<(String, String)>, PersistError> {
    let rows = client
        .query(
            "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&TABLE],
        )
        .await
        .map_err(PersistError::Postgres)?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// The partition of [`TABLE`] holding `day` (named for the view, as before migration V3).
pub fn partition_name(day: NaiveDate) -> String {
    format!("logs_{}", day.format("%Y%m%d"))
}

/// Today (UTC) and the `ahead` days after it.
pub fn days_ahead(ahead: u32) -> Vec<NaiveDate> {
    let today = chrono::Utc::now().date_naive();
    (0..=ahead).filter_map(|days| today.checked_add_days(Days::new(u64::from(days)))).collect()
}

/// Creates the day partitions for `days` that do not exist yet, each in a transaction of its
/// own. A day that a partition made by someone else already covers (other bounds: PostgreSQL
/// says the new one would overlap, SQLSTATE 42P17) is left to that partition: the rows go there.
pub async fn ensure_partitions(client: &Client, days: &[NaiveDate]) -> Result<(), PersistError> {
    for day in days {
        let next = day.checked_add_days(Days::new(1)).unwrap_or(*day);
        let statement = format!(
            "CREATE TABLE IF NOT EXISTS {} PARTITION OF {TABLE} FOR VALUES FROM ('{} 00:00:00+00') TO ('{} 00:00:00+00')",
            partition_name(*day),
            day.format("%Y-%m-%d"),
            next.format("%Y-%m-%d"),
        );
        match ddl(client, &statement).await {
            Ok(()) => {}
            Err(PersistError::Postgres(error)) if error.code() == Some(&SqlState::INVALID_OBJECT_DEFINITION) => {
                warn!(%day, error = %super::describe_postgres(&error), "a partition of other bounds covers this day; using it");
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Runs one DDL statement in its own transaction under the DDL lock. On any error the
/// transaction is rolled back before returning, so the session is never left aborted
/// (SQLSTATE 25P02 on every later statement).
async fn ddl(client: &Client, statement: &str) -> Result<(), PersistError> {
    let script = format!("BEGIN; SELECT pg_advisory_xact_lock({DDL_LOCK}); {statement}; COMMIT;");
    match client.batch_execute(&script).await {
        Ok(()) => Ok(()),
        Err(error) => {
            // Harmless if the failed statement already ended the transaction.
            let _ = client.batch_execute("ROLLBACK").await;
            Err(PersistError::Postgres(error))
        }
    }
}

/// The first day whose partition retention keeps on `today` (`None`: `retention_days = 0`
/// keeps everything). Older partitions are dropped, so a row older than this must not be
/// written (it would be dropped with its re-created partition, uncounted).
pub fn retention_cutoff(today: NaiveDate, retention_days: u32) -> Option<NaiveDate> {
    if retention_days == 0 {
        return None;
    }
    Some(today.checked_sub_days(Days::new(u64::from(retention_days))).unwrap_or(today))
}

/// Drops day partitions that ended more than `retention_days` before `today`. Returns their
/// names. `retention_days = 0` keeps everything.
pub async fn apply_retention(
    client: &Client,
    today: NaiveDate,
    retention_days: u32,
) -> Result<Vec<String>, PersistError> {
    let Some(cutoff) = retention_cutoff(today, retention_days) else {
        return Ok(Vec::new());
    };
    let rows = client
        .query(
            "SELECT c.relname FROM pg_inherits i \
             JOIN pg_class c ON c.oid = i.inhrelid \
             JOIN pg_class p ON p.oid = i.inhparent \
             JOIN pg_namespace n ON n.oid = p.relnamespace \
             WHERE p.relname = $1 AND n.nspname = current_schema() ORDER BY c.relname",
            &[&TABLE],
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
            ddl(client, &format!("DROP TABLE IF EXISTS {}", partition_name(day))).await?;
            info!(partition = %name, "dropped partition past retention");
            dropped.push(name);
        }
    }
    Ok(dropped)
}

/// Most dead letters one statement deletes: a backlog of them past retention goes in short
/// transactions, never one that locks the table for minutes.
const DEAD_LETTER_DELETE_CHUNK: i64 = 10_000;

/// Deletes dead letters received more than `retention_days` days ago (`0` keeps them all), in
/// chunks, each counted in `sluice_persist_dead_letters_deleted_total` as it commits. Returns
/// how many.
pub async fn apply_dead_letter_retention(client: &Client, retention_days: u32) -> Result<u64, PersistError> {
    if retention_days == 0 {
        return Ok(0);
    }
    let days = i32::try_from(retention_days).unwrap_or(i32::MAX);
    let mut deleted = 0;
    loop {
        let chunk = client
            .execute(
                "DELETE FROM dead_letters WHERE ctid IN (SELECT ctid FROM dead_letters \
                 WHERE received_at < now() - make_interval(days => $1) LIMIT $2)",
                &[&days, &DEAD_LETTER_DELETE_CHUNK],
            )
            .await
            .map_err(PersistError::Postgres)?;
        deleted += chunk;
        // Counted as each chunk commits: a later chunk that fails does not hide this one.
        metrics::counter!(crate::telemetry::PERSIST_DEAD_LETTERS_DELETED).increment(chunk);
        if chunk < DEAD_LETTER_DELETE_CHUNK as u64 {
            return Ok(deleted);
        }
    }
}

/// `"name"` with embedded quotes doubled. Names reaching here are validated identifiers; the
/// quoting is a second guard, not the first.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
