//! The delivery report: what becomes of a record once librdkafka has it.
//!
//! Owns: the producer's callbacks ([`ShipContext`]) — each record's delivery report deciding its
//! fate (stored in Kafka: queued for the settling thread, [`super::settle`]; retryable: back into the buffer
//! with the payload librdkafka hands back; given up: counted with its reason), a record the
//! drain leaves unsent, librdkafka's statistics and client errors (a fatal one flags the producer
//! for replacement) — and what travels with a record through librdkafka ([`InFlight`]). Must
//! not: block (the callbacks run on librdkafka's polling thread; a file delete is the most they
//! do), release a record's lease before its fate is settled, or settle a record twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use metrics::Counter;
use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::ProducerContext;
use tracing::error;

use super::settle::{Delivered, Settler};
use super::{Disposition, classify, give_up_reason, reason};
use crate::buffer::ack::Ack;
use crate::buffer::spool::SpoolPos;
use crate::buffer::{Buffer, Lease, Record};
use crate::lifecycle::Tasks;
use crate::telemetry;
use crate::telemetry::outcome::{Dropped, Failed};

/// librdkafka callbacks: delivery reports and client errors.
pub struct ShipContext {
    buffer: Buffer,
    /// Settles what Kafka stored, in batches ([`super::settle`]).
    pub(super) settler: Arc<Settler>,
    retried: Counter,
    errors: Arc<telemetry::librdkafka::ErrorTotals>,
    /// Set when librdkafka reports a fatal error: the shipper replaces the producer.
    pub(super) fatal: Arc<AtomicBool>,
    /// Set by the drain's last purge ([`super::Shipper::close`]): a record in flight that it
    /// purges was sent and its answer never came, so it is not retried but counted
    /// [`Failed::Unconfirmed`] (one in the spool stays there for the next start).
    pub(super) last_purge: AtomicBool,
    /// Records counted [`Failed::Unconfirmed`] by the last purge.
    pub(super) unconfirmed: AtomicU64,
}

impl ClientContext for ShipContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        telemetry::librdkafka::record(&statistics, &self.errors);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal)) {
            error!(%error, reason, "kafka producer reported a fatal error; it will be replaced");
            self.fatal.store(true, Ordering::Relaxed);
        } else {
            telemetry::librdkafka::client_error(&error, reason);
        }
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        telemetry::librdkafka::log(level, facility, message);
    }
}

/// What travels with a record through librdkafka and comes back in its delivery report.
pub struct InFlight {
    lease: Lease,
    retries: u32,
    pub(super) pos: Option<SpoolPos>,
    ingest_ms: u64,
    ack: Option<Ack>,
}

impl InFlight {
    /// A record as it goes to the producer: its payload and key, and what travels with it.
    pub(super) fn new(record: Record) -> (Bytes, Option<Bytes>, Box<InFlight>) {
        let Record { payload, key, lease, retries, pos, ingest_ms, ack } = record;
        (payload, key, Box::new(InFlight { lease, retries, pos, ingest_ms, ack }))
    }

    /// When the agent read the record (Unix ms).
    pub(super) fn ingest_ms(&self) -> u64 {
        self.ingest_ms
    }

    /// The budget it holds.
    pub(super) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// What settling it releases: its lease, its spool place, its writer's ack.
    pub(super) fn into_settled(self) -> (Lease, Option<SpoolPos>, Option<Ack>) {
        (self.lease, self.pos, self.ack)
    }
}

impl ShipContext {
    /// The record is stored in Kafka, or given up for good: release it everywhere.
    pub(super) fn settle(&self, in_flight: InFlight, refused: Option<Failed>) {
        let InFlight { lease, pos, mut ack, ingest_ms, .. } = in_flight;
        self.buffer.settled(lease.bytes(), ingest_ms);
        if let (Some(pos), Some(spool)) = (pos, self.buffer.spool()) {
            let (deletable, parked) = spool.done(pos);
            ack = ack.or(parked);
            // librdkafka's polling thread: a file delete is fine. On a runtime worker (`send`
            // giving up a record librdkafka refused) the spool writer's housekeeping deletes it.
            if deletable && tokio::runtime::Handle::try_current().is_err() {
                spool.delete_done();
            }
        }
        // The memory goes back before the writer hears of it: whoever is told the record is
        // settled sees its lease gone too.
        drop(lease);
        // An ack still unsettled here is settled now: delivered is durable, whatever point it
        // waited for (a `spooled` ack settled at write time is no longer with the record).
        if let Some(ack) = ack {
            match refused {
                None => ack.durable(),
                Some(reason) => ack.refused(reason),
            }
        }
        self.buffer.notify_settled();
    }
}

