//! Batching and writing: the read loop that parses messages into batches, one lane per group of
//! partitions, batch limits by records, bytes and time, retries with backoff, isolating the rows
//! PostgreSQL refuses, and handing on the offsets below what a batch committed.
//!
//! Owns: when a batch closes, how it is written and retried, and which offsets may be stored.
//! Must not: store an offset before its rows are committed, drop a message (it becomes a row or
//! a dead letter), give up a batch because PostgreSQL is down, or wait on one write longer than
//! `postgres.write_timeout` (a connection that went silent is left). The [`Database`],
//! [`BatchWriter`] and [`Source`] traits are the seam the persister's model test drives.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::{join, join_all};
use rdkafka::error::KafkaResult;
use rdkafka::message::Message;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::consumer::LagClock;
use super::row::{self, DeadLetter, Origin, Parsed, Row};
use super::writer::{self, Writer};
use super::{Health, PersistError, schema};
use crate::config::Config;
use crate::telemetry;
use crate::telemetry::outcome::{DeadLetterReason, Lost};

/// Longest wait between retries of a failed batch.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The database as batching sees it: where writers come from. [`Postgres`] in production, the
/// model test's fake PostgreSQL (`model.rs`) in tests.
pub(super) trait Database {
    type Writer: BatchWriter;
    /// One attempt to connect a writer ([`connect_writer`] retries).
    async fn connect(&self) -> Result<Self::Writer, PersistError>;
    /// Cancels what `writer`'s session runs, before the writer is dropped (a write given up on).
    async fn cancel(&self, writer: &Self::Writer);
}

/// One writer's transactions, as batching sees them ([`Writer`] in production).
pub(super) trait BatchWriter {
    /// Writes rows and dead letters in one transaction (see [`Writer::write`]).
    async fn write(&mut self, rows: &[Row], dead: &[DeadLetter]) -> Result<writer::Written, PersistError>;
    /// False once the connection has failed; the caller reconnects.
    fn is_usable(&self) -> bool;
}

/// The consumer as batching sees it: messages in, offsets stored ([`PersistConsumer`] in
/// production).
pub(super) trait Source {
    type Message<'a>: Message
    where
        Self: 'a;
    async fn recv(&self) -> KafkaResult<Self::Message<'_>>;
    /// Stores the next offset per partition (see [`store_offsets`]).
    fn store(&self, next_offsets: &BTreeMap<(String, i32), i64>);
}

/// The configured PostgreSQL.
pub(super) struct Postgres<'a>(pub(super) &'a Config);

impl Database for Postgres<'_> {
    type Writer = Writer;

    /// Connects, migrates and prepares a writer. Preparing waits at most `write_timeout` (it takes
    /// locks a stalled server may never grant); then its statement is cancelled.
    async fn connect(&self) -> Result<Writer, PersistError> {
        let config = self.0;
        let mut client = writer::connect(&config.postgres).await?;
        let token = client.cancel_token();
        let prepare = async move {
            // Cheap when there is nothing to do, and guarded by an advisory lock.
            schema::migrate(&mut client, &config.postgres.schema).await?;
            let columns = super::columns::Columns::new(&config.persist.columns);
            schema::ensure_columns(&client, &columns).await?;
            schema::ensure_partitions(&client, &schema::days_ahead(config.persist.partitions_ahead_days)).await?;
            Writer::new(client, &columns).await
        };
        match tokio::time::timeout(config.postgres.write_timeout, prepare).await {
            Ok(prepared) => prepared,
            Err(_) => {
                writer::cancel(&token, &config.postgres).await;
                Err(PersistError::WriteTimeout(config.postgres.write_timeout))
            }
        }
    }

    async fn cancel(&self, writer: &Writer) {
        writer::cancel(&writer.cancel_token(), &self.0.postgres).await;
    }
}

impl BatchWriter for Writer {
    async fn write(&mut self, rows: &[Row], dead: &[DeadLetter]) -> Result<writer::Written, PersistError> {
        Writer::write(self, rows, dead).await
    }

    fn is_usable(&self) -> bool {
        Writer::is_usable(self)
    }
}

