//! `Database` (one hardened read-only connection) and the `Cancel` token of its calls. Its tool
//! previews are `tool_result`'s; the process-wide settings and counters are `process`'s. The
//! equivalence check's reads (`rows`, `catalog`, `from_rows`' budget) and `file_digest` are here too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;

use super::args::{check_timeout, int, path_text, pred_text, sql_text, temp_cap_bytes};
use super::digest::{Digest, Verdict};
use super::errors::{invalid, to_py, DatabaseClosed};
use super::spec::{GradeSpec, ToolLimits};
use super::tool_result::{tool_result, ToolResult};
use crate::catalog::Catalog;
use crate::checked::{Int, Seconds};
use crate::compare;
use crate::exec;
use crate::guard::{Budget, GuardedConnection};

/// A cancellation token: `cancel()` from any thread interrupts the query that holds it.
#[pyclass(frozen, module = "t2sql._grader")]
pub struct Cancel {
    flag: Arc<AtomicBool>,
}

impl Cancel {
    /// A token on a flag that someone else sets too (a pool job's cancel flag).
    pub(crate) fn sharing(flag: Arc<AtomicBool>) -> Self {
        Cancel { flag }
    }
}

#[pymethods]
impl Cancel {
    #[new]
    fn new() -> Self {
        Cancel {
            flag: Arc::new(AtomicBool::new(false)),
        }
    }
    fn cancel(&self) {
        self.flag.store(true, Ordering::Relaxed);
    }
    #[getter]
    fn cancelled(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }
}

/// The budget of a call that names its timeout and temporary disk one by one.
fn budget(
    timeout_s: &Seconds,
    max_temp_mb: &Int,
    cancel: Option<&Bound<'_, Cancel>>,
) -> PyResult<Budget> {
    let timeout_s = check_timeout(timeout_s)?;
    Ok(budget_of(timeout_s, temp_cap_bytes(max_temp_mb)?, cancel))
}

/// The budget of a checked timeout and cap (a ToolLimits' or GradeSpec's own).
fn budget_of(timeout_s: f64, max_temp_bytes: u64, cancel: Option<&Bound<'_, Cancel>>) -> Budget {
    Budget {
        timeout_s,
        cancel: cancel.map(|c| Arc::clone(&c.get().flag)),
        max_temp_bytes,
    }
}

/// The default cap on a query's temporary disk, in MiB, as the calls that take it one by one
/// write it.
const DEFAULT_MAX_TEMP_MB: u64 = crate::tempfiles::DEFAULT_MAX_TEMP_BYTES / crate::tempfiles::MIB;

/// One table of `Database.from_rows`: (name, columns, rows of cells).
type TableArg<'py> = (String, Vec<String>, Vec<Vec<Bound<'py, PyAny>>>);

/// A cell handed in by Python: None, int (64-bit), float, str or bytes (bool is an int).
fn cell_from_py(value: &Bound<'_, PyAny>) -> PyResult<rusqlite::types::Value> {
    use rusqlite::types::Value;
    if value.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = value.cast::<pyo3::types::PyBytes>() {
        return Ok(Value::Blob(b.as_bytes().to_vec()));
    }
    if let Ok(s) = value.cast::<pyo3::types::PyString>() {
        return Ok(Value::Text(s.to_str()?.to_owned()));
    }
    if let Ok(f) = value.cast::<pyo3::types::PyFloat>() {
        return Ok(Value::Real(f.value()));
    }
    match value.extract::<i64>() {
        Ok(i) => Ok(Value::Integer(i)),
        Err(_) => Err(invalid(format!(
            "a cell must be None, a 64-bit int, a float, str or bytes, got {}",
            value.get_type().name()?
        ))),
    }
}

