//! The statement policy: one read-only SELECT, WITH or VALUES statement of bounded length,
//! prepared under the authorizer; the digest wrapper the core writes itself is prepared the same way.
//!
//! What is refused, and as what: `unsafe` is a statement that SQLite parses and that would write,
//! attach, detach, load, vacuum or change a setting (the authorizer refuses it, it is not read-only,
//! or it names such an action on an object that is not there: `DROP TABLE no_such_table`), wherever
//! it stands in the text. Anything else that is not one query is the query's own mistake, an SQL
//! error with SQLite's message: text SQLite cannot parse, an empty query, `EXPLAIN`, more than one
//! statement.

use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::Ordering;

use rusqlite::{ffi, Statement};

use super::GuardedConnection;
use crate::error::{GradeError, Result};
use crate::sqltext;

/// Longest SQL text accepted, in bytes. Far above any real query; stops parser-bombs early.
pub const MAX_SQL_BYTES: usize = 100_000;
/// Keywords a statement may start with.
const ALLOWED_FIRST_WORDS: [&str; 3] = ["SELECT", "WITH", "VALUES"];
/// Statements that write, attach, detach, vacuum or change settings (`sqltext::verb`).
const WRITE_VERBS: [&str; 19] = [
    "INSERT",
    "REPLACE",
    "UPDATE",
    "DELETE",
    "CREATE",
    "DROP",
    "ALTER",
    "ATTACH",
    "DETACH",
    "VACUUM",
    "PRAGMA",
    "BEGIN",
    "COMMIT",
    "END",
    "ROLLBACK",
    "SAVEPOINT",
    "RELEASE",
    "ANALYZE",
    "REINDEX",
];
const MORE_THAN_ONE: &str = "more than one statement: send a single SELECT";

/// How SQLite prepares the statement at the start of a text.
enum Probe {
    /// Prepared; `next` is where the text after it starts.
    Prepared {
        readonly: bool,
        explain: bool,
        next: usize,
    },
    /// No statement: only comments and whitespace up to `next`.
    Empty { next: usize },
    /// The authorizer refused it (what it refused).
    Denied(String),
    /// SQLite could not prepare it.
    Failed(rusqlite::Error),
}

/// Whether SQLite's message says it could not parse the text (its tokenizer's and parser's
/// messages), as opposed to a statement it parsed and could not prepare ("no such table").
fn cannot_parse(message: &str) -> bool {
    message.contains("syntax error")
        || message == "incomplete input"
        || message.starts_with("unrecognized token")
        || message == "Recursion limit"
}

