//! The delivery report: what becomes of a record once librdkafka has it.
//!
//! Owns: the producer's callbacks ([`ShipContext`]) — each record's delivery report deciding its
//! fate (stored in Kafka: queued for the settling thread, [`super::settle`]; retryable: back into
//! the buffer with the payload librdkafka hands back; given up: for good, or unanswered at the
//! drain's last purge), librdkafka's statistics, log lines and client errors (a fatal one flags
//! the producer for replacement). What each fate means for the record — its budget, its spool
//! place, its writer, its count — is the buffer's ([`crate::buffer::InFlight`] and its endings).
//! Must not: block (the callbacks run on librdkafka's polling thread; a file delete is the most
//! they do), release a record before its fate is decided, or decide a record's fate twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use metrics::Counter;
use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::ProducerContext;
use tracing::error;

use super::settle::Settler;
use super::{Disposition, classify, give_up_reason, reason};
use crate::buffer::{Buffer, InFlight};
use crate::lifecycle::Tasks;
use crate::telemetry;
use crate::telemetry::outcome::Failed;

/// librdkafka callbacks: delivery reports and client errors.
pub struct ShipContext {
    buffer: Buffer,
    /// Where a record goes whose topic the broker does not know.
    topics: Arc<crate::topic::Topics>,
    /// Settles what Kafka stored, in batches ([`super::settle`]).
    pub(super) settler: Arc<Settler>,
    retried: Counter,
    errors: Arc<telemetry::librdkafka::ErrorTotals>,
    /// Signs of this producer's requests reaching a broker, counted: a success, Produce
    /// requests sent (statistics), a connection lost "in state UP" (its log or a client error).
    /// Once there is one, a record it hands back without a success may have been stored; before,
    /// none can have been (nothing reached Kafka). Deliberately not "since the record was handed
    /// over": that rule counted 470 stored records lost in the soak (seed 2086022712: a batch
    /// timed out in librdkafka's queue with no sign after its hand-off), so a record queued
    /// through a later outage is over-counted `unconfirmed` rather than a stored one `lost`.
    pub(super) contacts: AtomicU64,
    /// Produce requests sent, as the last statistics counted them.
    produce_requests: AtomicU64,
    /// Set when librdkafka reports a fatal error: the shipper replaces the producer.
    pub(super) fatal: Arc<AtomicBool>,
    /// Set by the drain's last purge ([`super::Shipper::close`]): a record in flight that it
    /// purges was sent and its answer never came, so it is not retried but counted
    /// [`Failed::Unconfirmed`] (one in the spool stays there for the next start).
    pub(super) last_purge: AtomicBool,
    /// Records counted [`Failed::Unconfirmed`] by the last purge.
    pub(super) unconfirmed: AtomicU64,
    /// Kafka stored a record this producer sent: it worked once. A fatal producer that never did
    /// (refused at birth) is replaced only after a backoff.
    pub(super) delivered_any: AtomicBool,
    /// The drain stopped waiting for this producer (its close did not end by the deadline): the
    /// records it still held are counted already, so a report that comes later changes nothing.
    pub(super) given_up: AtomicBool,
    /// Delivery reports being served right now (the drain waits for none before it counts).
    pub(super) serving: std::sync::atomic::AtomicUsize,
}

impl ClientContext for ShipContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        let produce_requests: i64 =
            statistics.brokers.values().filter_map(|broker| broker.req.get("Produce")).map(|sent| (*sent).max(0)).sum();
        let produce_requests = produce_requests as u64;
        if produce_requests > self.produce_requests.swap(produce_requests, Ordering::Relaxed) {
            self.reached_a_broker();
        }
        telemetry::librdkafka::record(&statistics, &self.errors);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // A connection lost "after …ms in state UP" was up: requests may have gone out on it.
        // (Heard at once, where the statistics come every few seconds.)
        if reason.contains("in state UP") {
            self.reached_a_broker();
        }
        if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal)) {
            error!(%error, reason, "kafka producer reported a fatal error; it will be replaced");
            self.fatal.store(true, Ordering::Relaxed);
        } else {
            telemetry::librdkafka::client_error(&error, reason);
        }
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        // librdkafka says a connection that was up went down in its log (`FAIL`), not always
        // as a client error (the soak: a broker SIGKILLed with requests in flight).
        if message.contains("in state UP") {
            self.reached_a_broker();
        }
        telemetry::librdkafka::log(level, facility, message);
    }
}

/// A delivery report, as the producer boundary hands it over: stored in Kafka (the payload's
/// length), or failed with librdkafka's error and the message it hands back (payload and key,
/// so the buffer need not keep a copy of records in flight).
pub(crate) type Report<'a> = Result<usize, (&'a KafkaError, Option<&'a [u8]>, Option<&'a [u8]>)>;