/// Python cells (a row, a query's parameters) as SQLite values, each as cell_from_py takes it.
fn cells_from_py(cells: &[Bound<'_, PyAny>]) -> PyResult<Vec<rusqlite::types::Value>> {
    cells.iter().map(cell_from_py).collect()
}

/// A SQLite value as Python's (None, int, float, str, bytes).
fn value_to_py(py: Python<'_>, v: rusqlite::types::Value) -> PyResult<Py<PyAny>> {
    use rusqlite::types::Value;
    Ok(match v {
        Value::Null => py.None(),
        Value::Integer(i) => i.into_pyobject(py)?.into_any().unbind(),
        Value::Real(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::Text(t) => t.into_pyobject(py)?.into_any().unbind(),
        Value::Blob(b) => pyo3::types::PyBytes::new(py, &b).into_any().unbind(),
    })
}

/// Rows as a list of tuples of Python values.
fn rows_to_py(
    py: Python<'_>,
    rows: Vec<Vec<rusqlite::types::Value>>,
) -> PyResult<Py<pyo3::types::PyList>> {
    let list = pyo3::types::PyList::empty(py);
    for row in rows {
        let cells = row
            .into_iter()
            .map(|v| value_to_py(py, v))
            .collect::<PyResult<Vec<_>>>()?;
        list.append(pyo3::types::PyTuple::new(py, cells)?)?;
    }
    Ok(list.unbind())
}

/// A hardened read-only connection to one SQLite file. Calls on one Database are
/// serialized; open one per thread for parallel work (t2sql.Grader does). `close()` (or the
/// end of a `with` block) closes the file; any later call raises DatabaseClosed.
#[pyclass(frozen, module = "t2sql._grader")]
pub struct Database {
    /// None once closed.
    conn: Mutex<Option<GuardedConnection>>,
    /// The connection `catalog` reads on (catalog.rs), opened at its first call.
    catalog: Mutex<Option<Catalog>>,
    closed: AtomicBool,
    #[pyo3(get)]
    path: String,
    /// Opened immutable (no locks); false when a writer's side file made it read with locks.
    #[pyo3(get)]
    immutable: bool,
}

impl Database {
    fn opened(gc: GuardedConnection) -> Self {
        Database {
            immutable: gc.immutable,
            path: gc.path.clone(),
            conn: Mutex::new(Some(gc)),
            catalog: Mutex::new(None),
            closed: AtomicBool::new(false),
        }
    }

    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&GuardedConnection) -> crate::error::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let gc = self.conn.lock().unwrap_or_else(|p| p.into_inner());
            gc.as_ref().map(f)
        })
        .ok_or_else(|| {
            DatabaseClosed::new_err(format!(
                "Database({:?}) is closed; open a new Database to query it",
                self.path
            ))
        })?
        .map_err(to_py)
    }
}

#[pymethods]
impl Database {
    /// `path`: str, bytes or os.PathLike, as open() takes it.
    #[new]
    #[pyo3(signature = (path, *, immutable = true))]
    fn new(py: Python<'_>, path: &Bound<'_, PyAny>, immutable: bool) -> PyResult<Self> {
        let path = path_text(path)?;
        let gc = py
            .detach(|| GuardedConnection::open(&path, immutable))
            .map_err(to_py)?;
        Ok(Database::opened(gc))
    }

