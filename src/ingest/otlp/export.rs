//! One OTLP Export, acknowledged: every record offered to the buffer with an acknowledgement, the
//! answer given only when each reached `ingest.ack_point` or was refused.
//!
//! Owns: numbering an Export's records (its own [`AckTracker`], within the agent's acknowledgement
//! budget), the wait for their settlement bounded by the listener's `export_timeout`, and the
//! answer: done (refusals retrying cannot fix reported as a partial success, with their reason
//! words), or retry later (the buffer stayed full, the records did not reach the ack point in
//! time, the agent is stopping, a rate limit). Must not: hold more than one record as JSON beside
//! the decoded request, or wait past the export's deadline or the drain's.

use std::collections::BTreeMap;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use tokio_util::sync::CancellationToken;

use super::convert;
use crate::buffer::ack::{AckEvent, AckTracker};
use crate::config::RateLimitAction;
use crate::envelope::PeerFragment;
use crate::ingest::limit::LimitKey;
use crate::ingest::sink::RecordSink;
use crate::ingest::{IngestContext, ListenerContext};
use crate::telemetry::outcome::{Dropped, Failed, Refused, Rejected};

/// How an Export is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Every record reached the ack point, or was refused for a reason a retry cannot fix:
    /// `rejected` of them, `message` naming the reasons (OTLP's partial success).
    Done {
        /// Records refused.
        rejected: u64,
        /// `reason count, …`; empty when none was.
        message: String,
    },
    /// The client should send the Export again later.
    Retry {
        /// Why, for the status the client reads.
        why: RetryWhy,
        /// Said to the client.
        message: String,
    },
}

/// Why an Export is to be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryWhy {
    /// The buffer stayed full, the records did not reach the ack point within `export_timeout`,
    /// or the agent is stopping (gRPC `UNAVAILABLE`, HTTP 503).
    Unavailable,
    /// A rate limit (gRPC `RESOURCE_EXHAUSTED`, HTTP 429).
    RateLimited,
}

/// Refusals an Export's records met, by reason word.
#[derive(Default)]
struct Refusals {
    counts: BTreeMap<&'static str, u64>,
    retry: Option<RetryWhy>,
    /// A `rate_limited` refusal means "retry later" (`throttle`: its wait ran out); with `drop`
    /// it is the operator's choice, reported like any other refusal.
    rate_limit_retries: bool,
}

impl Refusals {
    fn add(&mut self, events: Vec<AckEvent>) {
        for event in events {
            if let AckEvent::Refused { reason, .. } = event {
                *self.counts.entry(reason.as_str()).or_default() += 1;
                let retry = match reason {
                    Refused::Dropped(Dropped::BlockTimeout) | Refused::Failed(Failed::DrainTimeout) => {
                        Some(RetryWhy::Unavailable)
                    }
                    Refused::Rejected(Rejected::RateLimited) if self.rate_limit_retries => Some(RetryWhy::RateLimited),
                    _ => None,
                };
                // Unavailable wins over a rate limit: the buffer is the harder limit.
                self.retry = match (self.retry, retry) {
                    (Some(RetryWhy::Unavailable), _) | (_, Some(RetryWhy::Unavailable)) => Some(RetryWhy::Unavailable),
                    (kept, None) => kept,
                    (_, some) => some,
                };
            }
        }
    }

    fn describe(&self) -> String {
        self.counts.iter().map(|(reason, count)| format!("{reason} {count}")).collect::<Vec<_>>().join(", ")
    }

    fn answer(self) -> Answer {
        let message = self.describe();
        match self.retry {
            Some(why) => Answer::Retry { why, message: format!("records refused, retry later: {message}") },
            None => Answer::Done { rejected: self.counts.values().sum(), message },
        }
    }
}

/// Who sent an Export, for the envelope and the rate limit.
pub struct Sender {
    /// Its rate-limit bucket.
    pub limit_key: LimitKey,
    /// Its peer, as envelopes carry it (none over TCP).
    pub peer: PeerFragment,
}

