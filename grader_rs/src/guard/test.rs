//! The guarded connection as a whole: the policy, the deadline, writers, special files, the
//! temporary disk cap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::*;

fn fixture() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.sqlite");
    let c = Connection::open(&path).unwrap();
    c.execute_batch(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'a'), (2, 'b');",
    )
    .unwrap();
    (dir, path.to_string_lossy().into_owned())
}

fn unsafe_reason(gc: &GuardedConnection, sql: &str) -> String {
    match gc.prepare_checked(sql) {
        Err(GradeError::Unsafe(m)) => m,
        Err(other) => panic!("{sql}: expected unsafe, got {other:?}"),
        Ok(_) => panic!("{sql}: expected unsafe, it prepared"),
    }
}

#[test]
fn policy_refuses_everything_but_one_select() {
    let (_dir, path) = fixture();
    let gc = GuardedConnection::open(&path, true).unwrap();
    assert!(
        unsafe_reason(&gc, "SELECT * FROM pragma_table_info('t')").contains("pragma_table_info")
    );
    assert!(unsafe_reason(&gc, "SELECT load_extension('x')").contains("load_extension"));
    assert!(unsafe_reason(&gc, "DELETE FROM t").contains("DELETE"));
    assert!(unsafe_reason(&gc, "WITH x AS (SELECT 1) DELETE FROM t").contains("writes"));
    // The digest aggregate is only for the core's own wrapper.
    let call = format!("SELECT {}(1)", gc.digest_fn);
    assert!(unsafe_reason(&gc, &call).contains("function"));
    assert!(gc
        .prepare_checked("SELECT value FROM json_each('[1]')")
        .is_ok());
    assert!(gc
        .prepare_checked("SELECT v FROM t -- trailing comment")
        .is_ok());
}

fn sql_error(gc: &GuardedConnection, sql: &str) -> String {
    match gc.prepare_checked(sql) {
        Err(GradeError::Sql(m)) => m,
        Err(other) => panic!("{sql}: expected an SQL error, got {other:?}"),
        Ok(_) => panic!("{sql}: expected an SQL error, it prepared"),
    }
}

