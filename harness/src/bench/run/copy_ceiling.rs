//! PostgreSQL's own ceiling for the persister's rows (docs/PERFORMANCE.md, "PostgreSQL's own
//! ceiling"): the rows a persister stored, written by the server to files in COPY's binary
//! format (what the persister sends), each half of the key range in a file of its own, then
//! loaded into a fresh schema, migrated as the persister migrates one, with
//! `COPY log_rows FROM 'file' (FORMAT binary)` — two sessions side by side (the persister's two
//! writers), and one session loading both halves one after the other. Rows per second, from
//! the first `COPY` sent to the last one done.
//!
//! Owns: those files (beside the server's data directory, where the server may write; removed
//! when the measurement ends, however it ends) and the fresh schemas. Must not: run anything
//! else meanwhile, or write a server-side file anywhere but beside the data directory (it
//! writes them as the stack's superuser).

use std::path::PathBuf;

use serde::Serialize;

use super::super::host::{clock_ticks, machine_busy_ticks, parent_pid, postmaster_cpu_ticks};
use super::{Bench, RunError, failed, now, random};

/// One way of loading the files.
#[derive(Debug, Clone, Serialize)]
pub struct CopyLoad {
    /// Sessions loading side by side.
    pub sessions: u32,
    /// From the first `COPY` sent to the last one done.
    pub seconds: f64,
    /// Rows loaded per second over that span.
    pub rows_per_second: f64,
    /// PostgreSQL's CPU over that span (postmaster, backends, background processes), in cores;
    /// none when its processes are not visible from here.
    pub postgres_cpu_cores: Option<f64>,
    /// The machine's busy cores over that span (everyone's).
    pub machine_busy_cores: f64,
}

/// PostgreSQL's `COPY … FROM` of the rows a persister stored, into a fresh schema.
#[derive(Debug, Clone, Serialize)]
pub struct CopyCeiling {
    /// Rows in the files (every row of the persister's schema).
    pub rows: u64,
    /// The files' size (COPY binary), bytes; 0 when this process cannot see them.
    pub file_bytes: u64,
    /// Two sessions, a half each.
    pub two_sessions: CopyLoad,
    /// One session, both halves in turn (when asked for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_session: Option<CopyLoad>,
}

/// The server-side files of one measurement: removed when dropped (a failed or panicking run
/// too). The harness runs as the server's user or as root (`scripts/stack`), so it may.
struct CopyFiles(Vec<PathBuf>);

impl Drop for CopyFiles {
    fn drop(&mut self) {
        for file in &self.0 {
            match std::fs::remove_file(file) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    super::log(&format!("could not remove {}: {error}", file.display()));
                }
                _ => {}
            }
        }
    }
}

/// A path as a SQL string literal.
fn literal(path: &std::path::Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "''"))
}

impl Bench {
    /// The COPY ceiling of the `rows` rows in `schema` (a persister's, on the stack's first
    /// cluster): two sessions, and with `one_session` one as well.
    pub(super) async fn copy_ceiling(
        &self,
        schema: &str,
        rows: u64,
        one_session: bool,
    ) -> Result<CopyCeiling, RunError> {
        super::log(&format!(
            "PostgreSQL's own COPY of the {rows} rows in {schema}: two sessions{}",
            if one_session { ", then one" } else { "" }
        ));
        let files = self.copy_out(schema, rows).await?;
        let file_bytes = files.0.iter().filter_map(|file| std::fs::metadata(file).ok()).map(|meta| meta.len()).sum();
        let days = self.partition_days(schema).await?;
        let two_sessions = self.copy_in(&files, 2, rows, &days).await?;
        let one_session = match one_session {
            true => Some(self.copy_in(&files, 1, rows, &days).await?),
            false => None,
        };
        Ok(CopyCeiling { rows, file_bytes, two_sessions, one_session })
    }

