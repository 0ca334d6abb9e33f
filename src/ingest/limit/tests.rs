use std::time::Duration;

use bytesize::ByteSize;
use governor::clock::FakeRelativeClock;

use super::*;

fn config(records: Option<u32>, bytes: Option<u64>, burst_ms: u64) -> RateLimitConfig {
    RateLimitConfig {
        records_per_second: records,
        bytes_per_second: bytes.map(ByteSize),
        burst: Duration::from_millis(burst_ms),
        ..RateLimitConfig::default()
    }
}

#[test]
fn allows_a_burst_then_refuses_until_tokens_return() {
    let clock = FakeRelativeClock::default();
    let limits = Limits::with_clock(&config(Some(10), None, 1000), clock.clone());
    let key = LimitKey::Connection(1);
    for _ in 0..10 {
        assert_eq!(limits.check(&key, 100), Ok(()));
    }
    let wait = limits.check(&key, 100).expect_err("the burst is spent");
    assert_eq!(wait, Duration::from_millis(100));
    clock.advance(Duration::from_millis(100));
    assert_eq!(limits.check(&key, 100), Ok(()));
    assert!(limits.check(&key, 100).is_err());
}

#[test]
fn keys_have_separate_buckets() {
    let clock = FakeRelativeClock::default();
    let limits = Limits::with_clock(&config(Some(1), None, 1000), clock);
    assert_eq!(limits.check(&LimitKey::Connection(1), 1), Ok(()));
    assert!(limits.check(&LimitKey::Connection(1), 1).is_err());
    assert_eq!(limits.check(&LimitKey::Connection(2), 1), Ok(()));
    assert_eq!(limits.check(&LimitKey::Peer(1000), 1), Ok(()));
}

#[test]
fn byte_bucket_charges_the_record_length() {
    let clock = FakeRelativeClock::default();
    let limits = Limits::with_clock(&config(None, Some(1000), 1000), clock.clone());
    let key = LimitKey::Peer(7);
    assert_eq!(limits.check(&key, 600), Ok(()));
    let wait = limits.check(&key, 600).expect_err("only 400 bytes left");
    assert_eq!(wait, Duration::from_millis(200));
    clock.advance(wait);
    assert_eq!(limits.check_bytes(&key, 600), Ok(()));
}

#[test]
fn a_record_larger_than_the_burst_is_slowed_not_refused_forever() {
    let clock = FakeRelativeClock::default();
    let limits = Limits::with_clock(&config(None, Some(100), 1000), clock.clone());
    let key = LimitKey::Connection(1);
    assert_eq!(limits.check(&key, 10_000), Ok(()), "charged as one full burst");
    let wait = limits.check(&key, 10_000).expect_err("the bucket is empty");
    assert_eq!(wait, Duration::from_secs(1));
    clock.advance(wait);
    assert_eq!(limits.check_bytes(&key, 10_000), Ok(()));
}

#[test]
fn buckets_of_vanished_keys_are_freed() {
    let clock = FakeRelativeClock::default();
    let limits = Limits::with_clock(&config(Some(100), Some(10_000), 1000), clock.clone());
    for connection in 0..1000 {
        assert_eq!(limits.check(&LimitKey::Connection(connection), 10), Ok(()));
    }
    assert_eq!(limits.keys(), 1000);
    limits.forget_idle();
    assert_eq!(limits.keys(), 1000, "buckets still refilling are kept");
    clock.advance(Duration::from_secs(2));
    limits.forget_idle();
    assert_eq!(limits.keys(), 0);
}

#[test]
fn key_follows_config() {
    let mut by_peer = config(Some(1), None, 1000);
    by_peer.key = RateLimitKey::Peer;
    let limits = Limits::new(&by_peer);
    assert_eq!(limits.key_for(5, 1000), LimitKey::Peer(1000));
    let limits = Limits::new(&config(Some(1), None, 1000));
    assert_eq!(limits.key_for(5, 1000), LimitKey::Connection(5));
}