    /// Close the file now (a call running on another thread finishes first). Closing a closed
    /// Database does nothing; any other call on it raises DatabaseClosed.
    fn close(&self, py: Python<'_>) {
        self.closed.store(true, Ordering::SeqCst);
        py.detach(|| {
            let gc = self.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(gc); // the SQLite connection closes here, without the GIL
            drop(
                self.catalog
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take(),
            );
        });
    }

    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the Database; an exception from the block goes on.
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: &Bound<'_, PyAny>,
        _exc_value: &Bound<'_, PyAny>,
        _traceback: &Bound<'_, PyAny>,
    ) -> bool {
        self.close(py);
        false
    }

    /// One tool call under `limits` (the caller's: the core has no default preview).
    #[pyo3(signature = (sql, limits, *, cancel = None))]
    fn run_tool(
        &self,
        py: Python<'_>,
        sql: &Bound<'_, PyAny>,
        limits: &Bound<'_, ToolLimits>,
        cancel: Option<&Bound<'_, Cancel>>,
    ) -> PyResult<ToolResult> {
        let sql = sql_text(sql)?;
        let limits = *limits.get();
        let budget = budget_of(limits.timeout_s, limits.max_temp_bytes, cancel);
        let opts = limits.options();
        let out = self.with(py, |gc| exec::run_tool(gc, &sql, opts, &budget))?;
        tool_result(py, out)
    }

    /// `spec` None: GradeSpec() (multiset, the default digits and timeout).
    #[pyo3(signature = (sql, spec = None, *, cancel = None))]
    fn digest(
        &self,
        py: Python<'_>,
        sql: &Bound<'_, PyAny>,
        spec: Option<&Bound<'_, GradeSpec>>,
        cancel: Option<&Bound<'_, Cancel>>,
    ) -> PyResult<Digest> {
        let sql = sql_text(sql)?;
        let spec = spec.map(|s| *s.get()).unwrap_or_default();
        let budget = budget_of(spec.timeout_s, spec.max_temp_bytes, cancel);
        let start = std::time::Instant::now();
        let inner = self.with(py, |gc| {
            compare::gold_digest(gc, &sql, spec.digest_spec(), &budget)
        })?;
        Ok(Digest {
            inner,
            elapsed_s: start.elapsed().as_secs_f64(),
        })
    }

    /// `max_temp_mb`: MiB of temporary files the prediction (and a subset gold collected again)
    /// may hold.
    #[pyo3(signature = (pred_sql, gold, timeout_s = Seconds::from(crate::compare::DEFAULT_GRADE_TIMEOUT_S), *, cancel = None, max_temp_mb = Int::from(DEFAULT_MAX_TEMP_MB)))]
    fn grade_against(
        &self,
        py: Python<'_>,
        pred_sql: &Bound<'_, PyAny>,
        gold: &Bound<'_, Digest>,
        timeout_s: Seconds,
        cancel: Option<&Bound<'_, Cancel>>,
        max_temp_mb: Int,
    ) -> PyResult<Verdict> {
        let pred = match pred_text(py, pred_sql)? {
            Ok(s) => s,
            Err(detail) => {
                let g = &gold.get().inner;
                return Ok(Verdict::pred_error(detail, g.method, Some(g.rows)));
            }
        };
        let budget = budget(&timeout_s, &max_temp_mb, cancel)?;
        let g = gold.get().inner.clone();
        Ok(self
            .with(py, |gc| compare::grade_against(gc, &pred, &g, &budget))?
            .into())
    }

    /// `spec` None: GradeSpec() (multiset, the default digits and timeout); a spec built for this
    /// gold (its "auto" resolved against it).
    #[pyo3(signature = (pred_sql, gold_sql, spec = None, *, cancel = None))]
    fn grade(
        &self,
        py: Python<'_>,
        pred_sql: &Bound<'_, PyAny>,
        gold_sql: &Bound<'_, PyAny>,
        spec: Option<&Bound<'_, GradeSpec>>,
        cancel: Option<&Bound<'_, Cancel>>,
    ) -> PyResult<Verdict> {
        let gold = sql_text(gold_sql)?;
        let spec = spec.map(|s| *s.get()).unwrap_or_default();
        let budget = budget_of(spec.timeout_s, spec.max_temp_bytes, cancel);
        let pred = match pred_text(py, pred_sql)? {
            Ok(s) => s,
            Err(detail) => return Ok(Verdict::pred_error(detail, spec.method, None)),
        };
        Ok(self
            .with(py, |gc| {
                compare::grade(gc, &pred, &gold, spec.digest_spec(), &budget)
            })?
            .into())
    }

    /// A small in-memory database built from `schema` (the source's CREATE TABLE / INDEX / VIEW
    /// statements) and `tables` ((name, columns, rows) with None, int, float, str or bytes
    /// cells), hardened like any other (see memdb.rs). `reverse_scans`: SQLite scans tables in
    /// reverse order where no ORDER BY says otherwise.
    /// Built under `timeout_s`, `cancel` and `max_temp_mb`; a row a constraint refuses is
    /// ConstraintError.
    #[staticmethod]
    #[pyo3(signature = (label, schema, tables, *, reverse_scans = false, timeout_s = Seconds::from(crate::compare::DEFAULT_GRADE_TIMEOUT_S), cancel = None, max_temp_mb = Int::from(DEFAULT_MAX_TEMP_MB)))]
    #[allow(clippy::too_many_arguments)]
    fn from_rows(
        py: Python<'_>,
        label: String,
        schema: Vec<String>,
        tables: Vec<TableArg<'_>>,
        reverse_scans: bool,
        timeout_s: Seconds,
        cancel: Option<&Bound<'_, Cancel>>,
        max_temp_mb: Int,
    ) -> PyResult<Database> {
        let budget = budget(&timeout_s, &max_temp_mb, cancel)?;
        let mut converted = Vec::with_capacity(tables.len());
        for (name, columns, rows) in tables {
            let rows = rows
                .iter()
                .map(|row| cells_from_py(row))
                .collect::<PyResult<Vec<_>>>()?;
            converted.push(crate::memdb::TableRows {
                name,
                columns,
                rows,
            });
        }
        let gc = py
            .detach(|| crate::memdb::build(&label, &schema, &converted, reverse_scans, &budget))
            .map_err(to_py)?;
        Ok(Database::opened(gc))
    }

    /// The rows of one checked query (the tool call's policy) with `params` bound to its `?`
    /// marks, as tuples of Python values: at most `max_rows` rows (the rest never stepped), and
    /// SqlError past `max_bytes` of values.
    #[pyo3(signature = (sql, params = Vec::new(), *, timeout_s = Seconds::from(crate::compare::DEFAULT_GRADE_TIMEOUT_S), max_temp_mb = Int::from(DEFAULT_MAX_TEMP_MB), max_rows = Int::from(crate::rows::RowsLimits::DEFAULT.max_rows as u64), max_bytes = Int::from(crate::rows::RowsLimits::DEFAULT.max_bytes as u64), cancel = None))]
    #[allow(clippy::too_many_arguments)]
    fn rows(
        &self,
        py: Python<'_>,
        sql: &Bound<'_, PyAny>,
        params: Vec<Bound<'_, PyAny>>,
        timeout_s: Seconds,
        max_temp_mb: Int,
        max_rows: Int,
        max_bytes: Int,
        cancel: Option<&Bound<'_, Cancel>>,
    ) -> PyResult<Py<pyo3::types::PyList>> {
        let sql = sql_text(sql)?;
        let params = cells_from_py(&params)?;
        let limits = crate::rows::RowsLimits {
            max_rows: int("max_rows", &max_rows)?,
            max_bytes: int("max_bytes", &max_bytes)?,
        };
        let budget = budget(&timeout_s, &max_temp_mb, cancel)?;
        let rows = self.with(py, |gc| {
            crate::rows::rows(gc, &sql, &params, limits, &budget)
        })?;
        rows_to_py(py, rows)
    }

    /// The distinct values of one checked query's one column (NULLs skipped) with how many rows
    /// hold each and their storage classes, counted as `GROUP BY v COLLATE BINARY` groups them
    /// (tally.rs), as (value, rows, classes) tuples; None once the groups pass `max_bytes`.
    #[pyo3(signature = (sql, params = Vec::new(), *, timeout_s = Seconds::from(crate::compare::DEFAULT_GRADE_TIMEOUT_S), max_temp_mb = Int::from(DEFAULT_MAX_TEMP_MB), max_bytes = Int::from(crate::rows::RowsLimits::DEFAULT.max_bytes as u64), cancel = None))]
    #[allow(clippy::too_many_arguments)]
    fn tally(
        &self,
        py: Python<'_>,
        sql: &Bound<'_, PyAny>,
        params: Vec<Bound<'_, PyAny>>,
        timeout_s: Seconds,
        max_temp_mb: Int,
        max_bytes: Int,
        cancel: Option<&Bound<'_, Cancel>>,
    ) -> PyResult<Option<Py<pyo3::types::PyList>>> {
        let sql = sql_text(sql)?;
        let params = cells_from_py(&params)?;
        let max_bytes = int("max_bytes", &max_bytes)?;
        let budget = budget(&timeout_s, &max_temp_mb, cancel)?;
        let Some(groups) = self.with(py, |gc| {
            crate::tally::tally(gc, &sql, &params, max_bytes, &budget)
        })?
        else {
            return Ok(None);
        };
        let list = pyo3::types::PyList::empty(py);
        for g in groups {
            let classes: Vec<&str> = crate::tally::CLASSES
                .iter()
                .enumerate()
                .filter(|(i, _)| g.classes & (1 << i) != 0)
                .map(|(_, name)| *name)
                .collect();
            let cells = (
                value_to_py(py, g.value)?,
                g.rows,
                pyo3::types::PyTuple::new(py, classes)?,
            );
            list.append(cells)?;
        }
        Ok(Some(list.unbind()))
    }

    /// The rows of SQLite's `pragma_<pragma>(name)`, one of CATALOG_PRAGMAS (`table_list` takes no
    /// name), read on a connection of the core's own that reads the schema and nothing else
    /// (catalog.rs); the name is bound, never SQL.
    #[pyo3(signature = (pragma, name = None, *, timeout_s = Seconds::from(crate::compare::DEFAULT_GRADE_TIMEOUT_S), cancel = None))]
    fn catalog(
        &self,
        py: Python<'_>,
        pragma: String,
        name: Option<String>,
        timeout_s: Seconds,
        cancel: Option<&Bound<'_, Cancel>>,
    ) -> PyResult<Py<pyo3::types::PyList>> {
        let budget = budget(&timeout_s, &Int::from(DEFAULT_MAX_TEMP_MB), cancel)?;
        if self.closed() {
            return Err(DatabaseClosed::new_err(format!(
                "Database({:?}) is closed; open a new Database to query it",
                self.path
            )));
        }
        let (path, immutable) = (self.path.clone(), self.immutable);
        let rows = py
            .detach(|| {
                let mut cat = self.catalog.lock().unwrap_or_else(|p| p.into_inner());
                if cat.is_none() {
                    *cat = Some(Catalog::open(&path, immutable)?);
                }
                cat.as_ref()
                    .expect("opened above")
                    .read(&pragma, name.as_deref(), &budget)
            })
            .map_err(to_py)?;
        rows_to_py(py, rows)
    }

    /// Step through the result without reading a value; returns the row count.
    #[pyo3(signature = (sql, timeout_s = Seconds::from(crate::compare::DEFAULT_GRADE_TIMEOUT_S), *, cancel = None, max_temp_mb = Int::from(DEFAULT_MAX_TEMP_MB)))]
    fn count_rows(
        &self,
        py: Python<'_>,
        sql: &Bound<'_, PyAny>,
        timeout_s: Seconds,
        cancel: Option<&Bound<'_, Cancel>>,
        max_temp_mb: Int,
    ) -> PyResult<u64> {
        let sql = sql_text(sql)?;
        let budget = budget(&timeout_s, &max_temp_mb, cancel)?;
        self.with(py, |gc| exec::count_rows(gc, &sql, &budget))
    }

    /// (type, name, sql) of every schema object with SQL text, from sqlite_master; read like
    /// any statement (checked, under the grading deadline).
    fn schema(&self, py: Python<'_>) -> PyResult<Vec<(String, String, String)>> {
        let budget = Budget::new(compare::DEFAULT_GRADE_TIMEOUT_S);
        self.with(py, |gc| gc.schema(&budget))
    }

    fn __repr__(&self) -> String {
        if self.closed() {
            format!("Database({:?}, closed)", self.path)
        } else {
            format!("Database({:?})", self.path)
        }
    }
}

/// The XXH3-128 of a file's bytes as 32 hex digits (filedigest.rs), read without the GIL; `cancel`
/// stops it between chunks (QueryCancelled).
#[pyfunction]
#[pyo3(signature = (path, *, cancel = None))]
pub(crate) fn file_digest(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    cancel: Option<&Bound<'_, Cancel>>,
) -> PyResult<String> {
    let path = path_text(path)?;
    let flag = cancel.map(|c| Arc::clone(&c.get().flag));
    py.detach(|| crate::filedigest::file_digest(&path, flag.as_deref()))
        .map_err(to_py)
}