#[test]
fn what_does_not_parse_is_an_sql_error_and_what_writes_is_unsafe() {
    let (_dir, path) = fixture();
    let gc = GuardedConnection::open(&path, true).unwrap();
    // SQLite's own message for what it cannot parse.
    assert!(sql_error(&gc, "SELEC count(*) FROM t").starts_with("near \"SELEC\": syntax error"));
    for (sql, message) in [
        (
            "WITH x AS (SELEC 1) SELECT * FROM x",
            "near \"SELEC\": syntax error",
        ),
        ("SELECT 1; SELEC 2", "near \"SELEC\": syntax error"),
        ("SELECT (1", "incomplete input"),
        ("SELECT 1 ^ 2", "unrecognized token: \"^\""),
        ("DROP TABLE", "incomplete input"),
        ("DROPP TABLE t", "near \"DROPP\": syntax error"),
        ("PRAGMA", "incomplete input"),
    ] {
        assert!(
            sql_error(&gc, sql).starts_with(message),
            "{sql}: {}",
            sql_error(&gc, sql)
        );
    }
    // Not one query, though nothing writes: the query's mistake too.
    for empty in ["", "   ", "-- nothing", ";;", "/* c */ ;"] {
        assert!(
            sql_error(&gc, empty).starts_with("empty query"),
            "{empty:?}"
        );
    }
    assert!(sql_error(&gc, "SELECT 1; SELECT 2").contains("more than one statement"));
    assert!(sql_error(&gc, "SELECT 1; VALUES (2);").contains("more than one statement"));
    assert!(sql_error(&gc, "EXPLAIN SELECT 1").starts_with("EXPLAIN"));
    assert!(sql_error(&gc, "EXPLAIN QUERY PLAN SELECT * FROM t").starts_with("EXPLAIN"));
    assert!(sql_error(&gc, "SELECT 1\0; DROP TABLE t").contains("NUL"));
    assert!(sql_error(&gc, "SELECT nope FROM t").starts_with("no such column: nope"));
    assert!(sql_error(&gc, "WITH x AS (SELECT 1) SELECT * FROM nope")
        .starts_with("no such table: nope"));
    // What parses and would write, attach, vacuum or change a setting, wherever it stands.
    assert!(unsafe_reason(&gc, "DROP TABLE t").contains("DROP"));
    assert!(unsafe_reason(&gc, "DROP TABLE no_such_table").contains("DROP"));
    let if_exists = unsafe_reason(&gc, "DROP TABLE IF EXISTS no_such_table");
    assert!(if_exists.contains("DROP"), "{if_exists}");
    assert!(unsafe_reason(&gc, "DELETE FROM no_such_table").contains("DELETE"));
    assert!(unsafe_reason(&gc, "INSERT INTO nope VALUES (1)").contains("INSERT"));
    assert!(
        unsafe_reason(&gc, "WITH x AS (SELECT 1) DELETE FROM nope").contains("DELETE"),
        "a WITH that ends in a write"
    );
    assert!(unsafe_reason(&gc, "SELECT 1; DROP TABLE t").contains("DROP"));
    assert!(unsafe_reason(&gc, "SELEC 1; DROP TABLE t").contains("DROP"));
    assert!(unsafe_reason(&gc, "SELECT 1; SELEC 2; UPDATE t SET v = 1").contains("UPDATE"));
    assert!(unsafe_reason(&gc, "PRAGMA x").contains("PRAGMA"));
    assert!(unsafe_reason(&gc, "PRAGMA query_only = 0").contains("PRAGMA"));
    assert_eq!(
        unsafe_reason(&gc, "VACUUM"),
        "VACUUM writes to the database"
    );
    assert!(unsafe_reason(&gc, "BEGIN").contains("transactions"));
    let r = unsafe_reason(&gc, "ROLLBACK TO nope");
    assert!(r.contains("savepoints"), "{r}");
    assert!(unsafe_reason(&gc, "ATTACH 'x.db' AS x").contains("ATTACH"));
    let r = unsafe_reason(&gc, "DETACH nope");
    assert!(r.contains("DETACH"), "{r}");
    assert!(unsafe_reason(&gc, "EXPLAIN DROP TABLE t").contains("DROP"));
    assert!(unsafe_reason(
        &gc,
        "CREATE TEMP TRIGGER x AFTER INSERT ON t BEGIN SELECT 1; END"
    )
    .contains("CREATE TEMP TRIGGER"));
    assert!(unsafe_reason(&gc, "SELECT load_extension('x')").contains("load_extension"));
    // Queries that parse and read still run: VALUES forms, a WITH, trailing `;` and comments.
    for query in [
        "VALUES (1), (2)",
        "WITH x AS (SELECT 1) VALUES (2)",
        "WITH RECURSIVE c(n) AS (VALUES (1) UNION ALL SELECT n + 1 FROM c WHERE n < 3) SELECT n FROM c;",
        "SELECT v FROM t; -- done",
    ] {
        assert!(gc.prepare_checked(query).is_ok(), "{query}");
    }
}

#[test]
fn deadline_and_cancel_stop_a_running_query() {
    let (_dir, path) = fixture();
    let gc = GuardedConnection::open(&path, true).unwrap();
    let endless =
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";
    let budget = Budget::new(0.2);
    let err = crate::exec::count_rows(&gc, endless, &budget).unwrap_err();
    assert_eq!(err, GradeError::Timeout(0.2));
    let flag = Arc::new(AtomicBool::new(false));
    let cancel = Budget {
        cancel: Some(Arc::clone(&flag)),
        ..Budget::new(60.0)
    };
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        flag.store(true, Ordering::Relaxed);
    });
    let started = Instant::now();
    assert_eq!(
        crate::exec::count_rows(&gc, endless, &cancel).unwrap_err(),
        GradeError::Cancelled
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    setter.join().unwrap();
    // The connection serves again after an interrupted query.
    assert_eq!(
        crate::exec::count_rows(&gc, "SELECT * FROM t", &Budget::new(5.0)).unwrap(),
        2
    );
}