/// Connects, migrates and prepares a writer, retrying until it works or shutdown begins.
pub(super) async fn connect_writer<D: Database>(
    database: &D,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<Option<D::Writer>, PersistError> {
    let mut backoff = Duration::from_millis(200);
    loop {
        match database.connect().await {
            Ok(writer) => {
                health.database_answered();
                return Ok(Some(writer));
            }
            // A migration that fails will fail again: stop instead of looping.
            Err(error @ PersistError::Migration(_)) => return Err(error),
            Err(error) => health.database_failed("connect", &error),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Lines about dead letters, collapsed (one a minute while they keep coming).
static DEAD_LETTER_LINES: crate::telemetry::repeats::Repeats =
    crate::telemetry::repeats::Repeats::new(crate::telemetry::repeats::REMINDER_EVERY);

/// Records collected for the next write.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) rows: Vec<Row>,
    pub(super) dead: Vec<DeadLetter>,
    /// Next offset to store per (topic, partition): last offset in the batch + 1.
    pub(super) next_offsets: BTreeMap<(String, i32), i64>,
    pub(super) started: Option<Instant>,
    /// Bytes of the Kafka message values added (for `persist.batch_max_bytes`).
    pub(super) bytes: usize,
    /// What has committed: everything once [`write_isolating`] returned `Ok`; the parts an
    /// isolation committed before an error not about the data interrupted it, which are not
    /// written (or counted) again when the rest is retried.
    pub(super) committed: Committed,
}

/// The committed parts of a batch.
#[derive(Default)]
pub(super) struct Committed {
    pub(super) rows: Vec<Row>,
}

impl Committed {
    /// Counts a part as it commits, from what PostgreSQL reported inserting (a redelivered row is
    /// a duplicate, a redelivered dead letter is not counted again) — not when the whole batch
    /// has: a batch the drain's deadline cuts off after parts of it committed leaves those rows
    /// in PostgreSQL, and its next reader finds them already stored.
    pub(super) fn add(&mut self, part: Part, written: writer::Written) {
        metrics::counter!(telemetry::PERSIST_ROWS).increment(written.inserted);
        metrics::counter!(telemetry::PERSIST_DUPLICATES).increment(written.duplicates);
        self.rows.extend(part.rows);
        let mut by_reason: BTreeMap<DeadLetterReason, u64> = BTreeMap::new();
        let mut letters_already_stored = 0;
        let mut first = None;
        for (letter, stored) in part.dead.into_iter().zip(written.dead_letters_stored) {
            if stored {
                *by_reason.entry(letter.reason).or_default() += 1;
                first.get_or_insert(letter.origin);
            } else {
                letters_already_stored += 1;
            }
        }
        if let Some(first) = first {
            // One line for the part, and while dead letters keep coming one a minute: a buggy app
            // can send thousands, each counted in sluice_persist_dead_letters_total.
            let letters: u64 = by_reason.values().sum();
            if let Some(repeated) = DEAD_LETTER_LINES.admit("dead letters") {
                let reasons: Vec<&str> = by_reason.keys().map(|reason| reason.as_str()).collect();
                warn!(
                    letters, ?reasons, topic = %first.topic, partition = first.partition, offset = first.offset,
                    batches_not_logged = repeated, "messages kept in dead_letters (the first one's coordinates)"
                );
            }
        }
        for (reason, letters) in by_reason {
            reason.count(letters);
        }
        if letters_already_stored > 0 {
            debug!(letters = letters_already_stored, "dead letters already stored (redelivered)");
        }
    }
}

impl Batch {
    pub(super) fn len(&self) -> usize {
        self.rows.len() + self.dead.len()
    }

    /// Moves rows that may not be written now (see [`row::Window`]) to the dead letters.
    pub(super) fn set_aside_outside(&mut self, window: &row::Window) {
        if self.rows.iter().all(|row| window.refuses(row).is_none()) {
            return;
        }
        let rows = std::mem::take(&mut self.rows);
        for row in rows {
            match window.refuses(&row) {
                None => self.rows.push(row),
                Some((reason, error)) => {
                    let origin = row.origin.clone();
                    self.dead.push(DeadLetter::new(origin, reason, &error, Some(row.into_envelope())));
                }
            }
        }
    }

    pub(super) fn add(&mut self, parsed: Parsed, origin: &Origin, bytes: usize) {
        self.started.get_or_insert_with(Instant::now);
        self.bytes += bytes;
        let next = self.next_offsets.entry((origin.topic.clone(), origin.partition)).or_insert(0);
        *next = (*next).max(origin.offset + 1);
        match parsed {
            Parsed::Row(row) => self.rows.push(*row),
            Parsed::Dead(letter) => self.dead.push(letter),
        }
    }
}

/// How big a batch may grow: `persist.batch_max_records` and `persist.batch_max_bytes`.
#[derive(Debug, Clone, Copy)]
pub(super) struct BatchLimits {
    pub(super) records: usize,
    /// Bytes of Kafka message values.
    pub(super) bytes: usize,
}

/// Adds a message of `bytes` to its lane's batch; returns the batches this closed, in order: the
/// batch in hand, if the message would take it past the byte cap, then the batch holding the
/// message, if it reached either cap. So a batch stays within the byte cap unless it is one
/// message larger than the cap, which is written alone rather than held back.
pub(super) fn add_closing(
    batch: &mut Batch,
    parsed: Parsed,
    origin: &Origin,
    bytes: usize,
    limits: BatchLimits,
) -> Vec<Batch> {
    let mut closed = Vec::new();
    if batch.len() > 0 && batch.bytes.saturating_add(bytes) > limits.bytes {
        closed.push(std::mem::take(batch));
    }
    batch.add(parsed, origin, bytes);
    if batch.len() >= limits.records || batch.bytes >= limits.bytes {
        closed.push(std::mem::take(batch));
    }
    closed
}

/// What the consume loop and the batch writer share for one run.
pub(super) struct Run<'a, D, C> {
    pub(super) config: &'a Config,
    /// The running config: batch limits may change with a reload.
    pub(super) running: &'a std::sync::RwLock<Config>,
    pub(super) consumer: &'a C,
    /// Where a writer whose connection failed gets a new one.
    pub(super) database: &'a D,
    /// Readiness: a write tells whether PostgreSQL answers.
    pub(super) health: &'a Health,
    pub(super) lag: &'a LagClock,
}

/// Reads and batches while the writers write: one lane per writer, a partition always in the same
/// lane (so its batches commit, and its offsets are stored, in order), at most one batch waiting
/// per lane. On shutdown the batches in hand are handed over and written until the drain deadline;
/// what is not committed by then is re-read by the partition's next owner.
pub(super) async fn consume<D: Database, C: Source>(
    run: &Run<'_, D, C>,
    writers: Vec<D::Writer>,
    shutdown: &CancellationToken,
) {
    let drain_deadline = CancellationToken::new();
    let mut senders = Vec::with_capacity(writers.len());
    let mut lanes = Vec::with_capacity(writers.len());
    for writer in writers {
        let (sender, batches) = tokio::sync::mpsc::channel(1);
        senders.push(sender);
        lanes.push(write_lane(run, writer, batches, &drain_deadline));
    }
    let work = join(read_batches(run, senders, shutdown, &drain_deadline), join_all(lanes));
    let deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(run.config.persist.drain_timeout).await;
    };
    tokio::select! {
        _ = work => {}
        _ = deadline => {
            drain_deadline.cancel();
            warn!("drain deadline passed before every batch in hand was written; the rest will be re-read");
        }
    }
}

/// Consumes and fills one batch per lane; hands a batch to its lane's writer when it is full (by
/// records or by bytes, see [`add_closing`]) or its first record has waited `batch_max_wait`. Waiting for a busy writer is the backpressure:
/// the consumer is not polled meanwhile.
pub(super) async fn read_batches<D, C: Source>(
    run: &Run<'_, D, C>,
    lanes: Vec<tokio::sync::mpsc::Sender<Batch>>,
    shutdown: &CancellationToken,
    drain_deadline: &CancellationToken,
) {
    let Run { consumer, running, .. } = *run;
    let consumed = metrics::counter!(telemetry::PERSIST_CONSUMED);
    // Restart-only: read once.
    let columns =
        super::columns::Columns::new(&running.read().unwrap_or_else(|poisoned| poisoned.into_inner()).persist.columns);
    let mut batches: Vec<Batch> = lanes.iter().map(|_| Batch::default()).collect();
    // Closed batches whose hand-over shutdown interrupted: handed over first below.
    let mut unsent: Vec<(usize, Batch)> = Vec::new();
    'reading: loop {
        let (limits, max_wait) = {
            let running = running.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            let persist = &running.persist;
            let bytes = usize::try_from(persist.batch_max_bytes.as_u64()).unwrap_or(usize::MAX);
            (BatchLimits { records: persist.batch_max_records, bytes }, persist.batch_max_wait)
        };
        let flush_at = batches.iter().filter_map(|batch| batch.started).min().map(|started| started + max_wait);
        let received = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            _ = sleep_until_opt(flush_at) => None,
            message = consumer.recv() => Some(message),
        };
        let ready: Vec<(usize, Batch)> = match received {
            Some(Ok(message)) => {
                consumed.increment(1);
                let origin = Origin {
                    topic: message.topic().to_string(),
                    partition: message.partition(),
                    offset: message.offset(),
                };
                let lane = lane_of(&origin.topic, origin.partition, lanes.len());
                let bytes = message.payload().map_or(0, <[u8]>::len);
                let mut parsed = row::parse(message.payload(), origin.clone());
                if let row::Parsed::Row(row) = &mut parsed
                    && !columns.is_empty()
                {
                    row.typed = columns.values(row.record.as_ref().map(|record| record.0.as_str()));
                }
                add_closing(&mut batches[lane], parsed, &origin, bytes, limits)
                    .into_iter()
                    .map(|batch| (lane, batch))
                    .collect()
            }
            Some(Err(error)) => {
                warn!(%error, "kafka consume error");
                continue;
            }
            None => {
                let now = Instant::now();
                batches
                    .iter_mut()
                    .enumerate()
                    .filter(|(_, batch)| batch.started.is_some_and(|at| at + max_wait <= now))
                    .map(|(lane, batch)| (lane, std::mem::take(batch)))
                    .collect()
            }
        };
        let mut ready = ready.into_iter();
        while let Some((lane, batch)) = ready.next() {
            tokio::select! {
                biased;
                permit = lanes[lane].reserve() => match permit {
                    Ok(permit) => permit.send(batch),
                    Err(_) => break 'reading, // the writer stopped: shutting down
                },
                _ = shutdown.cancelled() => {
                    unsent.push((lane, batch));
                    unsent.extend(ready);
                    break 'reading;
                }
            }
        }
    }
    // Shutting down with records in hand: hand them over so their offsets can be committed —
    // closed batches not yet handed over first, so a partition's batches still commit in order
    // (dropping one would let the batch in hand after it store offsets past its records).
    let in_hand = batches.into_iter().enumerate().filter(|(_, batch)| batch.len() > 0);
    for (lane, batch) in unsent.into_iter().chain(in_hand) {
        tokio::select! {
            _ = lanes[lane].send(batch) => {}
            _ = drain_deadline.cancelled() => break,
        }
    }
}

