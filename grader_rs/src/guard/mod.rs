//! The read-only connection and the safety policy (docs/grader.md#guarantees): nothing else
//! decides what a query may do. One concept a file: `open` (what a path must be, the open flags,
//! locks when a writer is at work), `config` (the database configuration and run-time limits),
//! `statement` (one read-only statement, prepared under the authorizer), `authorizer` (what a
//! statement may touch), `deadline` (a call's deadline and cancel token, the progress handler),
//! `heap` (SQLite's process-wide heap limit), `errors` (a SQLite error as the core's), `functions`
//! (built-in functions that could outrun the deadline inside one VM step, replaced or bounded,
//! the bounded ones then run on a connection of the core's own that replaces nothing). This file
//! holds the connection and `harden`, which puts them together.

use std::sync::Arc;

use rusqlite::hooks::AuthContext;
use rusqlite::Connection;

use crate::error::{GradeError, Result};
use crate::tempfiles::{self, TempAccount};

mod authorizer;
mod config;
mod deadline;
mod errors;
mod functions;
mod heap;
mod open;
mod statement;

use authorizer::authorize;
pub use authorizer::AuthState;
use deadline::PROGRESS_STEPS;
pub use deadline::{Budget, RunControl};
use errors::writer_error;
pub use functions::replaced as replaced_functions;
pub use heap::{set_heap_limit, DEFAULT_HEAP_LIMIT};
pub use open::writer_side_file;
pub use statement::MAX_SQL_BYTES;

/// What `GuardedConnection::schema` reads: every schema object that has SQL text.
const SCHEMA_SQL: &str =
    "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid";

/// A hardened read-only connection to one database file.
pub struct GuardedConnection {
    pub conn: Connection,
    pub path: String,
    control: Arc<RunControl>,
    auth: Arc<AuthState>,
    /// Name of the digest aggregate registered on this connection (random per process).
    pub digest_fn: String,
    /// State the digest aggregate shares with the host.
    pub aggregate: Arc<crate::digest::AggregateShared>,
    /// Opened `immutable=1` (no locks, the file trusted not to change); false when it reads with
    /// locks (a writer's side file was there, or the caller asked for it).
    pub immutable: bool,
    /// The temporary disk of this connection's queries (tempfiles.rs).
    temp: Arc<TempAccount>,
}

impl GuardedConnection {
    /// Lock down an open connection: everything of the policy but the open flags.
    /// `writable` marks a connection whose file could be written (an in-memory database the core
    /// built, memdb.rs): there `query_only` is set and writes to main are refused by the authorizer too.
    pub fn harden(mut conn: Connection, path: String, writable: bool) -> Result<Self> {
        let db_err =
            |e: rusqlite::Error| GradeError::Database(format!("cannot open database {path}: {e}"));
        config::configure(&conn, writable).map_err(db_err)?;
        // Reading the schema proves the file is a database (and not corrupt at its header).
        let temp = TempAccount::new(tempfiles::DEFAULT_MAX_TEMP_BYTES);
        tempfiles::charged_to(&temp, || {
            conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
                r.get::<_, i64>(0)
            })
        })
        .map_err(|e| match writer_error(&path, &e) {
            Some(err) => err,
            None => GradeError::Database(format!("{path} is not a readable SQLite database: {e}")),
        })?;

        let control = Arc::new(RunControl::new());
        let c = Arc::clone(&control);
        conn.progress_handler(PROGRESS_STEPS, Some(move || c.should_stop()))
            .map_err(db_err)?;
        functions::register(&conn, &control).map_err(db_err)?;

        let (digest_fn, aggregate) = crate::digest::register(&conn).map_err(db_err)?;
        let auth = Arc::new(AuthState::new(writable));
        let a = Arc::clone(&auth);
        let dfn = digest_fn.clone();
        conn.authorizer(Some(move |ctx: AuthContext<'_>| authorize(&a, &dfn, ctx)))
            .map_err(db_err)?;
        Ok(GuardedConnection {
            conn,
            path,
            control,
            auth,
            digest_fn,
            aggregate,
            immutable: false,
            temp,
        })
    }

    /// Bytes this connection's live temporary files hold (files of a statement not finalized yet).
    pub fn temp_bytes(&self) -> u64 {
        self.temp.used()
    }

    /// (type, name, sql) of every schema object with SQL text, from sqlite_master. A statement
    /// like any other: checked by the policy, stepped under `budget`, its errors classified.
    pub fn schema(&self, budget: &Budget) -> Result<Vec<(String, String, String)>> {
        let (mut stmt, _) = self.prepare_checked(SCHEMA_SQL)?;
        self.arm(budget)?;
        let outcome = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>());
        self.disarm();
        outcome.map_err(|e| self.classify_with(e, budget))
    }
}

#[cfg(test)]
mod test;
