//! What the crate's own tests share (compiled for tests only).
//!
//! Owns: the property tests' configuration. Must not: be used by the product.

use proptest::test_runner::{Config, RngSeed};

/// The model-based property tests' config: `SLUICE_PROP_CASES` cases and `SLUICE_PROP_SEED`
/// (`scripts/prop` sets both), else `default_cases` on the fixed seed 12 that keeps
/// `scripts/test` short and reproducible. No failure file: a failing case prints its steps.
pub(crate) fn prop_config(default_cases: u32) -> Config {
    let from_env = |name: &str| std::env::var(name).ok().and_then(|value| value.parse::<u64>().ok());
    Config {
        cases: from_env("SLUICE_PROP_CASES").map_or(default_cases, |cases| u32::try_from(cases).unwrap_or(u32::MAX)),
        rng_seed: RngSeed::Fixed(from_env("SLUICE_PROP_SEED").unwrap_or(12)),
        failure_persistence: None,
        ..Config::default()
    }
}
