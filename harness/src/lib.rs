//! What the integration tests (`tests/it`) and the benchmark (`sluice-bench`, behind
//! `scripts/bench`) share: the real `sluice` binary run as a child process on a config written
//! for it, the stack's services, and the benchmark itself.
//!
//! Owns: starting and stopping `sluice agent` / `sluice persist` (and any other child) by pid,
//! learning the admin address each bound (configs say `admin_listen = "127.0.0.1:0"`; the
//! process writes what it bound to `admin_address_file`), waiting until it is ready, the config
//! file it reads, and the stack's environment (`scripts/stack env`). Must not: be a dependency
//! of the product (it is the root package's dev-dependency and the benchmark's library), or
//! parse metrics or speak HTTP itself (`sluice::telemetry::scrape` and `sluice::admin::client`
//! do, for `sluice status` too).

pub mod bench;
pub mod config;
pub mod process;
pub mod stack;
pub mod wait;

pub use config::TestConfig;
pub use process::{Process, binary, http_get, start_agent, start_persister, wait_ready};
pub use stack::{NO_BROKER, Services, free_port, services, unique};
pub use wait::{WAIT, eventually, within};
