//! Error classes: a SQLite error as the core's (`GradeError`): a refusal of the authorizer is
//! unsafe, a stop of the progress handler a timeout or a cancel, a full disk at the call's cap a
//! temporary-disk error, a busy, locked or hot-journalled file a database error that says what to
//! do, a corrupt one a database error, and the rest SQLite's own message.

use std::sync::atomic::Ordering;

use rusqlite::ffi;

use super::deadline::{STOP_CANCEL, STOP_TIMEOUT};
use super::open::WRITER_WAIT;
use super::{Budget, GuardedConnection};
use crate::error::GradeError;

impl GuardedConnection {
    /// Turn a SQLite error into the core's error, naming a timeout or cancel as such.
    pub fn classify_with(&self, e: rusqlite::Error, budget: &Budget) -> GradeError {
        // Some actions reach the authorizer only while stepping (a virtual table's own query).
        if let Some(denied) = self.auth.take_denied() {
            return GradeError::Unsafe(format!("not allowed: {denied}"));
        }
        // A full disk that is the call's cap on temporary files, not the file system's.
        if self.temp.take_refused() && e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
        {
            return GradeError::TempDisk(self.temp.cap());
        }
        match self.control.stopped.load(Ordering::Relaxed) {
            STOP_TIMEOUT => GradeError::Timeout(budget.timeout_s),
            STOP_CANCEL => GradeError::Cancelled,
            _ => self.classify(e),
        }
    }

    pub(super) fn classify(&self, e: rusqlite::Error) -> GradeError {
        if let Some(err) = writer_error(&self.path, &e) {
            return err;
        }
        match &e {
            rusqlite::Error::SqliteFailure(f, msg) => {
                let text = msg.clone().unwrap_or_else(|| f.to_string());
                match f.code {
                    rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt => {
                        GradeError::Database(format!("{}: {text}", self.path))
                    }
                    rusqlite::ErrorCode::OutOfMemory => GradeError::Sql(format!(
                        "out of memory: the query needs more than the heap limit ({text})"
                    )),
                    _ => GradeError::Sql(text),
                }
            }
            other => GradeError::Sql(other.to_string()),
        }
    }
}

/// The errors a read-only connection meets on a database a writer is at work on, as database
/// errors that name the file and say what to do.
pub(super) fn writer_error(path: &str, e: &rusqlite::Error) -> Option<GradeError> {
    let rusqlite::Error::SqliteFailure(f, _) = e else {
        return None;
    };
    match f.code {
        rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked => {
            Some(GradeError::Database(format!(
                "{path} is locked by a writer (waited {}s): grade it once the writer has \
                 committed or rolled back",
                WRITER_WAIT.as_secs_f64()
            )))
        }
        rusqlite::ErrorCode::ReadOnly if f.extended_code == ffi::SQLITE_READONLY_ROLLBACK => {
            Some(GradeError::Database(format!(
                "{path} has a hot journal ({path}-journal): a writer stopped in the middle of a \
                 transaction, and a read-only reader cannot roll it back. Open the database \
                 once read-write (e.g. `sqlite3 {path} 'SELECT count(*) FROM sqlite_master'`) to restore its committed state"
            )))
        }
        _ => None,
    }
}