/// Which lane (writer) a topic partition's records go through: always the same one (its offsets
/// are stored in order). The topic counts too: many one-partition topics (a template's) spread
/// over the writers instead of all taking lane 0.
pub(super) fn lane_of(topic: &str, partition: i32, lanes: usize) -> usize {
    let spread = topic.bytes().fold(0u32, |hash, byte| hash.wrapping_mul(31).wrapping_add(u32::from(byte)));
    (spread.wrapping_add(partition as u32) % lanes.max(1) as u32) as usize
}

/// One writer: writes the batches handed to it, in order, until its lane is closed (shutdown) or
/// the drain deadline interrupts a batch's retries.
pub(super) async fn write_lane<D: Database, C: Source>(
    run: &Run<'_, D, C>,
    mut writer: D::Writer,
    mut batches: tokio::sync::mpsc::Receiver<Batch>,
    drain_deadline: &CancellationToken,
) {
    while let Some(batch) = batches.recv().await {
        if !write_batch(run, &mut writer, drain_deadline, batch).await {
            break;
        }
    }
}

pub(super) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes a batch, retrying until it commits; then stores its offsets. Returns false if `stop`
/// interrupted the retries (the batch's offsets are not stored: it will be re-read). Only errors
/// that are not about the data are retried (PostgreSQL away, a lock timeout): what PostgreSQL
/// refuses is isolated and set aside, so a batch is never retried unchanged forever.
pub(super) async fn write_batch<D: Database, C: Source>(
    run: &Run<'_, D, C>,
    writer: &mut D::Writer,
    stop: &CancellationToken,
    mut batch: Batch,
) -> bool {
    let Run { config, consumer, database, health, lag, .. } = *run;
    let mut backoff = Duration::from_millis(100);
    crate::lifecycle::fail_point("persist_write");
    loop {
        batch.set_aside_outside(&window(config));
        let started = Instant::now();
        match write_isolating(writer, &mut batch, config.postgres.write_timeout).await {
            Ok(()) => {
                health.database_answered();
                let committed = std::mem::take(&mut batch.committed);
                metrics::histogram!(telemetry::PERSIST_BATCH_SECONDS).record(started.elapsed().as_secs_f64());
                metrics::counter!(telemetry::PERSIST_BATCHES).increment(1);
                let committed_ms = chrono::Utc::now().timestamp_millis();
                let row_latency = metrics::histogram!(telemetry::PERSIST_ROW_LATENCY);
                for row in &committed.rows {
                    row_latency.record((committed_ms - row.ingest_time.timestamp_millis()).max(0) as f64 / 1000.0);
                }
                lag.persisted(&committed.rows);
                lag.stored(&batch.next_offsets);
                consumer.store(&batch.next_offsets);
                return true;
            }
            Err(error) => {
                metrics::counter!(telemetry::PERSIST_WRITE_ERRORS).increment(1);
                // Counted per write; logged once, then once a minute while writes keep failing.
                health.database_failed("batch write", &error);
                // A connection that never answered is left, not reused: what it would answer
                // next belongs to the write given up on. The batch goes again on a new one
                // (its committed parts are not written twice; a part whose commit went
                // unanswered is found stored and counted as duplicates).
                let stuck = matches!(error, PersistError::WriteTimeout(_));
                if stuck {
                    // Its session would otherwise wait on (holding its locks) beside the new one.
                    database.cancel(writer).await;
                }
                if stuck || !writer.is_usable() {
                    match connect_writer(database, health, stop).await {
                        Ok(Some(new_writer)) => *writer = new_writer,
                        Ok(None) => return false,
                        // A migration that fails (it will again): logged once a minute, retried.
                        Err(error) => health.database_failed("migration", &error),
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The ingest times rows may be written with now (see [`row::Window`]).
pub(super) fn window(config: &Config) -> row::Window {
    let now = chrono::Utc::now();
    let skew = chrono::Duration::from_std(config.persist.max_clock_skew).unwrap_or(chrono::Duration::days(1));
    row::Window {
        oldest_day: schema::retention_cutoff(now.date_naive(), config.persist.retention_days),
        latest: now + skew,
    }
}

/// Writes the batch. When PostgreSQL refuses something in it (a data error: SQLSTATE class 22,
/// 23 or 54), the batch is split in halves, and halves that are refused again are split again,
/// until each refused message stands alone: a refused row becomes a dead letter
/// (`rejected_by_postgres`, with PostgreSQL's error), a refused dead letter is tried once more
/// with an ASCII-only error text and then counted as lost. k bad messages in n cost about
/// 2·k·log2(n) transactions. Each part commits on its own; that is safe because the batch's
/// offsets are stored only when every part has committed, and writing a part again adds nothing.
/// What commits moves to `batch.committed`. Any other error returns at once with what has not
/// committed back in `batch.rows` and `batch.dead`, for the caller to retry: the committed parts
/// are neither written nor counted twice. Each write waits at most `limit` for PostgreSQL
/// ([`PersistError::WriteTimeout`], an error not about the data). The limit is on each write,
/// never on the whole: a part being isolated is in no batch field while it is written.
pub(super) async fn write_isolating(
    writer: &mut impl BatchWriter,
    batch: &mut Batch,
    limit: Duration,
) -> Result<(), PersistError> {
    let whole = match timed(writer.write(&batch.rows, &batch.dead), limit).await {
        Ok(written) => {
            let part = Part { rows: std::mem::take(&mut batch.rows), dead: std::mem::take(&mut batch.dead) };
            batch.committed.add(part, written);
            return Ok(());
        }
        Err(error) if error.is_rejected_data() => error,
        Err(error) => return Err(error),
    };
    warn!(error = %whole, records = batch.len(), "postgres refuses something in this batch; splitting it to find what");
    let mut pending = vec![(
        Part { rows: std::mem::take(&mut batch.rows), dead: std::mem::take(&mut batch.dead) },
        Some(whole.to_string()),
    )];
    while let Some((mut part, refused)) = pending.pop() {
        let refused = match refused {
            Some(error) => error,
            None => match timed(writer.write(&part.rows, &part.dead), limit).await {
                Ok(written) => {
                    batch.committed.add(part, written);
                    continue;
                }
                Err(error) if error.is_rejected_data() => error.to_string(),
                Err(error) => {
                    // Not about the data: what has not committed goes back, the caller retries it.
                    for (rest, _) in pending {
                        part.append(rest);
                    }
                    batch.rows = part.rows;
                    batch.dead = part.dead;
                    return Err(error);
                }
            },
        };
        if part.len() > 1 {
            let (left, right) = part.halves();
            pending.push((right, None));
            pending.push((left, None));
        } else if let Some(row) = part.rows.pop() {
            error!(error = %refused, topic = %row.origin.topic, partition = row.origin.partition, offset = row.origin.offset,
                "postgres rejects a record; it goes to dead_letters");
            let origin = row.origin.clone();
            let letter =
                DeadLetter::new(origin, DeadLetterReason::RejectedByPostgres, &refused, Some(row.into_envelope()));
            pending.push((Part { rows: Vec::new(), dead: vec![letter] }, None));
        } else if let Some(letter) = part.dead.pop() {
            let plain = letter.ascii_only();
            if plain.error != letter.error {
                pending.push((Part { rows: Vec::new(), dead: vec![plain] }, None));
            } else {
                // Counted here, not when the batch has committed, like the parts (Committed::add).
                Lost::DeadLetterRejected.count(1);
                error!(
                    topic = %letter.origin.topic, partition = letter.origin.partition, offset = letter.origin.offset,
                    reason = letter.reason.as_str(), error = %refused,
                    "postgres refused this message as a row and as a dead letter; it is not stored (read it from kafka at this offset)"
                );
            }
        }
    }
    Ok(())
}

/// `write`, or [`PersistError::WriteTimeout`] once it has waited `limit`.
async fn timed<T>(
    write: impl std::future::Future<Output = Result<T, PersistError>>,
    limit: Duration,
) -> Result<T, PersistError> {
    tokio::time::timeout(limit, write).await.unwrap_or(Err(PersistError::WriteTimeout(limit)))
}

/// Rows and dead letters written in one transaction while a refused batch is isolated.
#[derive(Default)]
pub(super) struct Part {
    pub(super) rows: Vec<Row>,
    pub(super) dead: Vec<DeadLetter>,
}

impl Part {
    pub(super) fn len(&self) -> usize {
        self.rows.len() + self.dead.len()
    }

    pub(super) fn append(&mut self, mut other: Part) {
        self.rows.append(&mut other.rows);
        self.dead.append(&mut other.dead);
    }

    /// Two halves, each non-empty when `len() >= 2`: rows first, then dead letters, cut in the
    /// middle.
    pub(super) fn halves(mut self) -> (Part, Part) {
        let at = self.len() / 2;
        let rows = self.rows.len();
        let right_rows = self.rows.split_off(at.min(rows));
        let right_dead = self.dead.split_off(at.saturating_sub(rows));
        (self, Part { rows: right_rows, dead: right_dead })
    }
}
