//! Set and subset digests past a tiny memory budget: the same verdicts as in memory, the spill
//! files gone on every exit path. Its own test binary (its own process): the budget it sets is
//! process-wide.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use _grader::compare::{gold_digest, grade, grade_against, Outcome};
use _grader::digest::{Digest, DigestSpec, GoldKeys, ResolvedMethod, SubsetOp};
use _grader::error::GradeError;
use _grader::guard::{Budget, GuardedConnection};
use _grader::spill::{set_grade_memory, spill_usage, GradeMemory, MIN_MEMORY_BYTES};

const ROWS: i64 = 120_000;

/// t(a, b): a = 0..ROWS distinct, b = a % 7 (so `SELECT b` has 7 distinct rows).
fn database(dir: &std::path::Path) -> GuardedConnection {
    let path = dir.join("s.sqlite");
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch(&format!(
        "CREATE TABLE t(a INTEGER, b INTEGER);
         WITH RECURSIVE n(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM n WHERE x + 1 < {ROWS})
         INSERT INTO t SELECT x, x % 7 FROM n;"
    ))
    .unwrap();
    drop(c);
    GuardedConnection::open(path.to_str().unwrap(), true).unwrap()
}

fn spec(method: ResolvedMethod) -> DigestSpec {
    DigestSpec {
        method,
        float_digits: Some(12),
        column_order: Default::default(),
        row_limit: None,
    }
}

fn files_in(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// One test: the budget is process-wide, so the cases run in order under it.
#[test]
fn set_and_subset_past_the_budget() {
    let db_dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let gc = database(db_dir.path());
    let budget = Budget::new(60.0);
    let subset = |op, n| ResolvedMethod::Subset { op, n };
    let cases: Vec<(&str, &str, ResolvedMethod, Outcome)> = vec![
        // 120,000 distinct rows, twice over in another order: equal as sets.
        (
            "SELECT a, b FROM t UNION ALL SELECT a, b FROM t ORDER BY b, a DESC",
            "SELECT a, b FROM t",
            ResolvedMethod::Set,
            Outcome::Match,
        ),
        // One row changed among 120,000.
        (
            "SELECT CASE a WHEN 77777 THEN -1 ELSE a END, b FROM t",
            "SELECT a, b FROM t",
            ResolvedMethod::Set,
            Outcome::Mismatch,
        ),
        // One row missing.
        (
            "SELECT a, b FROM t WHERE a <> 5",
            "SELECT a, b FROM t",
            ResolvedMethod::Set,
            Outcome::Mismatch,
        ),
        // Few distinct rows out of many.
        (
            "SELECT b FROM t",
            "SELECT DISTINCT b FROM t",
            ResolvedMethod::Set,
            Outcome::Match,
        ),
        // Subset against a gold of 120,000 distinct rows (past the budget: kept on disk).
        (
            "SELECT a, b FROM t WHERE a % 2 = 0",
            "SELECT a, b FROM t",
            subset(SubsetOp::AtLeast, 50_000),
            Outcome::Match,
        ),
        (
            "SELECT a, b FROM t WHERE a % 2 = 0",
            "SELECT a, b FROM t",
            subset(SubsetOp::Exactly, 50_000),
            Outcome::Mismatch,
        ),
        (
            "SELECT a, b FROM t WHERE a < 10 UNION ALL SELECT a, b FROM t WHERE a < 10",
            "SELECT a, b FROM t",
            subset(SubsetOp::Exactly, 10),
            Outcome::Match,
        ),
        (
            "SELECT a + 1, b FROM t",
            "SELECT a, b FROM t",
            subset(SubsetOp::AtLeast, 10),
            Outcome::Mismatch,
        ),
    ];
    let mut in_memory = Vec::new();
    for (pred, gold, method, _) in &cases {
        in_memory.push(
            grade(&gc, pred, gold, spec(*method), &budget)
                .unwrap()
                .outcome,
        );
    }
    assert_eq!(
        in_memory,
        cases.iter().map(|c| c.3).collect::<Vec<_>>(),
        "in memory"
    );

    set_grade_memory(GradeMemory {
        bytes: MIN_MEMORY_BYTES,
        tmp_dir: Some(tmp.path().to_path_buf()),
    })
    .unwrap();
    let (_, peak_before) = spill_usage();
    for (pred, gold, method, expect) in &cases {
        let v = grade(&gc, pred, gold, spec(*method), &budget).unwrap();
        assert_eq!(
            v.outcome, *expect,
            "{pred} vs {gold} under {method:?}: {v:?}"
        );
        assert_eq!(files_in(tmp.path()), 0);
    }
    let (now, peak) = spill_usage();
    assert_eq!(now, 0, "every spill file is gone");
    assert!(
        peak > peak_before && peak >= 16 * 100_000,
        "the grades spilled: {peak}"
    );

    // A subset gold past the budget keeps its keys on disk; as bytes it carries its SQL, and
    // a grade against those bytes collects the keys again.
    let gold = gold_digest(
        &gc,
        "SELECT a, b FROM t",
        spec(subset(SubsetOp::AtLeast, 3)),
        &budget,
    )
    .unwrap();
    assert!(matches!(
        gold.gold_keys.as_deref(),
        Some(GoldKeys::Spilled { .. })
    ));
    let bytes = gold.to_bytes().unwrap();
    assert!(bytes.len() < 200, "{} bytes", bytes.len());
    let back = Digest::from_bytes(&bytes).unwrap();
    assert!(back.gold_keys.is_none() && back.gold_sql.is_some());
    let pred = "SELECT a, b FROM t WHERE a IN (1, 2, 3)";
    _grader::spill::reset_spill_peak();
    assert_eq!(
        grade_against(&gc, pred, &back, &budget).unwrap().outcome,
        Outcome::Match
    );
    assert_eq!(
        grade_against(&gc, "SELECT a, b + 1 FROM t LIMIT 3", &back, &budget)
            .unwrap()
            .outcome,
        Outcome::Mismatch
    );
    // The second grade found the keys the first recollected: at most the gold's own keys and
    // one recollection were ever on disk at once.
    let keys = 16 * ROWS as u64;
    assert_eq!(spill_usage(), (2 * keys, 2 * keys));

    // A cancel while a large set grade runs (stepping, spilling or counting): Cancelled, and
    // nothing left behind.
    let flag = Arc::new(AtomicBool::new(false));
    let cancel = Budget {
        cancel: Some(Arc::clone(&flag)),
        ..Budget::new(60.0)
    };
    let flipper = {
        let flag = Arc::clone(&flag);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            flag.store(true, Ordering::Relaxed);
        })
    };
    let big = "SELECT x.a, y.a FROM t x, (SELECT a FROM t LIMIT 100) y";
    let r = grade(&gc, big, big, spec(ResolvedMethod::Set), &cancel);
    flipper.join().unwrap();
    assert!(matches!(r, Err(GradeError::Cancelled)), "{r:?}");
    // A deadline the same way: a timeout, as an outcome of the gold.
    let v = grade(&gc, big, big, spec(ResolvedMethod::Set), &Budget::new(0.2)).unwrap();
    assert_eq!(v.outcome, Outcome::GoldTimeout, "{v:?}");
    assert_eq!(files_in(tmp.path()), 0);
    // The spilled subset gold still holds its keys, anonymously; dropped, they are gone, and
    // only the recollected copy (kept for the next grade of that gold) is left.
    assert_eq!(spill_usage().0, 2 * keys);
    drop(gold);
    assert_eq!(spill_usage().0, keys);
}
