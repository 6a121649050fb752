//! Verdicts on a small real database: every method, its messages, early exits, failures of either
//! query.

use super::*;
use crate::digest::resolve_method;

/// Six rows, five distinct: (1, a) … (5, e), and (5, e) once more.
fn fixture() -> (tempfile::TempDir, GuardedConnection) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.sqlite");
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch(
        "CREATE TABLE t(id INTEGER, name TEXT);
         INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd'), (5, 'e'), (5, 'e');",
    )
    .unwrap();
    drop(c);
    let gc = GuardedConnection::open(path.to_str().unwrap(), true).unwrap();
    (dir, gc)
}

fn verdict(
    gc: &GuardedConnection,
    pred: &str,
    gold: &str,
    method: &str,
    order: ColumnOrder,
) -> Verdict {
    let spec = spec(resolve_method(Some(gold), method).unwrap(), Some(12), order);
    grade(gc, pred, gold, spec, &Budget::new(10.0)).unwrap()
}

#[test]
fn subset_verdicts_say_why() {
    let (_d, gc) = fixture();
    let gold = "SELECT id, name FROM t";
    let v = |pred: &str, method: &str| judged(&gc, pred, gold, method);
    assert_eq!(
        v("SELECT id, name FROM t WHERE id IN (1, 3, 5)", "subset,=,3"),
        (
            Outcome::Match,
            "3 distinct rows, each a gold row (subset,=,3)".into()
        )
    );
    // Duplicates of a gold row count once.
    assert_eq!(
        v("SELECT id, name FROM t WHERE id = 5", "subset,=,1").0,
        Outcome::Match
    );
    assert_eq!(
        v("SELECT id, name FROM t WHERE id < 3", "subset,=,3"),
        (
            Outcome::Mismatch,
            "2 distinct rows, need 3 (subset,=,3)".into()
        )
    );
    assert_eq!(
        v("SELECT id, name FROM t", "subset,=,3"),
        (
            Outcome::Mismatch,
            "more than 3 distinct gold rows (subset,=,3)".into()
        )
    );
    assert_eq!(
        v("SELECT id, upper(name) FROM t LIMIT 3", "subset,=,3"),
        (
            Outcome::Mismatch,
            "a row that is not in the gold (subset,=,3)".into()
        )
    );
    assert_eq!(v("SELECT id, name FROM t", "subset,>=,3").0, Outcome::Match);
    assert_eq!(
        v("SELECT id, name FROM t LIMIT 2", "subset,>=,3"),
        (
            Outcome::Mismatch,
            "2 distinct rows, need at least 3 (subset,>=,3)".into()
        )
    );
    // N above the gold's distinct rows (5): every gold row is needed.
    assert_eq!(
        v("SELECT DISTINCT id, name FROM t", "subset,=,10").0,
        Outcome::Match
    );
    assert_eq!(
        v("SELECT id FROM t", "subset,=,3"),
        (Outcome::Mismatch, "column count 1 vs 2 (subset,=,3)".into())
    );
}

#[test]
fn list_is_ordered_and_column_order_can_be_ignored() {
    let (_d, gc) = fixture();
    let gold = "SELECT id, name FROM t ORDER BY id";
    let reversed = "SELECT id, name FROM t ORDER BY id DESC";
    assert_eq!(
        verdict(&gc, reversed, gold, "list", ColumnOrder::Strict).detail,
        "same rows in a different order (ordered)"
    );
    assert_eq!(
        verdict(&gc, reversed, gold, "multiset", ColumnOrder::Strict).outcome,
        Outcome::Match
    );
    let swapped = "SELECT name, id FROM t ORDER BY id";
    assert_eq!(
        verdict(&gc, swapped, gold, "list", ColumnOrder::Strict).outcome,
        Outcome::Mismatch
    );
    let v = verdict(&gc, swapped, gold, "list", ColumnOrder::Ignore);
    assert_eq!(
        (v.outcome, v.detail.as_str()),
        (
            Outcome::Match,
            "6 rows match (ordered; columns in any order)"
        )
    );
    // A bare subset is the least a subset asks: at least one distinct gold row.
    assert_eq!(
        resolve_method(Some(gold), "subset").unwrap(),
        ResolvedMethod::Subset {
            op: SubsetOp::AtLeast,
            n: 1
        }
    );
    assert!(matches!(
        resolve_method(Some(gold), "subset,<,3"),
        Err(GradeError::Invalid(_))
    ));
}

