//! Acknowledgements to writers that asked for them: which of a connection's records have
//! reached the point it asked about (spooled to disk, or delivered to Kafka), and which were
//! refused.
//!
//! Owns: per-connection numbering of records (1, 2, 3…) and the cumulative watermark "every
//! record up to n is settled". Must not: settle a record twice, or report a record durable that
//! was refused (a refusal is reported as its own line before the watermark passes it).
//!
//! An [`Ack`] travels with its record through the buffer and librdkafka; whoever decides the
//! record's fate settles it. An `Ack` dropped unsettled (the process is stopping) is simply never
//! acknowledged, which is the truth: the writer must not count that record as durable.
//!
//! Bounded: a record's state here (out-of-order settlements, refusals not yet told, an ack parked
//! in the spool) lasts until it is reported to its writer, and a connection may have at most
//! [`AckBudget`]'s window of records numbered but not yet reported — past it the reader waits
//! (backpressure on that writer alone, e.g. one that never reads its acknowledgements) — and all
//! connections together at most the budget's limit. Each such record costs at most
//! [`ACK_STATE_BYTES`].

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::telemetry::outcome::Refused;

pub use crate::config::AckPoint;

/// What a writer is told, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckEvent {
    /// Record `seq` was refused for `reason` (the word its metric counted it with).
    Refused {
        /// The record's number on its connection.
        seq: u64,
        /// Why.
        reason: Refused,
    },
    /// Every record numbered up to and including this is settled.
    Upto(u64),
}

/// The most an unreported acknowledgement costs in memory: a settled-ahead entry, a refusal
/// waiting to be told, and an ack parked in the spool (for docs/PERFORMANCE.md's bound).
pub const ACK_STATE_BYTES: usize = 128;

/// How many records may be numbered and not yet reported to their writer: per connection, and
/// over all connections of the agent.
pub struct AckBudget {
    /// Per connection.
    window: u64,
    /// All connections.
    limit: usize,
    unreported: std::sync::atomic::AtomicUsize,
    freed: Notify,
}

impl AckBudget {
    /// A budget of `limit` unreported records in all, at most `window` per connection.
    pub fn new(limit: usize, window: u64) -> Arc<Self> {
        Arc::new(Self {
            window: window.max(1),
            limit: limit.max(1),
            unreported: std::sync::atomic::AtomicUsize::new(0),
            freed: Notify::new(),
        })
    }

    /// No limit (tests of the tracker alone).
    pub fn unlimited() -> Arc<Self> {
        Self::new(usize::MAX, u64::MAX)
    }

    /// Records numbered and not yet reported, over all connections.
    pub fn unreported(&self) -> usize {
        self.unreported.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn release(&self, records: u64) {
        if records > 0 {
            self.unreported.fetch_sub(records as usize, std::sync::atomic::Ordering::Relaxed);
            self.freed.notify_waiters();
        }
    }
}

#[derive(Default)]
struct State {
    /// Numbers handed out so far (the last one).
    issued: u64,
    /// Every record numbered up to this is settled.
    settled_upto: u64,
    /// Settled records beyond the watermark (settled out of order).
    settled_ahead: BTreeSet<u64>,
    /// Refusals not yet reported.
    refusals: Vec<(u64, Refused)>,
    /// The watermark last reported.
    reported_upto: u64,
    /// The connection will issue no more numbers.
    reading_done: bool,
}

/// One connection's acknowledgement state.
pub struct AckTracker {
    point: AckPoint,
    state: Mutex<State>,
    changed: Notify,
    budget: Arc<AckBudget>,
}

impl AckTracker {
    /// A tracker for a connection that asked to hear at `point`, with no limit on what it may
    /// have unreported (tests).
    pub fn new(point: AckPoint) -> Arc<Self> {
        Self::within(point, AckBudget::unlimited())
    }

    /// A tracker whose unreported records count against `budget`.
    pub fn within(point: AckPoint, budget: Arc<AckBudget>) -> Arc<Self> {
        Arc::new(Self { point, state: Mutex::new(State::default()), changed: Notify::new(), budget })
    }

