use super::*;

fn row(n: i64) -> Row {
    let bytes = format!(r#"{{"v":1,"id":"i-{n}","ingest_time":"2026-11-30T01:02:03Z","format":"json","record":{{}}}}"#);
    match row::parse(Some(bytes.as_bytes()), Origin { topic: "t".into(), partition: 0, offset: n }) {
        Parsed::Row(row) => *row,
        Parsed::Dead(letter) => panic!("{letter:?}"),
    }
}

fn letter(n: i64) -> DeadLetter {
    DeadLetter::new(Origin { topic: "t".into(), partition: 0, offset: n }, "malformed_envelope", "x", None)
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
