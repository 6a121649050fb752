//! The read-only connection: open flags, database configuration, limits, the authorizer and
//! the deadline. This module is the safety policy (grader.md §3); nothing else decides what a
//! query may do.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::config::DbConfig;
use rusqlite::ffi;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::{Connection, OpenFlags, Statement};

use crate::error::{GradeError, Result};
use crate::sqltext;
use crate::tempfiles::{self, TempAccount};

/// Longest SQL text accepted, in bytes. Far above any real query; stops parser-bombs early.
pub const MAX_SQL_BYTES: usize = 100_000;
/// Keywords a statement may start with.
const ALLOWED_FIRST_WORDS: [&str; 3] = ["SELECT", "WITH", "VALUES"];
/// Functions that reach outside the database.
const DENIED_FUNCTIONS: [&str; 2] = ["load_extension", "fts3_tokenizer"];
/// What `GuardedConnection::schema` reads: every schema object that has SQL text.
const SCHEMA_SQL: &str =
    "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid";
/// How many VM steps between two deadline checks (overhead lost in noise, latency ~µs).
const PROGRESS_STEPS: i32 = 1000;

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

/// Whether someone chose the heap limit: then the default is never installed over it.
static HEAP_LIMIT_CHOSEN: AtomicBool = AtomicBool::new(false);

/// Process-wide hard heap limit (`sqlite3_hard_heap_limit64`); returns the previous value.
pub fn set_heap_limit(bytes: i64) -> i64 {
    HEAP_LIMIT_CHOSEN.store(true, Ordering::SeqCst);
    unsafe { ffi::sqlite3_hard_heap_limit64(bytes) }
}

/// Default heap limit for the whole process, set when the first connection opens.
pub const DEFAULT_HEAP_LIMIT: i64 = 2 * 1024 * 1024 * 1024;

/// Why the last query was stopped by the progress handler.
const STOP_NONE: u8 = 0;
const STOP_TIMEOUT: u8 = 1;
const STOP_CANCEL: u8 = 2;

/// Deadline and cancellation shared with the progress handler.
pub struct RunControl {
    base: Instant,
    deadline_ns: AtomicU64,
    cancel: Mutex<Option<Arc<AtomicBool>>>,
    stopped: AtomicU8,
}

impl RunControl {
    fn new() -> Self {
        RunControl {
            base: Instant::now(),
            deadline_ns: AtomicU64::new(u64::MAX),
            cancel: Mutex::new(None),
            stopped: AtomicU8::new(STOP_NONE),
        }
    }

    fn should_stop(&self) -> bool {
        if let Some(flag) = self.cancel.lock().unwrap().as_ref() {
            if flag.load(Ordering::Relaxed) {
                self.stopped.store(STOP_CANCEL, Ordering::Relaxed);
                return true;
            }
        }
        if self.base.elapsed().as_nanos() as u64 >= self.deadline_ns.load(Ordering::Relaxed) {
            self.stopped.store(STOP_TIMEOUT, Ordering::Relaxed);
            return true;
        }
        false
    }
}

/// What the authorizer denied while the last statement was prepared.
#[derive(Default)]
pub struct AuthState {
    denied: Mutex<Option<String>>,
    /// The digest aggregate may appear only in the wrapper the core writes itself.
    allow_digest_fn: AtomicBool,
    /// The connection's file is writable (an in-memory copy): refuse writes to main too.
    writable: bool,
}

impl AuthState {
    fn deny(&self, what: String) -> Authorization {
        let mut d = self.denied.lock().unwrap();
        if d.is_none() {
            *d = Some(what);
        }
        Authorization::Deny
    }
    fn take_denied(&self) -> Option<String> {
        self.denied.lock().unwrap().take()
    }
}

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

/// A deadline, an optional cancel token and a cap on temporary disk, for one call.
#[derive(Clone)]
pub struct Budget {
    pub timeout_s: f64,
    pub cancel: Option<Arc<AtomicBool>>,
    /// Bytes of temporary files (sorts, temporary b-trees) the call's query may hold at once.
    pub max_temp_bytes: u64,
}

impl Budget {
    /// A deadline, no cancel token, the default cap on temporary disk.
    pub fn new(timeout_s: f64) -> Self {
        Budget {
            timeout_s,
            cancel: None,
            max_temp_bytes: tempfiles::DEFAULT_MAX_TEMP_BYTES,
        }
    }