fn spec(method: ResolvedMethod, float_digits: Option<u32>, order: ColumnOrder) -> DigestSpec {
    DigestSpec {
        method,
        float_digits,
        column_order: order,
        row_limit: None,
    }
}

/// (outcome, detail) of `pred` against `gold` under `method`, columns in order.
fn judged(gc: &GuardedConnection, pred: &str, gold: &str, method: &str) -> (Outcome, String) {
    let v = verdict(gc, pred, gold, method, ColumnOrder::Strict);
    (v.outcome, v.detail)
}

const GOLD: &str = "SELECT id, name FROM t";

#[test]
fn multiset_ignores_row_order_and_counts_duplicates() {
    let (_d, gc) = fixture();
    let v = verdict(
        &gc,
        "SELECT id, name FROM t ORDER BY id DESC",
        GOLD,
        "multiset",
        ColumnOrder::Strict,
    );
    assert_eq!(
        (v.outcome, v.detail.as_str()),
        (Outcome::Match, "6 rows match (multiset)")
    );
    assert_eq!((v.pred_rows, v.gold_rows), (Some(6), Some(6)));
    assert_eq!(v.pred_digest.map(|d| d.rows), Some(6));
    // The duplicate (5, e) counts: without it the counts differ.
    assert_eq!(
        judged(&gc, "SELECT DISTINCT id, name FROM t", GOLD, "multiset"),
        (Outcome::Mismatch, "row count 5 vs 6 (multiset)".into())
    );
    // Same count, other rows: (1, a) twice more instead of (5, e) twice.
    assert_eq!(
        judged(
            &gc,
            "SELECT id, name FROM t WHERE id < 5 UNION ALL SELECT 1, 'a' UNION ALL SELECT 1, 'a'",
            GOLD,
            "multiset"
        ),
        (
            Outcome::Mismatch,
            "same row count (6), different rows (multiset)".into()
        )
    );
    // TEXT is compared exactly.
    assert_eq!(
        judged(&gc, "SELECT id, upper(name) FROM t", GOLD, "multiset").0,
        Outcome::Mismatch
    );
}

#[test]
fn a_prediction_with_more_rows_than_the_gold_stops_early() {
    let (_d, gc) = fixture();
    let v = verdict(
        &gc,
        "SELECT a.id, a.name FROM t AS a, t AS b, t AS c",
        GOLD,
        "multiset",
        ColumnOrder::Strict,
    );
    assert_eq!(
        (v.outcome, v.detail.as_str()),
        (
            Outcome::Mismatch,
            "row count >6 vs 6 (stopped early) (multiset)"
        )
    );
    assert_eq!(v.pred_rows, None);
    assert!(v.pred_digest.is_none());
}

#[test]
fn subset_counts_distinct_gold_rows_against_n() {
    let (_d, gc) = fixture();
    // (3, c), (4, d), (5, e) twice: three distinct rows.
    assert_eq!(
        judged(
            &gc,
            "SELECT id, name FROM t WHERE id >= 3",
            GOLD,
            "subset,=,3"
        ),
        (
            Outcome::Match,
            "3 distinct rows, each a gold row (subset,=,3)".into()
        )
    );
    // Exactly N: the N+1st distinct row stops the prediction early.
    let v = verdict(
        &gc,
        "SELECT id, name FROM t WHERE id < 5",
        GOLD,
        "subset,=,3",
        ColumnOrder::Strict,
    );
    assert_eq!(
        (v.outcome, v.detail.as_str(), v.pred_rows),
        (
            Outcome::Mismatch,
            "more than 3 distinct gold rows (subset,=,3)",
            None
        )
    );
    // At least N: exactly N and more than N both match.
    assert_eq!(
        judged(&gc, "SELECT id, name FROM t LIMIT 3", GOLD, "subset,>=,3"),
        (
            Outcome::Match,
            "3 distinct rows, each a gold row (subset,>=,3)".into()
        )
    );
    assert_eq!(
        judged(
            &gc,
            "SELECT id, name FROM t WHERE id > 1",
            GOLD,
            "subset,>=,3"
        ),
        (
            Outcome::Match,
            "4 distinct rows, each a gold row (subset,>=,3)".into()
        )
    );
    assert_eq!(
        judged(
            &gc,
            "SELECT id, name FROM t UNION ALL SELECT 9, 'z'",
            GOLD,
            "subset,>=,3"
        ),
        (
            Outcome::Mismatch,
            "a row that is not in the gold (subset,>=,3)".into()
        )
    );
}

