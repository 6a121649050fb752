//! The statement policy: one read-only SELECT, WITH or VALUES statement of bounded length,
//! prepared under the authorizer; the digest wrapper the core writes itself is prepared the same way.

use std::sync::atomic::Ordering;

use rusqlite::Statement;

use super::GuardedConnection;
use crate::error::{GradeError, Result};
use crate::sqltext;

/// Longest SQL text accepted, in bytes. Far above any real query; stops parser-bombs early.
pub const MAX_SQL_BYTES: usize = 100_000;
/// Keywords a statement may start with.
const ALLOWED_FIRST_WORDS: [&str; 3] = ["SELECT", "WITH", "VALUES"];

impl GuardedConnection {
    /// Check `sql` against the policy and prepare it. Returns the statement and the text it
    /// was prepared from (the first statement, without trailing comments or `;`).
    pub fn prepare_checked<'a>(&'a self, sql: &'a str) -> Result<(Statement<'a>, &'a str)> {
        if sql.len() > MAX_SQL_BYTES {
            return Err(GradeError::Sql(format!(
                "query is {} bytes; the limit is {MAX_SQL_BYTES}",
                sql.len()
            )));
        }
        let first = match sqltext::first_statement(sql) {
            Some(f) if !f.text.is_empty() => f,
            _ => {
                return Err(GradeError::Unsafe(
                    "empty query: expected one SELECT statement".into(),
                ))
            }
        };
        if !ALLOWED_FIRST_WORDS.contains(&first.keyword.as_str()) {
            let got = if first.keyword.is_empty() {
                "something else".to_string()
            } else {
                first.keyword.clone()
            };
            return Err(GradeError::Unsafe(format!(
                "only one read-only SELECT, WITH or VALUES statement is allowed, got {got}"
            )));
        }
        if first.more_statements {
            return Err(GradeError::Unsafe(
                "more than one statement: send a single SELECT".into(),
            ));
        }
        let stmt = self.prepare_policed(first.text, false)?;
        if !stmt.readonly() {
            return Err(GradeError::Unsafe(
                "the statement writes to the database".into(),
            ));
        }
        Ok((stmt, first.text))
    }

    /// Prepare the digest wrapper around an already checked statement.
    pub fn prepare_wrapper<'a>(&'a self, wrapper: &str) -> Result<Statement<'a>> {
        let stmt = self.prepare_policed(wrapper, true)?;
        if !stmt.readonly() {
            return Err(GradeError::Unsafe(
                "the statement writes to the database".into(),
            ));
        }
        Ok(stmt)
    }

    fn prepare_policed<'a>(&'a self, text: &str, allow_digest_fn: bool) -> Result<Statement<'a>> {
        self.auth.take_denied();
        self.auth
            .allow_digest_fn
            .store(allow_digest_fn, Ordering::Relaxed);
        let prepared = self.conn.prepare(text);
        self.auth.allow_digest_fn.store(false, Ordering::Relaxed);
        let denied = self.auth.take_denied();
        match prepared {
            Ok(stmt) => Ok(stmt),
            Err(_) if denied.is_some() => Err(GradeError::Unsafe(format!(
                "not allowed: {}",
                denied.unwrap()
            ))),
            Err(rusqlite::Error::MultipleStatement) => Err(GradeError::Unsafe(
                "more than one statement: send a single SELECT".into(),
            )),
            Err(e) => Err(self.classify(e)),
        }
    }
}
