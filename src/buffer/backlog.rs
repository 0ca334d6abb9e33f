//! The backlog lane's read: disk-only records read back from the spool into memory, each with its
//! share of the budget, for the shipper to send.
//!
//! Owns: one chunk's read ([`Buffer::next_backlog`]: on the blocking pool, within the lease the
//! shipper took from the backlog's reserve), what a read's damage and errors count, a record the
//! current config cannot hold (given up, counted), and the records a chunk could not hold (back
//! to disk, read again later). Must not: read on a runtime worker, hold a spool file between
//! reads, or wait for memory (the lease is taken before the read; the shipper decides when).

use std::time::Duration;

use bytes::Bytes;
use tracing::error;

use super::spool::{SpoolOp, SpoolPos, SpoolReader};
use super::{Buffer, Lease, Record};
use crate::telemetry;
use crate::telemetry::outcome::{Dropped, Failed};

impl Buffer {
    /// One chunk of the backlog, from `from` up to `upto`, read from the spool (on the blocking
    /// pool) within `lease`: the records to send, each with its share of the lease cut out, and
    /// what is left of the lease (held until they are sent, as one read's chunk always was). A
    /// record no lease can hold is given up and counted; one that does not fit what is left goes
    /// back to the backlog. A read error is counted and retried after a second.
    pub async fn next_backlog(
        &self,
        mut reader: SpoolReader,
        mut lease: Lease,
        from: SpoolPos,
        upto: SpoolPos,
    ) -> (SpoolReader, Vec<Record>, Lease) {
        let (chunk, records) = (lease.bytes(), lease.records());
        let payload_budget = chunk.saturating_sub(records * super::RECORD_OVERHEAD).max(1);
        let (reader, result) = tokio::task::spawn_blocking(move || {
            let result = reader.read(from, upto, records, payload_budget);
            (reader, result)
        })
        .await
        .expect("spool reads do not panic");
        let batch = match result {
            Ok(batch) => batch,
            Err(error) => {
                metrics::counter!(telemetry::SPOOL_ERRORS, "op" => SpoolOp::Read.as_str()).increment(1);
                error!(%error, "cannot read the spool backlog; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                return (reader, Vec::new(), lease);
            }
        };
        if batch.corrupt_regions > 0 {
            Dropped::Corrupt.count(batch.corrupt_records);
            metrics::counter!(telemetry::SPOOL_CORRUPT_BYTES).increment(batch.corrupt_bytes);
            self.notify_settled();
        }
        let mut records = batch.records.into_iter();
        let mut out = Vec::new();
        // Nothing taken from the lease yet: a record that does not fit it now never will.
        let mut untouched = true;
        while let Some(record) = records.next() {
            let cost = self.cost(record.payload.len(), record.key.as_ref().map_or(0, Bytes::len));
            if untouched && cost > lease.bytes() {
                // Spooled under an earlier config with a larger `max_record_size`: larger than
                // any lease (and than `message.max.bytes`, set from the same limit). Put back, it
                // would come first in every read, for ever; it is given up and counted instead.
                self.too_large_for_this_config(record.pos, cost);
                continue;
            }
            let Some(lease) = self.split_lease(&mut lease, cost) else {
                // The chunk was sized for the payload budget; a record that does not fit goes
                // back to the backlog with the rest (read again next time).
                let rest = std::iter::once(record).chain(records).map(|record| (record.pos, None)).collect();
                self.back_to_disk(rest);
                break;
            };
            untouched = false;
            out.push(Record {
                payload: record.payload,
                topic: record.topic,
                key: record.key,
                lease,
                retries: 0,
                pos: Some(record.pos),
                ingest_ms: record.ingest_ms,
                ack: None,
                maybe_stored: record.maybe_stored,
            });
        }
        (reader, out, lease)
    }

    /// A spooled record larger than the current config lets any record be: finished in the
    /// spool and counted as librdkafka would refuse it (`message_size_too_large`).
    fn too_large_for_this_config(&self, pos: SpoolPos, cost: usize) {
        error!(
            segment = pos.segment,
            index = pos.index,
            cost,
            "a spooled record is larger than max_record_size now allows; given up and counted"
        );
        Failed::MessageSizeTooLarge.count(1);
        if let Some(spool) = self.spool() {
            // The spool writer's housekeeping deletes the segment once it is done (file I/O is
            // not for a runtime worker).
            let (_, parked) = spool.done(pos);
            if let Some(ack) = parked {
                ack.refused(Failed::MessageSizeTooLarge);
            }
        }
        self.notify_settled();
    }
}
