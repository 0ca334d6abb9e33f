//! Sluice: a per-pod sidecar log shipper. Apps write lines to a local Unix socket; the agent
//! buffers them within a fixed budget and ships them to Kafka with acks=all; the persister
//! writes them to PostgreSQL exactly once per record.
//!
//! The modules follow the pipeline: [`ingest`] → [`buffer`] → [`ship`], then [`persist`];
//! [`config`], [`admin`], [`telemetry`] and [`shutdown`] serve all of them. [`agent`] wires the
//! agent together; `ARCHITECTURE.md` has the picture and the invariants.

pub mod admin;
pub mod agent;
pub mod bench;
pub mod buffer;
pub mod client;
pub mod config;
pub mod envelope;
pub mod ingest;
pub mod inject;
pub mod lifecycle;
pub mod persist;
pub mod ship;
pub mod shutdown;
pub mod status;
pub mod telemetry;
