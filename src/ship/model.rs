//! Issue 13, part 1: a model-based property test of the agent's core — the real [`Buffer`],
//! [`Spool`], spool writer ([`Spooler`]) and [`AckTracker`]s, and the real delivery-report
//! handling ([`ShipContext::report`]) behind a fake Kafka the test controls (it accepts every
//! send, so `ShipContext::unsent` is not driven), driven by the same random sequence of
//! operations as a small reference model.
//!
//! The model ([`Model`]) is the set of records accepted, each with its state (being pushed, owed,
//! delivered, dropped with a reason, lost in a crash) and whether its writer was told it is
//! safe. The system's side of each record is observed, never predicted: where it waits in memory
//! (intake, retry, fresh — [`Buffer::peek`]), in flight at the fake producer, or only on disk
//! (its frame in a live segment file, and the ledger saying disk-only). After every step:
//!
//! - every owed record is in exactly one place (never in memory twice, never both in memory and
//!   disk-only), and the ledger agrees with where it is (in memory, disk-only, orphaned);
//! - a record that left every place without a delivery report is counted: the step's drop
//!   counters (`sluice_buffer_records_dropped_total`, `sluice_ship_records_failed_total`) grew by
//!   exactly the records that vanished, refused at push or given up by Kafka, and a reason a
//!   writer heard is one the counters grew by (so no segment is deleted while it owes a record);
//!   a record Kafka answered with a retryable error must not vanish in that step. Weaker than it
//!   reads: the total is exact, but per reason only a lower bound for the reasons a writer
//!   heard, so a record dropped under the wrong reason (an I/O error counted as a policy drop)
//!   passes; and damage found at recovery is counted once per damaged region (as the agent
//!   does), so only "some damage counted" is checked there;
//! - a delivered record is delivered once (between two crashes: after one, whatever is left on
//!   disk is sent again — that is the design) and never owed again;
//! - no `ACK` before the record is durable: `delivered` acks only after its delivery report,
//!   `spooled` acks only once its frame is on disk — and never for a record a failed fsync
//!   covered (`fsync = "always"`) before it is delivered; a refused record is no longer owed;
//! - memory: the leases held are the records in memory (plus what pushes waiting for room hold),
//!   within the budget's capacity, and leases + librdkafka's share within `buffer.max_bytes`;
//! - gauges and counters equal the model's counts: `sluice_buffer_records`, `sluice_spool_records`
//!   (and the spool's orphans), `sluice_ship_records_delivered_total`, drops by reason;
//! - every step ends within a bound of (paused) time; at the end everything drains: every
//!   record delivered, counted, or lost in a crash (before it was written, never acknowledged;
//!   or cut off by a truncation at a frame boundary, which nothing can detect — not checked for
//!   acknowledgement), and every acknowledgement reported. The drain's own report
//!   (`agent::account`) is run, not compared.
//!
//! Operations: pushes from three writers (no acks, `spooled`, `delivered`) under every
//! `when_full` with and without `block_timeout` (a writer whose push waits for room is blocked
//! until it ends, like its connection); one turn of the spool writer (a batch from the intake;
//! it may go on waiting for disk room while other steps run), a housekeeping tick; one turn of
//! the shipper (memory lane or a backlog read, alternating); delivery reports in any order (ok,
//! retryable, refused for good), one record or several at once; the settling thread's turn (a
//! record Kafka stored is only queued by its report and settled later, other steps between:
//! until then it holds its memory, spool place and ack, `src/ship/settle.rs`); producer replacement (after a fatal error or a reload: what the
//! old one holds comes back purged, as `retire` makes it); reload of the policy; write errors,
//! a full disk, fsync errors; time passing; a crash (everything in memory gone, the directory
//! kept, the last segment optionally truncated at a byte or a byte flipped) and recovery; a
//! shutdown with a deadline (the agent's drain order, `account`) and restart.
//!
//! Not covered (honestly): `fsync = "interval"` (its sync off the write path — the spooler's
//! unit tests cover it), the memory buffer type, the shipper's own loop (`Shipper::run`,
//! `send`'s handling of a refused produce — queue full, a fatal producer refusing — and
//! `recreate`/`retire` themselves: the fake stands where librdkafka and they are), librdkafka's
//! queue limit, keys, the backlog reader's read errors and damage found after start-up, a spool
//! opened on a full disk or damage recovery cannot repair (the spool's unit tests and
//! `an_agent_started_on_a_full_spool_disk_…` cover those), and the acknowledgement budget
//! (unlimited here).
//!
//! `SLUICE_MODEL_STATS=1` prints, per case, how the records ended (to see what a seed reaches).
//! One file over the usual size (~1,250 lines), on purpose: a model-based test is one state
//! machine — the operations, the model's state and the checks after every step are read together,
//! and split apart each check would sit away from the state it checks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use proptest::prelude::*;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio_util::sync::CancellationToken;

use super::{InFlight, ShipContext, read_backlog};
use crate::buffer::ack::{AckEvent, AckPoint, AckTracker};
use crate::buffer::spool::segment;
use crate::buffer::spool::{Fsync, Ledger, Spool, SpoolConfig, SpoolOp, SpoolPos, SpoolReader};
use crate::buffer::spooler::{self, Spooler};
use crate::buffer::{Admission, Buffer, BufferFull, Policy, Work};
use crate::config::{Config, WhenFull};
use crate::telemetry;

/// The writers: the acknowledgement each asked for.
const WRITERS: [Option<AckPoint>; 3] = [None, Some(AckPoint::Spooled), Some(AckPoint::Delivered)];
/// How long one step may take (paused time): longer means it waits for ever.
const STEP_LIMIT: Duration = Duration::from_secs(600);
/// The agent's drain timeout in the shutdown step.
const DRAIN: Duration = Duration::from_secs(10);
/// `buffer.max_bytes`.
const BUDGET: usize = 64 * 1024;

#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// Stored in Kafka.
    Ok,
    /// A retryable error (`message.timeout.ms` expired).
    Retry,
    /// Refused for good (too large).
    Refuse,
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The next write fails with EIO.
    WriteEio,
    /// The next write finds the disk full (ENOSPC).
    DiskFull,
    /// The next fsync fails with EIO.
    FsyncEio,
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    None,
    /// The last segment cut at this byte (modulo its length).
    Truncate(usize),
    /// This byte of the last segment flipped (modulo its length).
    Flip(usize),
}

