//! Integration tests: the real `sluice` binary against the real Kafka broker and PostgreSQL
//! started by `scripts/stack` (and, in `in_process`, the roles' `run` in the test's runtime).
//! One test binary, so it builds once.

mod admin;
mod chart;
mod cli;
mod faults;
mod hostile;
mod in_process;
mod ingest;
mod lifecycle;
mod observability;
mod persist;
mod pipeline;
mod protocols;
mod reload;
mod schema;
mod soak;
// The wait helpers that `support/scenario.rs` replaced (`wait_for_rows`, `wait_for_count`,
// `start_pipeline`, `committed_offset`) are still in support.rs, unused, until they are deleted.
#[allow(dead_code)]
mod support;
mod tls;
