//! librdkafka's producer with a thread of its own that serves its callbacks.
//!
//! Owns: the thread that polls the producer's queue (delivery reports, statistics, client
//! errors: [`ShipContext`]'s callbacks run there), and telling it to stop. Written by hand
//! because rdkafka's `ThreadedProducer` polls in 100 ms slices: ten wake-ups a second for an
//! agent with nothing to ship (issue 15: a sidecar idles most of its life, × every pod). This
//! thread serves each event as it comes, in calls of `POLL_WAIT` (each ends with ~1 ms of
//! rdkafka's busy wait: see there). Must not: call anything that
//! blocks other than the poll itself, or outlive the process's need for its reports (a retired
//! producer has served every report before it is dropped: `retire`).

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaResult;
use rdkafka::producer::BaseProducer;

use super::report::ShipContext;
use super::settle::SettleThread;

/// How long one `poll` call lasts: how long the thread may take to notice it should stop (after
/// its producer was let go: it owes no report then, and only holds the retired producer's
/// connections that long). Not shorter: rdkafka's `poll` hands librdkafka the time left in
/// whole milliseconds and loops until its deadline, so the last sub-millisecond of every call
/// is a busy loop of zero-timeout polls — ~1 ms of CPU per call, which at one call a second
/// was most of an idle agent's CPU (`perf record` on this thread: 62% `clock_gettime`).
const POLL_WAIT: Duration = Duration::from_secs(10);

/// How long one `poll` call lasts in a producer's first [`PROVING`]: a producer that fails at
/// birth (its `InitProducerId` refused: a missing ACL) is let go within seconds, and its thread
/// — holding the producer's own threads and sockets until it ends — must not outlive it by
/// `POLL_WAIT` each time (issue 30: thousands of threads). Costs ~1 ms of CPU a second, for
/// [`PROVING`] only.
const PROVING_POLL_WAIT: Duration = Duration::from_secs(1);

/// How long a new producer polls in [`PROVING_POLL_WAIT`] slices.
const PROVING: Duration = Duration::from_secs(30);

/// A [`BaseProducer`] whose callbacks a thread of its own serves; dropping it tells the thread
/// to stop (it lets the producer go within `POLL_WAIT`).
pub struct Polled {
    producer: Arc<BaseProducer<ShipContext>>,
    stop: Arc<AtomicBool>,
    /// The thread that settles what the reports say Kafka stored; stopped (having settled
    /// everything queued) after the producer handle above is let go.
    _settle: SettleThread,
}

impl Polled {
    /// Creates the producer and starts its polling thread, which holds `alive` (a token whose
    /// count says how many polling threads run) until it ends.
    pub fn create(client: &ClientConfig, context: ShipContext, alive: Arc<()>) -> KafkaResult<Self> {
        let settle = SettleThread::start(context.settler.clone()).map_err(|error| {
            rdkafka::error::KafkaError::ClientCreation(format!("cannot start the producer's settling thread: {error}"))
        })?;
        let producer: Arc<BaseProducer<ShipContext>> = Arc::new(client.create_with_context(context)?);
        let stop = Arc::new(AtomicBool::new(false));
        let (polled, stopping) = (producer.clone(), stop.clone());
        std::thread::Builder::new()
            .name("kafka-poll".into())
            .spawn(move || {
                let _alive = alive;
                let born = std::time::Instant::now();
                while !stopping.load(Ordering::Relaxed) {
                    polled.poll(if born.elapsed() < PROVING { PROVING_POLL_WAIT } else { POLL_WAIT });
                }
            })
            .map_err(|error| {
                rdkafka::error::KafkaError::ClientCreation(format!(
                    "cannot start the producer's polling thread: {error}"
                ))
            })?;
        Ok(Self { producer, stop, _settle: settle })
    }
}

impl Deref for Polled {
    type Target = BaseProducer<ShipContext>;

    fn deref(&self) -> &Self::Target {
        &self.producer
    }
}

impl Drop for Polled {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
