//! `ToolResult`: what the model sees for one tool call, as Python values (a preview's cells as
//! None, int, float, str or bytes), and its way back from pickle.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::exec::{self, Cell};

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

    /// Every field equal (the rows compared as Python compares them).
    fn __eq__(&self, py: Python<'_>, other: &Self) -> PyResult<bool> {
        Ok(self.columns == other.columns
            && self.row_count == other.row_count
            && self.row_count_capped == other.row_count_capped
            && self.truncated == other.truncated
            && self.elapsed_s == other.elapsed_s
            && self.text == other.text
            && self.rows.bind(py).eq(other.rows.bind(py))?)
    }

    /// A result crosses process boundaries (the process and Ray backends) as itself: unpickling
    /// calls the module's private `_tool_result` with the fields.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let restore = py.import("t2sql._grader")?.getattr("_tool_result")?;
        let fields = (
            self.columns.clone(),
            self.rows.clone_ref(py),
            self.row_count,
            self.row_count_capped,
            self.truncated,
            self.elapsed_s,
            self.text.clone(),
        )
            .into_pyobject(py)?;
        PyTuple::new(py, [restore, fields.into_any()])
    }
}

/// A ToolResult from its fields, as `ToolResult.__reduce__` hands them to pickle.
#[pyfunction]
#[pyo3(name = "_tool_result")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn restore_tool_result(
    columns: Vec<String>,
    rows: Bound<'_, PyList>,
    row_count: u64,
    row_count_capped: bool,
    truncated: bool,
    elapsed_s: f64,
    text: String,
) -> ToolResult {
    ToolResult {
        columns,
        rows: rows.unbind(),
        row_count,
        row_count_capped,
        truncated,
        elapsed_s,
        text,
    }
}

pub(crate) fn tool_result(py: Python<'_>, out: exec::ToolOutput) -> PyResult<ToolResult> {
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
