//! t2sql's grading core: hardened read-only SQLite execution and streaming result comparison.
//!
//! The work lives in modules named after what they wrap: `guard` (the read-only connection
//! and the safety policy), `canon` (value equality), `digest` (streaming digests), `exec`
//! (tool previews and digest runs), `compare` (verdicts), `sqltext` (scanning SQL text),
//! `checked` (the ranges of the numbers a caller passes),
//! `memdb` (small databases built from given rows), `rows` (a query's rows as values, bounded),
//! `tally` (a column's distinct values counted in a bounded hash),
//! `catalog` (a database's declared schema, read with the allowed pragmas), `filedigest` (a file's
//! content digest), `pool` (SQL worker threads), `spill` (the
//! grading memory budget and the temporary disk past it), `tempfiles` (SQLite's temporary files,
//! capped per query).
//! This file declares them and, with the `python` feature, registers `t2sql._grader`, whose
//! bindings live in `py`: argument conversion, releasing the GIL, and one Python exception
//! per error variant.

pub mod canon;
pub mod catalog;
pub mod checked;
pub mod compare;
pub mod digest;
pub mod error;
pub mod exec;
pub mod filedigest;
pub mod guard;
pub mod memdb;
pub mod pool;
pub mod rows;
pub mod spill;
pub mod sqltext;
pub mod tally;
pub mod tempfiles;

#[cfg(feature = "python")]
mod py;

/// The extension module: exceptions, then classes, then functions.
#[cfg(feature = "python")]
#[pyo3::pymodule]
fn _grader(m: &pyo3::Bound<'_, pyo3::types::PyModule>) -> pyo3::PyResult<()> {
    use pyo3::prelude::*;

    use py::database::{file_digest, Cancel, Database};
    use py::digest::{Digest, Verdict};
    use py::errors::{
        invalid_argument, ConstraintError, DatabaseClosed, DatabaseError, HashSecretMismatch,
        QueryCancelled, QueryTimeout, SpillError, SqlError, T2sqlError, TempDiskExceeded,
        UnsafeQuery,
    };
    use py::method::{method_name, resolve_method, PyMethod};
    use py::pool::{lower_thread_priority, SqlPool};
    use py::process::{
        grade_memory, hash_secret_id, set_grade_memory, set_hash_secret, set_heap_limit,
        spill_usage, sqlite_temp_dir, sqlite_version, temp_usage,
    };
    use py::spec::{GradeSpec, ToolLimits};
    use py::sqltext::sql_tokens;
    use py::tool_result::{restore_tool_result, ToolResult};

    let py = m.py();
    m.add("T2sqlError", py.get_type::<T2sqlError>())?;
    m.add("UnsafeQuery", py.get_type::<UnsafeQuery>())?;
    m.add("SqlError", py.get_type::<SqlError>())?;
    m.add("QueryTimeout", py.get_type::<QueryTimeout>())?;
    m.add("QueryCancelled", py.get_type::<QueryCancelled>())?;
    m.add("DatabaseError", py.get_type::<DatabaseError>())?;
    m.add("DatabaseClosed", py.get_type::<DatabaseClosed>())?;
    m.add("ConstraintError", py.get_type::<ConstraintError>())?;
    m.add("InvalidArgument", invalid_argument(py)?)?;
    m.add("HashSecretMismatch", py.get_type::<HashSecretMismatch>())?;
    m.add("SpillError", py.get_type::<SpillError>())?;
    m.add("TempDiskExceeded", py.get_type::<TempDiskExceeded>())?;
    m.add_class::<Cancel>()?;
    m.add_class::<Database>()?;
    m.add_class::<Digest>()?;
    m.add_class::<ToolResult>()?;
    m.add_class::<Verdict>()?;
    m.add_class::<SqlPool>()?;
    m.add_class::<ToolLimits>()?;
    m.add_class::<GradeSpec>()?;
    m.add_class::<PyMethod>()?;
    m.add_function(wrap_pyfunction!(resolve_method, m)?)?;
    m.add_function(wrap_pyfunction!(method_name, m)?)?;
    m.add_function(wrap_pyfunction!(sqlite_version, m)?)?;
    m.add_function(wrap_pyfunction!(set_hash_secret, m)?)?;
    m.add_function(wrap_pyfunction!(hash_secret_id, m)?)?;
    m.add_function(wrap_pyfunction!(set_heap_limit, m)?)?;
    m.add_function(wrap_pyfunction!(set_grade_memory, m)?)?;
    m.add_function(wrap_pyfunction!(grade_memory, m)?)?;
    m.add_function(wrap_pyfunction!(spill_usage, m)?)?;
    m.add_function(wrap_pyfunction!(temp_usage, m)?)?;
    m.add_function(wrap_pyfunction!(sqlite_temp_dir, m)?)?;
    m.add_function(wrap_pyfunction!(lower_thread_priority, m)?)?;
    m.add_function(wrap_pyfunction!(sql_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(restore_tool_result, m)?)?;
    m.add_function(wrap_pyfunction!(file_digest, m)?)?;

    // The core's defaults and names, for the Python layers above (one place for each).
    let outcomes: Vec<&str> = compare::Outcome::ALL.iter().map(|o| o.name()).collect();
    m.add("OUTCOMES", pyo3::types::PyTuple::new(py, outcomes)?)?;
    m.add("MAX_FLOAT_DIGITS", canon::MAX_FLOAT_DIGITS)?;
    m.add("MAX_SQL_BYTES", guard::MAX_SQL_BYTES)?;
    m.add(
        "CATALOG_PRAGMAS",
        pyo3::types::PyTuple::new(py, catalog::CATALOG_PRAGMAS)?,
    )?;
    let methods = digest::Method::forms();
    m.add("METHODS", pyo3::types::PyTuple::new(py, methods)?)?;
    let orders: Vec<&str> = digest::COLUMN_ORDERS.iter().map(|o| o.name()).collect();
    m.add("COLUMN_ORDERS", pyo3::types::PyTuple::new(py, orders)?)?;
    // GradeSpec() as a dict: the numbers themselves live where the core uses them.
    let spec = GradeSpec::default();
    let grade = pyo3::types::PyDict::new(py);
    grade.set_item("timeout_s", spec.timeout_s)?;
    grade.set_item("float_digits", spec.float_digits)?;
    grade.set_item(
        "memory_mb",
        crate::spill::DEFAULT_MEMORY_BYTES / (1024 * 1024),
    )?;
    grade.set_item("max_temp_mb", spec.max_temp_bytes / tempfiles::MIB)?;
    m.add("GRADE_DEFAULTS", grade)?;
    Ok(())
}
