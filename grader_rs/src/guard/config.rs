//! The database configuration and run-time limits every guarded connection gets.

use rusqlite::config::DbConfig;
use rusqlite::limits::Limit;
use rusqlite::Connection;

use super::statement::MAX_SQL_BYTES;

/// SQLite run-time limits applied to every connection; every BIRD dev gold query runs under them.
/// No sorter worker threads: a query's temporary files are opened by the thread that steps it,
/// which is how tempfiles.rs knows whose query pays for them.
const LIMITS: [(Limit, i32); 9] = [
    (Limit::SQLITE_LIMIT_ATTACHED, 0),
    (Limit::SQLITE_LIMIT_LENGTH, 16 * 1024 * 1024),
    (Limit::SQLITE_LIMIT_SQL_LENGTH, 2 * MAX_SQL_BYTES as i32),
    (Limit::SQLITE_LIMIT_COLUMN, 2000),
    (Limit::SQLITE_LIMIT_EXPR_DEPTH, 200),
    (Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 10_000),
    (Limit::SQLITE_LIMIT_COMPOUND_SELECT, 100),
    (Limit::SQLITE_LIMIT_VDBE_OP, 1_000_000),
    (Limit::SQLITE_LIMIT_WORKER_THREADS, 0),
];

/// Temporary storage on file, `query_only` for a `writable` connection (an in-memory database the
/// core built), defensive mode, no trusted schema, no ATTACH that creates or writes, no triggers,
/// and LIMITS.
pub(super) fn configure(conn: &Connection, writable: bool) -> rusqlite::Result<()> {
    // Sorters and temporary b-trees use temporary files (unlinked at open), not memory. With
    // in-memory temp storage SQLite's sorter keeps every row in one list and sorts it in a
    // single call that neither the progress handler nor sqlite3_interrupt reaches (a cross
    // join ORDER BY random() ran 110 s past a 30 s deadline, 1.6 GB resident). With files it
    // sorts runs of at most the page cache's size (cache_size, 2 MiB by default) and merges
    // them while stepping, so the deadline holds and memory stays bounded; disk use is what the
    // rows written before the deadline take.
    conn.pragma_update(None, "temp_store", "FILE")?;
    if writable {
        conn.pragma_update(None, "query_only", true)?;
    }
    for (cfg, on) in [
        (DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true),
        (DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false),
        (DbConfig::SQLITE_DBCONFIG_ENABLE_ATTACH_CREATE, false),
        (DbConfig::SQLITE_DBCONFIG_ENABLE_ATTACH_WRITE, false),
        (DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false),
    ] {
        conn.set_db_config(cfg, on)?;
    }
    for (limit, value) in LIMITS {
        conn.set_limit(limit, value)?;
    }
    Ok(())
}
