//! Issue 13, part 1 (first step): a model-based property test of the spool's ledger.
//!
//! A reference model (plain maps, obviously correct) and the real [`Spool`] (a temp directory,
//! the real writer and reader) are driven by the same random sequence of operations: append,
//! evict to the backlog, read the backlog, deliver, `drop_oldest`, delete finished segments.
//! After every step the ledger must agree with the model: what is owed (`undelivered`,
//! `orphaned`), what the reader hands out (only disk-only records, oldest first, none skipped),
//! what was counted lost (once), and no file deleted while a record in it is owed.
//!
//! Not yet modelled (issue 13 asks for them): acknowledgements, the buffer and spooler tasks,
//! delivery reports from a fake producer, crash and recovery, I/O faults.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// What the model knows of one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Held in memory (just written, or read back from the backlog).
    InMemory,
    /// Only on disk: the backlog owes it.
    DiskOnly,
    /// Delivered, or lost and counted: never handed out again.
    Finished,
}

#[derive(Debug, Clone)]
enum Op {
    /// Writes this many records.
    Append(usize),
    /// Evicts this many of the oldest records held in memory to the backlog.
    Evict(usize),
    /// Reads at most this many records from the backlog.
    Read(usize),
    /// Delivers the record held in memory at this index (modulo how many there are).
    Deliver(usize),
    /// `drop_oldest`, as a full spool under that policy does.
    DropOldest,
    /// Deletes the segments whose records are all finished.
    DeleteDone,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1..12usize).prop_map(Op::Append),
        2 => (1..8usize).prop_map(Op::Evict),
        2 => (1..20usize).prop_map(Op::Read),
        3 => any::<usize>().prop_map(Op::Deliver),
        1 => Just(Op::DropOldest),
        1 => Just(Op::DeleteDone),
    ]
}

struct Model {
    records: BTreeMap<SpoolPos, Held>,
    /// Segments deleted by `drop_oldest` (their in-memory records are orphans).
    dropped: std::collections::BTreeSet<u64>,
    appended: u64,
    delivered: u64,
    /// Counted lost by `drop_oldest` (disk-only records) and by `evicted` (orphans evicted).
    lost: u64,
}

impl Model {
    fn in_memory(&self) -> Vec<SpoolPos> {
        self.records.iter().filter(|(_, held)| **held == Held::InMemory).map(|(pos, _)| *pos).collect()
    }