#[derive(Debug, Clone)]
enum Op {
    /// A writer pushes this many records (if it is not still blocked in a push).
    Push { writer: usize, records: usize },
    /// The spool writer takes a batch from the intake and writes it.
    Spool,
    /// The spool writer's housekeeping.
    Tick,
    /// The shipper's next turn.
    Send,
    /// A delivery report for the record in flight at this index (modulo how many there are).
    Report { pick: usize, outcome: Outcome },
    /// One report storing several records at once (those at these indices).
    ReportBatch { picks: Vec<usize> },
    /// The settling thread takes what the reports queued (Kafka has those records; until now
    /// they held their memory, spool places and acks).
    Settle,
    /// The producer is replaced (fatal error, or reload): what it holds comes back purged.
    Replace { fatal: bool },
    /// A config reload changes the policy.
    Reload(Policy),
    /// A disk fault for the spool writer's next operation of its kind.
    Fault(Fault),
    /// Time passes (milliseconds).
    Wait(u64),
    /// The process dies; the directory stays (maybe damaged); the agent starts again on it.
    Crash(Damage),
    /// SIGTERM: the agent drains within its deadline (Kafka answering or not), then starts again.
    Shutdown { kafka_answers: bool },
}

fn policy() -> impl Strategy<Value = Policy> {
    let when_full = prop_oneof![Just(WhenFull::Block), Just(WhenFull::DropNewest), Just(WhenFull::DropOldest)];
    let timeout = prop_oneof![Just(None), Just(Some(Duration::from_millis(50))), Just(Some(Duration::from_secs(2)))];
    (when_full, timeout).prop_map(|(when_full, block_timeout)| Policy { when_full, block_timeout })
}

fn op() -> impl Strategy<Value = Op> {
    let outcome = prop_oneof![6 => Just(Outcome::Ok), 3 => Just(Outcome::Retry), 1 => Just(Outcome::Refuse)];
    let fault = prop_oneof![Just(Fault::WriteEio), Just(Fault::DiskFull), Just(Fault::FsyncEio)];
    let damage = prop_oneof![
        Just(Damage::None),
        any::<usize>().prop_map(Damage::Truncate),
        any::<usize>().prop_map(Damage::Flip)
    ];
    prop_oneof![
        8 => (0..WRITERS.len(), 1..12usize).prop_map(|(writer, records)| Op::Push { writer, records }),
        5 => Just(Op::Spool),
        2 => Just(Op::Tick),
        6 => Just(Op::Send),
        8 => (any::<usize>(), outcome).prop_map(|(pick, outcome)| Op::Report { pick, outcome }),
        3 => proptest::collection::vec(any::<usize>(), 2..8).prop_map(|picks| Op::ReportBatch { picks }),
        5 => Just(Op::Settle),
        1 => any::<bool>().prop_map(|fatal| Op::Replace { fatal }),
        1 => policy().prop_map(Op::Reload),
        2 => fault.prop_map(Op::Fault),
        2 => prop_oneof![Just(10u64), Just(100), Just(3000)].prop_map(Op::Wait),
        1 => damage.prop_map(Op::Crash),
        1 => any::<bool>().prop_map(|kafka_answers| Op::Shutdown { kafka_answers }),
    ]
}

/// What a case runs with (besides its operations).
#[derive(Debug, Clone)]
struct Case {
    /// `Always` or `Never`.
    fsync: Fsync,
    policy: Policy,
    /// A spool cap of a few segments (the cap's policy comes into play), or a roomy one.
    small_spool: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (prop_oneof![Just(Fsync::Always), Just(Fsync::Never)], policy(), any::<bool>())
        .prop_map(|(fsync, policy, small_spool)| Case { fsync, policy, small_spool })
}

/// A record's state in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Its writer is pushing it (or waits to).
    Pushing,
    /// Its push did not happen (the writer was stopped first).
    Unaccepted,
    /// Refused at push, with this reason.
    Refused(&'static str),
    /// Accepted, not yet delivered: the agent owes it.
    Owed,
    Delivered,
    /// Given up and counted; the reason when its writer heard it, else `"?"`.
    Dropped(&'static str),
    /// Held in memory only when the process died (never written, or its segment dropped).
    LostInCrash,
}

#[derive(Debug)]
struct Rec {
    writer: usize,
    state: State,
    cost: usize,
    /// Told durable (`ACK`), in this epoch.
    acked: bool,
    /// Seen written to the spool at some point.
    written: bool,
    /// Written by an append whose fsync failed (`always`): never `spooled`-acknowledged.
    unsynced: bool,
    /// Its segment was dropped while it was in memory.
    orphan: bool,
    /// The reason its writer was told it was refused.
    refusal: Option<&'static str>,
    /// Kafka answered this step with a retryable error: the record must still be somewhere
    /// (time and retryable errors alone never drop a record).
    kept: bool,
}

struct Model {
    records: BTreeMap<u64, Rec>,
    epoch: u32,
    policy: Policy,
    delivered: u64,
    /// Per writer: the last seq handed out in this epoch.
    issued: [u64; 3],
    /// Per writer: the writer was refused `block_timeout` and has not been admitted since.
    shedding: [bool; 3],
    /// Drops the model counts, by reason (`"?"`: its writer was not told): refusals at push,
    /// by Kafka, damage found at recovery, records that left without a delivery report.
    counted: BTreeMap<&'static str, u64>,
    /// (writer, seq, epoch) → record.
    by_seq: HashMap<(usize, u64, u32), u64>,
    /// Per writer: the policies in force since its push began (a reload does not change the
    /// rules for a record already waiting).
    policies: [Vec<Policy>; 3],
}

/// A record's payload carries its id.
fn payload(id: u64) -> Bytes {
    let pad = "x".repeat((id % 5) as usize * 300);
    Bytes::from(format!("{{\"id\":{id},\"pad\":\"{pad}\"}}"))
}

fn id_of(payload: &[u8]) -> u64 {
    let text = std::str::from_utf8(payload).expect("utf-8 payload");
    let digits = text.strip_prefix("{\"id\":").and_then(|rest| rest.split(',').next()).expect("an id");
    digits.parse().expect("numeric id")
}

/// One record the fake producer holds (what librdkafka would: payload, key, opaque).
struct Sent {
    id: u64,
    payload: Bytes,
    in_flight: Box<InFlight>,
}

/// The fake Kafka producer: accepts every send, reports when the test says.
struct Kafka {
    context: ShipContext,
    /// What a panic while settling would fail (the check asserts it never does).
    tasks: crate::lifecycle::Tasks,
    in_flight: Vec<Sent>,
    /// Records reported stored and queued for the settling thread, not settled yet.
    unsettled: Vec<(u64, Option<SpoolPos>)>,
}

impl Kafka {
    fn new(buffer: &Buffer) -> Self {
        let tasks = crate::lifecycle::Tasks::new(tokio_util::sync::CancellationToken::new());
        let context = ShipContext::new(buffer.clone(), tasks.clone(), crate::ship::tests::topics());
        // The model's Kafka answers from the start: what it hands back may have been stored.
        context.reached_a_broker();
        Self { context, tasks, in_flight: Vec::new(), unsettled: Vec::new() }
    }

    fn send(&mut self, record: crate::buffer::Record) {
        let (payload, key, in_flight) = InFlight::new(record);
        assert!(key.is_none(), "the model pushes no keys");
        self.in_flight.push(Sent { id: id_of(&payload), payload, in_flight });
    }

    /// Reports on the record at `at`; returns its id.
    fn report(&mut self, at: usize, outcome: Outcome) -> u64 {
        let Sent { id, payload, in_flight } = self.in_flight.remove(at);
        let error = match outcome {
            Outcome::Ok => {
                self.unsettled.push((id, in_flight.pos));
                self.context.report(Ok(payload.len()), *in_flight);
                return id;
            }
            Outcome::Retry => KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut),
            Outcome::Refuse => KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
        };
        self.context.report(Err((&error, Some(&payload), None)), *in_flight);
        id
    }

    /// One report storing the records at `picks` (indices modulo what is in flight, as they
    /// shrink), queued for the settling thread.
    fn report_batch(&mut self, picks: &[usize]) {
        for pick in picks {
            if self.in_flight.is_empty() {
                break;
            }
            let Sent { id, payload, in_flight } = self.in_flight.remove(pick % self.in_flight.len());
            self.unsettled.push((id, in_flight.pos));
            self.context.report(Ok(payload.len()), *in_flight);
        }
    }

    /// The settling thread's turn (also what `retire` does before a producer is let go):
    /// everything queued is settled. Returns the ids.
    fn settle(&mut self) -> Vec<u64> {
        self.context.settler.settle_now();
        self.unsettled.drain(..).map(|(id, _)| id).collect()
    }

    /// `retire`: every record it holds comes back through a (retryable) purge report.
    fn retire(&mut self, fatal: bool) {
        let code = if fatal { RDKafkaErrorCode::Fatal } else { RDKafkaErrorCode::PurgeInflight };
        let error = KafkaError::MessageProduction(code);
        for Sent { payload, in_flight, .. } in std::mem::take(&mut self.in_flight) {
            self.context.report(Err((&error, Some(&payload), None)), *in_flight);
        }
    }
}

