//! `sluice replay`: dead letters sent back to Kafka once their cause is fixed (a persister
//! upgraded, `persist.max_clock_skew` raised, a column type corrected), chosen by reason, time
//! range or id (docs/DEAD_LETTERS.md).
//!
//! Owns: choosing dead letters ([`Selection`]), sending each payload exactly as it was read to
//! its topic with an idempotent `acks=all` producer, and marking each one Kafka acknowledged
//! (`dead_letters.replayed_at`, migration V5). Replay is idempotent: a persister stores a record
//! once per envelope id (its unique key), so a record replayed twice is still one row, and a
//! marked dead letter is skipped unless [`Selection::again`]. A record that fails again becomes a
//! new dead letter (a new offset); the old one stays marked.
//!
//! Must not: change a payload, delete a dead letter (retention does that), mark one Kafka has not
//! acknowledged, or hold more than one page of payloads at a time.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::PersistError;
use crate::config::Config;

/// Dead letters read and sent per round trip: what replay holds at once.
const PAGE: i64 = 200;

/// How long one send may take before it counts as failed (and its dead letter stays unmarked).
const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// One dead letter: the Kafka coordinates it was read from, `TOPIC/PARTITION/OFFSET`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterId {
    /// The topic it was read from.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
}

impl std::str::FromStr for DeadLetterId {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        // Kafka topic names hold no `/`: the last two parts are the numbers.
        let mut parts = text.rsplitn(3, '/');
        let (Some(offset), Some(partition), Some(topic)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("`{text}` is not TOPIC/PARTITION/OFFSET"));
        };
        Ok(Self {
            topic: topic.to_string(),
            partition: partition.parse().map_err(|_| format!("`{partition}` is not a partition number"))?,
            offset: offset.parse().map_err(|_| format!("`{offset}` is not an offset"))?,
        })
    }
}

impl std::fmt::Display for DeadLetterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

/// Which dead letters to replay: all conditions given must hold.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Their `reason` (the words of `sluice_persist_dead_letters_total`).
    pub reason: Option<String>,
    /// Received at or after.
    pub since: Option<DateTime<Utc>>,
    /// Received before.
    pub until: Option<DateTime<Utc>>,
    /// These ones only (none: any).
    pub ids: Vec<DeadLetterId>,
    /// Also those replayed before.
    pub again: bool,
    /// At most this many.
    pub limit: Option<u64>,
}

/// What to do with the chosen ones.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Which.
    pub selection: Selection,
    /// Send them to this topic instead of the one each was read from.
    pub topic: Option<String>,
    /// List them; send nothing, mark nothing.
    pub dry_run: bool,
}

/// What a replay did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Acknowledged by Kafka and marked, by reason (listed, with `dry_run`).
    pub sent: BTreeMap<String, u64>,
    /// Not acknowledged (left unmarked: replay them again).
    pub failed: u64,
}

