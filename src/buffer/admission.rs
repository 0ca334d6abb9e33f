//! Admission: what happens to a record the socket hands to a full buffer — `buffer.when_full`
//! (`block` for at most `block_timeout`, `drop_newest`, `drop_oldest`) — and making room without
//! loss where the buffer can (a disk buffer's spooled records leave memory).
//!
//! Owns: the decision at the socket and its counts. Must not: block a reader longer than
//! `block_timeout`, or drop a record uncounted.

use std::time::Duration;

use super::*;
use crate::telemetry::outcome::Dropped;

/// The buffer was full and its policy let the record go (counted, and its ack refused, already).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("buffer full; record dropped ({})", .0.as_str())]
pub struct BufferFull(pub Dropped);

/// Per-connection admission state for `block_timeout`: once a writer has been held for the
/// whole timeout, its records are dropped at once until the buffer has room again.
#[derive(Debug, Default)]
pub struct Admission {
    pub(super) shedding: bool,
}

/// What a full buffer does; see [`WhenFull`] and `buffer.block_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The policy.
    pub when_full: WhenFull,
    /// How long `block` may hold a writer; `None` = as long as it takes.
    pub block_timeout: Option<Duration>,
}

impl Buffer {
    /// Accepts a record, applying `when_full` if there is no room. Under `block` this waits for
    /// room (the caller's socket is not read meanwhile: backpressure) for at most
    /// `block_timeout`; under `drop_*` it never waits. A refused record's ack is settled here.
    pub async fn push(
        &self,
        payload: Bytes,
        topic: Option<super::Topic>,
        key: Option<Bytes>,
        ingest_ms: u64,
        mut ack: Option<Ack>,
        admission: &mut Admission,
    ) -> Result<(), BufferFull> {
        let cost = self.cost(payload.len(), key.as_ref().map_or(0, Bytes::len));
        let lease = match self.admit(cost, admission).await {
            Ok(lease) => lease,
            Err(reason) => {
                reason.count(1);
                if let Some(ack) = ack.take() {
                    ack.refused(reason);
                }
                return Err(BufferFull(reason));
            }
        };
        let record = Record { payload, topic, key, lease, retries: 0, pos: None, ingest_ms, ack, maybe_stored: false };
        if self.shared.spool.is_none() {
            self.shared.ages.held(ingest_ms);
        }
        if self.shared.spool.is_some() {
            self.lock().intake.push_back(record);
            self.shared.intake_ready.notify_one();
        } else {
            self.lock().fresh.push_back(record);
            self.shared.ready.notify_one();
        }
        Ok(())
    }

    /// Room for a record of `cost` if there is some now, without applying `when_full`: what
    /// [`Buffer::push`] takes first. The record then goes in with [`Buffer::push_leased`].
    pub fn try_admit(&self, cost: usize, admission: &mut Admission) -> Option<Lease> {
        let lease = self.try_lease(cost)?;
        admission.shedding = false;
        Some(lease)
    }

    /// Records that already hold their room ([`Buffer::try_admit`]), in the order they were read,
    /// `records` emptied: one lock and one wake-up for all of them.
    pub fn push_leased(&self, records: &mut Vec<Record>) {
        if self.shared.spool.is_none() {
            self.shared.ages.held_many(records.iter().map(|record| record.ingest_ms));
            self.lock().fresh.extend(records.drain(..));
            self.shared.ready.notify_one();
        } else {
            self.lock().intake.extend(records.drain(..));
            self.shared.intake_ready.notify_one();
        }
    }

    pub(super) async fn admit(&self, cost: usize, admission: &mut Admission) -> Result<Lease, Dropped> {
        if let Some(lease) = self.try_lease(cost) {
            admission.shedding = false;
            return Ok(lease);
        }
        // Make room where the policy allows it without losing anything (disk: records already
        // spooled leave memory) or by dropping the oldest (drop_oldest).
        if self.evict(cost) > 0
            && let Some(lease) = self.try_lease(cost)
        {
            admission.shedding = false;
            return Ok(lease);
        }
        let Policy { when_full, block_timeout } = self.policy();
        match when_full {
            WhenFull::DropNewest => Err(Dropped::DropNewest),
            WhenFull::DropOldest => Err(Dropped::DropOldest),
            WhenFull::Block if admission.shedding => Err(Dropped::BlockTimeout),
            WhenFull::Block => {
                let wait = self.lease(cost);
                let lease = match block_timeout {
                    None => Some(wait.await),
                    Some(limit) => tokio::time::timeout(limit, wait).await.ok(),
                };
                match lease {
                    Some(lease) => Ok(lease),
                    None => {
                        admission.shedding = true;
                        Err(Dropped::BlockTimeout)
                    }
                }
            }
        }
    }

    /// Frees at least `cost` bytes of memory if the policy allows, oldest fresh records first:
    /// for the disk type they stay on disk (nothing lost); for `drop_oldest` they are dropped and
    /// counted. Returns how many records left memory.
    pub(super) fn evict(&self, cost: usize) -> usize {
        let disk = self.shared.spool.is_some();
        if !disk && self.policy().when_full != WhenFull::DropOldest {
            return 0;
        }
        let mut evicted = Vec::new();
        {
            let mut queues = self.lock();
            let needed = cost.saturating_sub(self.shared.bytes.available_permits()).max(1);
            let mut freed = 0;
            while freed < needed || self.shared.records.available_permits() + evicted.len() == 0 {
                let Some(record) = queues.fresh.pop_front() else { break };
                freed += record.lease.bytes.num_permits();
                evicted.push(record);
            }
        }
        if evicted.is_empty() {
            return 0;
        }
        let count = evicted.len();
        match &self.shared.spool {
            Some(_) => {
                // Spooled records: memory is freed, the record stays owed on disk (unless
                // drop_oldest deleted its segment meanwhile: then it is lost, and counted).
                self.back_to_disk(evicted.into_iter().filter_map(|record| Some((record.pos?, record.ack))).collect());
                self.shared.ready.notify_one();
            }
            None => {
                Dropped::DropOldest.count(count as u64);
                for mut record in evicted {
                    self.shared.ages.released(record.ingest_ms);
                    record.refuse(Dropped::DropOldest);
                }
                self.notify_settled();
            }
        }
        count
    }
}