/// The spool writer: idle between steps, or still in a write (waiting for disk room, say).
enum Slot {
    Idle(Box<Spooler>),
    Busy(tokio::task::JoinHandle<Box<Spooler>>),
    Gone,
}

struct Writer {
    tracker: Option<Arc<AckTracker>>,
    /// Its push, while it runs (the connection is blocked meanwhile).
    pushing: Option<tokio::task::JoinHandle<Admission>>,
    admission: Option<Admission>,
    /// The last watermark it was told.
    upto: u64,
}

/// One run of the agent on the spool directory (until a crash or a shutdown).
struct Agent {
    buffer: Buffer,
    spool: Arc<Spool>,
    spooler: Slot,
    reader: Option<SpoolReader>,
    kafka: Kafka,
    prefer_backlog: bool,
    writers: Vec<Writer>,
    give_up: CancellationToken,
    fsync: Fsync,
}

/// What a crash left for the check after it.
struct Crashed {
    /// The records on disk before the damage.
    before: BTreeSet<u64>,
    /// Corrupt regions recovery found.
    corrupt: u64,
    /// False if the damage cannot be told from a file never written further.
    detectable: bool,
}

/// What a push reports: the record, and how its push ended.
type PushLog = Arc<Mutex<Vec<(u64, Result<(), &'static str>)>>>;

fn config(case: &Case) -> Config {
    let mut config = Config::from_toml(&format!(
        "[buffer]\ntype = \"disk\"\nmax_bytes = \"{BUDGET} B\"\nmax_records = 64\n\
         [ingest.listeners.default]\nmax_record_size = \"256 B\"\n"
    ))
    .expect("valid");
    config.buffer.when_full = case.policy.when_full;
    config.buffer.block_timeout = case.policy.block_timeout;
    config
}

fn spool_config(case: &Case, dir: &Path) -> SpoolConfig {
    SpoolConfig {
        dir: dir.to_path_buf(),
        max_bytes: if case.small_spool { 16 * 1024 } else { 1 << 20 },
        segment_bytes: 4096,
        fsync: case.fsync,
        max_body: 64 * 1024,
    }
}

impl Agent {
    /// Starts on `dir` (recovering what is there), with `policy` in force.
    fn start(case: &Case, dir: &Path, policy: Policy) -> (Agent, crate::buffer::spool::Recovered) {
        let (spool, writer, recovered) = Spool::open(spool_config(case, dir)).expect("spool opens");
        // As `agent::open_buffer` counts it.
        metrics::counter!(telemetry::BUFFER_DROPPED, telemetry::REASON => "corrupt")
            .increment(recovered.corrupt_regions);
        let buffer = Buffer::for_config_with_spool(&config(case), spool.clone(), writer.end());
        buffer.set_policy(policy);
        let agent = Agent {
            kafka: Kafka::new(&buffer),
            reader: Some(spool.reader()),
            spooler: Slot::Idle(Box::new(Spooler::new(buffer.clone(), writer, case.fsync))),
            spool,
            buffer,
            prefer_backlog: true,
            writers: WRITERS
                .iter()
                .map(|point| Writer {
                    tracker: point.map(AckTracker::new),
                    pushing: None,
                    admission: Some(Admission::default()),
                    upto: 0,
                })
                .collect(),
            give_up: CancellationToken::new(),
            fsync: case.fsync,
        };
        (agent, recovered)
    }

    /// The shipper's turn: one batch from memory, or one backlog read, as `Shipper::run` does.
    async fn send(&mut self) -> bool {
        let Some(work) = self.buffer.next_work(self.prefer_backlog).now_or_never() else { return false };
        self.prefer_backlog = !self.prefer_backlog;
        match work {
            Work::Memory => {
                let mut batch = Vec::new();
                self.buffer.pop_batch(super::SEND_BATCH, &mut batch);
                batch.into_iter().for_each(|record| self.kafka.send(record));
            }
            Work::Backlog { from, upto } => {
                let Some(lease) = self.buffer.try_backlog_lease() else { return false };
                let reader = self.reader.take().expect("the reader is put back");
                let (reader, records, rest) = read_backlog(&self.buffer, reader, lease, from, upto).await;
                self.reader = Some(reader);
                records.into_iter().for_each(|record| self.kafka.send(record));
                drop(rest);
            }
        }
        true
    }

    /// Collects a finished write, if one ran.
    async fn reap(&mut self) -> Option<Box<Spooler>> {
        if !matches!(&self.spooler, Slot::Busy(handle) if handle.is_finished()) {
            return None;
        }
        let Slot::Busy(handle) = std::mem::replace(&mut self.spooler, Slot::Gone) else { unreachable!() };
        Some(handle.await.expect("spool writer step"))
    }
}

/// The metrics, read from a recorder of this test's own.
struct Metrics(metrics_exporter_prometheus::PrometheusHandle);

impl Metrics {
    /// The sum of `name` over series with this `reason` (any, if `None`).
    fn get(&self, name: &str, reason: Option<&str>) -> u64 {
        let text = self.0.render();
        let mut sum = 0.0;
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let (series_name, labels) = series.split_once('{').unwrap_or((series, ""));
            if series_name != name {
                continue;
            }
            if let Some(reason) = reason
                && !labels.contains(&format!("reason=\"{reason}\""))
            {
                continue;
            }
            sum += value.parse::<f64>().unwrap_or(0.0);
        }
        sum as u64
    }

    fn drops(&self) -> BTreeMap<&'static str, u64> {
        DROP_REASONS
            .iter()
            .map(|reason| {
                let both =
                    self.get(telemetry::BUFFER_DROPPED, Some(reason)) + self.get(telemetry::SHIP_FAILED, Some(reason));
                (*reason, both)
            })
            .collect()
    }

    fn all_drops(&self) -> u64 {
        self.get(telemetry::BUFFER_DROPPED, None) + self.get(telemetry::SHIP_FAILED, None)
    }
}

