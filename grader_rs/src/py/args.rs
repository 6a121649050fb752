//! Python arguments checked and converted to the core's types: SQL text, paths, integers,
//! float digits, column order, timeouts, digest specs (a tool call's limits are one value,
//! spec.rs's ToolLimits). Bad values raise InvalidArgument (a ValueError) naming the argument
//! (SQL that is not text: SqlError) before any SQL runs.

use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use super::errors::{invalid, to_py, SqlError};
use crate::checked::{self, Int, Seconds};
use crate::digest;

/// The text of a huge int for a message: Python's own digits, or their count when there are many.
fn huge_text(obj: &Borrowed<'_, '_, PyAny>) -> String {
    match obj.str() {
        Ok(s) if s.to_string().len() <= 60 => s.to_string(),
        _ => match obj
            .call_method0("bit_length")
            .and_then(|b| b.extract::<u64>())
        {
            Ok(bits) => {
                let sign = if obj.lt(0).unwrap_or(false) { "-" } else { "" };
                format!("{sign}an integer of {bits} bits")
            }
            Err(_) => "an integer too large to show".into(),
        },
    }
}

/// Any Python int (or object with __index__): range-checked where its name is known
/// (`checked::int`), so -1 or 2**80 are a named InvalidArgument, not a bare OverflowError.
impl<'a, 'py> FromPyObject<'a, 'py> for Int {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        match obj.extract::<i64>() {
            Ok(v) => Ok(Int::from(v)),
            Err(e) if e.is_instance_of::<PyOverflowError>(py) => match obj.extract::<u64>() {
                Ok(v) => Ok(Int::from(v)),
                Err(e) if e.is_instance_of::<PyOverflowError>(py) => Ok(Int::Huge(huge_text(&obj))),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }
}

/// A number of seconds: any float, or an int (one too large for a float is kept as its text).
impl<'a, 'py> FromPyObject<'a, 'py> for Seconds {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<f64>() {
            Ok(v) => Ok(Seconds::Value(v)),
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
                Ok(Seconds::Huge(huge_text(&obj)))
            }
            Err(e) => Err(e),
        }
    }
}

/// An integer argument in the range of `T` (for the unsigned ones, 0 up).
pub(crate) fn int<T: checked::Ranged>(name: &str, value: &Int) -> PyResult<T> {
    checked::int(name, value).map_err(to_py)
}

/// A path as `open()` takes it: str, bytes or os.PathLike, as UTF-8 text (the form the core
/// opens and reports files by).
pub(crate) fn path_text(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let py = obj.py();
    let fspath = py.import("os")?.getattr("fspath")?.call1((obj,))?;
    let text = if let Ok(b) = fspath.cast::<PyBytes>() {
        String::from_utf8(b.as_bytes().to_vec()).ok()
    } else {
        fspath.cast::<PyString>()?.to_str().ok().map(str::to_owned)
    };
    text.ok_or_else(|| {
        invalid(format!(
            "path {} is not valid UTF-8; rename the file or link to it from a UTF-8 name",
            fspath.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

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

pub(crate) fn check_digits(float_digits: Option<&Int>) -> PyResult<Option<u32>> {
    let max = crate::canon::MAX_FLOAT_DIGITS as i128;
    float_digits
        .map(|d| {
            checked::int_in::<u32>("float_digits", d, 1, max).map_err(|_| {
                invalid(format!(
                    "float_digits must be an integer from 1 to {max}, or None (exact), got {}",
                    d.text()
                ))
            })
        })
        .transpose()
}

pub(crate) fn column_order(name: &str) -> PyResult<digest::ColumnOrder> {
    digest::ColumnOrder::parse(name).ok_or_else(|| {
        let names: Vec<String> = digest::COLUMN_ORDERS
            .iter()
            .map(|o| format!("{:?}", o.name()))
            .collect();
        invalid(format!(
            "column_order must be {}, got {name:?}",
            names.join(" or ")
        ))
    })
}

pub(crate) fn check_timeout(timeout_s: &Seconds) -> PyResult<f64> {
    checked::seconds("timeout_s", timeout_s).map_err(to_py)
}

/// A cap on a query's temporary disk in MiB (1 or more) as the core counts it, in bytes.
pub(crate) fn temp_cap_bytes(max_temp_mb: &Int) -> PyResult<u64> {
    let mb: u64 = checked::int_in(
        "max_temp_mb",
        max_temp_mb,
        1,
        crate::tempfiles::MAX_TEMP_MB as i128,
    )
    .map_err(to_py)?;
    Ok(mb * crate::tempfiles::MIB)
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