impl ShipContext {
    /// A record that never reached librdkafka because the agent is stopping.
    pub(super) fn unsent(&self, in_flight: InFlight) {
        let InFlight { lease, pos, ack, ingest_ms, .. } = in_flight;
        self.buffer.settled(lease.bytes(), ingest_ms);
        match (pos, self.buffer.spool()) {
            (Some(pos), Some(spool)) => {
                let lost = spool.evicted(vec![(pos, ack)]);
                if lost > 0 {
                    Dropped::DropOldest.count(lost);
                }
            }
            _ => {
                error!("record not handed to kafka before the drain deadline; dropped and counted");
                Failed::DrainTimeout.count(1);
                if let Some(ack) = ack {
                    ack.refused(Failed::DrainTimeout);
                }
            }
        }
    }
}

/// A delivery report, as the producer boundary hands it over: stored in Kafka (the payload's
/// length), or failed with librdkafka's error and the message it hands back (payload and key,
/// so the buffer need not keep a copy of records in flight).
pub(crate) type Report<'a> = Result<usize, (&'a KafkaError, Option<&'a [u8]>, Option<&'a [u8]>)>;

impl ShipContext {
    /// Callbacks for a producer in front of `buffer`, with a fatal flag of their own; a panic
    /// while settling fails `tasks`.
    pub(super) fn new(buffer: Buffer, tasks: Tasks) -> Self {
        let fatal = Arc::new(AtomicBool::new(false));
        Self {
            settler: Arc::new(Settler::new(buffer.clone(), tasks)),
            buffer,
            retried: metrics::counter!(telemetry::SHIP_RETRIED),
            errors: Arc::default(),
            fatal,
            last_purge: AtomicBool::new(false),
            unconfirmed: AtomicU64::new(0),
        }
    }

    /// Decides a record's fate from its delivery report: acknowledged, back into the buffer
    /// (retryable), or given up and counted. Everything [`ProducerContext::delivery`] does past
    /// reading librdkafka's message (the seam the model-based test drives with a fake producer).
    pub(super) fn report(&self, report: Report<'_>, in_flight: InFlight) {
        match report {
            // Settled with the others the reports bring meanwhile, on the settling thread.
            Ok(payload_len) => self.settler.delivered(Delivered { in_flight, payload_len }),
            Err((error, payload, key)) => {
                let reason = reason(error);
                metrics::counter!(telemetry::SHIP_DELIVERY_ERRORS, telemetry::REASON => reason.clone()).increment(1);
                let unanswered = error.rdkafka_error_code() == Some(RDKafkaErrorCode::PurgeInflight);
                if unanswered && in_flight.pos.is_none() && self.last_purge.load(Ordering::Relaxed) {
                    // Sent, never answered, and the agent is stopping: Kafka may have it. Not
                    // lost and not delivered; counted apart, so neither count is wrong.
                    Failed::Unconfirmed.count(1);
                    self.unconfirmed.fetch_add(1, Ordering::Relaxed);
                    self.settle(in_flight, Some(Failed::Unconfirmed));
                    return;
                }
                match classify(error) {
                    Disposition::Retry => {
                        // librdkafka hands back the payload, so the buffer need not keep a copy
                        // of records in flight.
                        self.retried.increment(1);
                        let InFlight { lease, retries, pos, ingest_ms, ack } = in_flight;
                        self.buffer.requeue(Record {
                            payload: Bytes::copy_from_slice(payload.unwrap_or_default()),
                            key: key.map(Bytes::copy_from_slice),
                            lease,
                            retries: retries.saturating_add(1),
                            pos,
                            ingest_ms,
                            ack,
                        });
                    }
                    Disposition::GiveUp => {
                        let failed = give_up_reason(error);
                        error!(%error, kafka_error = reason, reason = failed.as_str(), "kafka refused a record; it is dropped and counted");
                        failed.count(1);
                        self.settle(in_flight, Some(failed));
                    }
                }
            }
        }
    }
}

impl ProducerContext for ShipContext {
    type DeliveryOpaque = Box<InFlight>;

    /// Runs on the producer's polling thread, never on a reader task.
    fn delivery(&self, result: &DeliveryResult<'_>, in_flight: Box<InFlight>) {
        let report = match result {
            Ok(message) => Ok(message.payload_len()),
            Err((error, message)) => Err((error, message.payload(), message.key())),
        };
        // A panic here would end the polling thread (no report served again, the agent still
        // ready): a bug, so the agent fails instead (`settle.rs`).
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.report(report, *in_flight)));
        if let Err(panic) = served {
            self.settler.panicked("serving a delivery report", panic.as_ref());
        }
    }
}
