//! t2sql's grading core: hardened read-only SQLite execution and streaming result comparison.
//!
//! The work lives in modules named after what they wrap: `guard` (the read-only connection
//! and the safety policy), `canon` (value equality), `digest` (streaming digests), `exec`
//! (tool previews and digest runs), `compare` (verdicts), `sqltext` (scanning SQL text).
//! This file declares them and, with the `python` feature, binds them as `t2sql._grader`:
//! argument conversion, releasing the GIL, and one Python exception per error variant.

pub mod canon;
pub mod compare;
pub mod digest;
pub mod error;
pub mod exec;
pub mod guard;
pub mod perturb;
pub mod pool;
pub mod sqltext;

#[cfg(feature = "python")]
mod bindings {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use pyo3::create_exception;
    use pyo3::exceptions::{PyException, PyValueError};
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyList, PyTuple};

    use crate::compare::{self, Outcome};
    use crate::digest::{self, Semantics};
    use crate::error::GradeError;
    use crate::exec::{self, Cell, ToolOptions};
    use crate::guard::{self, Budget, GuardedConnection};

    create_exception!(
        _grader,
        T2sqlError,
        PyException,
        "Base class of every error the grading core raises."
    );
    create_exception!(
        _grader,
        UnsafeQuery,
        T2sqlError,
        "Not one read-only SELECT/WITH/VALUES statement."
    );
    create_exception!(
        _grader,
        SqlError,
        T2sqlError,
        "SQLite rejected or failed the query."
    );
    create_exception!(
        _grader,
        QueryTimeout,
        T2sqlError,
        "The query ran past its deadline."
    );
    create_exception!(
        _grader,
        QueryCancelled,
        T2sqlError,
        "The query's Cancel token fired."
    );
    create_exception!(
        _grader,
        DatabaseError,
        T2sqlError,
        "The database is missing, unreadable or not SQLite."
    );

    fn to_py(e: GradeError) -> PyErr {
        let msg = e.to_string();
        match e {
            GradeError::Unsafe(_) => UnsafeQuery::new_err(msg),
            GradeError::Sql(_) => SqlError::new_err(msg),
            GradeError::Timeout(_) => QueryTimeout::new_err(msg),
            GradeError::Cancelled => QueryCancelled::new_err(msg),
            GradeError::Database(_) => DatabaseError::new_err(msg),
            GradeError::Invalid(_) => PyValueError::new_err(msg),
        }
    }

    /// SQL arrives as str (or UTF-8 bytes); a str with lone surrogates is not valid UTF-8.
    fn sql_text(obj: &Bound<'_, PyAny>) -> PyResult<String> {
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
    fn tool_options(
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
    fn digest_spec(
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

    fn check_timeout(timeout_s: f64) -> PyResult<f64> {
        if timeout_s.is_finite() && timeout_s > 0.0 {
            Ok(timeout_s)
        } else {
            Err(PyValueError::new_err(format!(
                "timeout_s must be a positive number of seconds, got {timeout_s}"
            )))
        }
    }

    /// A cancellation token: `cancel()` from any thread interrupts the query that holds it.
    #[pyclass(frozen, module = "t2sql._grader")]
    pub struct Cancel {
        flag: Arc<AtomicBool>,
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

    fn budget(timeout_s: f64, cancel: Option<&Bound<'_, Cancel>>) -> PyResult<Budget> {
        Ok(Budget {
            timeout_s: check_timeout(timeout_s)?,
            cancel: cancel.map(|c| Arc::clone(&c.get().flag)),
        })
    }

    fn cell_to_py(py: Python<'_>, c: &Cell) -> PyResult<Py<PyAny>> {
        Ok(match c {
            Cell::Null => py.None(),
            Cell::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
            Cell::Real(x) => x.into_pyobject(py)?.into_any().unbind(),
            Cell::Text(t) => t.into_pyobject(py)?.into_any().unbind(),
            Cell::Blob(b) => PyBytes::new(py, b).into_any().unbind(),
        })
    }

    /// What the model sees for one `execute_sql_query` call.
    #[pyclass(frozen, get_all, module = "t2sql._grader")]
    pub struct ToolResult {
        columns: Vec<String>,
        rows: Py<PyList>,
        row_count: u64,
        row_count_capped: bool,
        truncated: bool,
        elapsed_s: f64,
        text: String,
    }

    #[pymethods]
    impl ToolResult {
        fn __repr__(&self) -> String {
            let plus = if self.row_count_capped { "+" } else { "" };
            format!(
                "ToolResult(columns={:?}, row_count={}{plus}, truncated={})",
                self.columns, self.row_count, self.truncated
            )
        }
    }

    /// A result's streaming digest: counts plus a 128-bit keyed hash (never rows).
    #[pyclass(frozen, module = "t2sql._grader", eq)]
    #[derive(PartialEq)]
    pub struct Digest {
        inner: digest::Digest,
        elapsed_s: f64,
    }

    #[pymethods]
    impl Digest {
        #[getter]
        fn semantics(&self) -> String {
            self.inner.semantics.name()
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
                && a.semantics == b.semantics
                && a.float_digits == b.float_digits
                && a.column_order == b.column_order
                && a.rows == b.rows
                && a.columns == b.columns
                && a.key == b.key
        }
        /// A fixed binary layout for caches (digest.rs); `from_bytes` validates it.
        fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
            PyBytes::new(py, &self.inner.to_bytes())
        }
        #[staticmethod]
        fn from_bytes(data: &[u8]) -> PyResult<Self> {
            let inner = digest::Digest::from_bytes(data).map_err(|why| {
                PyValueError::new_err(format!("not a t2sql digest ({why}): recompute it"))
            })?;
            Ok(Digest {
                inner,
                elapsed_s: 0.0,
            })
        }
        fn __repr__(&self) -> String {
            format!(
                "Digest(semantics={:?}, rows={}, columns={}, float_digits={:?})",
                self.inner.semantics.name(),
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
        semantics: String,
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
                semantics: v.semantics.name(),
                pred_rows: v.pred_rows,
                gold_rows: v.gold_rows,
                elapsed_s: v.elapsed_s,
                pred_digest: v.pred_digest,
            }
        }
    }

    impl Verdict {
        /// A prediction that never reached SQLite (not valid UTF-8).
        fn pred_error(detail: String, semantics: Semantics, gold_rows: Option<u64>) -> Self {
            Verdict {
                outcome: Outcome::PredError.name(),
                detail,
                semantics: semantics.name(),
                pred_rows: None,
                gold_rows,
                elapsed_s: 0.0,
                pred_digest: None,
            }
        }
    }

    /// A prediction's text, or the reason it is not SQL text: for the grading path an
    /// undecodable prediction is a pred_error outcome, not an exception.
    fn pred_text(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Result<String, String>> {
        match sql_text(obj) {
            Ok(s) => Ok(Ok(s)),
            Err(e) if e.is_instance_of::<SqlError>(py) => Ok(Err(e.value(py).to_string())),
            Err(e) => Err(e),
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
        fn pred_digest<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
            self.pred_digest
                .as_ref()
                .map(|d| PyBytes::new(py, &d.to_bytes()))
        }
        fn __repr__(&self) -> String {
            format!(
                "Verdict(outcome={:?}, detail={:?})",
                self.outcome, self.detail
            )
        }
    }

    /// A hardened read-only connection to one SQLite file. Calls on one Database are
    /// serialized; open one per thread for parallel work (t2sql.Grader does).
    #[pyclass(frozen, module = "t2sql._grader")]
    pub struct Database {
        conn: Mutex<GuardedConnection>,
        #[pyo3(get)]
        path: String,
        /// Opened immutable (no locks); false when a writer's side file made it read with locks.
        #[pyo3(get)]
        immutable: bool,
    }

    impl Database {
        fn with<T: Send>(
            &self,
            py: Python<'_>,
            f: impl FnOnce(&GuardedConnection) -> crate::error::Result<T> + Send,
        ) -> PyResult<T> {
            py.detach(|| {
                let gc = self.conn.lock().unwrap_or_else(|p| p.into_inner());
                f(&gc)
            })
            .map_err(to_py)
        }
    }

    #[pymethods]
    impl Database {
        #[new]
        #[pyo3(signature = (path, *, immutable = true))]
        fn new(py: Python<'_>, path: std::path::PathBuf, immutable: bool) -> PyResult<Self> {
            let path = path.to_string_lossy().into_owned();
            let gc = py
                .detach(|| GuardedConnection::open(&path, immutable))
                .map_err(to_py)?;
            Ok(Database {
                immutable: gc.immutable,
                conn: Mutex::new(gc),
                path,
            })
        }

        #[pyo3(signature = (sql, timeout_s = 10.0, *, max_rows = 20, max_cell_chars = 120, max_chars = 4000, count_cap = 10000, cancel = None))]
        #[allow(clippy::too_many_arguments)]
        fn run_tool(
            &self,
            py: Python<'_>,
            sql: &Bound<'_, PyAny>,
            timeout_s: f64,
            max_rows: usize,
            max_cell_chars: usize,
            max_chars: usize,
            count_cap: u64,
            cancel: Option<&Bound<'_, Cancel>>,
        ) -> PyResult<ToolResult> {
            let sql = sql_text(sql)?;
            let budget = budget(timeout_s, cancel)?;
            let opts = tool_options(max_rows, max_cell_chars, max_chars, count_cap);
            let out = self.with(py, |gc| exec::run_tool(gc, &sql, opts, &budget))?;
            tool_result(py, out)
        }

        #[pyo3(signature = (sql, semantics = "multiset", float_digits = Some(12), timeout_s = 30.0, *, column_order = "strict", cancel = None))]
        #[allow(clippy::too_many_arguments)]
        fn digest(
            &self,
            py: Python<'_>,
            sql: &Bound<'_, PyAny>,
            semantics: &str,
            float_digits: Option<u32>,
            timeout_s: f64,
            column_order: &str,
            cancel: Option<&Bound<'_, Cancel>>,
        ) -> PyResult<Digest> {
            let sql = sql_text(sql)?;
            let spec = digest_spec(&sql, semantics, float_digits, column_order)?;
            let budget = budget(timeout_s, cancel)?;
            let start = std::time::Instant::now();
            let inner = self.with(py, |gc| compare::gold_digest(gc, &sql, spec, &budget))?;
            Ok(Digest {
                inner,
                elapsed_s: start.elapsed().as_secs_f64(),
            })
        }

        #[pyo3(signature = (pred_sql, gold, timeout_s = 30.0, *, cancel = None))]
        fn grade_against(
            &self,
            py: Python<'_>,
            pred_sql: &Bound<'_, PyAny>,
            gold: &Bound<'_, Digest>,
            timeout_s: f64,
            cancel: Option<&Bound<'_, Cancel>>,
        ) -> PyResult<Verdict> {
            let pred = match pred_text(py, pred_sql)? {
                Ok(s) => s,
                Err(detail) => {
                    let g = &gold.get().inner;
                    return Ok(Verdict::pred_error(detail, g.semantics, Some(g.rows)));
                }
            };
            let budget = budget(timeout_s, cancel)?;
            let g = gold.get().inner.clone();
            Ok(self
                .with(py, |gc| compare::grade_against(gc, &pred, &g, &budget))?
                .into())
        }

        #[pyo3(signature = (pred_sql, gold_sql, semantics = "multiset", float_digits = Some(12), timeout_s = 30.0, *, column_order = "strict", cancel = None))]
        #[allow(clippy::too_many_arguments)]
        fn grade(
            &self,
            py: Python<'_>,
            pred_sql: &Bound<'_, PyAny>,
            gold_sql: &Bound<'_, PyAny>,
            semantics: &str,
            float_digits: Option<u32>,
            timeout_s: f64,
            column_order: &str,
            cancel: Option<&Bound<'_, Cancel>>,
        ) -> PyResult<Verdict> {
            let gold = sql_text(gold_sql)?;
            let spec = digest_spec(&gold, semantics, float_digits, column_order)?;
            let budget = budget(timeout_s, cancel)?;
            let pred = match pred_text(py, pred_sql)? {
                Ok(s) => s,
                Err(detail) => return Ok(Verdict::pred_error(detail, spec.semantics, None)),
            };
            Ok(self
                .with(py, |gc| compare::grade(gc, &pred, &gold, spec, &budget))?
                .into())
        }

        /// An in-memory copy of this database with `kind` ("sample", "duplicate", "shuffle")
        /// applied under `seed`, opened with the same hardening (see perturb.rs).
        #[pyo3(signature = (kind, seed, *, max_bytes = crate::perturb::DEFAULT_MAX_BYTES))]
        fn perturbed(
            &self,
            py: Python<'_>,
            kind: &str,
            seed: u64,
            max_bytes: u64,
        ) -> PyResult<Database> {
            let kind = crate::perturb::Perturbation::parse(kind).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "unknown perturbation {kind:?}: use sample, duplicate, shuffle or nullify"
                ))
            })?;
            let copy = self.with(py, |gc| {
                crate::perturb::perturbed_copy(gc, kind, seed, max_bytes)
            })?;
            let path = copy.path.clone();
            Ok(Database {
                immutable: copy.immutable,
                conn: Mutex::new(copy),
                path,
            })
        }

        /// Step through the result without reading a value; returns the row count.
        #[pyo3(signature = (sql, timeout_s = 30.0, *, cancel = None))]
        fn count_rows(
            &self,
            py: Python<'_>,
            sql: &Bound<'_, PyAny>,
            timeout_s: f64,
            cancel: Option<&Bound<'_, Cancel>>,
        ) -> PyResult<u64> {
            let sql = sql_text(sql)?;
            let budget = budget(timeout_s, cancel)?;
            self.with(py, |gc| exec::count_rows(gc, &sql, &budget))
        }

        /// (type, name, sql) of every schema object with SQL text, from sqlite_master.
        fn schema(&self, py: Python<'_>) -> PyResult<Vec<(String, String, String)>> {
            self.with(py, |gc| {
                let mut stmt = gc
                    .conn
                    .prepare("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")
                    .map_err(|e| GradeError::Database(format!("{}: {e}", gc.path)))?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| GradeError::Database(format!("{}: {e}", gc.path)))?;
                Ok(rows)
            })
        }

        fn __repr__(&self) -> String {
            format!("Database({:?})", self.path)
        }
    }

    fn tool_result(py: Python<'_>, out: exec::ToolOutput) -> PyResult<ToolResult> {
        let rows = PyList::empty(py);
        for r in &out.rows {
            let cells = r
                .iter()
                .map(|c| cell_to_py(py, c))
                .collect::<PyResult<Vec<_>>>()?;
            rows.append(PyTuple::new(py, cells)?)?;
        }
        Ok(ToolResult {
            columns: out.columns,
            rows: rows.unbind(),
            row_count: out.row_count,
            row_count_capped: out.row_count_capped,
            truncated: out.truncated,
            elapsed_s: out.elapsed_s,
            text: out.text,
        })
    }

    /// What SqlPool.drain returns: (job id, value or None, exception or None) per finished job.
    type Drained = Vec<(u64, Py<PyAny>, Py<PyAny>)>;

    /// SQL worker threads that never take the GIL (see pool.rs). Jobs are submitted with an id;
    /// when `wake_fd` turns readable, `drain()` returns `(id, value, error)` for every finished
    /// job: value is a ToolResult, `(digest bytes, seconds)` or a Verdict; error an exception.
    #[pyclass(frozen, module = "t2sql._grader")]
    pub struct SqlPool {
        pool: crate::pool::Pool,
    }

    impl SqlPool {
        #[allow(clippy::too_many_arguments)]
        fn submit(
            &self,
            id: u64,
            path: String,
            size: u64,
            version: i64,
            sql: String,
            timeout_s: f64,
            work: crate::pool::Work,
        ) -> PyResult<()> {
            let job = crate::pool::Job {
                id,
                path,
                identity: (size, version),
                sql,
                timeout_s: check_timeout(timeout_s)?,
                work,
            };
            self.pool
                .submit(job)
                .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
        }
    }

    #[pymethods]
    impl SqlPool {
        #[new]
        #[pyo3(signature = (size, *, nice = 0))]
        fn new(size: usize, nice: i32) -> PyResult<Self> {
            if size == 0 {
                return Err(PyValueError::new_err(
                    "an SQL pool needs at least one worker",
                ));
            }
            let pool = crate::pool::Pool::new(size, nice)
                .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))?;
            Ok(SqlPool { pool })
        }

        fn wake_fd(&self) -> i32 {
            self.pool.wake_fd()
        }

        #[pyo3(signature = (job_id, path, size, version, sql, timeout_s, max_rows, max_cell_chars, max_chars, count_cap))]
        #[allow(clippy::too_many_arguments)]
        fn submit_tool(
            &self,
            job_id: u64,
            path: String,
            size: u64,
            version: i64,
            sql: &Bound<'_, PyAny>,
            timeout_s: f64,
            max_rows: usize,
            max_cell_chars: usize,
            max_chars: usize,
            count_cap: u64,
        ) -> PyResult<()> {
            let work = crate::pool::Work::Tool(tool_options(
                max_rows,
                max_cell_chars,
                max_chars,
                count_cap,
            ));
            self.submit(job_id, path, size, version, sql_text(sql)?, timeout_s, work)
        }

        #[pyo3(signature = (job_id, path, size, version, sql, semantics, float_digits, timeout_s, column_order = "strict"))]
        #[allow(clippy::too_many_arguments)]
        fn submit_digest(
            &self,
            job_id: u64,
            path: String,
            size: u64,
            version: i64,
            sql: &Bound<'_, PyAny>,
            semantics: &str,
            float_digits: Option<u32>,
            timeout_s: f64,
            column_order: &str,
        ) -> PyResult<()> {
            let sql = sql_text(sql)?;
            let work = crate::pool::Work::Digest(digest_spec(
                &sql,
                semantics,
                float_digits,
                column_order,
            )?);
            self.submit(job_id, path, size, version, sql, timeout_s, work)
        }

        /// Raises SqlError at once for a prediction that is not valid text.
        #[pyo3(signature = (job_id, path, size, version, sql, gold, timeout_s))]
        #[allow(clippy::too_many_arguments)]
        fn submit_grade(
            &self,
            job_id: u64,
            path: String,
            size: u64,
            version: i64,
            sql: &Bound<'_, PyAny>,
            gold: &[u8],
            timeout_s: f64,
        ) -> PyResult<()> {
            let work = crate::pool::Work::Grade(Digest::from_bytes(gold)?.inner);
            self.submit(job_id, path, size, version, sql_text(sql)?, timeout_s, work)
        }

        fn cancel(&self, job_id: u64) {
            self.pool.cancel(job_id)
        }

        fn drain(&self, py: Python<'_>) -> PyResult<Drained> {
            let mut out = Vec::new();
            for c in self.pool.drain() {
                let (value, error) = match c.result {
                    Ok(crate::pool::Output::Tool(t)) => {
                        (Py::new(py, tool_result(py, t)?)?.into_any(), py.None())
                    }
                    Ok(crate::pool::Output::Digest(inner, elapsed_s)) => {
                        let d = Digest { inner, elapsed_s };
                        let pair = PyTuple::new(
                            py,
                            [
                                d.to_bytes(py).into_any(),
                                elapsed_s.into_pyobject(py)?.into_any(),
                            ],
                        )?;
                        (pair.into_any().unbind(), py.None())
                    }
                    Ok(crate::pool::Output::Verdict(v)) => {
                        (Py::new(py, Verdict::from(v))?.into_any(), py.None())
                    }
                    Err(e) => (py.None(), to_py(e).into_value(py).into_any()),
                };
                out.push((c.id, value, error));
            }
            Ok(out)
        }

        /// Cancel everything, stop and join the workers (a last drain() collects the jobs
        /// that were cancelled by it).
        fn close(&self, py: Python<'_>) {
            py.detach(|| self.pool.close())
        }
    }

    #[pyfunction]
    fn resolve_semantics(gold_sql: &str, semantics: &str) -> PyResult<String> {
        compare::resolve_semantics(gold_sql, semantics)
            .map(|s| s.name())
            .map_err(to_py)
    }

    #[pyfunction]
    fn sqlite_version() -> &'static str {
        rusqlite::version()
    }

    /// Key every row hash with this secret from now on (a disk cache shared by processes sets it).
    #[pyfunction]
    fn set_hash_secret(secret: &[u8]) -> PyResult<()> {
        if secret.len() < 16 {
            return Err(PyValueError::new_err(
                "the hash secret must be at least 16 bytes",
            ));
        }
        digest::set_secret(secret);
        Ok(())
    }

    #[pyfunction]
    fn hash_secret_id() -> String {
        format!("{:016x}", digest::secret_id())
    }

    /// Set SQLite's process-wide hard heap limit in bytes (0 = none); returns the previous one.
    #[pyfunction]
    fn set_heap_limit(bytes: i64) -> i64 {
        guard::set_heap_limit(bytes)
    }

    /// Make the calling thread `nice` steps nicer (Linux; elsewhere, or if refused, a no-op).
    #[pyfunction]
    fn lower_thread_priority(nice: i32) {
        crate::pool::lower_priority(nice)
    }

    #[pymodule]
    fn _grader(m: &Bound<'_, PyModule>) -> PyResult<()> {
        let py = m.py();
        m.add("T2sqlError", py.get_type::<T2sqlError>())?;
        m.add("UnsafeQuery", py.get_type::<UnsafeQuery>())?;
        m.add("SqlError", py.get_type::<SqlError>())?;
        m.add("QueryTimeout", py.get_type::<QueryTimeout>())?;
        m.add("QueryCancelled", py.get_type::<QueryCancelled>())?;
        m.add("DatabaseError", py.get_type::<DatabaseError>())?;
        m.add_class::<Cancel>()?;
        m.add_class::<Database>()?;
        m.add_class::<Digest>()?;
        m.add_class::<ToolResult>()?;
        m.add_class::<Verdict>()?;
        m.add_class::<SqlPool>()?;
        m.add_function(wrap_pyfunction!(resolve_semantics, m)?)?;
        m.add_function(wrap_pyfunction!(sqlite_version, m)?)?;
        m.add_function(wrap_pyfunction!(set_hash_secret, m)?)?;
        m.add_function(wrap_pyfunction!(hash_secret_id, m)?)?;
        m.add_function(wrap_pyfunction!(set_heap_limit, m)?)?;
        m.add_function(wrap_pyfunction!(lower_thread_priority, m)?)?;
        Ok(())
    }
}
