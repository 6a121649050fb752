//! The values a caller builds once and hands the core whole: `ToolLimits` (what one tool call may
//! show, how long it may run and how much temporary disk it may use) and `GradeSpec` (how a
//! prediction is graded: the method, resolved once at construction, float digits, column order,
//! timeout, temporary disk). Both are checked when they are
//! built, with the messages the per-argument calls give, and are frozen, comparable, hashable and
//! picklable (they cross process boundaries inside jobs).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyTuple};

use super::args::{
    check_digits, check_timeout, column_order as parse_column_order, int, sql_text, temp_cap_bytes,
};
use super::errors::to_py;
use crate::checked::{Int, Seconds};
use crate::compare;
use crate::digest::{self, ColumnOrder, DigestSpec, ResolvedMethod};
use crate::exec::ToolOptions;
use crate::tempfiles::{DEFAULT_MAX_TEMP_BYTES, MIB};

/// The default cap on a query's temporary disk, in the MiB the Python values take it in.
const DEFAULT_MAX_TEMP_MB: u64 = DEFAULT_MAX_TEMP_BYTES / MIB;

/// A float as Python writes it (`repr`), so a value's repr reads back as the same value.
fn float_text(py: Python<'_>, x: f64) -> String {
    PyFloat::new(py, x)
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| x.to_string())
}

/// A Python hash from a Rust one (-1 is Python's "error" value).
fn py_hash(value: impl Hash) -> isize {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    match h.finish() as isize {
        -1 => -2,
        v => v,
    }
}

/// `(copyreg.__newobj_ex__, (cls, args, kwargs))`: unpickling calls the constructor again (so the
/// value is checked again), with the keyword-only arguments as keywords, under every protocol.
fn reduce_to_new<'py>(
    slf: &Bound<'py, PyAny>,
    args: Bound<'py, PyTuple>,
    kwargs: Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyTuple>> {
    let py = slf.py();
    let newobj = py.import("copyreg")?.getattr("__newobj_ex__")?;
    let call = PyTuple::new(
        py,
        [
            slf.get_type().into_any(),
            args.into_any(),
            kwargs.into_any(),
        ],
    )?;
    PyTuple::new(py, [newobj, call.into_any()])
}

/// What one `execute_sql_query` call may show, how long it may run and how much temporary disk
/// it may use.
#[pyclass(frozen, module = "t2sql._grader")]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToolLimits {
    pub(crate) timeout_s: f64,
    pub(crate) max_rows: usize,
    pub(crate) max_cell_chars: usize,
    pub(crate) max_chars: usize,
    pub(crate) count_cap: u64,
    pub(crate) max_temp_bytes: u64,
}

impl ToolLimits {
    /// The preview options: the limits as given, with the floors that keep a preview readable
    /// (at least 16 characters) and a count meaningful (at least 1 row).
    pub(crate) fn options(&self) -> ToolOptions {
        ToolOptions {
            max_rows: self.max_rows,
            max_cell_chars: self.max_cell_chars,
            max_chars: self.max_chars.max(16),
            count_cap: self.count_cap.max(1),
        }
    }
}

#[pymethods]
impl ToolLimits {
    /// Checked as the tool call checks them: the timeout first, then each limit by name.
    /// The preview and its timeout have no default here: the caller's preset owns them. Only
    /// `max_temp_mb` does (the core's cap): MiB of temporary files (sorts, DISTINCT, GROUP BY)
    /// the query may hold.
    #[new]
    #[pyo3(signature = (*, timeout_s, max_rows, max_cell_chars, max_chars, count_cap, max_temp_mb = Int::from(DEFAULT_MAX_TEMP_MB)))]
    fn new(
        timeout_s: Seconds,
        max_rows: Int,
        max_cell_chars: Int,
        max_chars: Int,
        count_cap: Int,
        max_temp_mb: Int,
    ) -> PyResult<Self> {
        Ok(ToolLimits {
            timeout_s: check_timeout(&timeout_s)?,
            max_rows: int("max_rows", &max_rows)?,
            max_cell_chars: int("max_cell_chars", &max_cell_chars)?,
            max_chars: int("max_chars", &max_chars)?,
            count_cap: int("count_cap", &count_cap)?,
            max_temp_bytes: temp_cap_bytes(&max_temp_mb)?,
        })
    }

    #[getter]
    fn timeout_s(&self) -> f64 {
        self.timeout_s
    }
    #[getter]
    fn max_rows(&self) -> usize {
        self.max_rows
    }
    #[getter]
    fn max_cell_chars(&self) -> usize {
        self.max_cell_chars
    }
    #[getter]
    fn max_chars(&self) -> usize {
        self.max_chars
    }
    #[getter]
    fn count_cap(&self) -> u64 {
        self.count_cap
    }
    #[getter]
    fn max_temp_mb(&self) -> u64 {
        self.max_temp_bytes / MIB
    }

    fn __eq__(&self, other: &Self) -> bool {
        self == other
    }

