//! Integration tests: the real `sluice` binary against the real Kafka broker and PostgreSQL
//! started by `scripts/stack`. One test binary, so it builds once.

mod admin;
mod chart;
mod cli;
mod faults;
mod hostile;
mod ingest;
mod lifecycle;
mod observability;
mod persist;
mod pipeline;
mod protocols;
mod reload;
mod schema;
mod soak;
mod support;
mod tls;