    fn owed(&self, pos: &SpoolPos) -> bool {
        self.records.get(pos).is_some_and(|held| *held != Held::Finished)
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = SpoolConfig {
        dir: dir.path().to_path_buf(),
        max_bytes: 1 << 30,
        segment_bytes: 256,
        fsync: Fsync::Never,
        max_body: 64 * 1024,
    };
    let (spool, mut writer, _) = Spool::open(config).expect("open");
    let mut reader = spool.reader();
    let mut model = Model { records: BTreeMap::new(), dropped: Default::default(), appended: 0, delivered: 0, lost: 0 };
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Append(n) => {
                let payloads: Vec<Vec<u8>> = (0..*n)
                    .map(|i| format!("record {} of step {step}", model.appended + i as u64).into_bytes())
                    .collect();
                let entries: Vec<Entry<'_>> = payloads
                    .iter()
                    .map(|payload| Entry { ingest_ms: 1_000, topic: None, key: None, payload })
                    .collect();
                let appended = writer.append(&entries);
                prop_assert!(appended.error.is_none());
                prop_assert_eq!(appended.positions.len(), *n);
                for pos in appended.positions {
                    prop_assert!(model.records.insert(pos, Held::InMemory).is_none(), "a position used twice");
                }
                model.appended += *n as u64;
            }
            Op::Evict(n) => {
                let evicted: Vec<SpoolPos> = model.in_memory().into_iter().take(*n).collect();
                let lost = spool.evicted(evicted.iter().map(|pos| (*pos, None)).collect());
                let mut expected_lost = 0;
                for pos in &evicted {
                    if model.dropped.contains(&pos.segment) {
                        // An orphan evicted: it has no segment to go back to.
                        model.records.insert(*pos, Held::Finished);
                        expected_lost += 1;
                    } else {
                        model.records.insert(*pos, Held::DiskOnly);
                    }
                }
                prop_assert_eq!(lost, expected_lost, "evicted orphans are counted lost once");
                model.lost += lost;
            }
            Op::Read(max) => {
                let Some(from) = spool.backlog() else { continue };
                let batch = reader.read(from, writer.end(), *max, usize::MAX).expect("read");
                prop_assert_eq!(batch.corrupt_records, 0);
                let mut last = None;
                for record in &batch.records {
                    let held = model.records.get(&record.pos).copied();
                    prop_assert_eq!(held, Some(Held::DiskOnly), "the reader hands out only disk-only records");
                    prop_assert!(last < Some(record.pos), "oldest first");
                    last = Some(record.pos);
                    model.records.insert(record.pos, Held::InMemory);
                }
                // None skipped: every disk-only record before where the read stopped was read.
                if let Some(next) = batch.next {
                    let skipped = model.records.iter().find(|(pos, held)| **pos < next && **held == Held::DiskOnly);
                    prop_assert!(skipped.is_none(), "a disk-only record was skipped: {:?}", skipped);
                }
            }
            Op::Deliver(i) => {
                let held = model.in_memory();
                if held.is_empty() {
                    continue;
                }
                let pos = held[i % held.len()];
                let _ = spool.done(pos);
                model.records.insert(pos, Held::Finished);
                model.delivered += 1;
            }
            Op::DropOldest => {
                let sealed: Option<u64> = model
                    .records
                    .keys()
                    .map(|pos| pos.segment)
                    .filter(|segment| *segment < writer.end().segment && !model.dropped.contains(segment))
                    .find(|segment| {
                        // Still on the books: not deleted as done.
                        spool.lock().segments.contains_key(segment)
                    });
                let dropped = spool.drop_oldest();
                prop_assert_eq!(dropped.map(|d| d.segment), sealed, "the oldest sealed segment goes");
                if let Some(dropped) = dropped {
                    let mut expected_lost = 0;
                    for (_, held) in model.records.iter_mut().filter(|(pos, _)| pos.segment == dropped.segment) {
                        if *held == Held::DiskOnly {
                            *held = Held::Finished;
                            expected_lost += 1;
                        }
                    }
                    prop_assert_eq!(dropped.lost, expected_lost, "its disk-only records are counted lost");
                    model.lost += dropped.lost;
                    model.dropped.insert(dropped.segment);
                }
            }
            Op::DeleteDone => {
                spool.delete_done();
            }
        }
        // The ledger agrees with the model after every step.
        let owed_on_books = model
            .records
            .iter()
            .filter(|(pos, held)| **held != Held::Finished && !model.dropped.contains(&pos.segment));
        prop_assert_eq!(spool.undelivered(), owed_on_books.count() as u64, "undelivered after {:?}", op);
        let orphans = model
            .records
            .iter()
            .filter(|(pos, held)| **held == Held::InMemory && model.dropped.contains(&pos.segment))
            .count() as u64;
        prop_assert_eq!(spool.orphaned(), orphans, "orphaned after {:?}", op);
        let open = model.records.values().filter(|held| **held != Held::Finished).count() as u64;
        prop_assert_eq!(model.appended, model.delivered + model.lost + open, "every record once");
        // No file deleted while a record in it is owed (dropped segments excepted: counted).
        for pos in model.records.keys().filter(|pos| model.owed(pos) && !model.dropped.contains(&pos.segment)) {
            prop_assert!(segment_path(dir.path(), pos.segment).exists(), "segment {} deleted while owed", pos.segment);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(crate::test_support::prop_config(256))]

    #[test]
    fn the_spool_ledger_agrees_with_its_model_after_every_step(ops in proptest::collection::vec(op(), 1..120)) {
        run(&ops)?;
    }
}
