//! `SqlPool`: the GIL-free SQL worker threads of `crate::pool`, seen from Python.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::args::{check_timeout, digest_spec, sql_text, tool_options};
use super::database::tool_result;
use super::digest::{Digest, Verdict};
use super::errors::to_py;

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
        let work =
            crate::pool::Work::Tool(tool_options(max_rows, max_cell_chars, max_chars, count_cap));
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
        let work =
            crate::pool::Work::Digest(digest_spec(&sql, semantics, float_digits, column_order)?);
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

/// Make the calling thread `nice` steps nicer (Linux; elsewhere, or if refused, a no-op).
#[pyfunction]
pub(crate) fn lower_thread_priority(nice: i32) {
    crate::pool::lower_priority(nice)
}
