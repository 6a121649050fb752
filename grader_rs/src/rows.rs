//! A query's rows as values, for the equivalence check's own reads (real rows, lineage, mining):
//! one statement under the tool call's policy (`prepare_checked`: one read-only statement, the
//! authorizer), its parameters bound (never spliced), stepped under a budget (deadline, cancel,
//! temporary-disk cap), and what comes back bounded in rows and bytes.

use rusqlite::types::{Value, ValueRef};

use crate::error::{GradeError, Result};
use crate::guard::{Budget, GuardedConnection};

/// How much of a result comes back: the first `max_rows` rows (the rest is never stepped), and
/// at most `max_bytes` of values (past it the call fails: a result cut inside is no answer).
#[derive(Debug, Clone, Copy)]
pub struct RowsLimits {
    pub max_rows: usize,
    pub max_bytes: usize,
}

impl RowsLimits {
    /// What a caller that names no bounds gets.
    pub const DEFAULT: RowsLimits = RowsLimits {
        max_rows: 10_000,
        max_bytes: 16 * 1024 * 1024,
    };
}

/// What one value costs against `max_bytes`: its bytes, and 8 for a number or NULL.
fn value_bytes(v: &ValueRef<'_>) -> usize {
    match v {
        ValueRef::Text(t) => t.len().max(8),
        ValueRef::Blob(b) => b.len().max(8),
        _ => 8,
    }
}

/// An owned value; text that is not UTF-8 is kept as SQLite's bytes, read leniently.
pub(crate) fn owned(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(x) => Value::Real(x),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

/// The rows of `sql` with `params` bound to its `?` marks, in order.
pub fn rows(
    gc: &GuardedConnection,
    sql: &str,
    params: &[Value],
    limits: RowsLimits,
    budget: &Budget,
) -> Result<Vec<Vec<Value>>> {
    let (mut stmt, _) = gc.prepare_checked(sql)?;
    read(gc, &mut stmt, params, limits, budget)
}

/// Bind `params` to a statement's `?` marks, in order: as many as it has, or Invalid.
pub(crate) fn bind(stmt: &mut rusqlite::Statement<'_>, params: &[Value]) -> Result<()> {
    let wanted = stmt.parameter_count();
    if wanted != params.len() {
        return Err(GradeError::Invalid(format!(
            "the query has {wanted} parameter(s), {} given",
            params.len()
        )));
    }
    for (i, p) in params.iter().enumerate() {
        stmt.raw_bind_parameter(i + 1, p)
            .map_err(|e| GradeError::Invalid(format!("parameter {}: {e}", i + 1)))?;
    }
    Ok(())
}

/// Bind `params` to a prepared statement and read its rows under `budget` (rows.rs's bounds);
/// the statement was checked by whoever prepared it.
pub(crate) fn read(
    gc: &GuardedConnection,
    stmt: &mut rusqlite::Statement<'_>,
    params: &[Value],
    limits: RowsLimits,
    budget: &Budget,
) -> Result<Vec<Vec<Value>>> {
    bind(stmt, params)?;
    let width = stmt.column_count();
    gc.arm(budget)?;
    let mut out: Vec<Vec<Value>> = Vec::new();
    let mut bytes = 0usize;
    let outcome = (|| {
        let mut rows = stmt.raw_query();
        while out.len() < limits.max_rows {
            let Some(row) = rows.next()? else { break };
            let mut values = Vec::with_capacity(width);
            for i in 0..width {
                let v = row.get_ref_unwrap(i);
                bytes = bytes.saturating_add(value_bytes(&v));
                if bytes > limits.max_bytes {
                    return Ok(Err(GradeError::Sql(format!(
                        "the result passed {} bytes, the most this read takes back",
                        limits.max_bytes
                    ))));
                }
                values.push(owned(v));
            }
            out.push(values);
        }
        Ok::<_, rusqlite::Error>(Ok(()))
    })();
    gc.disarm();
    outcome.map_err(|e| gc.classify_with(e, budget))??;
    Ok(out)
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::memdb::{build, TableRows};

    fn small() -> GuardedConnection {
        let rows = (1..=5)
            .map(|i| vec![Value::Integer(i), Value::Text(format!("n{i}"))])
            .collect();
        build(
            "t",
            &["CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)".into()],
            &[TableRows {
                name: "t".into(),
                columns: vec!["id".into(), "name".into()],
                rows,
            }],
            false,
            &Budget::new(5.0),
        )
        .unwrap()
    }

    #[test]
    fn binds_parameters_and_stops_at_max_rows() {
        let gc = small();
        let got = rows(
            &gc,
            "SELECT id, name FROM t WHERE id >= ? ORDER BY id",
            &[Value::Integer(2)],
            RowsLimits {
                max_rows: 2,
                max_bytes: 1000,
            },
            &Budget::new(5.0),
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                vec![Value::Integer(2), Value::Text("n2".into())],
                vec![Value::Integer(3), Value::Text("n3".into())],
            ]
        );
    }

    #[test]
    fn a_result_past_max_bytes_is_an_error_not_a_cut() {
        let gc = small();
        let got = rows(
            &gc,
            "SELECT zeroblob(1000)",
            &[],
            RowsLimits {
                max_rows: 10,
                max_bytes: 999,
            },
            &Budget::new(5.0),
        );
        assert!(matches!(got, Err(GradeError::Sql(m)) if m.contains("999 bytes")));
    }

    #[test]
    fn the_policy_and_the_deadline_hold() {
        let gc = small();
        let limits = RowsLimits::DEFAULT;
        let budget = Budget::new(5.0);
        for bad in [
            "DELETE FROM t",
            "SELECT * FROM pragma_table_info('t')",
            "PRAGMA foo",
        ] {
            assert!(
                matches!(
                    rows(&gc, bad, &[], limits, &budget),
                    Err(GradeError::Unsafe(_))
                ),
                "{bad}"
            );
        }
        let slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";
        let started = std::time::Instant::now();
        let got = rows(&gc, slow, &[], limits, &Budget::new(0.2));
        assert!(matches!(got, Err(GradeError::Timeout(_))));
        assert!(started.elapsed().as_secs_f64() < 2.0);
        let wrong = rows(&gc, "SELECT ?", &[], limits, &budget);
        assert!(matches!(wrong, Err(GradeError::Invalid(_))));
    }
}
