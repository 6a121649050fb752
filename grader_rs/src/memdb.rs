//! A small in-memory database the core builds from rows it is given: the equivalence check's
//! witness databases (a few dozen rows each, chosen from the real database by t2sql's own
//! Python and checked against the database's constraints and invariants before they get here).
//!
//! The schema is the source database's own CREATE statements (tables, indexes, views; never
//! triggers, which would write when a row is inserted), run on a private connection; the rows are
//! bound as parameters, never spliced into SQL. The connection is then hardened like any other
//! (`GuardedConnection::harden`, writable: `query_only` on and writes to main refused), so the
//! model's SQL meets the same policy here as on the real file.
//!
//! Building runs under the caller's budget (a CHECK constraint is an expression of the source's
//! schema, and a slow one runs at every insert): past its deadline or at its Cancel the build
//! stops. A row the schema refuses (a CHECK, a UNIQUE under another collation, a unique
//! expression index: constraints the caller's own checks cannot see) is `GradeError::Constraint`.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::backup::Backup;
use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags};

use crate::error::{GradeError, Result};
use crate::guard::{Budget, GuardedConnection};
use crate::sqltext;

/// The rows of one table, in the order they are inserted (which is their rowid order where the
/// table has no INTEGER PRIMARY KEY).
pub struct TableRows {
    pub name: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
}

/// Statement kinds a witness database's schema may hold.
const SCHEMA_KINDS: [&str; 3] = ["TABLE", "INDEX", "VIEW"];

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The kind of a CREATE statement ("TABLE", "INDEX", "VIEW", "TRIGGER", ...), skipping
/// TEMP/TEMPORARY/UNIQUE/VIRTUAL; None for anything that is not one CREATE statement.
fn created_kind(sql: &str) -> Option<String> {
    let first = sqltext::first_statement(sql)?;
    if first.keyword != "CREATE" || first.more_statements {
        return None;
    }
    let words = sqltext::tokens(first.text)
        .filter(|t| t.kind == sqltext::TokenKind::Word)
        .map(|t| first.text[t.start..t.end].to_ascii_uppercase());
    words
        .skip(1)
        .find(|w| !matches!(w.as_str(), "TEMP" | "TEMPORARY" | "UNIQUE"))
}

/// Empty databases holding a schema, by the schema's statements: parsing a dozen CREATE statements
/// costs more than copying the few pages they make, and the check builds many small databases of
/// one schema. Bounded: the oldest schema goes first.
static TEMPLATES: Mutex<Vec<(Vec<String>, Connection)>> = Mutex::new(Vec::new());
const TEMPLATES_KEPT: usize = 32;
/// The page size of a small database (SQLite's smallest).
const SMALL_PAGE: i64 = 512;

/// Put `schema` into the empty connection `dst`, by copying a template built once per schema.
fn copy_schema(schema: &[String], dst: &mut Connection) -> Result<()> {
    let fail = |e: rusqlite::Error| GradeError::Database(e.to_string());
    let mut templates = TEMPLATES.lock().unwrap_or_else(|p| p.into_inner());
    let found = templates.iter().position(|(s, _)| s.as_slice() == schema);
    let index = match found {
        Some(i) => i,
        None => {
            let template = Connection::open_in_memory().map_err(fail)?;
            template
                .pragma_update(None, "page_size", SMALL_PAGE)
                .map_err(fail)?;
            for sql in schema {
                match created_kind(sql) {
                    Some(kind) if SCHEMA_KINDS.contains(&kind.as_str()) => {
                        template.execute_batch(sql).map_err(fail)?
                    }
                    _ => {
                        return Err(GradeError::Invalid(format!(
                            "a witness database's schema holds CREATE TABLE, INDEX or VIEW statements only, got: {}",
                            sql.chars().take(80).collect::<String>()
                        )))
                    }
                }
            }
            if templates.len() >= TEMPLATES_KEPT {
                templates.remove(0);
            }
            templates.push((schema.to_vec(), template));
            templates.len() - 1
        }
    };
    Backup::new(&templates[index].1, dst)
        .and_then(|b| b.run_to_completion(1024, Duration::ZERO, None))
        .map_err(fail)
}

/// Why a build's progress handler stopped it.
const STOPPED_TIMEOUT: u8 = 1;
const STOPPED_CANCEL: u8 = 2;

/// Stop the build's statements at `budget`'s deadline or cancel (the progress handler `harden`
/// installs afterwards replaces this one); the cell says which fired.
fn arm_build(conn: &mut Connection, budget: &Budget) -> rusqlite::Result<Arc<AtomicU8>> {
    let stopped = Arc::new(AtomicU8::new(0));
    let why = Arc::clone(&stopped);
    let deadline = Instant::now() + Duration::from_secs_f64(budget.timeout_s.clamp(0.0, 1e9));
    let cancel = budget.cancel.clone();
    conn.progress_handler(
        1000,
        Some(move || {
            if cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
                why.store(STOPPED_CANCEL, Ordering::Relaxed);
                return true;
            }
            if Instant::now() >= deadline {
                why.store(STOPPED_TIMEOUT, Ordering::Relaxed);
                return true;
            }
            false
        }),
    )?;
    Ok(stopped)
}