    /// Waits until this connection may number another record: its own unreported records are
    /// below the window and all connections' below the limit. The caller bounds the wait (the
    /// drain deadline).
    pub async fn room(&self) {
        loop {
            // Created before the check: a release between the two wakes it.
            let freed = self.budget.freed.notified();
            let own = {
                let state = self.lock();
                state.issued - state.reported_upto
            };
            if own < self.budget.window && self.budget.unreported() < self.budget.limit {
                return;
            }
            freed.await;
        }
    }

    /// The point this connection asked for.
    pub fn point(&self) -> AckPoint {
        self.point
    }

    /// The number given to the last record so far (0 before the first).
    pub fn issued(&self) -> u64 {
        self.lock().issued
    }

    /// Numbers the connection's next record.
    pub fn issue(self: &Arc<Self>) -> Ack {
        let mut state = self.lock();
        state.issued += 1;
        self.budget.unreported.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ack { tracker: self.clone(), seq: state.issued, point: self.point }
    }

    fn settle(&self, seq: u64, refused: Option<Refused>) {
        let mut state = self.lock();
        // A record released unreported (`release_unreported`) has no one to be told of.
        if let Some(reason) = refused
            && seq > state.reported_upto
        {
            state.refusals.push((seq, reason));
        }
        if seq == state.settled_upto + 1 {
            state.settled_upto = seq;
            loop {
                let next = state.settled_upto + 1;
                if !state.settled_ahead.remove(&next) {
                    break;
                }
                state.settled_upto = next;
            }
        } else if seq > state.settled_upto {
            state.settled_ahead.insert(seq);
        }
        drop(state);
        self.changed.notify_one();
    }

    /// Waits until there is something new to tell the writer, and returns it in the order to
    /// write it: refusals first, then the watermark.
    pub async fn next_events(&self) -> Vec<AckEvent> {
        loop {
            let notified = self.changed.notified();
            let events = self.take_events();
            if !events.is_empty() || (self.reading_done() && self.all_reported()) {
                return events;
            }
            notified.await;
        }
    }

    /// Takes whatever is new without waiting.
    pub fn take_events(&self) -> Vec<AckEvent> {
        let mut state = self.lock();
        let mut events: Vec<AckEvent> =
            state.refusals.drain(..).map(|(seq, reason)| AckEvent::Refused { seq, reason }).collect();
        events.sort_by_key(|event| match event {
            AckEvent::Refused { seq, .. } => *seq,
            AckEvent::Upto(_) => 0,
        });
        if state.settled_upto > state.reported_upto {
            let newly = state.settled_upto - state.reported_upto;
            state.reported_upto = state.settled_upto;
            events.push(AckEvent::Upto(state.settled_upto));
            drop(state);
            self.budget.release(newly);
        }
        events
    }

    /// Its writer will not hear about the records still unreported (an OTLP Export answered
    /// "retry" before they settled): their share of the budget goes back now; they settle
    /// later unreported.
    pub fn release_unreported(&self) {
        let mut state = self.lock();
        let unreported = state.issued - state.reported_upto;
        state.reported_upto = state.issued;
        state.refusals.clear();
        drop(state);
        self.budget.release(unreported);
    }

    /// The connection has read its last record.
    pub fn finish_reading(&self) {
        self.lock().reading_done = true;
        self.changed.notify_one();
    }

    /// True once [`AckTracker::finish_reading`] was called.
    pub fn reading_done(&self) -> bool {
        self.lock().reading_done
    }

    /// True once every issued record is settled and reported.
    pub fn all_reported(&self) -> bool {
        let state = self.lock();
        state.reported_upto == state.issued && state.refusals.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for AckTracker {
    /// The last `Ack` of a connection is gone: its state with it.
    fn drop(&mut self) {
        let state = self.lock();
        let unreported = state.issued - state.reported_upto;
        drop(state);
        self.budget.release(unreported);
    }
}

/// One record's claim to be acknowledged. Settle it exactly once.
pub struct Ack {
    tracker: Arc<AckTracker>,
    seq: u64,
    /// When it is settled: the connection's point, or `Delivered` once the spool could not make
    /// the record durable ([`Ack::hold_until_delivered`]).
    point: AckPoint,
}

impl std::fmt::Debug for Ack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ack({})", self.seq)
    }
}

impl Ack {
    /// The record's number on its connection.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The point at which it is settled (the writer's, unless the spool failed it).
    pub fn point(&self) -> AckPoint {
        self.point
    }