#[test]
fn set_ignores_duplicates_and_row_order() {
    let (_d, gc) = fixture();
    assert_eq!(
        judged(
            &gc,
            "SELECT DISTINCT id, name FROM t ORDER BY name DESC",
            GOLD,
            "set"
        ),
        (Outcome::Match, "5 rows match (set)".into())
    );
    // Every row twice more: still the same set.
    assert_eq!(
        judged(
            &gc,
            "SELECT id, name FROM t UNION ALL SELECT id, name FROM t",
            GOLD,
            "set"
        )
        .0,
        Outcome::Match
    );
    assert_eq!(
        judged(&gc, "SELECT id, name FROM t WHERE id < 5", GOLD, "set"),
        (Outcome::Mismatch, "distinct row count 4 vs 5 (set)".into())
    );
    assert_eq!(
        judged(
            &gc,
            "SELECT id, name FROM t WHERE id <> 3 UNION ALL SELECT 9, 'z'",
            GOLD,
            "set"
        ),
        (
            Outcome::Mismatch,
            "same distinct row count (5), different rows (set)".into()
        )
    );
}

#[test]
fn ordered_needs_the_gold_order() {
    let (_d, gc) = fixture();
    let gold = "SELECT id, name FROM t ORDER BY id";
    assert_eq!(
        judged(
            &gc,
            "SELECT id, name FROM t ORDER BY id, name",
            gold,
            "ordered"
        ),
        (Outcome::Match, "6 rows match (ordered)".into())
    );
    assert_eq!(
        judged(
            &gc,
            "SELECT id, name FROM t ORDER BY id DESC",
            gold,
            "ordered"
        ),
        (
            Outcome::Mismatch,
            "same rows in a different order (ordered)".into()
        )
    );
    assert_eq!(
        judged(
            &gc,
            "SELECT id, upper(name) FROM t ORDER BY id",
            gold,
            "ordered"
        ),
        (
            Outcome::Mismatch,
            "same row count (6), different rows (ordered)".into()
        )
    );
}

#[test]
fn another_column_count_is_a_mismatch_under_every_method() {
    let (_d, gc) = fixture();
    for (method, note) in [
        ("multiset", "multiset"),
        ("set", "set"),
        ("list", "ordered"),
        ("subset,>=,2", "subset,>=,2"),
    ] {
        let v = verdict(
            &gc,
            "SELECT id, name, id FROM t",
            GOLD,
            method,
            ColumnOrder::Ignore,
        );
        assert_eq!(
            (v.outcome, v.detail),
            (
                Outcome::Mismatch,
                format!("column count 3 vs 2 ({note}; columns in any order)")
            ),
            "{method}"
        );
        assert_eq!(v.pred_rows, None);
    }
}

#[test]
fn ignoring_column_order_keeps_each_row_whole() {
    let (_d, gc) = fixture();
    let swapped = "SELECT name, id FROM t";
    for (method, matched) in [("multiset", "6 rows match"), ("set", "5 rows match")] {
        assert_eq!(
            judged(&gc, swapped, GOLD, method).0,
            Outcome::Mismatch,
            "{method}"
        );
        let v = verdict(&gc, swapped, GOLD, method, ColumnOrder::Ignore);
        assert_eq!(
            (v.outcome, v.detail),
            (
                Outcome::Match,
                format!("{matched} ({method}; columns in any order)")
            )
        );
    }
    // The same cells, regrouped into other rows, are other rows.
    let v = verdict(
        &gc,
        "VALUES (1, 4), (3, 2)",
        "VALUES (1, 2), (3, 4)",
        "multiset",
        ColumnOrder::Ignore,
    );
    assert_eq!(v.outcome, Outcome::Mismatch);
}

#[test]
fn reals_are_rounded_to_float_digits_and_integral_reals_are_integers() {
    let (_d, gc) = fixture();
    let run = |pred: &str, gold: &str, digits| {
        let s = spec(ResolvedMethod::Multiset, digits, ColumnOrder::Strict);
        grade(&gc, pred, gold, s, &Budget::new(10.0))
            .unwrap()
            .outcome
    };
    assert_eq!(
        run("SELECT 0.3", "SELECT 0.1 + 0.2", Some(12)),
        Outcome::Match
    );
    assert_eq!(
        run("SELECT 0.3", "SELECT 0.1 + 0.2", None),
        Outcome::Mismatch
    );
    assert_eq!(run("SELECT 2.0", "SELECT 2", None), Outcome::Match);
    assert_eq!(run("SELECT '2'", "SELECT 2", Some(12)), Outcome::Mismatch);
}

