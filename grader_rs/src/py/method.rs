//! `Method`: a grading method as a task or a flag names it, read once by the core's parser
//! (`crate::digest::Method`) and handed to Python whole, so the layers above (the prompt's ordering
//! rule) read its parts instead of splitting its name again.

use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

use super::errors::to_py;
use crate::digest::{self, ResolvedMethod, SubsetOp};

/// A grading method, parsed: its canonical name, its kind, and a subset's operator and count.
#[pyclass(frozen, eq, hash, module = "t2sql._grader", name = "Method")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyMethod {
    inner: digest::Method,
}

impl PyMethod {
    fn subset_op(&self) -> Option<SubsetOp> {
        match self.inner {
            digest::Method::Named(ResolvedMethod::Subset { op, .. }) => Some(op),
            _ => None,
        }
    }
}

#[pymethods]
impl PyMethod {
    /// Read `name` as every grade reads it (case and spaces do not matter, `list` is ordered,
    /// `==` is `=`); an unreadable name is InvalidArgument saying what is wrong.
    #[new]
    fn new(name: &str) -> PyResult<Self> {
        let inner = digest::Method::parse(name).map_err(to_py)?;
        Ok(PyMethod { inner })
    }

    /// The canonical name: one of METHODS, a subset's N its count.
    #[getter]
    fn name(&self) -> String {
        self.inner.name()
    }
    /// auto, multiset, ordered, set or subset.
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    /// A subset's comparison as its name writes it ("=", ">=", ...); None for every other kind.
    #[getter]
    fn operator(&self) -> Option<&'static str> {
        self.subset_op().map(SubsetOp::symbol)
    }
    /// A subset's comparison in the prompt's words ("exactly", "at least", ...); None for every
    /// other kind.
    #[getter]
    fn operator_words(&self) -> Option<&'static str> {
        self.subset_op().map(SubsetOp::words)
    }
    /// A subset's count of distinct gold rows; None for every other kind.
    #[getter]
    fn count(&self) -> Option<u64> {
        match self.inner {
            digest::Method::Named(ResolvedMethod::Subset { n, .. }) => Some(n),
            _ => None,
        }
    }

    fn __str__(&self) -> String {
        self.inner.name()
    }
    fn __repr__(&self) -> String {
        format!("Method({:?})", self.inner.name())
    }
    /// Unpickled from its canonical name, which reads back as the same method.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyType>, Bound<'py, PyTuple>)> {
        let args = PyTuple::new(slf.py(), [slf.get().inner.name()])?;
        Ok((slf.get_type(), args))
    }
}

/// The canonical name of a grading method as a task or a flag writes it ("list" -> "ordered",
/// " Subset, =,5" -> "subset,=,5", "auto" stays "auto"); InvalidArgument saying what is wrong.
#[pyfunction]
pub(crate) fn method_name(name: &str) -> PyResult<String> {
    digest::method_name(name).map_err(to_py)
}

/// The canonical name of the method `method` names for this gold ("auto" resolved against its SQL).
#[pyfunction]
pub(crate) fn resolve_method(gold_sql: &str, method: &str) -> PyResult<String> {
    digest::resolve_method(Some(gold_sql), method)
        .map(|s| s.name())
        .map_err(to_py)
}
