//! Python arguments checked and converted to the core's types: SQL text, float digits,
//! column order, timeouts, tool preview limits, digest specs. Bad values raise ValueError
//! (SQL that is not text: SqlError) before any SQL runs.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::errors::{to_py, SqlError};
use crate::compare;
use crate::digest;
use crate::exec::ToolOptions;

/// SQL arrives as str (or UTF-8 bytes); a str with lone surrogates is not valid UTF-8.
pub(crate) fn sql_text(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = obj.extract::<String>() {
        return Ok(s);
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return String::from_utf8(b.as_bytes().to_vec())
            .map_err(|_| SqlError::new_err("query is not valid UTF-8"));
    }
    if obj.is_instance_of::<pyo3::types::PyString>() {
        return Err(SqlError::new_err(
            "query is not valid UTF-8 (it holds lone surrogates)",
        ));
    }
    Err(pyo3::exceptions::PyTypeError::new_err("SQL must be str"))
}

fn check_digits(float_digits: Option<u32>) -> PyResult<Option<u32>> {
    match float_digits {
        Some(d) if d == 0 || d > crate::canon::MAX_FLOAT_DIGITS => {
            Err(PyValueError::new_err(format!(
                "float_digits must be 1..={} or None (exact), got {d}",
                crate::canon::MAX_FLOAT_DIGITS
            )))
        }
        other => Ok(other),
    }
}

/// What a tool call may show; the floors keep a preview readable and a count meaningful.
pub(crate) fn tool_options(
    max_rows: usize,
    max_cell_chars: usize,
    max_chars: usize,
    count_cap: u64,
) -> ToolOptions {
    ToolOptions {
        max_rows,
        max_cell_chars,
        max_chars: max_chars.max(16),
        count_cap: count_cap.max(1),
    }
}

fn column_order(name: &str) -> PyResult<digest::ColumnOrder> {
    digest::ColumnOrder::parse(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "column_order must be \"strict\" or \"ignore\", got {name:?}"
        ))
    })
}

/// The digest a gold query gets: `semantics` resolved against its SQL ("auto").
pub(crate) fn digest_spec(
    sql: &str,
    semantics: &str,
    float_digits: Option<u32>,
    order: &str,
) -> PyResult<digest::DigestSpec> {
    Ok(digest::DigestSpec {
        semantics: compare::resolve_semantics(sql, semantics).map_err(to_py)?,
        float_digits: check_digits(float_digits)?,
        column_order: column_order(order)?,
        row_limit: None,
    })
}

pub(crate) fn check_timeout(timeout_s: f64) -> PyResult<f64> {
    if timeout_s.is_finite() && timeout_s > 0.0 {
        Ok(timeout_s)
    } else {
        Err(PyValueError::new_err(format!(
            "timeout_s must be a positive number of seconds, got {timeout_s}"
        )))
    }
}

/// A prediction's text, or the reason it is not SQL text: for the grading path an
/// undecodable prediction is a pred_error outcome, not an exception.
pub(crate) fn pred_text(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
) -> PyResult<Result<String, String>> {
    match sql_text(obj) {
        Ok(s) => Ok(Ok(s)),
        Err(e) if e.is_instance_of::<SqlError>(py) => Ok(Err(e.value(py).to_string())),
        Err(e) => Err(e),
    }
}
