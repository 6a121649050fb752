//! The Python exceptions of the grading core: one per `GradeError` variant, all under
//! `T2sqlError`, and the mapping from the Rust error to them.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::error::GradeError;

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
    "A statement that parses and would write, attach, detach, load, vacuum or change a setting."
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

create_exception!(
    _grader,
    DatabaseClosed,
    DatabaseError,
    "The Database was closed (close() or the end of its with block); open a new one."
);

create_exception!(
    _grader,
    ConstraintError,
    DatabaseError,
    "A row given to Database.from_rows breaks a constraint of the schema (CHECK, UNIQUE, NOT NULL, ...)."
);

create_exception!(
    _grader,
    SpillError,
    T2sqlError,
    "A set or subset digest past its memory budget could not spill to its temporary directory."
);

create_exception!(
    _grader,
    TempDiskExceeded,
    SqlError,
    "The query needed more temporary disk (SQLite's files for sorts, DISTINCT, GROUP BY and temporary results) than its cap, max_temp_mb."
);

create_exception!(
    _grader,
    HashSecretMismatch,
    T2sqlError,
    "A gold digest made under another hash secret than the process's: compute it again."
);

/// `InvalidArgument(T2sqlError, ValueError)`: a caller's value the core cannot take (a negative
/// limit, an unknown method name, ...). Made once with both bases, which create_exception! cannot
/// give: code that catches ValueError and code that catches T2sqlError both see it.
pub(crate) fn invalid_argument(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TYPE.get_or_try_init(py, || {
        let bases = PyTuple::new(
            py,
            [py.get_type::<T2sqlError>(), py.get_type::<PyValueError>()],
        )?;
        let namespace = PyDict::new(py);
        namespace.set_item("__module__", "t2sql._grader")?;
        namespace.set_item(
            "__doc__",
            "An argument the core cannot take (out of range, unknown name); the message names it.",
        )?;
        let made = py
            .get_type::<PyType>()
            .call1(("InvalidArgument", bases, namespace))?;
        Ok(made.cast_into::<PyType>()?.unbind())
    })
    .map(|t| t.bind(py))
}

/// An InvalidArgument with this message.
pub(crate) fn invalid(message: String) -> PyErr {
    Python::attach(|py| match invalid_argument(py) {
        Ok(ty) => PyErr::from_type(ty.clone(), message),
        Err(e) => e,
    })
}

pub(crate) fn to_py(e: GradeError) -> PyErr {
    let msg = e.to_string();
    match e {
        GradeError::Unsafe(_) => UnsafeQuery::new_err(msg),
        GradeError::Sql(_) => SqlError::new_err(msg),
        GradeError::Timeout(_) => QueryTimeout::new_err(msg),
        GradeError::Cancelled => QueryCancelled::new_err(msg),
        GradeError::Database(_) => DatabaseError::new_err(msg),
        GradeError::Invalid(_) => invalid(msg),
        GradeError::Constraint(_) => ConstraintError::new_err(msg),
        GradeError::SecretMismatch(_) => HashSecretMismatch::new_err(msg),
        GradeError::Spill(_) => SpillError::new_err(msg),
        GradeError::TempDisk(_) => TempDiskExceeded::new_err(msg),
    }
}