/// A build's SQLite error as the core's: a stop of its budget, a refused row, or a database error.
fn build_error(label: &str, e: rusqlite::Error, stopped: &AtomicU8, budget: &Budget) -> GradeError {
    match stopped.load(Ordering::Relaxed) {
        STOPPED_TIMEOUT => return GradeError::Timeout(budget.timeout_s),
        STOPPED_CANCEL => return GradeError::Cancelled,
        _ => {}
    }
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) {
        return GradeError::Constraint(format!(
            "a row of the database {label} breaks a constraint: {e}"
        ));
    }
    GradeError::Database(format!("cannot build the database {label}: {e}"))
}

/// Build the database: `schema` (CREATE TABLE / INDEX / VIEW statements; anything else is an
/// error) then `tables`' rows, with foreign keys unenforced as in the source (the caller keeps
/// references closed), under `budget` (its deadline, cancel and temporary-disk cap). `reverse_scans` turns on `reverse_unordered_selects`, so a query whose
/// result depends on the order SQLite happens to scan rows in shows it.
pub fn build(
    label: &str,
    schema: &[String],
    tables: &[TableRows],
    reverse_scans: bool,
    budget: &Budget,
) -> Result<GuardedConnection> {
    if budget
        .cancel
        .as_ref()
        .is_some_and(|c| c.load(Ordering::Relaxed))
    {
        return Err(GradeError::Cancelled);
    }
    let fail = |e: rusqlite::Error| {
        GradeError::Database(format!("cannot build the database {label}: {e}"))
    };
    // Through the core's VFS, so the database's queries are capped on temporary disk like any other.
    let vfs = crate::tempfiles::vfs_name().map_err(GradeError::Database)?;
    let mut conn =
        Connection::open_in_memory_with_flags_and_vfs(OpenFlags::default(), vfs).map_err(fail)?;
    // No lookaside memory: the check keeps thousands of these small databases open, and each
    // connection's default lookaside (about 120 KiB) would be most of its memory.
    // SAFETY: a connection just opened, nothing allocated from its lookaside yet; a null buffer with
    // size 0 and count 0 is the documented way to turn lookaside off.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_db_config(
            conn.handle(),
            rusqlite::ffi::SQLITE_DBCONFIG_LOOKASIDE,
            std::ptr::null_mut::<std::ffi::c_void>(),
            0 as std::ffi::c_int,
            0 as std::ffi::c_int,
        )
    };
    if rc != rusqlite::ffi::SQLITE_OK {
        return Err(GradeError::Database(format!(
            "cannot build the database {label}: lookaside off failed ({rc})"
        )));
    }
    // Small pages: a few dozen rows over a dozen tables fill a page each, not 4 KiB each (the
    // template has the same size, which a backup into an in-memory database needs).
    conn.pragma_update(None, "page_size", SMALL_PAGE)
        .map_err(fail)?;
    conn.pragma_update(None, "foreign_keys", false)
        .map_err(fail)?;
    conn.pragma_update(None, "temp_store", "MEMORY")
        .map_err(fail)?;
    copy_schema(schema, &mut conn).map_err(|e| match e {
        GradeError::Database(m) => {
            GradeError::Database(format!("cannot build the database {label}: {m}"))
        }
        other => other,
    })?;
    let stopped = arm_build(&mut conn, budget).map_err(fail)?;
    let temp = crate::tempfiles::TempAccount::new(budget.max_temp_bytes);
    crate::tempfiles::charged_to(&temp, || insert_rows(&mut conn, tables)).map_err(
        |e| match e {
            Inserted::Sqlite(e) => build_error(label, e, &stopped, budget),
            Inserted::Grade(g) => g,
        },
    )?;
    if reverse_scans {
        conn.pragma_update(None, "reverse_unordered_selects", true)
            .map_err(fail)?;
    }
    GuardedConnection::harden(conn, label.to_string(), true)
}

/// What inserting the rows failed with.
enum Inserted {
    Sqlite(rusqlite::Error),
    Grade(GradeError),
}

impl From<rusqlite::Error> for Inserted {
    fn from(e: rusqlite::Error) -> Self {
        Inserted::Sqlite(e)
    }
}