impl Replayed {
    /// Sent (or listed) in all.
    pub fn total(&self) -> u64 {
        self.sent.values().sum()
    }
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// PostgreSQL could not be reached or refused a query.
    #[error(transparent)]
    Postgres(#[from] PersistError),
    /// The schema is older than this build's (no `replayed_at`): a persister of this version
    /// migrates it at start.
    #[error("the dead_letters table has no replayed_at column: start a persister of this version first (migration V5)")]
    NotMigrated,
    /// The reason is not one a persister writes.
    #[error("`{0}` is not a dead-letter reason (one of: {1})")]
    UnknownReason(String, String),
    /// The producer could not be created.
    #[error("cannot create the Kafka producer: {0}")]
    Kafka(#[from] KafkaError),
}

/// Replays the dead letters `options` choose, calling `each` with one line per dead letter
/// (`TOPIC/PARTITION/OFFSET received_at reason bytes` and, unless listing, its outcome).
pub async fn replay(config: &Config, options: &Options, mut each: impl FnMut(&str)) -> Result<Replayed, ReplayError> {
    if let Some(reason) = &options.selection.reason {
        let known = crate::telemetry::outcome::DeadLetterReason::ALL.map(|reason| reason.as_str());
        if !known.contains(&reason.as_str()) {
            return Err(ReplayError::UnknownReason(reason.clone(), known.join(", ")));
        }
    }
    let client = super::writer::connect(&config.postgres).await?;
    let migrated = client
        .query_opt(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() \
             AND table_name = 'dead_letters' AND column_name = 'replayed_at'",
            &[],
        )
        .await
        .map_err(PersistError::Postgres)?;
    if migrated.is_none() {
        return Err(ReplayError::NotMigrated);
    }
    let producer: Option<FutureProducer> = if options.dry_run { None } else { Some(producer(config).create()?) };
    let selection = &options.selection;
    // What a replay sends that fails again comes back as a new dead letter, received after the
    // replay began: never chosen by this run (it would chase its own tail for ever), whatever
    // `--until` says.
    let began: DateTime<Utc> = client.query_one("SELECT now()", &[]).await.map_err(PersistError::Postgres)?.get(0);
    let until = Some(selection.until.map_or(began, |until| until.min(began)));
    let ids: Vec<String> = selection.ids.iter().map(ToString::to_string).collect();
    let mut replayed = Replayed::default();
    // Where the last page ended (none yet): pages follow the order of the query, so a dead
    // letter that fails stays behind and is not read again.
    let mut after: (Option<DateTime<Utc>>, String, i32, i64) = (None, String::new(), -1, -1);
    let mut left = selection.limit.unwrap_or(u64::MAX);
    while left > 0 {
        let page = PAGE.min(i64::try_from(left).unwrap_or(i64::MAX));
        let rows = client
            .query(
                "SELECT received_at, kafka_topic, kafka_partition, kafka_offset, reason, payload FROM dead_letters \
                 WHERE payload IS NOT NULL \
                 AND ($1::text IS NULL OR reason = $1) \
                 AND ($2::timestamptz IS NULL OR received_at >= $2) \
                 AND ($3::timestamptz IS NULL OR received_at < $3) \
                 AND ($4 OR replayed_at IS NULL) \
                 AND (cardinality($5::text[]) = 0 \
                      OR kafka_topic || '/' || kafka_partition || '/' || kafka_offset = ANY($5)) \
                 AND ($6::timestamptz IS NULL \
                      OR (received_at, kafka_topic, kafka_partition, kafka_offset) > ($6, $7, $8, $9)) \
                 ORDER BY received_at, kafka_topic, kafka_partition, kafka_offset LIMIT $10",
                &[
                    &selection.reason,
                    &selection.since,
                    &until,
                    &selection.again,
                    &ids,
                    &after.0,
                    &after.1,
                    &after.2,
                    &after.3,
                    &page,
                ],
            )
            .await
            .map_err(PersistError::Postgres)?;
        let Some(last) = rows.last() else { break };
        after = (Some(last.get(0)), last.get(1), last.get(2), last.get(3));
        left = left.saturating_sub(rows.len() as u64);
        let letters: Vec<Letter> = rows
            .iter()
            .map(|row| Letter {
                id: DeadLetterId { topic: row.get(1), partition: row.get(2), offset: row.get(3) },
                received_at: row.get(0),
                reason: row.get(4),
                payload: row.get(5),
            })
            .collect();
        let Some(producer) = &producer else {
            for letter in &letters {
                each(&letter.describe());
                *replayed.sent.entry(letter.reason.clone()).or_default() += 1;
            }
            continue;
        };
        let sends = letters.iter().map(|letter| {
            let topic = options.topic.as_deref().unwrap_or(&letter.id.topic);
            producer.send(FutureRecord::<(), [u8]>::to(topic).payload(&letter.payload[..]), SEND_TIMEOUT)
        });
        let answers = futures_util::future::join_all(sends).await;
        if answers.iter().all(Result::is_err) {
            // Kafka took none of a page: the next would wait as long for nothing.
            replayed.failed += answers.len() as u64;
            each(&format!(
                "stopping: kafka acknowledged none of {} dead letters ({})",
                answers.len(),
                answers.into_iter().find_map(Result::err).map_or_else(String::new, |(error, _)| error.to_string())
            ));
            break;
        }
        for (letter, answer) in letters.iter().zip(answers) {
            match answer {
                Ok(_) => {
                    client
                        .execute(
                            "UPDATE dead_letters SET replayed_at = now() \
                             WHERE kafka_topic = $1 AND kafka_partition = $2 AND kafka_offset = $3",
                            &[&letter.id.topic, &letter.id.partition, &letter.id.offset],
                        )
                        .await
                        .map_err(PersistError::Postgres)?;
                    each(&format!("{} replayed", letter.describe()));
                    *replayed.sent.entry(letter.reason.clone()).or_default() += 1;
                }
                Err((error, _)) => {
                    each(&format!("{} not replayed: {error}", letter.describe()));
                    replayed.failed += 1;
                }
            }
        }
    }
    Ok(replayed)
}

/// A dead letter being replayed.
struct Letter {
    id: DeadLetterId,
    received_at: DateTime<Utc>,
    reason: String,
    payload: Vec<u8>,
}

impl Letter {
    fn describe(&self) -> String {
        format!(
            "{} {} {} {} bytes",
            self.id,
            self.received_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            self.reason,
            self.payload.len()
        )
    }
}

/// The replay's producer: the config's Kafka client settings, idempotent, `acks=all`, taking a
/// message as large as any a dead letter can hold (the broker's `max.message.bytes` still rules).
fn producer(config: &Config) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (key, value) in &config.kafka.client_properties() {
        client.set(key, value);
    }
    client
        .set("bootstrap.servers", &config.kafka.brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.max.bytes", "100000000")
        // A page waits this long for Kafka at most (librdkafka's default is 5 minutes).
        .set("message.timeout.ms", SEND_TIMEOUT.as_millis().to_string())
        .set("client.id", "sluice-replay");
    client
}

#[cfg(test)]
mod tests {
    use super::DeadLetterId;

    #[test]
    fn a_dead_letter_id_reads_as_topic_partition_offset() {
        let id: DeadLetterId = "logs.shop/3/1042".parse().expect("an id");
        assert_eq!(id, DeadLetterId { topic: "logs.shop".into(), partition: 3, offset: 1042 });
        assert_eq!(id.to_string(), "logs.shop/3/1042");
        assert!("logs/x/1".parse::<DeadLetterId>().expect_err("not a number").contains("partition"));
        assert!("logs".parse::<DeadLetterId>().is_err());
    }
}
