//! `SqlPool`: the GIL-free SQL worker threads of `crate::pool`, seen from Python.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::args::{check_timeout, int, sql_text, temp_cap_bytes};
use super::database::Cancel;
use super::digest::{Digest, Verdict};
use super::errors::{invalid, to_py};
use super::spec::{GradeSpec, ToolLimits};
use super::tool_result::tool_result;
use crate::checked::{Int, Seconds};

/// What SqlPool.drain returns: (job id, value or None, exception or None) per finished job.
type Drained = Vec<(u64, Py<PyAny>, Py<PyAny>)>;

/// SQL worker threads that never take the GIL (see pool.rs). Jobs are submitted with an id;
/// when `wake_fd` turns readable, `drain()` returns `(id, value, error)` for every finished
/// job: value is a ToolResult, `(digest bytes, seconds)`, a Verdict or what a call returned;
/// error an exception.
#[pyclass(frozen, module = "t2sql._grader")]
pub struct SqlPool {
    pool: crate::pool::Pool,
}

/// The fields every job names, read by name from the Python job (t2sql.serving.jobs:
/// ToolJob, DigestJob, GradeJob), so a job whose fields move or are renamed fails at once.
#[derive(FromPyObject)]
struct Target {
    job_id: Int,
    db_path: String,
    /// (size, version) of the file as the Grader saw it (t2sql.serving.manifest.FileIdentity).
    identity: (Int, Int),
}

/// A GradeJob's deadline and cap on temporary disk (a ToolJob's are its limits', a DigestJob's
/// its spec's).
#[derive(FromPyObject)]
struct Deadline {
    timeout_s: Seconds,
    max_temp_mb: Int,
}

impl SqlPool {
    fn submit_task(&self, id: u64, task: crate::pool::Task) -> PyResult<()> {
        self.pool
            .submit(crate::pool::Job { id, task })
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
    }

    fn submit_query(
        &self,
        job: &Bound<'_, PyAny>,
        sql: String,
        (timeout_s, max_temp_bytes): (f64, u64),
        work: crate::pool::Work,
    ) -> PyResult<()> {
        let target: Target = job.extract()?;
        let (size, version) = &target.identity;
        let query = crate::pool::Query {
            path: target.db_path,
            identity: (
                int("identity size", size)?,
                int("identity version", version)?,
            ),
            sql,
            timeout_s,
            max_temp_bytes,
            work,
        };
        self.submit_task(
            int("job_id", &target.job_id)?,
            crate::pool::Task::Query(query),
        )
    }
}

#[pymethods]
impl SqlPool {
    #[new]
    #[pyo3(signature = (size, *, nice = Int::from(0)))]
    fn new(size: Int, nice: Int) -> PyResult<Self> {
        let size: usize = int("size", &size)?;
        if size == 0 {
            return Err(invalid("an SQL pool needs at least one worker".into()));
        }
        let pool = crate::pool::Pool::new(size, int("nice", &nice)?)
            .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))?;
        Ok(SqlPool { pool })
    }

    fn wake_fd(&self) -> i32 {
        self.pool.wake_fd()
    }

    /// Queue a ToolJob: its `limits` is one ToolLimits, read whole.
    fn submit_tool(&self, job: &Bound<'_, PyAny>) -> PyResult<()> {
        let limits = *job.getattr("limits")?.cast::<ToolLimits>()?.get();
        let work = crate::pool::Work::Tool(limits.options());
        let budget = (limits.timeout_s, limits.max_temp_bytes);
        self.submit_query(job, sql_text(&job.getattr("sql")?)?, budget, work)
    }

    /// Queue a DigestJob: its `spec` is one GradeSpec, read whole.
    fn submit_digest(&self, job: &Bound<'_, PyAny>) -> PyResult<()> {
        let spec = *job.getattr("spec")?.cast::<GradeSpec>()?.get();
        let sql = sql_text(&job.getattr("sql")?)?;
        let work = crate::pool::Work::Digest(spec.digest_spec());
        self.submit_query(job, sql, (spec.timeout_s, spec.max_temp_bytes), work)
    }

    /// Queue a GradeJob (its `gold` is Digest.to_bytes()). Raises SqlError at once for a
    /// prediction that is not valid text.
    fn submit_grade(&self, job: &Bound<'_, PyAny>) -> PyResult<()> {
        let gold = job.getattr("gold")?;
        let gold = gold.cast::<pyo3::types::PyBytes>()?;
        let work = crate::pool::Work::Grade(Digest::from_bytes(gold.as_bytes())?.inner);
        let deadline: Deadline = job.extract()?;
        let budget = (
            check_timeout(&deadline.timeout_s)?,
            temp_cap_bytes(&deadline.max_temp_mb)?,
        );
        self.submit_query(job, sql_text(&job.getattr("sql")?)?, budget, work)
    }

    /// Run `function(cancel)` on a worker, where a query would run: the work of the layer above
    /// that runs its own SQL (the equivalence check) counts against the pool's size like every
    /// query. The worker takes the GIL to call it; the function should release it for its SQL
    /// (the core's Database calls do) and watch `cancel` (a Cancel that `cancel(job_id)` sets).
    /// Its return value, or the exception it raised, comes back through drain().
    fn submit_call(&self, job_id: Int, function: Py<PyAny>) -> PyResult<()> {
        let job_id = int("job_id", &job_id)?;
        let call: crate::pool::Call = Box::new(move |flag| {
            let returned: PyResult<Py<PyAny>> = Python::attach(move |py| {
                let cancel = Py::new(py, Cancel::sharing(flag))?;
                function.call1(py, (cancel,))
            });
            crate::pool::Output::Called(Box::new(returned))
        });
        self.submit_task(job_id, crate::pool::Task::Call(call))
    }

    fn cancel(&self, job_id: Int) -> PyResult<()> {
        self.pool.cancel(int("job_id", &job_id)?);
        Ok(())
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
                            d.to_bytes(py)?.into_any(),
                            elapsed_s.into_pyobject(py)?.into_any(),
                        ],
                    )?;
                    (pair.into_any().unbind(), py.None())
                }
                Ok(crate::pool::Output::Verdict(v)) => {
                    (Py::new(py, Verdict::from(v))?.into_any(), py.None())
                }
                Ok(crate::pool::Output::Called(returned)) => {
                    match returned.downcast::<PyResult<Py<PyAny>>>().map(|b| *b) {
                        Ok(Ok(value)) => (value, py.None()),
                        Ok(Err(e)) => (py.None(), e.into_value(py).into_any()),
                        Err(_) => unreachable!("submit_call's functions return PyResult"),
                    }
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
pub(crate) fn lower_thread_priority(nice: Int) -> PyResult<()> {
    crate::pool::lower_priority(int("nice", &nice)?);
    Ok(())
}
