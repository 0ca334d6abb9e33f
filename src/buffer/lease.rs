//! The memory budget: every record in memory holds a `Lease` of bytes and one record slot, taken
//! from the buffer's two semaphores and given back when it is dropped; the backlog's reserve,
//! librdkafka's share, and what the shipper may have in flight.
//!
//! Owns: taking and returning leases. Must not: wait for room the shipper cannot free (the
//! backlog lane's reserve and the in-flight half exist for that), or free room for a record still
//! in memory.

use tokio::sync::OwnedSemaphorePermit;

use super::*;

/// A record's share of the memory budget. Dropping it frees the room for new records, so it must
/// be dropped exactly when the record is no longer held in memory: acknowledged by Kafka, given
/// up and counted, or (disk type) evicted to the spool.
#[derive(Debug)]
pub struct Lease {
    pub(super) bytes: OwnedSemaphorePermit,
    pub(super) records: OwnedSemaphorePermit,
}

impl Lease {
    /// The bytes this lease holds.
    pub fn bytes(&self) -> usize {
        self.bytes.num_permits()
    }

    /// The records this lease holds.
    pub fn records(&self) -> usize {
        self.records.num_permits()
    }

    /// Adds `other`'s room to this lease, so that many records' room goes back to the budget in
    /// one return; a lease from other pools (the backlog's reserve) goes back on its own.
    pub fn absorb(&mut self, other: Lease) {
        if self.same_pools(&other) {
            self.bytes.merge(other.bytes);
            self.records.merge(other.records);
        }
    }

    /// Whether `other` was taken from the pools this lease was.
    pub fn same_pools(&self, other: &Lease) -> bool {
        Arc::ptr_eq(self.bytes.semaphore(), other.bytes.semaphore())
            && Arc::ptr_eq(self.records.semaphore(), other.records.semaphore())
    }

    /// Takes `cost` bytes and one record out of this (larger) lease.
    pub(super) fn split(&mut self, cost: usize) -> Option<Lease> {
        let bytes = self.bytes.split(cost)?;
        match self.records.split(1) {
            Some(records) => Some(Lease { bytes, records }),
            None => {
                self.bytes.merge(bytes);
                None
            }
        }
    }
}

impl Buffer {
    pub(super) fn try_lease(&self, cost: usize) -> Option<Lease> {
        let records = self.shared.records.clone().try_acquire_owned().ok()?;
        let bytes = self.shared.bytes.clone().try_acquire_many_owned(cost as u32).ok()?;
        Some(Lease { bytes, records })
    }

    /// Waits for room. The semaphores are fair (first come, first served), so one flooding
    /// connection cannot starve a quiet one: each waits its turn for the next free room.
    pub(super) async fn lease(&self, cost: usize) -> Lease {
        // The semaphores are never closed, so acquire cannot fail.
        let records = self.shared.records.clone().acquire_owned().await.expect("buffer semaphore is never closed");
        let bytes =
            self.shared.bytes.clone().acquire_many_owned(cost as u32).await.expect("buffer semaphore is never closed");
        Lease { bytes, records }
    }

    /// Memory for reading backlog, if there is room now: a chunk of the shared budget, or else
    /// the reserve readers never get (see `Shared::backlog_bytes`; it comes back as soon as the
    /// records it lent are delivered). The lease says how much may be read ([`Lease::bytes`],
    /// [`Lease::records`]). The shipper never waits for memory: the records holding it may be the
    /// ones only it can send.
    pub fn try_backlog_lease(&self) -> Option<Lease> {
        let take = |byte_pool: &Arc<Semaphore>, record_pool: &Arc<Semaphore>, (bytes, records): (usize, usize)| {
            if bytes == 0 || records == 0 {
                return None;
            }
            let records = record_pool.clone().try_acquire_many_owned(records as u32).ok()?;
            let bytes = byte_pool.clone().try_acquire_many_owned(bytes as u32).ok()?;
            Some(Lease { bytes, records })
        };
        take(&self.shared.bytes, &self.shared.records, self.shared.backlog_chunk)
            .or_else(|| take(&self.shared.backlog_bytes, &self.shared.backlog_records, self.shared.backlog_reserve))
    }

    /// Cuts one record's lease out of a backlog lease; `None` when the chunk is used up.
    pub fn split_lease(&self, chunk: &mut Lease, cost: usize) -> Option<Lease> {
        let lease = chunk.split(cost)?;
        self.shipping(lease.bytes.num_permits());
        Some(lease)
    }

    /// With a spool, true while records in flight or waiting for a retry use half the budget.
    pub(super) fn shipping_full(&self) -> bool {
        self.shared.spool.is_some() && self.shared.shipping.load(Ordering::Relaxed) >= self.shared.max_bytes / 2
    }

    /// A record (of `bytes` lease bytes) goes to the shipper.
    pub fn shipping(&self, bytes: usize) {
        self.shared.shipping.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A record handed to the shipper is settled (delivered or given up): its share returns.
    pub fn settled(&self, bytes: usize, ingest_ms: u64) {
        self.settled_many(std::iter::once((bytes, ingest_ms)));
    }

    /// [`Buffer::settled`] for many records (their lease bytes and ingest times) at once.
    pub fn settled_many(&self, records: impl IntoIterator<Item = (usize, u64)>) {
        let mut bytes = 0;
        match self.shared.spool {
            None => self.shared.ages.released_many(records.into_iter().map(|(lease, ingest_ms)| {
                bytes += lease;
                ingest_ms
            })),
            Some(_) => bytes = records.into_iter().map(|(lease, _)| lease).sum(),
        }
        self.shared.shipping.fetch_sub(bytes, Ordering::Relaxed);
        if self.shared.spool.is_some() {
            self.shared.ready.notify_one();
        }
    }
}
