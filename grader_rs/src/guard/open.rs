//! Opening a file: what a path must be (a regular file, no FIFO or device), the read-only URI and
//! open flags, and `immutable=1` unless a writer's side file says the database is being written
//! (then it is read with locks, waiting a while for a writer's lock).

use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::{heap, GuardedConnection};
use crate::error::{GradeError, Result};
use crate::tempfiles;

/// How long a connection that reads with locks waits for a writer's lock before it gives up.
pub(super) const WRITER_WAIT: Duration = Duration::from_millis(1000);

/// The first file beside `path` that says a writer is (or was) at work, with its size: a
/// non-empty `-wal` holds committed pages the main file does not have yet; a non-empty
/// `-journal` is a transaction in progress, or the hot journal of a writer that died in one.
/// An immutable open ignores both, so such a database is opened with locks instead.
pub fn writer_side_file(path: &str) -> Option<(String, u64)> {
    ["-wal", "-journal"].iter().find_map(|suffix| {
        let side = format!("{path}{suffix}");
        match std::fs::metadata(&side) {
            Ok(m) if m.is_file() && m.len() > 0 => Some((side, m.len())),
            _ => None,
        }
    })
}

fn uri_for(path: &str, immutable: bool) -> String {
    let mut uri = String::from("file:");
    for ch in path.chars() {
        match ch {
            '%' | '?' | '#' => uri.push_str(&format!("%{:02X}", ch as u32)),
            _ => uri.push(ch),
        }
    }
    uri.push_str("?mode=ro");
    if immutable {
        uri.push_str("&immutable=1");
    }
    uri
}

impl GuardedConnection {
    /// Open `path` read-only with every hardening of the policy (docs/grader.md#guarantees).
    pub fn open(path: &str, immutable: bool) -> Result<Self> {
        heap::install_default();
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(GradeError::Database(format!(
                    "database file not found: {path} (check --db-root and the db_id)"
                )))
            }
            Err(e) => {
                return Err(GradeError::Database(format!(
                    "cannot read database {path}: {e}"
                )))
            }
            Ok(m) if m.is_dir() => {
                return Err(GradeError::Database(format!(
                    "{path} is a directory, not a SQLite file"
                )))
            }
            // Opening a FIFO waits for a writer, and a device reads forever: refused unopened.
            Ok(m) if !m.is_file() => {
                return Err(GradeError::Database(format!(
                    "{path} is {}, not a regular file: a database must be a SQLite file",
                    special_file_kind(&m.file_type())
                )))
            }
            Ok(_) => {}
        }
        // A database a writer is at work on is read with locks, so SQLite sees the committed
        // state (the WAL's frames included) or refuses (a hot journal, a writer's lock).
        let immutable = immutable && writer_side_file(path).is_none();
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        let vfs = tempfiles::vfs_name().map_err(GradeError::Database)?;
        let conn = Connection::open_with_flags_and_vfs(uri_for(path, immutable), flags, vfs)
            .map_err(|e| GradeError::Database(format!("cannot open database {path}: {e}")))?;
        if !immutable {
            conn.busy_timeout(WRITER_WAIT)
                .map_err(|e| GradeError::Database(format!("cannot open database {path}: {e}")))?;
        }
        let mut gc = Self::harden(conn, path.to_string(), false)?;
        gc.immutable = immutable;
        Ok(gc)
    }
}

/// What a path that is not a regular file is, for a message.
fn special_file_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn uri_escapes_query_characters() {
        assert_eq!(
            uri_for("/a/b?c#d%e.sqlite", true),
            "file:/a/b%3Fc%23d%25e.sqlite?mode=ro&immutable=1"
        );
        assert_eq!(uri_for("/x/é.db", false), "file:/x/é.db?mode=ro");
    }
}