    /// Writes `schema`'s rows to two files in COPY binary format, split at the middle key
    /// `(agent, seq)`, each in key order (as a persister's lane writes a partition's records).
    async fn copy_out(&self, schema: &str, rows: u64) -> Result<CopyFiles, RunError> {
        let data = self.db.query_one("SHOW data_directory", &[]).await?.get::<_, String>(0);
        let dir = PathBuf::from(&data).parent().map(PathBuf::from).unwrap_or_else(|| PathBuf::from(&data));
        let name = format!("sluice-bench-copy-{}-{}", self.stamp, random());
        let files = CopyFiles(vec![dir.join(format!("{name}-a.bin")), dir.join(format!("{name}-b.bin"))]);
        let middle = i64::try_from(rows / 2).unwrap_or(i64::MAX);
        let key = self
            .db
            .query_one(
                &format!("SELECT agent::text, seq FROM {schema}.log_rows ORDER BY agent, seq OFFSET $1 LIMIT 1"),
                &[&middle],
            )
            .await?;
        let (agent, seq) = (key.get::<_, String>(0), key.get::<_, i64>(1));
        let mut written = 0;
        for (file, side) in files.0.iter().zip(["<", ">="]) {
            written += self
                .db
                .execute(
                    &format!(
                        "COPY (SELECT * FROM {schema}.log_rows WHERE (agent, seq) {side} ('{agent}'::uuid, {seq}) \
                         ORDER BY agent, seq) TO {} (FORMAT binary)",
                        literal(file)
                    ),
                    &[],
                )
                .await?;
        }
        if written != rows {
            return Err(failed(format!("COPY TO wrote {written} rows of the {rows} in {schema}")));
        }
        Ok(files)
    }

    /// The days `schema.log_rows` has partitions for: the fresh schema gets the same.
    async fn partition_days(&self, schema: &str) -> Result<Vec<chrono::NaiveDate>, RunError> {
        let names = self
            .db
            .query(
                &format!(
                    "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                     WHERE i.inhparent = '{schema}.log_rows'::regclass"
                ),
                &[],
            )
            .await?;
        Ok(names
            .iter()
            .filter_map(|row| {
                let name = row.get::<_, String>(0);
                chrono::NaiveDate::parse_from_str(name.strip_prefix("logs_")?, "%Y%m%d").ok()
            })
            .collect())
    }

    /// Loads `files` into a fresh schema with `sessions` sessions side by side (the files dealt
    /// out in turn); the schema is dropped after.
    async fn copy_in(
        &self,
        files: &CopyFiles,
        sessions: u32,
        rows: u64,
        days: &[chrono::NaiveDate],
    ) -> Result<CopyLoad, RunError> {
        let schema = self.new_schema();
        let mut ddl = super::connect(&self.services.pg, Some(&schema)).await?;
        sluice::persist::schema::migrate(&mut ddl, &schema)
            .await
            .map_err(|error| failed(format!("migrating {schema}: {error}")))?;
        sluice::persist::schema::ensure_partitions(&ddl, days)
            .await
            .map_err(|error| failed(format!("partitions of {schema}: {error}")))?;
        let mut clients = Vec::new();
        for _ in 0..sessions {
            clients.push(super::connect(&self.services.pg, None).await?);
        }
        let backend = ddl.query_one("SELECT pg_backend_pid()", &[]).await?.get::<_, i32>(0);
        let postmaster = parent_pid(backend);
        let ticks = |postmaster: Option<i32>| (postmaster.map(postmaster_cpu_ticks), machine_busy_ticks());
        let before = ticks(postmaster);
        let started = now();
        let mut loads = Vec::new();
        for (session, client) in clients.into_iter().enumerate() {
            let statements: Vec<String> = files
                .0
                .iter()
                .skip(session)
                .step_by(sessions as usize)
                .map(|file| format!("COPY {schema}.log_rows FROM {} (FORMAT binary)", literal(file)))
                .collect();
            loads.push(tokio::spawn(async move {
                let mut loaded = 0;
                for statement in statements {
                    loaded += client.execute(&statement, &[]).await?;
                }
                Ok::<u64, tokio_postgres::Error>(loaded)
            }));
        }
        let mut loaded = 0;
        for load in loads {
            loaded += load.await.map_err(|error| failed(format!("a COPY session panicked: {error}")))??;
        }
        let seconds = now() - started;
        let after = ticks(postmaster);
        let cores = |before: u64, after: u64| after.saturating_sub(before) as f64 / clock_ticks() as f64 / seconds;
        if loaded != rows {
            return Err(failed(format!("COPY FROM loaded {loaded} rows of {rows} into {schema}")));
        }
        self.sql(&format!("DROP SCHEMA {schema} CASCADE")).await?;
        Ok(CopyLoad {
            sessions,
            seconds,
            rows_per_second: rows as f64 / seconds,
            postgres_cpu_cores: before.0.zip(after.0).map(|(before, after)| cores(before, after)),
            machine_busy_cores: cores(before.1, after.1),
        })
    }
}
