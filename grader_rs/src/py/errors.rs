//! The Python exceptions of the grading core: one per `GradeError` variant, all under
//! `T2sqlError`, and the mapping from the Rust error to them.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

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

create_exception!(
    _grader,
    HashSecretMismatch,
    T2sqlError,
    "A gold digest made under another hash secret than the process's: compute it again."
);

pub(crate) fn to_py(e: GradeError) -> PyErr {
    let msg = e.to_string();
    match e {
        GradeError::Unsafe(_) => UnsafeQuery::new_err(msg),
        GradeError::Sql(_) => SqlError::new_err(msg),
        GradeError::Timeout(_) => QueryTimeout::new_err(msg),
        GradeError::Cancelled => QueryCancelled::new_err(msg),
        GradeError::Database(_) => DatabaseError::new_err(msg),
        GradeError::Invalid(_) => PyValueError::new_err(msg),
        GradeError::SecretMismatch(_) => HashSecretMismatch::new_err(msg),
    }
}
