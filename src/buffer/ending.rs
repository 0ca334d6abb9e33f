//! How a record leaves the buffer's books, whoever decides that it does: Kafka stored it
//! ([`Buffer::settle_delivered`], a batch at a time), Kafka will never take it or the drain ends
//! before its answer ([`Buffer::give_up`]), the drain leaves it unsent ([`Buffer::unsent`]), or
//! it comes back to be sent again ([`Buffer::retry`]); and what travels with a record while the
//! producer has it ([`InFlight`]).
//!
//! Owns: what each ending means — the record's share of the budget returned (with its ingest-time
//! age and its shipping share), its place in the spool finished or handed back to the backlog,
//! its writer's acknowledgement settled, and a record that is let go counted with its reason —
//! written once, for every caller: the delivery report and the settling thread, the send path,
//! the drain, the backlog reader and eviction. Vector's `disk_v2` ledger is the model: the
//! shipper decides *when* a record ends, the buffer decides *what* that means. Must not: talk to
//! Kafka, decide when a record ends, tell a writer before the record's memory is back, or delete
//! a spool file on a runtime worker (the spool writer's housekeeping deletes it then).

use bytes::Bytes;
use tracing::error;

use super::ack::Ack;
use super::spool::SpoolPos;
use super::{Buffer, Lease, Record};
use crate::telemetry::outcome::{Dropped, Failed};
use crate::telemetry::repeats::Repeats;

/// What travels with a record through the producer and comes back with its delivery report:
/// everything the buffer holds for it but its bytes (librdkafka hands those back on a failure,
/// so the buffer keeps no copy of records in flight).
#[derive(Debug)]
pub struct InFlight {
    /// The topic it is sent to (`None`: the default topic; see [`Record::topic`]).
    pub(crate) topic: Option<super::Topic>,
    lease: Lease,
    retries: u32,
    /// Where it is in the spool (disk type).
    pub(crate) pos: Option<SpoolPos>,
    ingest_ms: u64,
    ack: Option<Ack>,
    /// Kafka may hold it already: an earlier attempt failed after the broker may have written
    /// it (librdkafka's "possibly persisted"). Never sent is not to be said of it at the drain.
    maybe_stored: bool,
    /// The message's length, for the delivered bytes.
    payload_len: usize,
}

impl InFlight {
    /// A record as it goes to the producer: its payload and key, and what travels with it.
    pub fn new(record: Record) -> (Bytes, Option<Bytes>, Box<InFlight>) {
        let Record { payload, topic, key, lease, retries, pos, ingest_ms, ack, maybe_stored } = record;
        let payload_len = payload.len();
        (payload, key, Box::new(InFlight { topic, lease, retries, pos, ingest_ms, ack, maybe_stored, payload_len }))
    }

    /// When the agent read the record (Unix ms).
    pub fn ingest_ms(&self) -> u64 {
        self.ingest_ms
    }

    /// The message's length in bytes.
    pub fn payload_len(&self) -> usize {
        self.payload_len
    }

    /// Whether Kafka may hold it already (an attempt failed after it may have been written).
    pub fn maybe_stored(&self) -> bool {
        self.maybe_stored
    }

    /// Kafka may hold it already: its delivery report said "possibly persisted".
    pub fn may_be_stored(&mut self) {
        self.maybe_stored = true;
    }
}

/// Lines about records the drain leaves behind, collapsed: one per drain, not one per record.
static DRAIN_LINES: Repeats = Repeats::new(crate::telemetry::repeats::REMINDER_EVERY);

impl Buffer {
    /// Records Kafka stored, `batch` emptied (its allocation kept): their budget and ages back
    /// once for the batch, their spool places finished (a segment that is then done is deleted
    /// here: call it from a thread of its own, never a runtime worker), then their writers told,
    /// after their memory is back (whoever hears a record is settled sees its lease gone).
    pub fn settle_delivered(&self, batch: &mut Vec<InFlight>) {
        if batch.is_empty() {
            return;
        }
        self.settled_many(batch.iter().map(|record| (record.lease.bytes(), record.ingest_ms)));
        let spool = self.spool();
        let mut deletable = false;
        // One lease per pool the batch's came from (the shared budget, the backlog's reserve).
        let mut room: Vec<Lease> = Vec::new();
        let mut acks = Vec::new();
        for InFlight { lease, pos, mut ack, .. } in batch.drain(..) {
            if let (Some(pos), Some(spool)) = (pos, spool) {
                let (done, parked) = spool.done(pos);
                deletable |= done;
                ack = ack.or(parked);
            }
            match room.iter_mut().find(|pool| pool.same_pools(&lease)) {
                Some(pool) => pool.absorb(lease),
                None => room.push(lease),
            }
            acks.extend(ack);
        }
        if deletable && let Some(spool) = spool {
            spool.delete_done();
        }
        drop(room);
        // An ack still unsettled here is settled now: delivered is durable, whatever point it
        // waited for (a `spooled` ack settled at write time is no longer with the record).
        for ack in acks {
            ack.durable();
        }
        self.notify_settled();
    }