    /// The spool could not make the record durable (a write or fsync failed): it is
    /// acknowledged only once Kafka has it. An I/O error is never an acknowledgement.
    pub fn hold_until_delivered(&mut self) {
        self.point = AckPoint::Delivered;
    }

    /// The record reached the point its writer asked for.
    pub fn durable(self) {
        self.tracker.settle(self.seq, None);
    }

    /// The record will never get there, for `reason`.
    pub fn refused(self, reason: impl Into<Refused>) {
        self.tracker.settle(self.seq, Some(reason.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::outcome::Dropped;

    #[test]
    fn the_watermark_advances_only_over_contiguous_settled_records() {
        let tracker = AckTracker::new(AckPoint::Delivered);
        let (one, two, three) = (tracker.issue(), tracker.issue(), tracker.issue());
        two.durable();
        assert!(tracker.take_events().is_empty(), "record 1 is still open");
        one.durable();
        assert_eq!(tracker.take_events(), vec![AckEvent::Upto(2)]);
        three.refused(Dropped::DropNewest);
        assert_eq!(
            tracker.take_events(),
            vec![AckEvent::Refused { seq: 3, reason: Refused::Dropped(Dropped::DropNewest) }, AckEvent::Upto(3)]
        );
        assert!(tracker.all_reported());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_waits_for_room_past_its_window_until_its_acks_are_reported() {
        let budget = AckBudget::new(100, 2);
        let tracker = AckTracker::within(AckPoint::Delivered, budget.clone());
        let (one, _two) = (tracker.issue(), tracker.issue());
        assert_eq!(budget.unreported(), 2);
        let waiting = tokio::spawn({
            let tracker = tracker.clone();
            async move { tracker.room().await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "two numbered, none reported: the window is full");
        one.durable();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "settled is not enough: the writer has not been told");
        assert_eq!(tracker.take_events(), vec![AckEvent::Upto(1)]);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting).await.expect("room").expect("task");
        assert_eq!(budget.unreported(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn all_connections_together_stay_within_the_limit_and_a_closed_one_gives_its_share_back() {
        let budget = AckBudget::new(2, 100);
        let first = AckTracker::within(AckPoint::Delivered, budget.clone());
        let second = AckTracker::within(AckPoint::Delivered, budget.clone());
        let held = (first.issue(), first.issue());
        let waiting = tokio::spawn({
            let second = second.clone();
            async move { second.room().await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "the agent-wide limit is reached");
        drop(held); // unsettled acks dropped: the connection and its records are gone
        drop(first);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting).await.expect("room").expect("task");
        assert_eq!(budget.unreported(), 0);
    }

    #[test]
    fn records_released_unreported_give_their_budget_back_once() {
        let budget = AckBudget::new(100, 100);
        let tracker = AckTracker::within(AckPoint::Delivered, budget.clone());
        let (one, two) = (tracker.issue(), tracker.issue());
        assert_eq!(budget.unreported(), 2);
        tracker.release_unreported();
        assert_eq!(budget.unreported(), 0, "the writer was answered: the budget is free");
        one.durable();
        two.refused(Dropped::DropNewest);
        assert!(tracker.take_events().is_empty(), "nothing more to tell");
        drop(tracker);
        assert_eq!(budget.unreported(), 0, "not released twice");
    }

    #[tokio::test]
    async fn a_waiting_writer_is_woken_by_a_settlement() {
        let tracker = AckTracker::new(AckPoint::Spooled);
        let ack = tracker.issue();
        let waiter = tokio::spawn({
            let tracker = tracker.clone();
            async move { tracker.next_events().await }
        });
        tokio::task::yield_now().await;
        ack.durable();
        assert_eq!(waiter.await.expect("task"), vec![AckEvent::Upto(1)]);
    }
}