/// The refusal of a prepared statement that is not read-only, naming what it does.
fn writes(stmt: &str) -> String {
    match sqltext::verb(stmt) {
        verb if verb.is_empty() => "the statement writes to the database".into(),
        verb => format!("{verb} writes to the database"),
    }
}

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
        if sql.as_bytes().contains(&0) {
            // SQLite reads a statement's text up to its first NUL: what follows would be unseen.
            return Err(GradeError::Sql(
                "the query holds a NUL character (\\0): send plain SQL text".into(),
            ));
        }
        if let Some(first) = sqltext::first_statement(sql) {
            let keyword = first.keyword.as_str();
            if !first.more_statements && ALLOWED_FIRST_WORDS.contains(&keyword) {
                match self.prepare_policed(first.text, false) {
                    Ok(stmt) if stmt.readonly() => return Ok((stmt, first.text)),
                    Ok(_) => {}
                    // A WITH may end in a write: the refusal below tells.
                    Err(GradeError::Sql(_)) if keyword == "WITH" => {}
                    // A SELECT or VALUES statement cannot write: its error is the query's.
                    Err(e) => return Err(e),
                }
            }
        }
        Err(self.refusal(sql))
    }

    /// Why `sql` is not one read-only query. Every statement of the text is prepared (never run)
    /// in turn: the first that would write makes the whole text unsafe; otherwise the first
    /// statement's own error, or the policy's (empty, EXPLAIN, more than one statement).
    fn refusal(&self, sql: &str) -> GradeError {
        let mut rest = sql;
        let mut queries = 0usize;
        let mut problem: Option<GradeError> = None;
        while let Some(first) = sqltext::first_statement(rest) {
            if first.text.is_empty() {
                rest = first.rest; // an empty statement: `;` alone
                continue;
            }
            // From the statement's first token to the end: SQLite says where it ends (a trigger's
            // body holds `;`); after a failure the scanner's `;` does.
            let from = &rest[first.text.as_ptr() as usize - rest.as_ptr() as usize..];
            match self.probe(from) {
                Probe::Empty { next } => rest = &from[next..],
                Probe::Denied(what) => return GradeError::Unsafe(format!("not allowed: {what}")),
                Probe::Prepared {
                    readonly: false, ..
                } => return GradeError::Unsafe(writes(first.text)),
                Probe::Prepared {
                    explain: true,
                    next,
                    ..
                } => {
                    problem.get_or_insert_with(|| {
                        GradeError::Sql(
                            "EXPLAIN shows SQLite's plan, not a result: send the query itself"
                                .into(),
                        )
                    });
                    rest = &from[next..];
                }
                Probe::Prepared { next, .. } => {
                    // Read-only and past the authorizer, yet not a query: nothing SQLite has today
                    // (a `DROP TABLE IF EXISTS` of no table is one); refused as unsafe all the same.
                    if !ALLOWED_FIRST_WORDS.contains(&first.keyword.as_str()) {
                        return GradeError::Unsafe(format!(
                            "only one read-only SELECT, WITH or VALUES statement is allowed, got {}",
                            first.keyword
                        ));
                    }
                    queries += 1;
                    rest = &from[next..];
                }
                Probe::Failed(e) => {
                    let message = match &e {
                        rusqlite::Error::SqlInputError { msg, .. } => msg.clone(),
                        rusqlite::Error::SqliteFailure(_, Some(msg)) => msg.clone(),
                        other => other.to_string(),
                    };
                    let err = self.classify(e);
                    if !matches!(err, GradeError::Sql(_)) {
                        return err; // the database's fault (locked, corrupt), not the query's
                    }
                    let verb = sqltext::verb(first.text);
                    if !cannot_parse(&message) && WRITE_VERBS.contains(&verb.as_str()) {
                        return GradeError::Unsafe(format!(
                            "{verb} writes to the database or its settings ({message})"
                        ));
                    }
                    problem.get_or_insert(err);
                    rest = first.rest;
                }
            }
        }
        problem.unwrap_or_else(|| {
            GradeError::Sql(if queries == 0 {
                "empty query: send one SELECT statement".into()
            } else {
                MORE_THAN_ONE.into()
            })
        })
    }

    /// Prepare the statement at the start of `text` under the authorizer and finalize it at once.
    fn probe(&self, text: &str) -> Probe {
        self.auth.take_denied();
        let db = unsafe { self.conn.handle() };
        let mut stmt: *mut ffi::sqlite3_stmt = std::ptr::null_mut();
        let mut tail: *const c_char = std::ptr::null();
        // SAFETY: `text` outlives the call and its length is passed; `stmt` is finalized below.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                db,
                text.as_ptr().cast(),
                text.len() as c_int,
                0,
                &mut stmt,
                &mut tail,
            )
        };
        let denied = self.auth.take_denied();
        if rc != ffi::SQLITE_OK {
            if let Some(what) = denied {
                return Probe::Denied(what);
            }
            // SAFETY: the connection is open; message and offset are read before any other call.
            let (message, offset) = unsafe {
                let m = CStr::from_ptr(ffi::sqlite3_errmsg(db)).to_string_lossy();
                (m.into_owned(), ffi::sqlite3_error_offset(db))
            };
            // The error as rusqlite's own prepare makes it, so its message reads the same.
            let error = ffi::Error::new(rc);
            return Probe::Failed(
                if error.code == rusqlite::ErrorCode::Unknown && offset >= 0 {
                    rusqlite::Error::SqlInputError {
                        error,
                        msg: message,
                        sql: text.to_owned(),
                        offset,
                    }
                } else {
                    rusqlite::Error::SqliteFailure(error, Some(message))
                },
            );
        }
        let next = if tail.is_null() {
            text.len()
        } else {
            (tail as usize - text.as_ptr() as usize).min(text.len())
        };
        if stmt.is_null() {
            return Probe::Empty { next: next.max(1) };
        }
        // SAFETY: `stmt` is the statement just prepared; finalized once, here.
        let (readonly, explain) = unsafe {
            let r = (
                ffi::sqlite3_stmt_readonly(stmt) != 0,
                ffi::sqlite3_stmt_isexplain(stmt) != 0,
            );
            ffi::sqlite3_finalize(stmt);
            r
        };
        Probe::Prepared {
            readonly,
            explain,
            next: next.max(1),
        }
    }

    /// Prepare the digest wrapper around an already checked statement.
    pub fn prepare_wrapper<'a>(&'a self, wrapper: &str) -> Result<Statement<'a>> {
        let stmt = self.prepare_policed(wrapper, true)?;
        if !stmt.readonly() {
            return Err(GradeError::Unsafe(writes(wrapper)));
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
            Err(rusqlite::Error::MultipleStatement) => Err(GradeError::Sql(MORE_THAN_ONE.into())),
            Err(e) => Err(self.classify(e)),
        }
    }
}