/// Every table's rows, in one transaction, each row bound as parameters.
fn insert_rows(conn: &mut Connection, tables: &[TableRows]) -> std::result::Result<(), Inserted> {
    let tx = conn.transaction()?;
    for table in tables {
        if table.columns.is_empty() {
            continue;
        }
        let names: Vec<String> = table.columns.iter().map(|c| quote(c)).collect();
        let marks = vec!["?"; names.len()].join(", ");
        let mut insert = tx.prepare(&format!(
            "INSERT INTO {} ({}) VALUES ({marks})",
            quote(&table.name),
            names.join(", ")
        ))?;
        for row in &table.rows {
            if row.len() != names.len() {
                return Err(Inserted::Grade(GradeError::Invalid(format!(
                    "a row of {} has {} values for {} columns",
                    table.name,
                    row.len(),
                    names.len()
                ))));
            }
            insert.execute(rusqlite::params_from_iter(row.iter()))?;
        }
    }
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::exec;
    use crate::guard::Budget;

    fn people(rows: &[(i64, &str)]) -> TableRows {
        TableRows {
            name: "person".into(),
            columns: vec!["id".into(), "name".into()],
            rows: rows
                .iter()
                .map(|(id, name)| vec![Value::Integer(*id), Value::Text((*name).into())])
                .collect(),
        }
    }

    const SCHEMA: &str = "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT)";

    #[test]
    fn builds_the_rows_and_answers_queries_under_the_policy() {
        let db = build(
            "w",
            &[
                SCHEMA.into(),
                "CREATE INDEX person_name ON person(name)".into(),
            ],
            &[people(&[(1, "Ann"), (2, "Bob"), (3, "ann")])],
            false,
            &Budget::new(5.0),
        )
        .unwrap();
        let budget = Budget::new(5.0);
        let n = exec::count_rows(&db, "SELECT * FROM person WHERE name LIKE 'ann'", &budget);
        assert_eq!(n.unwrap(), 2);
        assert!(matches!(
            db.prepare_checked("DELETE FROM person"),
            Err(GradeError::Unsafe(_))
        ));
        assert!(db.conn.execute("DELETE FROM person", []).is_err());
    }

    #[test]
    fn refuses_triggers_and_other_statements_in_the_schema() {
        for bad in [
            "CREATE TRIGGER t AFTER INSERT ON person BEGIN SELECT 1; END",
            "INSERT INTO person VALUES (1, 'x')",
            "CREATE TABLE a(x); CREATE TABLE b(y)",
        ] {
            let got = build(
                "w",
                &[SCHEMA.into(), bad.into()],
                &[],
                false,
                &Budget::new(5.0),
            );
            assert!(matches!(got, Err(GradeError::Invalid(_))), "{bad}");
        }
    }

    #[test]
    fn a_constraint_the_rows_break_is_a_typed_error_not_a_silent_drop() {
        let budget = Budget::new(5.0);
        let got = build(
            "w",
            &[SCHEMA.into()],
            &[people(&[(1, "a"), (1, "b")])],
            false,
            &budget,
        );
        assert!(matches!(got, Err(GradeError::Constraint(m)) if m.contains("UNIQUE")));
        // Constraints a caller comparing values cannot see: a collation, an expression, a CHECK.
        for schema in [
            "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT UNIQUE COLLATE NOCASE)",
            "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT CHECK (name = lower(name)))",
        ] {
            let got = build(
                "w",
                &[schema.into()],
                &[people(&[(1, "Ann"), (2, "ann")])],
                false,
                &budget,
            );
            assert!(matches!(got, Err(GradeError::Constraint(_))), "{schema}");
        }
        let index = "CREATE UNIQUE INDEX person_lower ON person (lower(name))";
        let got = build(
            "w",
            &[SCHEMA.into(), index.into()],
            &[people(&[(1, "Ann"), (2, "ann")])],
            false,
            &budget,
        );
        assert!(matches!(got, Err(GradeError::Constraint(_))));
    }

    #[test]
    fn a_slow_check_stops_at_the_deadline_and_at_cancel() {
        // Every insert runs the CHECK, whose list of 20,000 values is built again for each row.
        let values: Vec<String> = (100_000..120_000).map(|i| i.to_string()).collect();
        let slow = format!(
            "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT CHECK (id NOT IN ({})))",
            values.join(", ")
        );
        let many: Vec<(i64, &str)> = (1..=20_000).map(|i| (i, "a")).collect();
        let rows = people(&many);
        let started = Instant::now();
        let got = build(
            "w",
            std::slice::from_ref(&slow),
            std::slice::from_ref(&rows),
            false,
            &Budget::new(0.3),
        );
        assert!(
            matches!(got, Err(GradeError::Timeout(_))),
            "{:?}",
            got.err()
        );
        assert!(started.elapsed() < Duration::from_secs(3));
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cancel = Budget {
            cancel: Some(Arc::clone(&flag)),
            ..Budget::new(60.0)
        };
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            flag.store(true, Ordering::Relaxed);
        });
        let started = Instant::now();
        let got = build("w", &[slow], &[rows], false, &cancel);
        setter.join().unwrap();
        assert!(matches!(got, Err(GradeError::Cancelled)), "{:?}", got.err());
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn reverse_scans_reverse_an_unordered_scan() {
        let rows = [(1, "a"), (2, "b"), (3, "c")];
        let first = |reverse: bool| {
            let db = build(
                "w",
                &[SCHEMA.into()],
                &[people(&rows)],
                reverse,
                &Budget::new(5.0),
            )
            .unwrap();
            let name: String = db
                .conn
                .query_row("SELECT name FROM person LIMIT 1", [], |r| r.get(0))
                .unwrap();
            name
        };
        assert_eq!(first(false), "a");
        assert_eq!(first(true), "c");
    }
}