#[test]
fn deadline_holds_while_sqlite_sorts() {
    // A sort of millions of rows: with in-memory temp storage SQLite sorted them in one call
    // that no progress handler reaches (seconds past the deadline). With file-backed temp
    // storage the sorter spills runs and merges while stepping, under the deadline's checks.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.sqlite");
    let c = Connection::open(&path).unwrap();
    c.execute_batch(
        "CREATE TABLE n(x INTEGER); WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1500) \
         INSERT INTO n SELECT x FROM c;",
    )
    .unwrap();
    drop(c);
    let gc = GuardedConnection::open(path.to_str().unwrap(), true).unwrap();
    // 2.25M rows: produced within the deadline, then sorted before the first row comes out.
    let sort = "SELECT a.x FROM n a, n b ORDER BY random()";
    let opts = crate::exec::ToolOptions {
        max_rows: 5,
        max_cell_chars: 20,
        max_chars: 1000,
        count_cap: 10,
    };
    let started = Instant::now();
    match crate::exec::run_tool(&gc, sort, opts, &Budget::new(0.8)) {
        Ok(out) => assert_eq!(out.rows.len(), 5),
        Err(e) => assert_eq!(e, GradeError::Timeout(0.8)),
    }
    assert!(
        started.elapsed() < Duration::from_millis(1800),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_database_with_a_committed_wal_is_read_with_locks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.sqlite");
    let writer = Connection::open(&path).unwrap();
    writer
        .execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE t(x); \
             INSERT INTO t VALUES (1), (2), (3);",
        )
        .unwrap();
    let path = path.to_str().unwrap();
    assert!(writer_side_file(path).is_some_and(|(f, n)| f.ends_with("-wal") && n > 0));
    let gc = GuardedConnection::open(path, true).unwrap();
    assert!(!gc.immutable);
    // The rows live only in the WAL: an immutable open would not see the table at all.
    assert_eq!(
        crate::exec::count_rows(&gc, "SELECT * FROM t", &Budget::new(5.0)).unwrap(),
        3
    );
    drop(gc);
    drop(writer); // the last connection checkpoints and removes the WAL
    assert!(writer_side_file(path).is_none());
    assert!(GuardedConnection::open(path, true).unwrap().immutable);
}

#[test]
fn the_schema_is_read_through_the_guarded_path() {
    let (_dir, path) = fixture();
    let gc = GuardedConnection::open(&path, false).unwrap();
    let table = (
        "table".to_string(),
        "t".to_string(),
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)".to_string(),
    );
    assert_eq!(gc.schema(&Budget::new(5.0)).unwrap(), vec![table.clone()]);
    // The call's budget holds: a cancelled token stops it before it steps.
    let cancelled = Budget {
        cancel: Some(Arc::new(AtomicBool::new(true))),
        ..Budget::new(5.0)
    };
    assert_eq!(gc.schema(&cancelled).unwrap_err(), GradeError::Cancelled);
    // A writer's lock is answered as for any statement, not as a bare "database is locked".
    let writer = Connection::open(&path).unwrap();
    writer.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let locked = crate::exec::count_rows(&gc, "SELECT * FROM t", &Budget::new(5.0));
    let err = gc.schema(&Budget::new(5.0)).unwrap_err();
    assert!(
        matches!(&err, GradeError::Database(m) if m.contains("locked by a writer")),
        "{err:?}"
    );
    assert_eq!(Err(err), locked);
    writer.execute_batch("ROLLBACK").unwrap();
    assert_eq!(gc.schema(&Budget::new(5.0)).unwrap(), vec![table]);
}

#[test]
fn missing_and_non_sqlite_files_are_database_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.sqlite");
    assert!(
        matches!(GuardedConnection::open(missing.to_str().unwrap(), true), Err(GradeError::Database(m)) if m.contains("not found"))
    );
    let text = dir.path().join("text.sqlite");
    std::fs::write(&text, vec![b'x'; 4096]).unwrap();
    assert!(matches!(
        GuardedConnection::open(text.to_str().unwrap(), true),
        Err(GradeError::Database(_))
    ));
}