    fn __hash__(&self) -> isize {
        // Timeouts are positive and finite, so equal floats have equal bits.
        py_hash((
            self.timeout_s.to_bits(),
            self.max_rows,
            self.max_cell_chars,
            self.max_chars,
            self.count_cap,
            self.max_temp_bytes,
        ))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "ToolLimits(timeout_s={}, max_rows={}, max_cell_chars={}, max_chars={}, count_cap={}, \
             max_temp_mb={})",
            float_text(py, self.timeout_s),
            self.max_rows,
            self.max_cell_chars,
            self.max_chars,
            self.count_cap,
            self.max_temp_bytes / MIB
        )
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let kwargs = PyDict::new(py);
        let me = slf.get();
        kwargs.set_item("timeout_s", me.timeout_s)?;
        kwargs.set_item("max_rows", me.max_rows)?;
        kwargs.set_item("max_cell_chars", me.max_cell_chars)?;
        kwargs.set_item("max_chars", me.max_chars)?;
        kwargs.set_item("count_cap", me.count_cap)?;
        kwargs.set_item("max_temp_mb", me.max_temp_bytes / MIB)?;
        reduce_to_new(slf.as_any(), PyTuple::empty(py), kwargs)
    }
}

/// How a prediction is graded: the method (resolved once, here: `auto` against `gold_sql`),
/// float digits (None: exact), column order, and the timeout and temporary disk of each query.
#[pyclass(frozen, module = "t2sql._grader")]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradeSpec {
    pub(crate) method: ResolvedMethod,
    pub(crate) float_digits: Option<u32>,
    pub(crate) column_order: ColumnOrder,
    pub(crate) timeout_s: f64,
    pub(crate) max_temp_bytes: u64,
}

impl Default for GradeSpec {
    /// What a grade gets when the caller names nothing: multiset, the default digits, strict
    /// column order, the default grade timeout (GRADE_DEFAULTS).
    fn default() -> Self {
        GradeSpec {
            method: ResolvedMethod::Multiset,
            float_digits: Some(crate::canon::DEFAULT_FLOAT_DIGITS),
            column_order: ColumnOrder::Strict,
            timeout_s: compare::DEFAULT_GRADE_TIMEOUT_S,
            max_temp_bytes: DEFAULT_MAX_TEMP_BYTES,
        }
    }
}

impl GradeSpec {
    /// The digest a gold (or a prediction, for a vote) gets under this spec.
    pub(crate) fn digest_spec(&self) -> DigestSpec {
        DigestSpec {
            method: self.method,
            float_digits: self.float_digits,
            column_order: self.column_order,
            row_limit: None,
        }
    }
}

#[pymethods]
impl GradeSpec {
    /// Checked in the order a grade checks its arguments: the method, the digits, the column
    /// order, the timeout, the temporary disk; each refusal is the InvalidArgument that call
    /// raises.
    #[new]
    #[pyo3(signature = (method = "multiset", *, gold_sql = None, float_digits = Some(Int::from(crate::canon::DEFAULT_FLOAT_DIGITS)), column_order = "strict", timeout_s = Seconds::from(compare::DEFAULT_GRADE_TIMEOUT_S), max_temp_mb = Int::from(DEFAULT_MAX_TEMP_MB)))]
    fn new(
        method: &str,
        gold_sql: Option<&Bound<'_, PyAny>>,
        float_digits: Option<Int>,
        column_order: &str,
        timeout_s: Seconds,
        max_temp_mb: Int,
    ) -> PyResult<Self> {
        let gold = gold_sql.map(sql_text).transpose()?;
        Ok(GradeSpec {
            method: digest::resolve_method(gold.as_deref(), method).map_err(to_py)?,
            float_digits: check_digits(float_digits.as_ref())?,
            column_order: parse_column_order(column_order)?,
            timeout_s: check_timeout(&timeout_s)?,
            max_temp_bytes: temp_cap_bytes(&max_temp_mb)?,
        })
    }

    /// The resolved method's canonical name: one of METHODS but auto, a subset's N its count.
    #[getter]
    fn method(&self) -> String {
        self.method.name()
    }
    #[getter]
    fn float_digits(&self) -> Option<u32> {
        self.float_digits
    }
    #[getter]
    fn column_order(&self) -> &'static str {
        self.column_order.name()
    }
    #[getter]
    fn timeout_s(&self) -> f64 {
        self.timeout_s
    }
    #[getter]
    fn max_temp_mb(&self) -> u64 {
        self.max_temp_bytes / MIB
    }

    fn __eq__(&self, other: &Self) -> bool {
        self == other
    }

    fn __hash__(&self) -> isize {
        py_hash((
            self.method,
            self.float_digits,
            self.column_order,
            self.timeout_s.to_bits(),
            self.max_temp_bytes,
        ))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let digits = match self.float_digits {
            Some(d) => d.to_string(),
            None => "None".into(),
        };
        format!(
            "GradeSpec({:?}, float_digits={digits}, column_order={:?}, timeout_s={}, max_temp_mb={})",
            self.method.name(),
            self.column_order.name(),
            float_text(py, self.timeout_s),
            self.max_temp_bytes / MIB
        )
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let me = slf.get();
        let kwargs = PyDict::new(py);
        kwargs.set_item("float_digits", me.float_digits)?;
        kwargs.set_item("column_order", me.column_order.name())?;
        kwargs.set_item("timeout_s", me.timeout_s)?;
        kwargs.set_item("max_temp_mb", me.max_temp_bytes / MIB)?;
        // The canonical name reads back as the same method (no gold needed: never "auto").
        let args = PyTuple::new(py, [me.method.name()])?;
        reduce_to_new(slf.as_any(), args, kwargs)
    }
}