#[test]
fn one_gold_digest_grades_many_predictions() {
    let (_d, gc) = fixture();
    let budget = Budget::new(10.0);
    let s = spec(ResolvedMethod::Set, Some(12), ColumnOrder::Strict);
    let gold = gold_digest(&gc, GOLD, s, &budget).unwrap();
    assert_eq!((gold.rows, gold.columns), (5, 2));
    let outcome = |pred: &str| grade_against(&gc, pred, &gold, &budget).unwrap().outcome;
    assert_eq!(outcome("SELECT DISTINCT id, name FROM t"), Outcome::Match);
    assert_eq!(outcome("SELECT id, name FROM t LIMIT 2"), Outcome::Mismatch);
    // A digest of another secret, or a subset gold without its keys, is refused.
    let mut foreign = gold.clone();
    foreign.secret_id ^= 1;
    assert!(matches!(
        grade_against(&gc, GOLD, &foreign, &budget),
        Err(GradeError::SecretMismatch(_))
    ));
    let subset = spec(
        ResolvedMethod::Subset {
            op: SubsetOp::Exactly,
            n: 2,
        },
        Some(12),
        ColumnOrder::Strict,
    );
    let mut keyless = gold_digest(&gc, GOLD, subset, &budget).unwrap();
    assert!(keyless.gold_keys.is_some());
    keyless.gold_keys = None;
    assert!(matches!(
        grade_against(&gc, GOLD, &keyless, &budget),
        Err(GradeError::Invalid(_))
    ));
}

#[test]
fn failures_of_either_query_are_outcomes() {
    let (_d, gc) = fixture();
    // Counting an endless CTE returns no row before the deadline: no early exit to take.
    let endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
                   SELECT count(*), max(x) FROM c";
    let s = spec(ResolvedMethod::Multiset, Some(12), ColumnOrder::Strict);
    let quick = |pred: &str, gold: &str| {
        let v = grade(&gc, pred, gold, s, &Budget::new(0.2)).unwrap();
        (v.outcome, v.detail)
    };
    assert_eq!(quick("DELETE FROM t", GOLD).0, Outcome::Unsafe);
    assert_eq!(quick("SELECT nope FROM t", GOLD).0, Outcome::PredError);
    assert_eq!(
        quick(endless, GOLD),
        (
            Outcome::PredTimeout,
            "prediction timed out after 0.2s".into()
        )
    );
    let (outcome, detail) = quick(GOLD, "SELECT nope FROM t");
    assert_eq!(outcome, Outcome::GoldError);
    assert!(detail.starts_with("gold query failed: "), "{detail}");
    let (outcome, detail) = quick(GOLD, "DROP TABLE t");
    assert_eq!(outcome, Outcome::GoldError);
    assert!(detail.starts_with("gold query is unsafe: "), "{detail}");
    assert_eq!(
        quick(GOLD, endless),
        (
            Outcome::GoldTimeout,
            "gold query timed out after 0.2s".into()
        )
    );
}

#[test]
fn a_gold_whose_result_changed_since_its_digest_says_so_in_one_sentence() {
    let (dir, gc) = fixture();
    let budget = Budget::new(10.0);
    let subset = spec(
        ResolvedMethod::Subset {
            op: SubsetOp::AtLeast,
            n: 2,
        },
        Some(12),
        ColumnOrder::Strict,
    );
    // A gold that travels by its SQL (as one whose keys spilled does) is run again to recollect
    // its keys; the database has changed in between.
    let mut gold = gold_digest(&gc, GOLD, subset, &budget).unwrap();
    gold.gold_keys = None;
    gold.gold_sql = Some(Arc::from(GOLD));
    let path = dir.path().join("c.sqlite");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("INSERT INTO t VALUES (6, 'f')", [])
        .unwrap();
    let changed = GuardedConnection::open(path.to_str().unwrap(), true).unwrap();
    match grade_against(&changed, GOLD, &gold, &budget) {
        Err(GradeError::Database(m)) => assert!(
            m.ends_with(
                "c.sqlite: the gold's result is not the one its digest was made from (the \
                 database changed?): recompute the gold digest"
            ),
            "{m}"
        ),
        other => panic!("expected a database error, got {other:?}"),
    }
}