const DROP_REASONS: [&str; 6] =
    ["drop_newest", "drop_oldest", "block_timeout", "corrupt", "drain_timeout", "message_size_too_large"];

/// Where the system has each record right now.
#[derive(Default)]
struct Seen {
    /// Waiting in memory or in flight: the place and the record's spool position.
    memory: HashMap<u64, Vec<(&'static str, Option<SpoolPos>)>>,
    /// Frames in live segment files.
    disk: HashMap<u64, Vec<SpoolPos>>,
}

fn scan_dir(dir: &Path) -> HashMap<u64, Vec<SpoolPos>> {
    let mut disk: HashMap<u64, Vec<SpoolPos>> = HashMap::new();
    for entry in std::fs::read_dir(dir).expect("spool dir") {
        let path = entry.expect("entry").path();
        let Some(segment) = path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.strip_suffix(".seg"))
            .and_then(|number| number.parse::<u64>().ok())
        else {
            continue;
        };
        let data = std::fs::read(&path).expect("segment");
        let report = segment::scan(&data);
        for (index, range) in report.frames.iter().enumerate() {
            let (frame, _) = segment::frame_at(&data, range.start).expect("scanned frame");
            let pos = SpoolPos { segment, offset: range.start as u64, index: index as u32 };
            disk.entry(id_of(frame.payload)).or_default().push(pos);
        }
    }
    disk
}

fn observe(agent: &Agent, dir: &Path) -> Seen {
    let mut seen = Seen { disk: scan_dir(dir), ..Seen::default() };
    agent.buffer.peek(|place, record| {
        seen.memory.entry(id_of(&record.payload)).or_default().push((place, record.pos));
    });
    for sent in &agent.kafka.in_flight {
        seen.memory.entry(sent.id).or_default().push(("in flight", sent.in_flight.pos));
    }
    // Stored in Kafka, not settled yet: still holding memory and its spool place.
    for (id, pos) in &agent.kafka.unsettled {
        seen.memory.entry(*id).or_default().push(("in flight", *pos));
    }
    seen
}

fn eio() -> std::io::Error {
    std::io::Error::from_raw_os_error(5)
}

/// Runs one case: the operations, a check after each, and the final drain.
fn run(case: &Case, ops: &[Op]) -> Result<(), TestCaseError> {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = Metrics(recorder.handle());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("rt");
    metrics::with_local_recorder(&recorder, || runtime.block_on(Run::new(case, metrics).go(ops)))
}

struct Run<'a> {
    case: &'a Case,
    dir: tempfile::TempDir,
    agent: Agent,
    model: Model,
    metrics: Metrics,
    log: PushLog,
    next_id: u64,
    /// Set by a crash for the check after it.
    crashed: Option<Crashed>,
}

impl<'a> Run<'a> {
    fn new(case: &'a Case, metrics: Metrics) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let (agent, _) = Agent::start(case, dir.path(), case.policy);
        let model = Model {
            records: BTreeMap::new(),
            epoch: 0,
            policy: case.policy,
            delivered: 0,
            issued: [0; 3],
            shedding: [false; 3],
            counted: BTreeMap::new(),
            by_seq: HashMap::new(),
            policies: Default::default(),
        };
        Run { case, dir, agent, model, metrics, log: PushLog::default(), next_id: 0, crashed: None }
    }

    async fn go(mut self, ops: &[Op]) -> Result<(), TestCaseError> {
        for (step, op) in ops.iter().enumerate() {
            let done = tokio::time::timeout(STEP_LIMIT, self.step(op)).await;
            prop_assert!(done.is_ok(), "step {step} ({op:?}) did not end within {STEP_LIMIT:?}");
            done.expect("checked")?;
            self.check(step, op).await?;
        }
        let drained = tokio::time::timeout(STEP_LIMIT, self.drain(ops.len())).await;
        prop_assert!(drained.is_ok(), "the final drain did not end: {}", self.agent.buffer.describe());
        drained.expect("checked")?;
        self.finish()
    }