/// A database of `n` rows: its cross join with itself is n² rows to sort.
fn numbers(n: u32) -> (tempfile::TempDir, GuardedConnection) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.sqlite");
    let c = Connection::open(&path).unwrap();
    c.execute_batch(&format!(
        "CREATE TABLE n(x INTEGER); WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 \
         FROM c WHERE x < {n}) INSERT INTO n SELECT x FROM c;"
    ))
    .unwrap();
    drop(c);
    let gc = GuardedConnection::open(path.to_str().unwrap(), true).unwrap();
    (dir, gc)
}

const MIB: u64 = tempfiles::MIB;

#[test]
fn a_query_past_its_temp_cap_stops_with_a_temp_disk_error() {
    let (_dir, gc) = numbers(600);
    // 360k distinct pairs: a temporary b-tree of several MiB.
    let distinct = "SELECT DISTINCT a.x, b.x FROM n a, n b";
    let capped = Budget::new(60.0).with_max_temp_bytes(MIB);
    let err = crate::exec::count_rows(&gc, distinct, &capped).unwrap_err();
    assert_eq!(err, GradeError::TempDisk(MIB));
    assert!(
        err.to_string()
            .contains("needed more than 1 MiB of temporary disk"),
        "{err}"
    );
    assert_eq!(gc.temp_bytes(), 0, "the failed statement's files are gone");
    // The same on the tool path, and under the default cap the query runs.
    let opts = crate::exec::ToolOptions::FOR_TESTS;
    let tool = crate::exec::run_tool(
        &gc,
        "SELECT a.x FROM n a, n b ORDER BY random()",
        opts,
        &capped,
    );
    assert_eq!(tool.unwrap_err(), GradeError::TempDisk(MIB));
    let count = crate::exec::count_rows(&gc, distinct, &Budget::new(60.0)).unwrap();
    assert_eq!(count, 360_000);
}

#[test]
fn a_statement_finalized_later_keeps_its_files_charged_to_its_connection() {
    let (_dir, gc) = numbers(600);
    let (mut sorted, _) = gc
        .prepare_checked("SELECT a.x, b.x FROM n a, n b ORDER BY 2, 1")
        .unwrap();
    gc.arm(&Budget::new(60.0)).unwrap();
    let mut rows = sorted.raw_query();
    assert!(rows.next().unwrap().is_some()); // sorted: the runs wait on disk to be merged
    gc.disarm();
    let held = gc.temp_bytes();
    assert!(held > MIB, "the sort holds {held} bytes");
    // The connection's next query starts with those bytes already counted against its cap.
    let capped = Budget::new(60.0).with_max_temp_bytes(held + 64 * 1024);
    let distinct = "SELECT DISTINCT a.x, b.x FROM n a, n b";
    assert_eq!(
        crate::exec::count_rows(&gc, distinct, &capped).unwrap_err(),
        GradeError::TempDisk(held + 64 * 1024)
    );
    drop(rows);
    drop(sorted);
    assert_eq!(gc.temp_bytes(), 0);
    let count = crate::exec::count_rows(&gc, distinct, &Budget::new(60.0)).unwrap();
    assert_eq!(count, 360_000);
}

#[test]
fn a_path_that_is_not_a_regular_file_is_refused_without_opening_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe.sqlite");
    let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    // Opening a FIFO for reading would wait for a writer forever: the refusal comes first.
    match GuardedConnection::open(fifo.to_str().unwrap(), true) {
        Err(GradeError::Database(m)) => assert!(m.contains("a FIFO"), "{m}"),
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("a FIFO opened as a database"),
    }
    match GuardedConnection::open("/dev/null", true) {
        Err(GradeError::Database(m)) => {
            assert!(m.contains("a character device, not a regular file"), "{m}")
        }
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("/dev/null opened as a database"),
    }
}