impl ShipContext {
    /// A sign that requests reach a broker: what was handed over before may have been stored.
    pub(super) fn reached_a_broker(&self) {
        self.contacts.fetch_add(1, Ordering::Relaxed);
    }

    /// The signs of contact so far.
    pub(super) fn contacts(&self) -> u64 {
        self.contacts.load(Ordering::Relaxed)
    }

    /// Callbacks for a producer in front of `buffer`, with a fatal flag of their own; a panic
    /// while settling fails `tasks`.
    pub(super) fn new(buffer: Buffer, tasks: Tasks, topics: Arc<crate::topic::Topics>) -> Self {
        let fatal = Arc::new(AtomicBool::new(false));
        Self {
            topics,
            settler: Arc::new(Settler::new(buffer.clone(), tasks)),
            buffer,
            retried: metrics::counter!(telemetry::SHIP_RETRIED),
            errors: Arc::default(),
            fatal,
            last_purge: AtomicBool::new(false),
            unconfirmed: AtomicU64::new(0),
            delivered_any: AtomicBool::new(false),
            contacts: AtomicU64::new(0),
            produce_requests: AtomicU64::new(0),
            given_up: AtomicBool::new(false),
            serving: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Decides a record's fate from its delivery report: acknowledged, back into the buffer
    /// (retryable), or given up and counted. Everything [`ProducerContext::delivery`] does past
    /// reading librdkafka's message (the seam the model-based test drives with a fake producer).
    ///
    /// A record that comes back from librdkafka without a success, from a producer that has been
    /// whose requests have reached a broker, may be stored in Kafka: it carries that on, through its retries, to
    /// the drain, where what Kafka may hold is counted `unconfirmed`, never `drain_timeout` ("not
    /// stored"). librdkafka's own per-message status (`rd_kafka_message_status`) is not relied
    /// on: after a broker restart its idempotent producer resets its producer id and reports a
    /// batch the broker had appended as "not persisted" (the soak found 467 such records counted
    /// lost: issue 30). A producer none of whose requests reached a broker stored nothing: what it
    /// hands back, given up at the drain, is `drain_timeout`, lost, and said so.
    pub(super) fn report(&self, report: Report<'_>, mut in_flight: InFlight) {
        match report {
            // Settled with the others the reports bring meanwhile, on the settling thread.
            Ok(_) => {
                if !self.delivered_any.load(Ordering::Relaxed) {
                    self.delivered_any.store(true, Ordering::Relaxed);
                }
                self.reached_a_broker();
                self.settler.delivered(in_flight);
            }
            Err((error, payload, key)) => {
                let reason = reason(error);
                metrics::counter!(telemetry::SHIP_DELIVERY_ERRORS, telemetry::REASON => reason.clone()).increment(1);
                // Purged in flight (sent, unanswered) or a broker's own error code: it went out.
                // Otherwise it may have, once this producer's requests have reached a broker.
                let went_out = error
                    .rdkafka_error_code()
                    .is_some_and(|code| code == RDKafkaErrorCode::PurgeInflight || (code as i32) >= 0);
                if went_out || self.contacts() > 0 {
                    in_flight.may_be_stored();
                }
                if in_flight.maybe_stored() && in_flight.pos.is_none() && self.last_purge.load(Ordering::Relaxed) {
                    // The agent is stopping and Kafka may have it. Not lost and not delivered;
                    // counted apart, so neither count is wrong. (A spooled one stays in the
                    // spool, sent again at the next start: the persister keeps one row per id.)
                    self.unconfirmed.fetch_add(1, Ordering::Relaxed);
                    self.buffer.give_up(in_flight, Failed::Unconfirmed);
                    return;
                }
                match classify(error) {
                    Disposition::Retry => {
                        super::reroute_unknown(&self.topics, error, &mut in_flight);
                        self.retried.increment(1);
                        self.buffer.retry(in_flight, payload.unwrap_or_default(), key);
                    }
                    Disposition::GiveUp => {
                        let failed = give_up_reason(error);
                        error!(%error, kafka_error = reason, reason = failed.as_str(), "kafka refused a record; it is dropped and counted");
                        self.buffer.give_up(in_flight, failed);
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
        // Marked before the check: the drain sets `given_up`, then waits for this to be 0.
        self.serving.fetch_add(1, Ordering::SeqCst);
        let _served = Served(&self.serving);
        if self.given_up.load(Ordering::SeqCst) {
            // Counted when the drain stopped waiting (`Shipper::close`): let go, not counted again.
            return;
        }
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

/// One delivery report being served ([`ShipContext::serving`]), until dropped.
struct Served<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Served<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
