//! Integration tests: the real `sluice` binary against the real Kafka broker and PostgreSQL
//! started by `scripts/stack` (and, in `in_process`, the roles' `run` in the test's runtime).
//! One test binary, so it builds once.

mod admin;
mod chart;
mod cli;
mod clusters;
mod faults;
mod hostile;
mod in_process;
mod ingest;
mod lifecycle;
mod multiline;
mod observability;
mod otlp;
mod persist;
mod pipeline;
mod protocols;
mod redact;
mod reload;
mod routing;
mod schema;
mod sessions;
mod soak;
mod support;
mod tls;