    pub fn with_max_temp_bytes(self, max_temp_bytes: u64) -> Self {
        Budget {
            max_temp_bytes,
            ..self
        }
    }
}

/// How long a connection that reads with locks waits for a writer's lock before it gives up.
const WRITER_WAIT: Duration = Duration::from_millis(1000);

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
    /// Open `path` read-only with every hardening of grader.md §3.
    pub fn open(path: &str, immutable: bool) -> Result<Self> {
        static HEAP_LIMIT: std::sync::Once = std::sync::Once::new();
        HEAP_LIMIT.call_once(|| {
            if !HEAP_LIMIT_CHOSEN.load(Ordering::SeqCst) {
                unsafe { ffi::sqlite3_hard_heap_limit64(DEFAULT_HEAP_LIMIT) };
            }
        });
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

    /// Lock down an open connection: everything of grader.md §3 but the open flags.
    /// `writable` marks a connection whose file could be written (an in-memory database the core
    /// built, memdb.rs): there `query_only` is set and writes to main are refused by the authorizer too.
    pub fn harden(mut conn: Connection, path: String, writable: bool) -> Result<Self> {
        let db_err =
            |e: rusqlite::Error| GradeError::Database(format!("cannot open database {path}: {e}"));
        // Sorters and temporary b-trees use temporary files (unlinked at open), not memory. With
        // in-memory temp storage SQLite's sorter keeps every row in one list and sorts it in a
        // single call that neither the progress handler nor sqlite3_interrupt reaches (a cross
        // join ORDER BY random() ran 110 s past a 30 s deadline, 1.6 GB resident). With files it
        // sorts runs of at most the page cache's size (cache_size, 2 MiB by default) and merges
        // them while stepping, so the deadline holds and memory stays bounded; disk use is what the
        // rows written before the deadline take.
        conn.pragma_update(None, "temp_store", "FILE")
            .map_err(db_err)?;
        if writable {
            conn.pragma_update(None, "query_only", true)
                .map_err(db_err)?;
        }
        for (cfg, on) in [
            (DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true),
            (DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false),
            (DbConfig::SQLITE_DBCONFIG_ENABLE_ATTACH_CREATE, false),
            (DbConfig::SQLITE_DBCONFIG_ENABLE_ATTACH_WRITE, false),
            (DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false),
        ] {
            conn.set_db_config(cfg, on).map_err(db_err)?;
        }
        for (limit, value) in LIMITS {
            conn.set_limit(limit, value).map_err(db_err)?;
        }
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

        let (digest_fn, aggregate) = crate::digest::register(&conn).map_err(db_err)?;
        let auth = Arc::new(AuthState {
            writable,
            ..AuthState::default()
        });
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

    /// Arm the deadline and the cancel token for one call; `disarm` must follow.
    pub fn arm(&self, budget: &Budget) -> Result<()> {
        if let Some(flag) = &budget.cancel {
            if flag.load(Ordering::Relaxed) {
                return Err(GradeError::Cancelled);
            }
        }
        let now = self.control.base.elapsed();
        let deadline = now + Duration::from_secs_f64(budget.timeout_s.clamp(0.0, 1e9));
        self.control
            .deadline_ns
            .store(deadline.as_nanos() as u64, Ordering::Relaxed);
        *self.control.cancel.lock().unwrap() = budget.cancel.clone();
        self.control.stopped.store(STOP_NONE, Ordering::Relaxed);
        // Temporary files opened on this thread from now on are this connection's, under the
        // call's cap (files still open from an earlier statement count against it too).
        self.temp.start_query(budget.max_temp_bytes);
        tempfiles::set_current(Some(Arc::clone(&self.temp)));
        Ok(())
    }

    pub fn disarm(&self) {
        self.control.deadline_ns.store(u64::MAX, Ordering::Relaxed);
        *self.control.cancel.lock().unwrap() = None;
        tempfiles::set_current(None);
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

    /// Whether the armed call's deadline has passed or its cancel token fired (asked by work
    /// the progress handler does not reach: the end of a digest that spilled).
    pub fn interrupted(&self) -> bool {
        self.control.should_stop()
    }

    /// The error for a call `interrupted` stopped.
    pub fn stop_error(&self, budget: &Budget) -> GradeError {
        match self.control.stopped.load(Ordering::Relaxed) {
            STOP_TIMEOUT => GradeError::Timeout(budget.timeout_s),
            _ => GradeError::Cancelled,
        }
    }

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

    fn classify(&self, e: rusqlite::Error) -> GradeError {
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
fn writer_error(path: &str, e: &rusqlite::Error) -> Option<GradeError> {
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

fn authorize(auth: &AuthState, digest_fn: &str, ctx: AuthContext<'_>) -> Authorization {
    use AuthAction as A;
    match ctx.action {
        // Table-valued pragmas (pragma_table_info, …) are eponymous virtual tables: their reads
        // are refused here, at prepare time; the PRAGMA they run at step time is refused below.
        A::Read { table_name, .. } if is_pragma_table(table_name) => {
            auth.deny(format!("{table_name}()"))
        }
        A::Select | A::Read { .. } | A::Recursive => Authorization::Allow,
        A::Function { function_name } => {
            let denied = DENIED_FUNCTIONS
                .iter()
                .any(|f| f.eq_ignore_ascii_case(function_name));
            let digest_off = function_name.eq_ignore_ascii_case(digest_fn)
                && !auth.allow_digest_fn.load(Ordering::Relaxed);
            if denied || digest_off {
                auth.deny(format!("function {function_name}()"))
            } else {
                Authorization::Allow
            }
        }
        // The first use of an eponymous virtual table (json_each) may report a write to main's
        // schema; writes to main cannot happen on a read-only connection anyway.
        // (An in-memory database the core built is writable: there, writes to main are refused too.)
        A::Insert { .. } | A::Update { .. } | A::Delete { .. }
            if ctx.database_name == Some("main") && !auth.writable =>
        {
            Authorization::Allow
        }
        A::Insert { table_name } | A::Delete { table_name } => {
            auth.deny(format!("write to {table_name}"))
        }
        A::Update { table_name, .. } => auth.deny(format!("write to {table_name}")),
        A::Pragma { pragma_name, .. } => auth.deny(format!("PRAGMA {pragma_name}")),
        A::Attach { .. } => auth.deny("ATTACH (also VACUUM INTO)".into()),
        A::Detach { .. } => auth.deny("DETACH".into()),
        A::Transaction { .. } => auth.deny("transactions".into()),
        A::Savepoint { .. } => auth.deny("savepoints".into()),
        A::Analyze { .. } => auth.deny("ANALYZE".into()),
        A::Reindex { .. } => auth.deny("REINDEX".into()),
        A::AlterTable { .. } => auth.deny("ALTER TABLE".into()),
        other => auth.deny(action_name(&other)),
    }
}

fn is_pragma_table(name: &str) -> bool {
    name.len() > 7 && name[..7].eq_ignore_ascii_case("pragma_")
}

fn action_name(a: &AuthAction<'_>) -> String {
    // CREATE/DROP of any object (including TEMP and virtual tables) and anything unknown.
    let s = format!("{a:?}");
    s.split([' ', '{']).next().unwrap_or("action").to_string()
}

#[cfg(test)]
mod test {
    use super::*;

    fn fixture() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.sqlite");
        let c = Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'a'), (2, 'b');").unwrap();
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
        assert!(unsafe_reason(&gc, "SELECT * FROM pragma_table_info('t')")
            .contains("pragma_table_info"));
        assert!(unsafe_reason(&gc, "SELECT load_extension('x')").contains("load_extension"));
        assert!(unsafe_reason(&gc, "DELETE FROM t").contains("DELETE"));
        assert!(unsafe_reason(&gc, "WITH x AS (SELECT 1) DELETE FROM t").contains("writes"));
        assert!(unsafe_reason(&gc, "SELECT 1; SELECT 2").contains("more than one"));
        assert!(unsafe_reason(&gc, "  -- nothing").contains("empty"));
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

    #[test]
    fn deadline_and_cancel_stop_a_running_query() {
        let (_dir, path) = fixture();
        let gc = GuardedConnection::open(&path, true).unwrap();
        let endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";
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
        let opts = crate::exec::ToolOptions::DEFAULT;
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

    #[test]
    fn uri_escapes_query_characters() {
        assert_eq!(
            uri_for("/a/b?c#d%e.sqlite", true),
            "file:/a/b%3Fc%23d%25e.sqlite?mode=ro&immutable=1"
        );
        assert_eq!(uri_for("/x/é.db", false), "file:/x/é.db?mode=ro");
    }
}
