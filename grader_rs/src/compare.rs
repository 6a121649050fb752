//! Verdicts: run gold and prediction through the digests and say whether they match.

use std::time::Instant;

use crate::digest::{secret_id, Digest, DigestSpec, Semantics};
use crate::error::{GradeError, Result};
use crate::exec::{digest, Run};
use crate::guard::{Budget, GuardedConnection};
use crate::sqltext;

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
    pub semantics: Semantics,
    pub pred_rows: Option<u64>,
    pub gold_rows: Option<u64>,
    pub elapsed_s: f64,
}

/// `auto` = ordered when the gold's outermost query has ORDER BY, else multiset.
pub fn resolve_semantics(gold_sql: &str, name: &str) -> Result<Semantics> {
    if name == "auto" {
        let ordered =
            sqltext::first_statement(gold_sql).is_some_and(|s| sqltext::has_outer_order_by(s.text));
        return Ok(if ordered {
            Semantics::Ordered
        } else {
            Semantics::Multiset
        });
    }
    Semantics::parse(name).ok_or_else(|| {
        GradeError::Invalid(format!(
            "unknown semantics {name:?}: use multiset, ordered, set or auto"
        ))
    })
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
        budget,
    )? {
        Run::Done(d) => Ok(d),
        other => Err(GradeError::Sql(format!(
            "unexpected early exit on gold: {other:?}"
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
        return Err(GradeError::Invalid(
            "the gold digest was made with another hash secret (set_hash_secret): recompute it"
                .into(),
        ));
    }
    let spec = DigestSpec {
        semantics: gold.semantics,
        float_digits: gold.float_digits,
        row_limit: Some(gold.rows),
    };
    let verdict = |outcome, detail: String, pred_rows| Verdict {
        outcome,
        detail,
        semantics: gold.semantics,
        pred_rows,
        gold_rows: Some(gold.rows),
        elapsed_s: start.elapsed().as_secs_f64(),
    };
    let rows_word = if gold.semantics == Semantics::Set {
        "distinct row count"
    } else {
        "row count"
    };
    let run = match digest(gc, pred_sql, spec, Some(gold.columns), budget) {
        Ok(run) => run,
        Err(GradeError::Unsafe(m)) => return Ok(verdict(Outcome::Unsafe, m, None)),
        Err(GradeError::Sql(m)) => return Ok(verdict(Outcome::PredError, m, None)),
        Err(GradeError::Timeout(s)) => {
            return Ok(verdict(
                Outcome::PredTimeout,
                format!("prediction timed out after {}s", crate::error::seconds(s)),
                None,
            ))
        }
        Err(e) => return Err(e),
    };
    Ok(match run {
        Run::OtherColumns { columns } => verdict(
            Outcome::Mismatch,
            format!("column count {columns} vs {}", gold.columns),
            None,
        ),
        Run::TooManyRows { .. } => verdict(
            Outcome::Mismatch,
            format!(
                "{rows_word} >{} vs {} (stopped early)",
                gold.rows, gold.rows
            ),
            None,
        ),
        Run::Done(pred) => {
            let rows = Some(pred.rows);
            if pred.rows != gold.rows {
                verdict(
                    Outcome::Mismatch,
                    format!("{rows_word} {} vs {}", pred.rows, gold.rows),
                    rows,
                )
            } else if pred.key == gold.key {
                let s = if pred.rows == 1 { "" } else { "s" };
                verdict(
                    Outcome::Match,
                    format!("{} row{s} match ({})", pred.rows, gold.semantics.name()),
                    rows,
                )
            } else if gold.semantics == Semantics::Ordered
                && pred.unordered_key == gold.unordered_key
            {
                verdict(
                    Outcome::Mismatch,
                    "same rows in a different order".into(),
                    rows,
                )
            } else {
                verdict(
                    Outcome::Mismatch,
                    format!("same {rows_word} ({}), different rows", pred.rows),
                    rows,
                )
            }
        }
    })
}

/// Grade a prediction against a gold query: gold first (its failure is the data's fault).
pub fn grade(
    gc: &GuardedConnection,
    pred_sql: &str,
    gold_sql: &str,
    semantics: Semantics,
    float_digits: Option<u32>,
    budget: &Budget,
) -> Result<Verdict> {
    let start = Instant::now();
    let spec = DigestSpec {
        semantics,
        float_digits,
        row_limit: None,
    };
    let gold_failed = |outcome, detail: String| Verdict {
        outcome,
        detail,
        semantics,
        pred_rows: None,
        gold_rows: None,
        elapsed_s: start.elapsed().as_secs_f64(),
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
        Err(e) => return Err(e),
    };
    let mut v = grade_against(gc, pred_sql, &gold, budget)?;
    v.elapsed_s = start.elapsed().as_secs_f64();
    Ok(v)
}