    async fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Push { writer, records } => self.push(*writer, *records),
            Op::Spool => self.spool(),
            Op::Tick => {
                if let Slot::Idle(spooler) = &mut self.agent.spooler {
                    spooler.tick().await;
                }
            }
            Op::Send => {
                self.agent.send().await;
            }
            Op::Report { pick, outcome } => {
                if !self.agent.kafka.in_flight.is_empty() {
                    let at = pick % self.agent.kafka.in_flight.len();
                    self.report(at, *outcome)?;
                }
            }
            Op::ReportBatch { picks } => self.agent.kafka.report_batch(picks),
            Op::Settle => self.settle()?,
            Op::Replace { fatal } => {
                // `retire` settles what the reports queued before the producer is let go.
                self.settle()?;
                self.agent.kafka.retire(*fatal);
                self.agent.kafka = Kafka::new(&self.agent.buffer);
            }
            Op::Reload(policy) => {
                self.agent.buffer.set_policy(*policy);
                self.model.policy = *policy;
                self.model.policies.iter_mut().for_each(|policies| policies.push(*policy));
            }
            Op::Fault(fault) => {
                if let Slot::Idle(spooler) = &mut self.agent.spooler {
                    let writer = spooler.writer();
                    match fault {
                        Fault::WriteEio => writer.inject(SpoolOp::Write, eio()),
                        Fault::DiskFull => writer.inject(SpoolOp::Write, std::io::Error::from_raw_os_error(28)),
                        Fault::FsyncEio => writer.inject(SpoolOp::Fsync, eio()),
                    }
                }
            }
            Op::Wait(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
            Op::Crash(damage) => self.crash(*damage).await?,
            Op::Shutdown { kafka_answers } => self.shutdown(*kafka_answers).await?,
        }
        // Quiet: every task parked and no blocking call running (paused time moves only then).
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.reap().await
    }

    fn push(&mut self, writer: usize, records: usize) {
        let w = &mut self.agent.writers[writer];
        if w.pushing.is_some() {
            return; // Still blocked in its last push.
        }
        let mut admission = w.admission.take().expect("admission");
        let tracker = w.tracker.clone();
        self.model.policies[writer] = vec![self.model.policy];
        let mut batch = Vec::new();
        for _ in 0..records {
            let id = self.next_id;
            self.next_id += 1;
            if tracker.is_some() {
                self.model.issued[writer] += 1;
                self.model.by_seq.insert((writer, self.model.issued[writer], self.model.epoch), id);
            }
            let cost = self.agent.buffer.cost(payload(id).len(), 0);
            self.model.records.insert(
                id,
                Rec {
                    writer,
                    state: State::Pushing,
                    cost,
                    acked: false,
                    written: false,
                    unsynced: false,
                    orphan: false,
                    refusal: None,
                    kept: false,
                },
            );
            batch.push(id);
        }
        let (buffer, log) = (self.agent.buffer.clone(), self.log.clone());
        w.pushing = Some(tokio::spawn(async move {
            for id in batch {
                let ack = tracker.as_ref().map(|tracker| tracker.issue());
                let pushed = buffer.push(payload(id), None, None, 1_000, ack, &mut admission).await;
                log.lock().expect("log").push((id, pushed.map_err(|BufferFull(reason)| reason.as_str())));
            }
            admission
        }));
    }

    fn spool(&mut self) {
        let Slot::Idle(_) = &self.agent.spooler else { return };
        let Slot::Idle(mut spooler) = std::mem::replace(&mut self.agent.spooler, Slot::Gone) else { unreachable!() };
        let give_up = self.agent.give_up.clone();
        let handle = tokio::spawn(async move {
            spooler.write_intake(&give_up).await;
            spooler
        });
        self.agent.spooler = Slot::Busy(handle);
    }

    /// A finished write: no record an fsync failure left unsynced (the bytes written since the
    /// last sync that worked) may have been acknowledged as spooled before its delivery.
    async fn reap(&mut self) -> Result<(), TestCaseError> {
        let Some(mut spooler) = self.agent.reap().await else { return Ok(()) };
        let failed = spooler.writer().take_failed_syncs();
        self.agent.spooler = Slot::Idle(spooler);
        if failed.is_empty() {
            return Ok(());
        }
        for (id, positions) in scan_dir(self.dir.path()) {
            let covered = positions.iter().any(|pos| {
                failed.iter().any(|(segment, from, to)| pos.segment == *segment && (*from..*to).contains(&pos.offset))
            });
            if !covered {
                continue;
            }
            if let Some(rec) = self.model.records.get_mut(&id) {
                rec.unsynced = true;
                prop_assert!(
                    !(rec.acked && rec.state != State::Delivered && WRITERS[rec.writer] == Some(AckPoint::Spooled)),
                    "record {} was acknowledged as spooled, but the fsync covering it failed",
                    id
                );
            }
        }
        Ok(())
    }

    /// The settling thread's turn: the model's side of every record it settles.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        for id in self.agent.kafka.settle() {
            self.delivered(id)?;
        }
        Ok(())
    }

    /// The model's side of a record Kafka stored, once it is settled.
    fn delivered(&mut self, id: u64) -> Result<(), TestCaseError> {
        let rec = self.model.records.get_mut(&id).expect("a known record");
        prop_assert_eq!(rec.state, State::Owed, "record {} delivered, but it was not owed", id);
        rec.state = State::Delivered;
        self.model.delivered += 1;
        Ok(())
    }

    fn report(&mut self, at: usize, outcome: Outcome) -> Result<(), TestCaseError> {
        let id = self.agent.kafka.report(at, outcome);
        let rec = self.model.records.get_mut(&id).expect("a known record");
        match outcome {
            // Delivered once the settling thread takes it (`Op::Settle`).
            Outcome::Ok => return Ok(()),
            Outcome::Retry => rec.kept = true,
            Outcome::Refuse => {
                prop_assert_eq!(rec.state, State::Owed, "record {} refused by Kafka, but it was not owed", id);
                rec.state = State::Dropped("message_size_too_large");
                *self.model.counted.entry("message_size_too_large").or_default() += 1;
            }
        }
        Ok(())
    }

    /// Everything in memory is gone; the directory stays, maybe damaged; the agent starts on it.
    async fn crash(&mut self, damage: Damage) -> Result<(), TestCaseError> {
        // A write under way may have dropped (and counted) some of the records in its hands
        // without telling anyone (a writer without acks): the model cannot tell which, only how
        // many, and that they are no more than it holds.
        let writing = matches!(self.agent.spooler, Slot::Busy(..));
        self.stop().await;
        if writing {
            let seen = observe(&self.agent, self.dir.path());
            let in_hands = self
                .model
                .records
                .iter()
                .filter(|(id, rec)| {
                    rec.state == State::Owed
                        && !rec.written
                        && rec.refusal.is_none()
                        && !seen.memory.contains_key(id)
                        && !seen.disk.contains_key(id)
                })
                .count() as u64;
            let counted: u64 = self.model.counted.values().sum();
            let gap = self.metrics.all_drops().saturating_sub(counted);
            prop_assert!(
                gap <= in_hands,
                "{} drops counted that the model cannot place ({} in the writer's hands)",
                gap,
                in_hands
            );
            *self.model.counted.entry("?").or_default() += gap;
        }
        let before: BTreeSet<u64> = scan_dir(self.dir.path()).into_keys().collect();
        let last = std::fs::read_dir(self.dir.path())
            .expect("spool dir")
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "seg"))
            .max();
        // A file cut where a frame ends (or to nothing, or to its header) looks like one that was
        // never written further: what it lost cannot be told from what never was.
        let mut detectable = true;
        if let Some(last) = last {
            let mut data = std::fs::read(&last).expect("segment");
            match damage {
                Damage::None => {}
                Damage::Truncate(at) if !data.is_empty() => {
                    let at = at % data.len();
                    let report = segment::scan(&data);
                    detectable = at != 0 && at != segment::HEADER.len() && report.frames.iter().all(|f| f.end != at);
                    data.truncate(at);
                }
                Damage::Flip(at) if !data.is_empty() => {
                    let at = at % data.len();
                    data[at] ^= 0xFF;
                }
                _ => {}
            }
            std::fs::write(&last, &data).expect("damage");
        }
        let corrupt = self.restart().await;
        *self.model.counted.entry("corrupt").or_default() += corrupt;
        self.crashed = Some(Crashed { before, corrupt, detectable });
        Ok(())
    }

    /// SIGTERM: the agent's drain, in its order (`agent::run`), then a restart.
    async fn shutdown(&mut self, kafka_answers: bool) -> Result<(), TestCaseError> {
        let start = tokio::time::Instant::now();
        let deadline = start + DRAIN;
        // 1. Connections: their pushes may go on for half the drain timeout, then they give up.
        while self.agent.writers.iter().any(|w| w.pushing.as_ref().is_some_and(|p| !p.is_finished()))
            && tokio::time::Instant::now() < start + DRAIN / 2
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.stop_writers().await;
        // 2. The spool writer finishes its write, writes what the connections accepted and seals;
        //    at the deadline it gives up what it could not write.
        let spooler = match std::mem::replace(&mut self.agent.spooler, Slot::Gone) {
            Slot::Idle(spooler) => spooler,
            Slot::Busy(mut handle) => match tokio::time::timeout_at(deadline, &mut handle).await {
                Ok(spooler) => spooler.expect("spool writer step"),
                Err(_) => {
                    self.agent.give_up.cancel();
                    handle.await.expect("spool writer step")
                }
            },
            Slot::Gone => unreachable!("a spool writer is always there"),
        };
        let writer = spooler.into_writer().await;
        let stop = CancellationToken::new();
        stop.cancel();
        let mut task = tokio::spawn(spooler::run(
            self.agent.buffer.clone(),
            writer,
            self.agent.fsync,
            stop,
            self.agent.give_up.clone(),
        ));
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            self.agent.give_up.cancel();
            task.await.expect("spool writer");
        }
        // 3. Ship until Kafka has everything or the deadline passes.
        while kafka_answers && self.agent.buffer.undelivered() > 0 && tokio::time::Instant::now() < deadline {
            self.ship_everything().await?;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if !kafka_answers {
            tokio::time::sleep_until(deadline).await;
        }
        self.agent.give_up.cancel();
        // 4. The producer is closed: it delivers what it can, the rest comes back purged.
        if kafka_answers {
            while !self.agent.kafka.in_flight.is_empty() {
                self.report(0, Outcome::Ok)?;
            }
        }
        self.settle()?;
        self.agent.kafka.retire(false);
        // 5. The final count.
        crate::agent::account(&self.agent.buffer, 0, 0);
        self.restart().await;
        Ok(())
    }

    /// Every record in flight delivered, after every send the shipper has.
    async fn ship_everything(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..64 {
            if !self.agent.send().await {
                break;
            }
        }
        while !self.agent.kafka.in_flight.is_empty() {
            self.report(0, Outcome::Ok)?;
        }
        self.settle()
    }

    /// Stops the agent's tasks: pushes (their connections are gone) and a write under way.
    async fn stop(&mut self) {
        self.stop_writers().await;
        if let Slot::Busy(handle) = std::mem::replace(&mut self.agent.spooler, Slot::Gone) {
            handle.abort();
            let _ = handle.await;
        }
    }

    /// Ends every writer's push (its connection is gone); what it had not pushed never was.
    async fn stop_writers(&mut self) {
        for writer in &mut self.agent.writers {
            if let Some(pushing) = writer.pushing.take() {
                pushing.abort();
                if let Ok(admission) = pushing.await {
                    writer.admission = Some(admission);
                }
            }
        }
        self.collect_pushes();
        for rec in self.model.records.values_mut().filter(|rec| rec.state == State::Pushing) {
            rec.state = State::Unaccepted;
        }
    }

    /// A new run of the agent on the directory (the old one's memory is gone). Records found on
    /// disk are owed again, whatever happened to them before. Returns the corrupt regions found.
    async fn restart(&mut self) -> u64 {
        self.stop().await;
        // The orphans: held in memory, their segment dropped (a crash loses them).
        let seen = observe(&self.agent, self.dir.path());
        for (id, places) in &seen.memory {
            if places.iter().any(|(_, pos)| pos.is_some_and(|pos| self.agent.spool.ledger(pos).is_none()))
                && let Some(rec) = self.model.records.get_mut(id)
            {
                rec.orphan = true;
            }
        }
        let (agent, recovered) = Agent::start(self.case, self.dir.path(), self.model.policy);
        drop(std::mem::replace(&mut self.agent, agent));
        self.model.epoch += 1;
        self.model.issued = [0; 3];
        self.model.shedding = [false; 3];
        for (id, _) in scan_dir(self.dir.path()) {
            let rec = self.model.records.get_mut(&id).expect("a known record");
            rec.state = State::Owed;
            rec.refusal = None;
            rec.unsynced = false;
        }
        recovered.corrupt_regions
    }

    /// How pushes ended; a push not logged did not happen. Also takes back the admission state
    /// of writers whose push ended.
    fn collect_pushes(&mut self) {
        for (id, result) in std::mem::take(&mut *self.log.lock().expect("log")) {
            let rec = self.model.records.get_mut(&id).expect("a known record");
            if rec.state != State::Pushing {
                continue; // Pushed before a restart the model already accounted.
            }
            match result {
                Ok(()) => {
                    rec.state = State::Owed;
                    self.model.shedding[rec.writer] = false;
                }
                Err(reason) => {
                    rec.state = State::Refused(reason);
                    *self.model.counted.entry(reason).or_default() += 1;
                    let allowed = &self.model.policies[rec.writer];
                    let fits = allowed.iter().any(|policy| match policy.when_full {
                        WhenFull::DropNewest => reason == "drop_newest",
                        WhenFull::DropOldest => reason == "drop_oldest",
                        WhenFull::Block => {
                            reason == "block_timeout"
                                && (policy.block_timeout.is_some() || self.model.shedding[rec.writer])
                        }
                    });
                    assert!(fits, "record {id} refused at push with {reason}, under {allowed:?}");
                    if reason == "block_timeout" {
                        self.model.shedding[rec.writer] = true;
                    }
                }
            }
        }
    }

    async fn check(&mut self, step: usize, op: &Op) -> Result<(), TestCaseError> {
        let failures = self.agent.kafka.tasks.failures();
        prop_assert!(failures.is_empty(), "settling failed after {:?}: {:?}", op, failures);
        for writer in &mut self.agent.writers {
            if writer.pushing.as_ref().is_some_and(|pushing| pushing.is_finished()) {
                let pushing = writer.pushing.take().expect("checked");
                writer.admission = Some(pushing.await.expect("push task"));
            }
        }
        self.collect_pushes();
        let crashed = self.crashed.take();
        let seen = observe(&self.agent, self.dir.path());
        let spool = self.agent.spool.clone();
        // A write under way holds the records it has not handed on yet.
        let writing = matches!(self.agent.spooler, Slot::Busy(..));

        // What each writer heard (checked below, once the model knows where each record is).
        let mut refused_now = Vec::new();
        let mut acked_now = Vec::new();
        for (w, writer) in self.agent.writers.iter_mut().enumerate() {
            let Some(tracker) = &writer.tracker else { continue };
            for event in tracker.take_events() {
                match event {
                    AckEvent::Refused { seq, reason } => {
                        let id = self.model.by_seq[&(w, seq, self.model.epoch)];
                        self.model.records.get_mut(&id).expect("known").refusal = Some(reason.as_str());
                        refused_now.push(id);
                    }
                    AckEvent::Upto(upto) => {
                        for seq in writer.upto + 1..=upto {
                            let id = self.model.by_seq[&(w, seq, self.model.epoch)];
                            if self.model.records[&id].refusal.is_none() {
                                acked_now.push((w, seq, id));
                            }
                        }
                        writer.upto = upto;
                    }
                }
            }
        }

        // Where each record is: exactly one place.
        for (id, frames) in &seen.disk {
            prop_assert!(frames.len() == 1, "record {} written twice: {:?} (after {:?})", id, frames, op);
        }
        let (mut held, mut held_bytes, mut orphans, mut on_books) = (0u64, 0usize, 0u64, 0u64);
        let (mut in_writing, mut in_writing_bytes) = (0u64, 0usize);
        let mut vanished = Vec::new();
        for (id, rec) in &mut self.model.records {
            let memory = seen.memory.get(id);
            let frame = seen.disk.get(id).map(|frames| frames[0]);
            let ledger = frame.and_then(|pos| spool.ledger(pos));
            if rec.state != State::Owed {
                prop_assert!(memory.is_none(), "record {} is {:?}, yet in memory: {:?}", id, rec.state, memory);
                prop_assert!(
                    !matches!(ledger, Some(Ledger::DiskOnly | Ledger::InMemory)),
                    "record {} is {:?}, yet the ledger still owes it ({:?})",
                    id,
                    rec.state,
                    ledger
                );
                continue;
            }
            if frame.is_some() {
                rec.written = true;
            }
            if matches!(ledger, Some(Ledger::DiskOnly | Ledger::InMemory)) {
                on_books += 1;
            }
            match memory.map(Vec::as_slice) {
                Some([(place, pos)]) => {
                    held += 1;
                    held_bytes += rec.cost;
                    match pos {
                        None => prop_assert_eq!(*place, "intake", "record {} has no spool position", id),
                        Some(pos) => {
                            rec.written = true;
                            match spool.ledger(*pos) {
                                Some(Ledger::InMemory) => {}
                                None => {
                                    orphans += 1;
                                    rec.orphan = true;
                                }
                                other => prop_assert!(
                                    false,
                                    "record {} is in memory ({}), the ledger says {:?}",
                                    id,
                                    place,
                                    other
                                ),
                            }
                            if let Some(frame) = frame {
                                prop_assert_eq!(frame, *pos, "record {} is not where its position says", id);
                            }
                        }
                    }
                }
                Some(places) => prop_assert!(false, "record {} is in memory twice: {:?} (after {:?})", id, places, op),
                None if ledger == Some(Ledger::DiskOnly) => {}
                None if writing && !rec.written && rec.refusal.is_none() => {
                    in_writing += 1;
                    in_writing_bytes += rec.cost;
                }
                None => vanished.push(*id),
            }
        }

        // Records that left without a delivery report: lost in a crash, or dropped and counted.
        for id in &vanished {
            let rec = self.model.records.get_mut(id).expect("known");
            match &crashed {
                Some(crashed) if crashed.before.contains(id) && crashed.detectable => {
                    rec.state = State::Dropped("corrupt")
                }
                Some(crashed) if crashed.before.contains(id) => rec.state = State::LostInCrash,
                Some(_) => {
                    prop_assert!(
                        !rec.acked || rec.orphan,
                        "record {} was acknowledged, then lost in a crash (it was never on disk)",
                        id
                    );
                    rec.state = State::LostInCrash;
                }
                None => {
                    prop_assert!(!rec.kept, "record {} vanished after a retryable report (counted as dropped)", id);
                    let reason = rec.refusal.unwrap_or("?");
                    rec.state = State::Dropped(reason);
                    *self.model.counted.entry(reason).or_default() += 1;
                }
            }
        }
        if let Some(Crashed { before, corrupt, detectable: true }) = &crashed {
            let damaged = vanished.iter().filter(|id| before.contains(id)).count();
            prop_assert!(damaged == 0 || *corrupt > 0, "{} records lost to damage, none counted corrupt", damaged);
        }

        // No acknowledgement before the record is safe; a refused record is gone.
        for (w, seq, id) in acked_now {
            let rec = self.model.records.get_mut(&id).expect("known");
            rec.acked = true;
            let point = WRITERS[w].expect("an acknowledged writer");
            let durable = match point {
                AckPoint::Delivered => rec.state == State::Delivered,
                AckPoint::Spooled => {
                    rec.state == State::Delivered || (rec.written && !rec.unsynced) || vanished.contains(&id)
                }
            };
            prop_assert!(
                durable,
                "record {} (writer {}, seq {}) acknowledged at {:?} while {:?} (written: {}, fsync failed: {})",
                id,
                w,
                seq,
                point,
                rec.state,
                rec.written,
                rec.unsynced
            );
        }
        for id in &refused_now {
            let rec = &self.model.records[id];
            prop_assert!(
                !matches!(rec.state, State::Owed | State::Delivered),
                "record {} refused ({:?}) but {:?}",
                id,
                rec.refusal,
                rec.state
            );
            if let State::Refused(reason) = rec.state {
                prop_assert_eq!(Some(reason), rec.refusal, "record {} refused at push", id);
            }
        }

        // Counters: every record that left is counted once, with its reason (a write under way
        // may have counted records the model still sees in its hands).
        let drops = self.metrics.all_drops();
        let by_reason = self.metrics.drops();
        let counted: u64 = self.model.counted.values().sum();
        let agrees = if writing { drops >= counted } else { drops == counted };
        prop_assert!(
            agrees,
            "step {} ({:?}): {} drops counted, but the model has {} ({:?})",
            step,
            op,
            drops,
            counted,
            self.model.counted
        );
        for reason in DROP_REASONS {
            let expected = self.model.counted.get(reason).copied().unwrap_or(0);
            prop_assert!(
                by_reason[reason] >= expected,
                "{} drops counted with reason {}, the model knows {} (after {:?})",
                by_reason[reason],
                reason,
                expected,
                op
            );
        }
        prop_assert_eq!(self.metrics.get(telemetry::SHIP_DELIVERED, None), self.model.delivered, "delivered counter");

        // Memory and gauges.
        self.agent.buffer.report();
        let pending = self.agent.writers.iter().filter(|w| w.pushing.is_some()).count();
        let largest = self.agent.buffer.cost(payload(4).len(), 0);
        let gauge_records = self.metrics.get(telemetry::BUFFER_RECORDS, None);
        let gauge_bytes = self.metrics.get(telemetry::BUFFER_BYTES, None) as usize;
        // (Of the records a write under way holds, some may have been dropped already.)
        let (low, high) = (held, held + in_writing + pending as u64);
        prop_assert!(
            (low..=high).contains(&gauge_records),
            "{} {} but {} records are in memory ({} being written, {} pushes waiting) after {:?}",
            telemetry::BUFFER_RECORDS,
            gauge_records,
            held,
            in_writing,
            pending,
            op
        );
        let (low, high) = (held_bytes, held_bytes + in_writing_bytes + pending * largest);
        prop_assert!(
            (low..=high).contains(&gauge_bytes),
            "{} {} but the records in memory cost {} after {:?}",
            telemetry::BUFFER_BYTES,
            gauge_bytes,
            low,
            op
        );
        let capacity = self.metrics.get(telemetry::BUFFER_CAPACITY_BYTES, None) as usize;
        prop_assert!(gauge_bytes <= capacity, "{} bytes held, capacity {}", gauge_bytes, capacity);
        prop_assert!(
            capacity + self.agent.buffer.librdkafka_bytes() <= BUDGET,
            "leases and librdkafka within the budget"
        );
        prop_assert!(
            gauge_records <= self.metrics.get(telemetry::BUFFER_CAPACITY_RECORDS, None),
            "records held within the budget"
        );
        prop_assert_eq!(
            self.metrics.get(telemetry::SPOOL_RECORDS, None),
            on_books,
            "{} after {:?}",
            telemetry::SPOOL_RECORDS,
            op
        );
        prop_assert_eq!(spool.orphaned(), orphans, "orphaned records after {:?}", op);
        for rec in self.model.records.values_mut() {
            rec.kept = false;
        }
        Ok(())
    }

    /// No more operations: everything that waits gets its turn until nothing is owed.
    async fn drain(&mut self, from_step: usize) -> Result<(), TestCaseError> {
        for round in 0..200 {
            let idle = self.agent.writers.iter().all(|w| w.pushing.is_none())
                && matches!(self.agent.spooler, Slot::Idle(_))
                && self.agent.buffer.undelivered() == 0
                && self.agent.kafka.in_flight.is_empty()
                && self.agent.kafka.unsettled.is_empty();
            if idle {
                return Ok(());
            }
            if let Slot::Idle(spooler) = &mut self.agent.spooler {
                spooler.tick().await;
            }
            self.spool();
            self.ship_everything().await?;
            tokio::time::sleep(Duration::from_millis(150)).await;
            self.reap().await?;
            self.check(from_step + round, &Op::Wait(150)).await?;
        }
        prop_assert!(false, "not drained after 200 rounds: {}", self.agent.buffer.describe());
        Ok(())
    }

    fn finish(&mut self) -> Result<(), TestCaseError> {
        if std::env::var("SLUICE_MODEL_STATS").is_ok() {
            let mut states: BTreeMap<String, u64> = BTreeMap::new();
            for rec in self.model.records.values() {
                *states.entry(format!("{:?}", rec.state)).or_default() += 1;
            }
            let acked = self.model.records.values().filter(|rec| rec.acked).count();
            let unsynced = self.model.records.values().filter(|rec| rec.unsynced).count();
            let orphans = self.model.records.values().filter(|rec| rec.orphan).count();
            eprintln!(
                "STATS epochs={} acked={acked} unsynced={unsynced} orphans={orphans} {states:?}",
                self.model.epoch
            );
        }
        for (id, rec) in &self.model.records {
            prop_assert!(
                !matches!(rec.state, State::Owed | State::Pushing),
                "record {} still {:?} after the drain",
                id,
                rec.state
            );
        }
        for (w, writer) in self.agent.writers.iter().enumerate() {
            if writer.tracker.is_some() {
                prop_assert_eq!(writer.upto, self.model.issued[w], "writer {} heard of every record", w);
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(crate::test_support::prop_config(48))]

    #[test]
    fn the_agent_core_agrees_with_its_model_after_every_step(
        case in case(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        run(&case, &ops)?;
    }
}