/// Offers `request`'s records (`wire_len` bytes as sent) and waits until each settled, or
/// `deadline` (the listener's `export_timeout`) or the drain's passes. The request and its
/// decoding `slot` go once every record is offered: the wait for acknowledgements holds neither.
pub async fn export(
    request: ExportLogsServiceRequest,
    slot: tokio::sync::OwnedSemaphorePermit,
    wire_len: usize,
    ingest: &IngestContext,
    listener: &ListenerContext,
    sender: Sender,
    deadline: &CancellationToken,
) -> Answer {
    let total = convert::count(&request);
    if total == 0 {
        return Answer::Done { rejected: 0, message: String::new() };
    }
    let tracker = AckTracker::within(ingest.ack_point, ingest.acks.clone());
    let rate_limit_retries = listener.limits.as_ref().is_some_and(|limits| limits.action == RateLimitAction::Throttle);
    let mut refusals = Refusals { rate_limit_retries, ..Refusals::default() };
    let wire_each = wire_len / total;
    let mut sink = RecordSink::new(ingest, listener, sender.limit_key, sender.peer).until(deadline.clone());
    let mut offered = 0;
    let max_record = listener.config.max_record_bytes();
    for json in convert::records(&request, max_record) {
        // Records that settle at once (refused, or room in the buffer) never make this loop
        // wait: it gives the worker back now and then.
        tokio::task::consume_budget().await;
        let ack = loop {
            tokio::select! {
                biased;
                _ = ingest.abandon.cancelled() => break None,
                _ = deadline.cancelled() => break None,
                // What settled meanwhile is taken, so the budget it held comes back.
                events = tracker.next_events() => refusals.add(events),
                _ = tracker.room() => break Some(tracker.issue()),
            }
        };
        let Some(ack) = ack else { break };
        match json {
            Ok(json) => sink.offer_json(&json, wire_each, Some(ack)).await,
            Err(reason) => sink.reject(reason, Some(ack)),
        }
        offered += 1;
        refusals.add(tracker.take_events());
    }
    let unoffered = total - offered;
    if unoffered > 0 {
        // Read, never offered: counted as the wait that ran out (the client is told to retry).
        for _ in 0..unoffered {
            if ingest.abandon.is_cancelled() {
                sink.give_up();
            } else {
                sink.timed_out();
            }
        }
        // Records offered before keep their acks until they settle; the writer is answered now,
        // so their share of the acknowledgement budget goes back now.
        tracker.release_unreported();
        return Answer::Retry {
            why: refusals.retry.unwrap_or(RetryWhy::Unavailable),
            message: format!("{unoffered} of {total} records found no room in time; retry later"),
        };
    }
    drop(sink);
    drop(request);
    drop(slot);
    tracker.finish_reading();
    match wait_for_settlement(&tracker, ingest, deadline, &mut refusals).await {
        Some(retry) => {
            tracker.release_unreported();
            retry
        }
        None => refusals.answer(),
    }
}

/// Waits until every record of the Export is reported; `Some` answer if a deadline came first.
async fn wait_for_settlement(
    tracker: &Arc<AckTracker>,
    ingest: &IngestContext,
    deadline: &CancellationToken,
    refusals: &mut Refusals,
) -> Option<Answer> {
    loop {
        refusals.add(tracker.take_events());
        if tracker.all_reported() {
            return None;
        }
        tokio::select! {
            biased;
            _ = ingest.abandon.cancelled() => {
                return Some(Answer::Retry { why: RetryWhy::Unavailable, message: "the agent is stopping".into() });
            }
            _ = deadline.cancelled() => {
                let point = ingest.ack_point.as_str();
                return Some(Answer::Retry {
                    why: RetryWhy::Unavailable,
                    message: format!("records not yet {point} within export_timeout; retry later"),
                });
            }
            events = tracker.next_events() => refusals.add(events),
        }
    }
}
