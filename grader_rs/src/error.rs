//! One error enum for the core; the Python binding maps each variant to its own exception.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum GradeError {
    /// A statement that parses and would write, attach, detach, load, vacuum or change a setting
    /// (guard/statement.rs); what SQLite cannot parse is `Sql`.
    #[error("unsafe query: {0}")]
    Unsafe(String),
    /// SQLite rejected or failed the query; the text is SQLite's message.
    #[error("{0}")]
    Sql(String),
    /// The deadline passed and the query was interrupted.
    #[error("query timed out after {0}s")]
    Timeout(f64),
    /// The query's Cancel token fired.
    #[error("query cancelled")]
    Cancelled,
    /// The database file is missing, unreadable, corrupt or not SQLite.
    #[error("{0}")]
    Database(String),
    /// A row given to a small database (memdb.rs) breaks a constraint of its schema (CHECK,
    /// UNIQUE, NOT NULL, ...); the text is SQLite's message.
    #[error("{0}")]
    Constraint(String),
    /// A caller's mistake that is not about SQL (an unknown method name, a closed pool, ...).
    #[error("{0}")]
    Invalid(String),
    /// A set or subset digest past its memory budget could not spill to its temporary directory.
    #[error("{0}")]
    Spill(String),
    /// A gold digest made under another hash secret than the process's: compute it again.
    #[error("{0}")]
    SecretMismatch(String),
    /// The query's temporary files (sorts, temporary b-trees) would have passed its cap, in bytes.
    #[error(
        "the query needed more than {} of temporary disk (SQLite's files for sorting, DISTINCT, \
         GROUP BY and temporary results) and was stopped: write a cheaper query, or raise the \
         per-query cap (max_temp_mb, --max-temp-mb)",
        crate::tempfiles::describe_bytes(*.0)
    )]
    TempDisk(u64),
}

pub type Result<T> = std::result::Result<T, GradeError>;

/// Render a timeout the way the model sees it ("2s", "0.5s").
pub fn seconds(s: f64) -> String {
    if s.fract() == 0.0 {
        format!("{}", s as i64)
    } else {
        format!("{s}")
    }
}
