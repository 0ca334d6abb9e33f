//! The services the stack started (`scripts/stack env`: Kafka, PostgreSQL and its CA) as the
//! environment hands them over, and names no other test or run uses.
//!
//! Owns: reading `SLUICE_TEST_*`, unique names, the address where no broker answers, and
//! [`free_port`] for the servers that must be told their port before they start. Must not:
//! start or stop the stack (`scripts/stack` does).

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// A broker address where nothing listens (port 1, tcpmux, is privileged and unused): every
/// connection is refused at once, as with a broker that is down.
pub const NO_BROKER: &str = "127.0.0.1:1";

/// The services the stack started (`scripts/stack env`).
#[derive(Clone, Debug)]
pub struct Services {
    /// Kafka's bootstrap address (`SLUICE_TEST_KAFKA`).
    pub kafka: String,
    /// PostgreSQL's URL (`SLUICE_TEST_PG`).
    pub pg: String,
}

/// The stack's services from the environment; panics, saying how to set them, when they are not.
pub fn services() -> Services {
    let read = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set. Integration tests run against real services: \
                 `scripts/stack up && export $(scripts/stack env)`, or run `scripts/test`."
            )
        })
    };
    Services { kafka: read("SLUICE_TEST_KAFKA"), pg: read("SLUICE_TEST_PG") }
}

/// A name no other test (or earlier run) uses: lower-case, valid as topic and schema name.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{prefix}_{}_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed), nanos % 1_000_000_000)
}

/// A free loopback port (bound, then released for the child to take), only for servers that
/// cannot bind port 0 and say what they bound: a private Kafka broker (its KRaft voters and
/// advertised listener name the port before it starts) and a private PostgreSQL (its port
/// names its socket). `sluice` itself binds port 0 ([`crate::Process::admin`]).
///
/// Taken below Linux's ephemeral range (32768–60999), where the kernel never puts outgoing
/// connections: a port the kernel handed out (port 0) could be given to a client's connection
/// before the child binds it. Each call of this process moves on from a random start, so two
/// tests are not handed the same port.
pub fn free_port() -> u16 {
    static NEXT: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        AtomicU32::new(nanos.wrapping_add(std::process::id()))
    });
    for _ in 0..2000 {
        let port = 20_000 + (next.fetch_add(1, Ordering::Relaxed) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between 20000 and 32000")
}