    /// A record that will not be stored by this agent: Kafka refused it for good, or (`reason`
    /// [`Failed::Unconfirmed`]) the drain ended before Kafka's answer. Counted with `reason`, its
    /// writer told, released everywhere (a spooled one is finished in the spool: not sent again).
    pub fn give_up(&self, in_flight: InFlight, reason: Failed) {
        reason.count(1);
        let InFlight { lease, pos, mut ack, ingest_ms, .. } = in_flight;
        self.settled(lease.bytes(), ingest_ms);
        if let (Some(pos), Some(spool)) = (pos, self.spool()) {
            let (deletable, parked) = spool.done(pos);
            ack = ack.or(parked);
            // Off the runtime (librdkafka's polling thread) a file delete is fine; on a runtime
            // worker (`send` giving up a record librdkafka refused at once) the spool writer's
            // housekeeping deletes it.
            if deletable && tokio::runtime::Handle::try_current().is_err() {
                spool.delete_done();
            }
        }
        drop(lease);
        if let Some(ack) = ack {
            ack.refused(reason);
        }
        self.notify_settled();
    }

    /// A record the drain leaves without an answer from Kafka, never to be sent by this process:
    /// a spooled one stays owed on disk for the next start (unless `drop_oldest` deleted its
    /// segment meanwhile: counted `drop_oldest`); one only in memory is lost — counted
    /// `drain_timeout`, or `unconfirmed` if an earlier attempt may have stored it.
    pub fn unsent(&self, in_flight: InFlight) {
        let InFlight { lease, pos, ack, ingest_ms, maybe_stored, .. } = in_flight;
        self.settled(lease.bytes(), ingest_ms);
        drop(lease);
        match (pos, self.spool()) {
            (Some(pos), Some(_)) => self.back_to_disk_marked(vec![(pos, ack, maybe_stored)]),
            _ => {
                let reason = if maybe_stored { Failed::Unconfirmed } else { Failed::DrainTimeout };
                if let Some(repeated) = DRAIN_LINES.admit(reason.as_str()) {
                    error!(
                        reason = reason.as_str(),
                        repeated, "a record only in memory was not handed to kafka before the drain deadline; counted"
                    );
                }
                reason.count(1);
                let tally = if maybe_stored { &self.shared.unsent.1 } else { &self.shared.unsent.0 };
                tally.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(ack) = ack {
                    ack.refused(reason);
                }
            }
        }
        self.notify_settled();
    }

    /// A record whose delivery failed in a way worth retrying, back in the buffer with its lease
    /// (it never left the budget: this never waits and never drops), `payload` and `key` as
    /// librdkafka hands them back. Sent before fresh records, in the order the failures came.
    pub fn retry(&self, in_flight: InFlight, payload: &[u8], key: Option<&[u8]>) {
        let InFlight { topic, lease, retries, pos, ingest_ms, ack, maybe_stored, .. } = in_flight;
        self.requeue(Record {
            payload: Bytes::copy_from_slice(payload),
            topic,
            key: key.map(Bytes::copy_from_slice),
            lease,
            retries: retries.saturating_add(1),
            pos,
            ingest_ms,
            ack,
            maybe_stored,
        });
    }

    /// Spooled records that leave memory unfinished (evicted, not handed to Kafka, read from the
    /// backlog without room to send them): disk-only again, the backlog reader sends them later
    /// and their acks wait parked until then. One whose segment `drop_oldest` deleted meanwhile
    /// is lost: counted `drop_oldest` here, its writer told.
    pub(crate) fn back_to_disk(&self, records: Vec<(SpoolPos, Option<Ack>)>) {
        self.back_to_disk_marked(records.into_iter().map(|(pos, ack)| (pos, ack, false)).collect());
    }

    /// [`Buffer::back_to_disk`] for records each with whether Kafka may hold it already: such a
    /// record stays marked on disk (`maybe_stored`, also across a restart), and one lost with its
    /// segment is counted `unconfirmed`, not `drop_oldest`.
    pub(crate) fn back_to_disk_marked(&self, records: Vec<(SpoolPos, Option<Ack>, bool)>) {
        let Some(spool) = self.spool() else { return };
        let (lost, lost_maybe) = spool.evicted_marked(records);
        if lost > lost_maybe {
            Dropped::DropOldest.count(lost - lost_maybe);
        }
        if lost_maybe > 0 {
            Failed::Unconfirmed.count(lost_maybe);
        }
    }
}
