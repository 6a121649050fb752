//! `Digest` (a result's streaming digest; the wire format is `crate::digest`'s), `Verdict`
//! (one graded prediction), and the functions that name a method or key the row hashes.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::errors::{invalid, to_py};
use crate::compare::{self, Outcome};
use crate::digest::{self, ResolvedMethod};

/// A result's streaming digest: counts plus a 128-bit keyed hash (never rows).
#[pyclass(frozen, module = "t2sql._grader", eq)]
#[derive(PartialEq)]
pub struct Digest {
    pub(crate) inner: digest::Digest,
    pub(crate) elapsed_s: f64,
}

#[pymethods]
impl Digest {
    #[getter]
    fn method(&self) -> String {
        self.inner.method.name()
    }
    #[getter]
    fn column_order(&self) -> &'static str {
        self.inner.column_order.name()
    }
    #[getter]
    fn float_digits(&self) -> Option<u32> {
        self.inner.float_digits
    }
    #[getter]
    fn rows(&self) -> u64 {
        self.inner.rows
    }
    #[getter]
    fn columns(&self) -> u32 {
        self.inner.columns
    }
    #[getter]
    fn elapsed_s(&self) -> f64 {
        self.elapsed_s
    }
    #[getter]
    fn secret_id(&self) -> String {
        format!("{:016x}", self.inner.secret_id)
    }
    /// Whether two digests of this secret say the results are equal under this digest's
    /// method (what majority voting groups by; never re-executes anything).
    fn same_result(&self, other: &Digest) -> bool {
        let (a, b) = (&self.inner, &other.inner);
        a.secret_id == b.secret_id
            && a.method == b.method
            && a.float_digits == b.float_digits
            && a.column_order == b.column_order
            && a.rows == b.rows
            && a.columns == b.columns
            && a.key == b.key
    }
    /// A fixed binary layout for caches (digest/wire.rs); `from_bytes` validates it.
    pub(crate) fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = py
            .detach(|| self.inner.to_bytes())
            .map_err(|m| to_py(crate::error::GradeError::Spill(m)))?;
        Ok(PyBytes::new(py, &bytes))
    }
    #[staticmethod]
    pub(crate) fn from_bytes(data: &[u8]) -> PyResult<Self> {
        let inner = digest::Digest::from_bytes(data)
            .map_err(|why| invalid(format!("not a t2sql digest ({why}): recompute it")))?;
        Ok(Digest {
            inner,
            elapsed_s: 0.0,
        })
    }
    fn __repr__(&self) -> String {
        format!(
            "Digest(method={:?}, rows={}, columns={}, float_digits={:?})",
            self.inner.method.name(),
            self.inner.rows,
            self.inner.columns,
            self.inner.float_digits
        )
    }
}

#[pyclass(frozen, module = "t2sql._grader")]
pub struct Verdict {
    #[pyo3(get)]
    outcome: &'static str,
    #[pyo3(get)]
    detail: String,
    #[pyo3(get)]
    method: String,
    #[pyo3(get)]
    pred_rows: Option<u64>,
    #[pyo3(get)]
    gold_rows: Option<u64>,
    #[pyo3(get)]
    elapsed_s: f64,
    pred_digest: Option<digest::Digest>,
}

impl From<compare::Verdict> for Verdict {
    fn from(v: compare::Verdict) -> Self {
        Verdict {
            outcome: v.outcome.name(),
            detail: v.detail,
            method: v.method.name(),
            pred_rows: v.pred_rows,
            gold_rows: v.gold_rows,
            elapsed_s: v.elapsed_s,
            pred_digest: v.pred_digest,
        }
    }
}

impl Verdict {
    /// A prediction that never reached SQLite (not valid UTF-8).
    pub(crate) fn pred_error(
        detail: String,
        method: ResolvedMethod,
        gold_rows: Option<u64>,
    ) -> Self {
        Verdict {
            outcome: Outcome::PredError.name(),
            detail,
            method: method.name(),
            pred_rows: None,
            gold_rows,
            elapsed_s: 0.0,
            pred_digest: None,
        }
    }
}

#[pymethods]
impl Verdict {
    #[getter]
    fn matched(&self) -> bool {
        self.outcome == Outcome::Match.name()
    }
    /// The prediction's digest (`Digest.from_bytes`) when it ran to its end; None after an
    /// error or an early exit (another column count, more rows than the gold, a foreign row).
    #[getter]
    fn pred_digest<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let Some(d) = &self.pred_digest else {
            return Ok(None);
        };
        // A prediction's digest keeps no keys, so its bytes are never read back from disk.
        let bytes = d
            .to_bytes()
            .map_err(|m| to_py(crate::error::GradeError::Spill(m)))?;
        Ok(Some(PyBytes::new(py, &bytes)))
    }
    fn __repr__(&self) -> String {
        format!(
            "Verdict(outcome={:?}, detail={:?})",
            self.outcome, self.detail
        )
    }
}
