use super::lanes::{Batch, BatchLimits, Part, add_closing};
use super::*;
use crate::persist::row::{DeadLetter, Origin, Parsed, Row};
use crate::telemetry::outcome::DeadLetterReason;

fn row(n: i64) -> Row {
    let bytes = format!(r#"{{"v":1,"id":"i-{n}","ingest_time":"2026-11-30T01:02:03Z","format":"json","record":{{}}}}"#);
    match row::parse(Some(bytes.as_bytes()), Origin { topic: "t".into(), partition: 0, offset: n }) {
        Parsed::Row(row) => *row,
        Parsed::Dead(letter) => panic!("{letter:?}"),
    }
}

fn letter(n: i64) -> DeadLetter {
    DeadLetter::new(
        Origin { topic: "t".into(), partition: 0, offset: n },
        DeadLetterReason::MalformedEnvelope,
        "x",
        None,
    )
}

fn offsets(part: &Part) -> Vec<i64> {
    part.rows.iter().map(|row| row.origin.offset).chain(part.dead.iter().map(|letter| letter.origin.offset)).collect()
}

#[test]
fn a_refused_part_splits_into_two_non_empty_halves_that_keep_every_message() {
    for (rows, letters) in [(2, 0), (0, 2), (1, 1), (5, 0), (3, 4), (1, 6), (7, 1)] {
        let part = Part { rows: (0..rows).map(row).collect(), dead: (rows..rows + letters).map(letter).collect() };
        let all = offsets(&part);
        let (left, right) = part.halves();
        assert!(left.len() > 0 && right.len() > 0, "{rows} rows, {letters} letters");
        assert!(left.len().abs_diff(right.len()) <= 1);
        let mut together = offsets(&left);
        together.extend(offsets(&right));
        together.sort_unstable();
        assert_eq!(together, all);
    }
}

fn parsed(n: i64) -> (Parsed, Origin) {
    (Parsed::Row(Box::new(row(n))), Origin { topic: "t".into(), partition: 0, offset: n })
}

fn add(batch: &mut Batch, n: i64, bytes: usize, limits: BatchLimits) -> Vec<Vec<i64>> {
    let (parsed, origin) = parsed(n);
    let closed = add_closing(batch, parsed, &origin, bytes, limits);
    closed.iter().map(|batch| batch.rows.iter().map(|row| row.origin.offset).collect()).collect()
}

#[test]
fn a_batch_closes_on_bytes_before_the_message_that_would_pass_the_cap_and_a_larger_message_goes_alone() {
    let limits = BatchLimits { records: 100, bytes: 100 };
    let mut batch = Batch::default();
    assert!(add(&mut batch, 0, 40, limits).is_empty());
    assert!(add(&mut batch, 1, 40, limits).is_empty());
    // 80 + 40 > 100: the batch in hand closes; the message starts the next one.
    assert_eq!(add(&mut batch, 2, 40, limits), vec![vec![0, 1]]);
    assert_eq!((batch.len(), batch.bytes), (1, 40));
    // Reaching the cap exactly closes the batch with the message in it.
    assert_eq!(add(&mut batch, 3, 60, limits), vec![vec![2, 3]]);
    assert_eq!((batch.len(), batch.bytes, batch.started), (0, 0, None));
    // A message larger than the cap is written alone, never held back...
    assert_eq!(add(&mut batch, 4, 500, limits), vec![vec![4]]);
    // ...also when a batch is in hand: that one closes first, in order.
    assert!(add(&mut batch, 5, 10, limits).is_empty());
    assert_eq!(add(&mut batch, 6, 500, limits), vec![vec![5], vec![6]]);
    assert_eq!(batch.len(), 0);
}

#[test]
fn a_batch_still_closes_on_records_below_the_byte_cap() {
    let limits = BatchLimits { records: 2, bytes: 1 << 20 };
    let mut batch = Batch::default();
    assert!(add(&mut batch, 0, 10, limits).is_empty());
    assert_eq!(add(&mut batch, 1, 10, limits), vec![vec![0, 1]]);
}

/// Found by a fault test under CI load (the consumer lag read 0 for both partitions 30 s into a
/// PostgreSQL outage): a partition whose watermarks could not be fetched in one measurement was
/// reported as no lag, exactly when the lag matters. It keeps its last figure; only a partition
/// no longer assigned goes to 0.
#[test]
fn a_partition_whose_lag_could_not_be_measured_keeps_its_last_figure() {
    use std::collections::{BTreeSet, HashMap};
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let clock = consumer::LagClock::default();
    metrics::with_local_recorder(&recorder, || {
        let t = |partition: i32| ("t".to_string(), partition);
        clock.report(
            &HashMap::from([(t(0), 500), (t(1), 700), (("u".to_string(), 0), 300)]),
            &BTreeSet::from([t(0), t(1), ("u".to_string(), 0)]),
        );
        // Partition 0 was revoked; partition 1's watermarks did not come this time.
        clock.report(&HashMap::new(), &BTreeSet::from([t(1), ("u".to_string(), 0)]));
    });
    let text = handle.render();
    let gauge = |topic: &str, partition: &str| {
        let series =
            format!("{}{{topic=\"{topic}\",partition=\"{partition}\"}} ", crate::telemetry::PERSIST_LAG_RECORDS);
        text.lines().find_map(|line| line.strip_prefix(series.as_str())).map(str::to_string)
    };
    assert_eq!(gauge("t", "1").as_deref(), Some("700"), "{text}");
    assert_eq!(gauge("t", "0").as_deref(), Some("0"), "{text}");
    assert_eq!(gauge("u", "0").as_deref(), Some("300"), "another topic's partition 0 is its own: {text}");
}

/// Found by the cold review of the fix above: a partition revoked and later given back measured
/// its lag from the offset this persister had stored before, for ever if it had gone idle.
#[test]
fn a_revoked_partition_forgets_what_this_persister_stored_for_it() {
    let clock = consumer::LagClock::default();
    clock.stored(&std::collections::BTreeMap::from([(("t".to_string(), 0), 100), (("t".to_string(), 1), 200)]));
    clock.forget([("t".to_string(), 0)].into_iter());
    assert_eq!(clock.next_offset(&("t".to_string(), 0)), None, "measured from the group's commit once given back");
    assert_eq!(clock.next_offset(&("t".to_string(), 1)), Some(200));
}
