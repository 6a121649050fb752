//! The Python binding `t2sql._grader` (the `python` feature): argument conversion, releasing
//! the GIL around every SQLite call, and one Python exception per error variant. The work
//! itself stays in the core modules; lib.rs registers what these modules define.

pub(crate) mod args;
pub(crate) mod database;
pub(crate) mod digest;
pub(crate) mod errors;
pub(crate) mod method;
pub(crate) mod pool;
pub(crate) mod process;
pub(crate) mod spec;
pub(crate) mod sqltext;
pub(crate) mod tool_result;
