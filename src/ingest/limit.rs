//! Rate limits: token buckets in records/s and bytes/s, one pair per connection or per peer.
//!
//! Owns: the keyed limiters of one listener (governor's GCRA, the same arithmetic as a token
//! bucket), deciding whether a record may pass now or when it may, and freeing the buckets of
//! keys that went away. Must not: sleep (the caller decides whether to wait or drop), or keep a
//! bucket for a connection or peer that has not written for longer than a burst.
//!
//! governor does the arithmetic; Sluice only decides the key and what a refusal means.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};

use crate::config::{RateLimitAction, RateLimitConfig, RateLimitKey};

#[cfg(test)]
mod tests;

/// Whose bucket a record is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitKey {
    /// One connection (by its number on the listener), or the whole socket of a datagram
    /// listener.
    Connection(u64),
    /// Every connection of one uid.
    Peer(u32),
}

type Keyed<C> = RateLimiter<LimitKey, DashMapStateStore<LimitKey>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// One listener's rate limits.
pub struct Limits<C: Clock = DefaultClock> {
    records: Option<Keyed<C>>,
    bytes: Option<Keyed<C>>,
    /// Largest charge the byte bucket can take at once (its burst); a bigger record is charged
    /// this much, so one large record is slowed, never refused forever.
    bytes_capacity: NonZeroU32,
    clock: C,
    /// `connection` or `peer`.
    pub key: RateLimitKey,
    /// `throttle` or `drop`.
    pub action: RateLimitAction,
}

impl Limits<DefaultClock> {
    /// The limits a listener's config asks for.
    pub fn new(config: &RateLimitConfig) -> Self {
        Self::with_clock(config, DefaultClock::default())
    }
}

impl<C: Clock + Clone> Limits<C> {
    /// The limits with a given clock (governor's fake clock in tests).
    pub fn with_clock(config: &RateLimitConfig, clock: C) -> Self {
        let records = config.records_per_second.map(|rate| quota(u64::from(rate), config.burst));
        let bytes = config.bytes_per_second.map(|rate| quota(rate.as_u64(), config.burst));
        let bytes_capacity = bytes.map(|quota| quota.burst_size()).unwrap_or(NonZeroU32::MIN);
        Self {
            records: records.map(|quota| RateLimiter::dashmap_with_clock(quota, clock.clone())),
            bytes: bytes.map(|quota| RateLimiter::dashmap_with_clock(quota, clock.clone())),
            bytes_capacity,
            clock,
            key: config.key,
            action: config.action,
        }
    }

    /// The key a connection's records are charged to.
    pub fn key_for(&self, connection: u64, uid: u32) -> LimitKey {
        match self.key {
            RateLimitKey::Connection => LimitKey::Connection(connection),
            RateLimitKey::Peer => LimitKey::Peer(uid),
        }
    }

    /// Charges one record of `len` bytes to `key`. `Ok` if it may pass now; otherwise how long
    /// until it might (nothing is charged then, except a record token when only the byte
    /// bucket refused: see `docs/PROTOCOL.md`).
    pub fn check(&self, key: &LimitKey, len: usize) -> Result<(), Duration> {
        self.check_records(key)?;
        self.check_bytes(key, len)
    }

    /// Charges only the record bucket.
    pub fn check_records(&self, key: &LimitKey) -> Result<(), Duration> {
        let Some(records) = &self.records else { return Ok(()) };
        records.check_key(key).map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Charges only the byte bucket.
    pub fn check_bytes(&self, key: &LimitKey, len: usize) -> Result<(), Duration> {
        let Some(bytes) = &self.bytes else { return Ok(()) };
        let charge = u32::try_from(len).unwrap_or(u32::MAX).clamp(1, self.bytes_capacity.get());
        let charge = NonZeroU32::new(charge).unwrap_or(NonZeroU32::MIN);
        match bytes.check_key_n(key, charge) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(not_until.wait_time_from(self.clock.now())),
            // The charge is clamped to the burst, so this cannot happen; treat it as "wait".
            Err(_) => Err(Duration::from_millis(10)),
        }
    }

    /// Frees the buckets of keys that have not been charged for longer than a burst (they are
    /// indistinguishable from fresh ones). Called periodically by the listener.
    pub fn forget_idle(&self) {
        for limiter in [&self.records, &self.bytes].into_iter().flatten() {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }

    /// How many keys hold a bucket (the larger of the two limiters).
    pub fn keys(&self) -> usize {
        [&self.records, &self.bytes].into_iter().flatten().map(|limiter| limiter.len()).max().unwrap_or(0)
    }
}

/// `rate` per second with a burst of `burst` seconds of rate (at least one).
fn quota(rate: u64, burst: Duration) -> Quota {
    let rate = u32::try_from(rate).unwrap_or(u32::MAX).max(1);
    let burst_cells = (f64::from(rate) * burst.as_secs_f64()).clamp(1.0, f64::from(u32::MAX)) as u32;
    let rate = NonZeroU32::new(rate).unwrap_or(NonZeroU32::MIN);
    let burst_cells = NonZeroU32::new(burst_cells).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(rate).allow_burst(burst_cells)
}
