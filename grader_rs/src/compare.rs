//! Verdicts: run gold and prediction through the digests and say whether they match.

use std::time::Instant;

use std::sync::Arc;

use crate::digest::{
    secret_id, ColumnOrder, Digest, DigestSpec, GoldKeys, ResolvedMethod, SubsetOp,
};
use crate::error::{GradeError, Result};
use crate::exec::{digest, Run};
use crate::guard::{Budget, GuardedConnection};

/// A grade's deadline when the caller names none (each of gold and prediction gets it).
pub const DEFAULT_GRADE_TIMEOUT_S: f64 = 30.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Match,
    Mismatch,
    PredError,
    PredTimeout,
    Unsafe,
    GoldError,
    GoldTimeout,
}

impl Outcome {
    /// Every outcome, in the order reports list them.
    pub const ALL: [Outcome; 7] = [
        Outcome::Match,
        Outcome::Mismatch,
        Outcome::PredError,
        Outcome::PredTimeout,
        Outcome::Unsafe,
        Outcome::GoldError,
        Outcome::GoldTimeout,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Match => "match",
            Outcome::Mismatch => "mismatch",
            Outcome::PredError => "pred_error",
            Outcome::PredTimeout => "pred_timeout",
            Outcome::Unsafe => "unsafe",
            Outcome::GoldError => "gold_error",
            Outcome::GoldTimeout => "gold_timeout",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Verdict {
    pub outcome: Outcome,
    pub detail: String,
    pub method: ResolvedMethod,
    pub pred_rows: Option<u64>,
    pub gold_rows: Option<u64>,
    pub elapsed_s: f64,
    /// The prediction's own digest when it ran to its end (no early exit): what majority voting
    /// groups by, so grouping needs no second run. None for errors and early exits.
    pub pred_digest: Option<Digest>,
}

/// The gold's digest. Errors stay errors: the caller decides (gold_error, retry, cache).
pub fn gold_digest(
    gc: &GuardedConnection,
    gold_sql: &str,
    spec: DigestSpec,
    budget: &Budget,
) -> Result<Digest> {
    match digest(
        gc,
        gold_sql,
        DigestSpec {
            row_limit: None,
            ..spec
        },
        None,
        None,
        budget,
    )? {
        Run::Done(mut d) => {
            if matches!(d.gold_keys.as_deref(), Some(GoldKeys::Spilled { .. })) {
                d.gold_sql = Some(Arc::from(gold_sql));
            }
            Ok(d)
        }
        other => Err(GradeError::Sql(format!(
            "unexpected early exit on gold: {other:?}"
        ))),
    }
}

/// The method as a verdict's detail names it: `(set)`, `(subset,=,5; columns in any order)`.
fn method_note(gold: &Digest) -> String {
    match gold.column_order {
        ColumnOrder::Strict => format!("({})", gold.method.name()),
        ColumnOrder::Ignore => format!("({}; columns in any order)", gold.method.name()),
    }
}

/// Which gold a set of recollected keys belongs to: its file, SQL, spec, and digest.
#[derive(PartialEq)]
struct Recollected {
    path: String,
    sql: Arc<str>,
    method: ResolvedMethod,
    float_digits: Option<u32>,
    column_order: ColumnOrder,
    rows: u64,
    key: u128,
}

/// The keys of the last few large subset golds recollected, kept (on disk, in their spill
/// files) so the samples of one prompt, graded one after another, run their gold once.
static RECOLLECTED: std::sync::Mutex<Vec<(Recollected, Arc<GoldKeys>)>> =
    std::sync::Mutex::new(Vec::new());
const RECOLLECTED_KEPT: usize = 4;

impl Recollected {
    fn cached(&self) -> Option<Arc<GoldKeys>> {
        let kept = RECOLLECTED.lock().unwrap();
        kept.iter()
            .find(|(k, _)| k == self)
            .map(|(_, keys)| Arc::clone(keys))
    }

    fn keep(self, keys: Arc<GoldKeys>) {
        let mut kept = RECOLLECTED.lock().unwrap();
        kept.retain(|(k, _)| *k != self);
        if kept.len() >= RECOLLECTED_KEPT {
            kept.remove(0);
        }
        kept.push((self, keys));
    }
}

/// A subset gold's keys: its own, or, for a digest that carries its SQL instead (keys too many
/// to travel), collected again by running the gold — a gold failure then is the verdict.
fn subset_keys(
    gc: &GuardedConnection,
    gold: &Digest,
    budget: &Budget,
) -> Result<std::result::Result<Arc<GoldKeys>, (Outcome, String)>> {
    if let Some(keys) = &gold.gold_keys {
        return Ok(Ok(Arc::clone(keys)));
    }
    let Some(sql) = &gold.gold_sql else {
        return Err(GradeError::Invalid(
            "a subset gold digest without its row keys: recompute it".into(),
        ));
    };
    let recollected = Recollected {
        path: gc.path.clone(),
        sql: Arc::clone(sql),
        method: gold.method,
        float_digits: gold.float_digits,
        column_order: gold.column_order,
        rows: gold.rows,
        key: gold.key,
    };
    if let Some(keys) = recollected.cached() {
        return Ok(Ok(keys));
    }
    let spec = DigestSpec {
        method: gold.method,
        float_digits: gold.float_digits,
        column_order: gold.column_order,
        row_limit: None,
    };
    let again = match gold_digest(gc, sql, spec, budget) {
        Ok(d) => d,
        Err(GradeError::Timeout(s)) => {
            let detail = format!("gold query timed out after {}s", crate::error::seconds(s));
            return Ok(Err((Outcome::GoldTimeout, detail)));
        }
        Err(GradeError::Sql(m) | GradeError::Unsafe(m)) => {
            return Ok(Err((Outcome::GoldError, format!("gold query: {m}"))))
        }
        Err(e @ GradeError::TempDisk(_)) => {
            return Ok(Err((Outcome::GoldError, format!("gold query: {e}"))))
        }
        Err(e) => return Err(e),
    };
    match again.gold_keys {
        Some(keys) if again.rows == gold.rows && again.key == gold.key => {
            recollected.keep(Arc::clone(&keys));
            Ok(Ok(keys))
        }
        _ => Err(GradeError::Database(format!(
            "{}: the gold's result is not the one its digest was made from (the database \
             changed?): recompute the gold digest",
            gc.path
        ))),
    }
}

/// Grade a prediction against a gold digest. Errors of the prediction are outcomes; only a
/// cancel, a broken database or a digest from another secret are errors.
pub fn grade_against(
    gc: &GuardedConnection,
    pred_sql: &str,
    gold: &Digest,
    budget: &Budget,
) -> Result<Verdict> {
    let start = Instant::now();
    if gold.secret_id != secret_id() {
        return Err(GradeError::SecretMismatch(
            "the gold digest was made with another hash secret (set_hash_secret): recompute it"
                .into(),
        ));
    }
    let method = method_note(gold);
    // A subset prediction needs min(N, the gold's distinct rows) distinct rows: every gold row
    // when the gold has fewer than N.
    let subset = match gold.method {
        ResolvedMethod::Subset { op, n } => match subset_keys(gc, gold, budget)? {
            Ok(keys) => Some((op, n.min(gold.rows), keys)),
            Err((outcome, detail)) => {
                return Ok(Verdict {
                    outcome,
                    detail,
                    method: gold.method,
                    pred_rows: None,
                    gold_rows: Some(gold.rows),
                    elapsed_s: start.elapsed().as_secs_f64(),
                    pred_digest: None,
                })
            }
        },
        _ => None,
    };
    let spec = DigestSpec {
        method: gold.method,
        float_digits: gold.float_digits,
        column_order: gold.column_order,
        row_limit: match &subset {
            Some((SubsetOp::Exactly, need, _)) => Some(*need),
            Some((SubsetOp::AtLeast, _, _)) => None,
            None => Some(gold.rows),
        },
    };
    let verdict = |outcome, detail: String, pred_rows| Verdict {
        outcome,
        detail,
        method: gold.method,
        pred_rows,
        gold_rows: Some(gold.rows),
        elapsed_s: start.elapsed().as_secs_f64(),
        pred_digest: None,
    };
    let rows_word = if gold.method == ResolvedMethod::Set {
        "distinct row count"
    } else {
        "row count"
    };
    let keys = subset.as_ref().map(|(_, _, k)| k.clone());
    let run = match digest(gc, pred_sql, spec, Some(gold.columns), keys, budget) {
        Ok(run) => run,
        Err(GradeError::Unsafe(m)) => return Ok(verdict(Outcome::Unsafe, m, None)),
        Err(GradeError::Sql(m)) => return Ok(verdict(Outcome::PredError, m, None)),
        Err(e @ GradeError::TempDisk(_)) => {
            return Ok(verdict(Outcome::PredError, e.to_string(), None))
        }
        Err(GradeError::Timeout(s)) => {
            return Ok(verdict(
                Outcome::PredTimeout,
                format!("prediction timed out after {}s", crate::error::seconds(s)),
                None,
            ))
        }
        Err(e) => return Err(e),
    };
    let plural = |n: u64| if n == 1 { "" } else { "s" };
    let pred_digest = match &run {
        Run::Done(d) => Some(d.clone()),
        _ => None,
    };
    let mut v = match (run, &subset) {
        (Run::OtherColumns { columns }, _) => verdict(
            Outcome::Mismatch,
            format!("column count {columns} vs {} {method}", gold.columns),
            None,
        ),
        (Run::ForeignRow, _) => verdict(
            Outcome::Mismatch,
            format!("a row that is not in the gold {method}"),
            None,
        ),
        (Run::TooManyRows { .. }, Some((_, need, _))) => verdict(
            Outcome::Mismatch,
            format!(
                "more than {need} distinct gold row{} {method}",
                plural(*need)
            ),
            None,
        ),
        (Run::TooManyRows { .. }, None) => verdict(
            Outcome::Mismatch,
            format!(
                "{rows_word} >{} vs {} (stopped early) {method}",
                gold.rows, gold.rows
            ),
            None,
        ),
        (Run::Done(pred), Some((op, need, _))) => {
            let need_text = match op {
                SubsetOp::Exactly => format!("{need}"),
                SubsetOp::AtLeast => format!("at least {need}"),
            };
            if op.holds(pred.rows, *need) {
                verdict(
                    Outcome::Match,
                    format!(
                        "{} distinct row{}, each a gold row {method}",
                        pred.rows,
                        plural(pred.rows)
                    ),
                    Some(pred.rows),
                )
            } else {
                verdict(
                    Outcome::Mismatch,
                    format!(
                        "{} distinct row{}, need {need_text} {method}",
                        pred.rows,
                        plural(pred.rows)
                    ),
                    Some(pred.rows),
                )
            }
        }
        (Run::Done(pred), None) => {
            let rows = Some(pred.rows);
            if pred.rows != gold.rows {
                verdict(
                    Outcome::Mismatch,
                    format!("{rows_word} {} vs {} {method}", pred.rows, gold.rows),
                    rows,
                )
            } else if pred.key == gold.key {
                verdict(
                    Outcome::Match,
                    format!("{} row{} match {method}", pred.rows, plural(pred.rows)),
                    rows,
                )
            } else if gold.method == ResolvedMethod::Ordered
                && pred.unordered_key == gold.unordered_key
            {
                verdict(
                    Outcome::Mismatch,
                    format!("same rows in a different order {method}"),
                    rows,
                )
            } else {
                verdict(
                    Outcome::Mismatch,
                    format!("same {rows_word} ({}), different rows {method}", pred.rows),
                    rows,
                )
            }
        }
    };
    v.pred_digest = pred_digest;
    Ok(v)
}

/// Grade a prediction against a gold query: gold first (its failure is the data's fault).
pub fn grade(
    gc: &GuardedConnection,
    pred_sql: &str,
    gold_sql: &str,
    spec: DigestSpec,
    budget: &Budget,
) -> Result<Verdict> {
    let start = Instant::now();
    let gold_failed = |outcome, detail: String| Verdict {
        outcome,
        detail,
        method: spec.method,
        pred_rows: None,
        gold_rows: None,
        elapsed_s: start.elapsed().as_secs_f64(),
        pred_digest: None,
    };
    let gold = match gold_digest(gc, gold_sql, spec, budget) {
        Ok(d) => d,
        Err(GradeError::Timeout(s)) => {
            return Ok(gold_failed(
                Outcome::GoldTimeout,
                format!("gold query timed out after {}s", crate::error::seconds(s)),
            ))
        }
        Err(GradeError::Unsafe(m)) => {
            return Ok(gold_failed(
                Outcome::GoldError,
                format!("gold query is unsafe: {m}"),
            ))
        }
        Err(GradeError::Sql(m)) => {
            return Ok(gold_failed(
                Outcome::GoldError,
                format!("gold query failed: {m}"),
            ))
        }
        Err(e @ GradeError::TempDisk(_)) => {
            return Ok(gold_failed(
                Outcome::GoldError,
                format!("gold query failed: {e}"),
            ))
        }
        Err(e) => return Err(e),
    };
    let mut v = grade_against(gc, pred_sql, &gold, budget)?;
    v.elapsed_s = start.elapsed().as_secs_f64();
    Ok(v)
}

#[cfg(test)]
mod test;
