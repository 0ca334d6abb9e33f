//! The soak's fault schedule: drawn from a seed (printed, replayable with `--seed`), as rounds of
//! every fault kind in a shuffled order, so even a short run injects each kind; faults on
//! different targets overlap, faults on the same target wait for each other.

use std::time::Duration;

/// Every fault the soak injects. The target is part of the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// SIGKILL the durable agent (disk spool, `fsync = "always"`, acked writers), start it again.
    KillAgent,
    /// SIGTERM an agent under load: it drains, reports its final counts, starts again.
    TermAgent(usize),
    /// SIGKILL a persister, start it again.
    KillPersister(usize),
    /// SIGSTOP a persister longer than the group's session timeout, then SIGCONT.
    PausePersister(usize),
    /// SIGKILL the broker, start it again on its data.
    KillBroker,
    /// `pg_ctl stop -m immediate`, then start.
    CrashPostgres,
    /// Hold an exclusive lock on `logs`: every insert waits.
    StallPostgres,
    /// Cut the persisters' connections to PostgreSQL at a proxy, and refuse new ones.
    CutPostgres,
    /// Fill the durable agent's spool disk (a small tmpfs), then free it.
    FillDisk,
    /// Rewrite an agent's config (policy, block timeout, producer linger): a live reload.
    ReloadAgent(usize),
    /// Rewrite the persisters' batch size: a live reload.
    ReloadPersisters,
}

impl Kind {
    /// The name in the soak's table.
    pub fn name(self) -> &'static str {
        match self {
            Kind::KillAgent => "sigkill_agent",
            Kind::TermAgent(_) => "sigterm_agent",
            Kind::KillPersister(_) => "sigkill_persister",
            Kind::PausePersister(_) => "sigstop_persister",
            Kind::KillBroker => "sigkill_broker",
            Kind::CrashPostgres => "crash_postgres",
            Kind::StallPostgres => "stall_postgres",
            Kind::CutPostgres => "cut_postgres_connection",
            Kind::FillDisk => "fill_spool_disk",
            Kind::ReloadAgent(_) => "reload_agent",
            Kind::ReloadPersisters => "reload_persisters",
        }
    }

    /// What it holds: faults with one target run one at a time.
    pub fn target(self) -> &'static str {
        match self {
            Kind::KillAgent | Kind::FillDisk => "agent0",
            Kind::TermAgent(0) | Kind::ReloadAgent(0) => "agent0",
            Kind::TermAgent(1) | Kind::ReloadAgent(1) => "agent1",
            Kind::TermAgent(_) | Kind::ReloadAgent(_) => "agent2",
            Kind::KillPersister(0) | Kind::PausePersister(0) => "persister0",
            Kind::KillPersister(1) | Kind::PausePersister(1) => "persister1",
            Kind::KillPersister(_) | Kind::PausePersister(_) => "persister2",
            Kind::ReloadPersisters => "persisters",
            Kind::KillBroker => "broker",
            Kind::CrashPostgres | Kind::StallPostgres => "postgres",
            Kind::CutPostgres => "proxy",
        }
    }
}

/// One fault: when it starts (from the soak's start), what, and how long the fault lasts before
/// it is healed (a restart, SIGCONT, unlock, restore, free).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub at: Duration,
    pub kind: Kind,
    pub lasts: Duration,
    /// A choice the fault makes (which config change, how many bytes to leave on the disk).
    pub variant: u64,
}

/// splitmix64: small, seedable, and the same on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high` milliseconds.
    pub fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = (high - low).as_millis() as u64 + 1;
        low + Duration::from_millis(self.next() % span)
    }
}

/// The schedule for a run: faults start from `first` until `window` ends, `gap` apart (drawn
/// between its bounds), each round a shuffled deck of every kind.
pub fn schedule(seed: u64, first: Duration, window: Duration, gap: (Duration, Duration), short: bool) -> Vec<Fault> {
    let mut rng = Rng::new(seed);
    let deck = [
        Kind::KillAgent,
        Kind::TermAgent(0),
        Kind::TermAgent(1),
        Kind::TermAgent(2),
        Kind::KillPersister(0),
        Kind::KillPersister(1),
        Kind::KillPersister(2),
        Kind::PausePersister(0),
        Kind::PausePersister(2),
        Kind::KillBroker,
        Kind::CrashPostgres,
        Kind::StallPostgres,
        Kind::CutPostgres,
        Kind::FillDisk,
        Kind::ReloadAgent(0),
        Kind::ReloadAgent(1),
        Kind::ReloadAgent(2),
        Kind::ReloadPersisters,
    ];
    let mut faults = Vec::new();
    let mut at = first;
    'rounds: loop {
        let mut round = deck.to_vec();
        for i in (1..round.len()).rev() {
            round.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        for kind in round {
            if at >= window {
                break 'rounds;
            }
            let secs = Duration::from_secs;
            let lasts = match (kind, short) {
                (Kind::PausePersister(_), _) => rng.between(secs(8), secs(11)),
                (Kind::KillBroker, true) => rng.between(secs(1), secs(4)),
                (Kind::KillBroker, false) => rng.between(secs(2), secs(30)),
                (Kind::ReloadAgent(_) | Kind::ReloadPersisters, _) => Duration::ZERO,
                (_, true) => rng.between(secs(1), secs(5)),
                (_, false) => rng.between(secs(1), secs(20)),
            };
            faults.push(Fault { at, kind, lasts, variant: rng.next() });
            at += rng.between(gap.0, gap.1);
        }
    }
    faults
}

#[test]
fn a_seed_gives_the_same_schedule_and_a_short_run_has_every_kind() {
    let secs = Duration::from_secs;
    let one = schedule(7, secs(5), secs(80), (secs(1), secs(3)), true);
    assert_eq!(one, schedule(7, secs(5), secs(80), (secs(1), secs(3)), true));
    assert_ne!(one, schedule(8, secs(5), secs(80), (secs(1), secs(3)), true));
    let kinds: std::collections::BTreeSet<&str> = one.iter().map(|f| f.kind.name()).collect();
    assert_eq!(kinds.len(), 11, "{kinds:?}");
}
