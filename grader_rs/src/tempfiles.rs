//! SQLite's temporary files, counted and capped per query.
//!
//! A query's sorts (ORDER BY, DISTINCT, GROUP BY), temporary b-trees and materialized subqueries
//! go to temporary files (guard.rs sets `temp_store=FILE`: in-memory ones escape the deadline).
//! Unchecked, one query filled 3.4 GB of disk before its deadline, and the Grader runs as many as
//! it has workers. So every connection of the core opens its files through a small VFS,
//! registered once under `VFS_NAME`, that wraps the system's default one:
//!
//! - a database file (the main file, its WAL or journal) is the default VFS's own file object,
//!   untouched: reading the database costs nothing extra;
//! - a temporary file (opened without a name, or as a temporary database, transient database,
//!   temporary journal, which is what the sorter opens, or statement journal) is wrapped: each
//!   write past the file's end, and each truncate that extends it, is charged to a `TempAccount`,
//!   and refused with `SQLITE_FULL` once the account's cap would be passed. Closing the file gives
//!   its bytes back. The wrapper has no memory-mapped I/O (its methods are version 1, and
//!   `SQLITE_FCNTL_MMAP_SIZE` is answered with 0) and ignores size hints, so bytes reach the file
//!   only through the calls it charges.
//!
//! Which account pays: each guarded connection owns one, and makes it this thread's current one
//! while it steps a statement (`GuardedConnection::arm` .. `disarm`); a file is charged to the
//! account current when it was opened, for as long as it lives. A statement finalized after its
//! call (or stepped again later) still charges its files to the connection that opened them, and
//! a connection's leftover files count against its next query's cap. Temporary files are opened
//! by the thread that steps (SQLite's sorter threads are off: guard.rs limits them to 0, and the
//! `threads` PRAGMA is refused); a file opened where no account is current is capped on its own at
//! the default.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rusqlite::ffi;

/// A query's temporary disk when the caller names no cap (ToolLimits and GradeSpec take theirs
/// from here, as `max_temp_mb`).
pub const DEFAULT_MAX_TEMP_BYTES: u64 = 1 << 30;
/// Caps are given in MiB.
pub const MIB: u64 = 1 << 20;
/// The largest cap in MiB that still fits in bytes.
pub const MAX_TEMP_MB: u64 = u64::MAX / MIB;
/// The name the VFS is registered under (never the default VFS: only the core's connections
/// name it).
pub const VFS_NAME: &str = "t2sql-tempcap";
const VFS_NAME_C: &CStr = c"t2sql-tempcap";

/// "8 MiB", or the bytes when the amount is not a whole number of MiB.
pub fn describe_bytes(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// The temporary disk of one connection's queries: bytes its live temporary files hold, the cap
/// of the query it runs now, and whether a write was refused since the query started.
#[derive(Debug)]
pub struct TempAccount {
    cap: AtomicU64,
    used: AtomicU64,
    refused: AtomicBool,
}

impl TempAccount {
    pub fn new(cap: u64) -> Arc<Self> {
        Arc::new(TempAccount {
            cap: AtomicU64::new(cap),
            used: AtomicU64::new(0),
            refused: AtomicBool::new(false),
        })
    }

    /// The start of a query: its cap, and no refusal yet.
    pub fn start_query(&self, cap: u64) {
        self.cap.store(cap, Ordering::Relaxed);
        self.refused.store(false, Ordering::Relaxed);
    }

    pub fn cap(&self) -> u64 {
        self.cap.load(Ordering::Relaxed)
    }

    /// Bytes the live temporary files charged to this account hold.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether a write was refused since the query started (and forget it).
    pub fn take_refused(&self) -> bool {
        self.refused.swap(false, Ordering::Relaxed)
    }

    /// Add `bytes` if the cap allows it; else remember the refusal.
    fn charge(&self, bytes: u64) -> bool {
        let cap = self.cap();
        let taken = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&total| total <= cap)
            });
        match taken {
            Ok(_) => {
                add_live(bytes);
                true
            }
            Err(_) => {
                self.refused.store(true, Ordering::Relaxed);
                false
            }
        }
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
        LIVE.fetch_sub(bytes, Ordering::Relaxed);
    }
}

thread_local! {
    /// The account that pays for temporary files this thread opens now.
    static CURRENT: RefCell<Option<Arc<TempAccount>>> = const { RefCell::new(None) };
}

/// Make `account` (or none) the one that pays for temporary files this thread opens from now on;
/// returns the one it replaces.
pub fn set_current(account: Option<Arc<TempAccount>>) -> Option<Arc<TempAccount>> {
    CURRENT.with(|c| c.replace(account))
}

/// Run `f` with `account` paying for the temporary files this thread opens meanwhile.
pub fn charged_to<T>(account: &Arc<TempAccount>, f: impl FnOnce() -> T) -> T {
    let previous = set_current(Some(Arc::clone(account)));
    let out = f();
    set_current(previous);
    out
}

fn current() -> Option<Arc<TempAccount>> {
    CURRENT.with(|c| c.borrow().clone())
}

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

fn add_live(bytes: u64) {
    let now = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

/// (bytes all of the process's SQLite temporary files hold now, the most they held at once since
/// the last reset).
pub fn temp_usage() -> (u64, u64) {
    (LIVE.load(Ordering::Relaxed), PEAK.load(Ordering::Relaxed))
}

/// Start the peak over from what is held now.
pub fn reset_temp_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// The directory SQLite's default (unix) VFS puts temporary files in: the first of
/// `SQLITE_TMPDIR`, `TMPDIR`, /var/tmp, /usr/tmp, /tmp and . that is a directory this process
/// may write and enter (os_unix.c's unixTempFileDir; the core never sets sqlite3_temp_directory).
pub fn temp_dir() -> Option<PathBuf> {
    let from_env = ["SQLITE_TMPDIR", "TMPDIR"]
        .into_iter()
        .filter_map(|name| std::env::var_os(name).map(PathBuf::from));
    let fixed = ["/var/tmp", "/usr/tmp", "/tmp", "."].map(PathBuf::from);
    from_env.chain(fixed).find(|dir| writable_dir(dir))
}

fn writable_dir(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    if !dir.is_dir() {
        return false;
    }
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; access() only reads it.
    unsafe { libc::access(path.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

// ---- the VFS ---------------------------------------------------------------------------

/// The flags SQLite opens its temporary files with (the sorter's are TEMP_JOURNAL).
const TEMPORARY_KINDS: c_int = ffi::SQLITE_OPEN_TEMP_DB
    | ffi::SQLITE_OPEN_TRANSIENT_DB
    | ffi::SQLITE_OPEN_TEMP_JOURNAL
    | ffi::SQLITE_OPEN_SUBJOURNAL;

fn is_temporary(name: *const c_char, flags: c_int) -> bool {
    name.is_null() || flags & (TEMPORARY_KINDS | ffi::SQLITE_OPEN_DELETEONCLOSE) != 0
}

/// A wrapped temporary file: SQLite's file header (its methods are ours), the account, the
/// extent charged, then, at `INNER_OFFSET`, the default VFS's own file object.
#[repr(C)]
struct TempFile {
    base: ffi::sqlite3_file,
    /// From `Arc::into_raw`; given back in `close`.
    account: *const TempAccount,
    /// The file's end as charged: the largest end written, or the size truncated to since.
    extent: u64,
}

const INNER_OFFSET: usize = std::mem::size_of::<TempFile>().next_multiple_of(16);

/// The default VFS's file object inside a wrapped one.
///
/// SAFETY (for every helper below): `file` is a `TempFile` this VFS's `open` filled in, inside
/// the `szOsFile` bytes SQLite allocated for it.
unsafe fn inner(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    file.cast::<u8>().add(INNER_OFFSET).cast()
}

unsafe fn inner_methods(file: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    &*(*inner(file)).pMethods
}

unsafe fn state<'a>(file: *mut ffi::sqlite3_file) -> (&'a mut TempFile, &'a TempAccount) {
    let temp = &mut *file.cast::<TempFile>();
    let account = &*temp.account;
    (temp, account)
}

/// The default VFS, as found when ours was registered.
fn default_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: our VFS's pAppData is the default VFS (set in `register`), which SQLite keeps.
    unsafe { (*vfs).pAppData.cast() }
}

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let real = default_vfs(vfs);
    let real_open = (*real).xOpen.expect("a VFS has xOpen");
    if !is_temporary(name, flags) {
        // A database file is the default VFS's own object, at the start of our larger buffer.
        return real_open(real, name, file, flags, out_flags);
    }
    (*file).pMethods = std::ptr::null();
    let rc = real_open(real, name, inner(file), flags, out_flags);
    if rc != ffi::SQLITE_OK {
        // SQLite closes nothing whose methods are null: close what the default VFS left open.
        if let Some(methods) = (*inner(file)).pMethods.as_ref() {
            (methods.xClose.expect("xClose"))(inner(file));
        }
        return rc;
    }
    let account = current().unwrap_or_else(|| TempAccount::new(DEFAULT_MAX_TEMP_BYTES));
    std::ptr::write(
        file.cast::<TempFile>(),
        TempFile {
            base: ffi::sqlite3_file {
                pMethods: &TEMP_METHODS,
            },
            account: Arc::into_raw(account),
            extent: 0,
        },
    );
    ffi::SQLITE_OK
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    let rc = (inner_methods(file).xClose.expect("xClose"))(inner(file));
    let temp = &mut *file.cast::<TempFile>();
    let account = Arc::from_raw(temp.account);
    account.release(temp.extent);
    temp.extent = 0;
    temp.account = std::ptr::null();
    rc
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    (inner_methods(file).xRead.expect("xRead"))(inner(file), buf, amount, offset)
}

/// Charge the file's growth to `end` (nothing when it does not grow): false when refused.
unsafe fn grow_to(file: *mut ffi::sqlite3_file, end: u64) -> bool {
    let (temp, account) = state(file);
    if end <= temp.extent {
        return true;
    }
    if !account.charge(end - temp.extent) {
        return false;
    }
    temp.extent = end;
    true
}

/// Give back what the file holds past `end` (after a truncate, or a failed write's charge).
unsafe fn shrink_to(file: *mut ffi::sqlite3_file, end: u64) {
    let (temp, account) = state(file);
    if end < temp.extent {
        account.release(temp.extent - end);
        temp.extent = end;
    }
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    let before = state(file).0.extent;
    let end = offset.max(0) as u64 + amount.max(0) as u64;
    if !grow_to(file, end) {
        return ffi::SQLITE_FULL;
    }
    let rc = (inner_methods(file).xWrite.expect("xWrite"))(inner(file), buf, amount, offset);
    if rc != ffi::SQLITE_OK {
        shrink_to(file, before);
    }
    rc
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    let before = state(file).0.extent;
    let size = size.max(0) as u64;
    if !grow_to(file, size) {
        return ffi::SQLITE_FULL;
    }
    let rc = (inner_methods(file).xTruncate.expect("xTruncate"))(inner(file), size as i64);
    if rc == ffi::SQLITE_OK {
        shrink_to(file, size);
    } else {
        shrink_to(file, before);
    }
    rc
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    (inner_methods(file).xSync.expect("xSync"))(inner(file), flags)
}

unsafe extern "C" fn file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    (inner_methods(file).xFileSize.expect("xFileSize"))(inner(file), size)
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    (inner_methods(file).xLock.expect("xLock"))(inner(file), level)
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    (inner_methods(file).xUnlock.expect("xUnlock"))(inner(file), level)
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    (inner_methods(file)
        .xCheckReservedLock
        .expect("xCheckReservedLock"))(inner(file), out)
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    match op {
        // A size hint or chunk size would let the default VFS grow the file itself (ftruncate,
        // fallocate) past the charged writes; both are hints, so they are dropped.
        ffi::SQLITE_FCNTL_SIZE_HINT | ffi::SQLITE_FCNTL_CHUNK_SIZE => ffi::SQLITE_OK,
        // Memory-mapped writes would bypass `write`: the map stays off.
        ffi::SQLITE_FCNTL_MMAP_SIZE => {
            let limit = arg.cast::<ffi::sqlite3_int64>();
            if *limit > 0 {
                *limit = 0;
            }
            (inner_methods(file).xFileControl.expect("xFileControl"))(inner(file), op, arg)
        }
        _ => (inner_methods(file).xFileControl.expect("xFileControl"))(inner(file), op, arg),
    }
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    (inner_methods(file).xSectorSize.expect("xSectorSize"))(inner(file))
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    (inner_methods(file)
        .xDeviceCharacteristics
        .expect("xDeviceCharacteristics"))(inner(file))
}

/// Version 1: no shared memory and no xFetch, so SQLite never maps a temporary file.
static TEMP_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

/// The VFS's name, registering it at the first call; an error when SQLite has no default VFS to
/// wrap or refuses the registration.
pub fn vfs_name() -> Result<&'static str, String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED.get_or_init(register).clone().map(|()| VFS_NAME)
}

fn register() -> Result<(), String> {
    // SAFETY: sqlite3_vfs_find(NULL) returns the default VFS (SQLite initialises itself first);
    // ours copies its fields, points pAppData at it, and is leaked, so it outlives every
    // connection, as sqlite3_vfs_register requires.
    unsafe {
        let real = ffi::sqlite3_vfs_find(std::ptr::null());
        if real.is_null() {
            return Err("SQLite has no default VFS to open temporary files with".into());
        }
        let mut ours: ffi::sqlite3_vfs = *real;
        ours.iVersion = ours.iVersion.min(3);
        ours.szOsFile = (INNER_OFFSET as c_int) + (*real).szOsFile;
        ours.pNext = std::ptr::null_mut();
        ours.zName = VFS_NAME_C.as_ptr();
        ours.pAppData = real.cast();
        ours.xOpen = Some(open);
        let ours = Box::into_raw(Box::new(ours));
        match ffi::sqlite3_vfs_register(ours, 0) {
            ffi::SQLITE_OK => Ok(()),
            rc => Err(format!(
                "SQLite refused the temporary-file VFS (error {rc})"
            )),
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    /// A connection through the VFS with temporary files on disk (`temp_store=FILE`) and a small
    /// page cache, so a sort of a few thousand rows spills.
    fn connection() -> Connection {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let c =
            Connection::open_with_flags_and_vfs(":memory:", flags, vfs_name().unwrap()).unwrap();
        c.execute_batch("PRAGMA temp_store=FILE; PRAGMA cache_size=-64;")
            .unwrap();
        c
    }

    /// 200k distinct rows of ~40 bytes: several MiB of sorter runs and temporary b-tree pages.
    const SORT: &str =
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 200000) \
                        SELECT DISTINCT x, printf('%030d', x * 7) FROM n ORDER BY 2 DESC";

    fn run(c: &Connection, sql: &str) -> rusqlite::Result<u64> {
        let mut stmt = c.prepare(sql)?;
        let mut rows = stmt.raw_query();
        let mut n = 0;
        while rows.next()?.is_some() {
            n += 1;
        }
        Ok(n)
    }

    #[test]
    fn a_sort_is_charged_to_the_current_account_and_given_back_on_close() {
        let c = connection();
        let account = TempAccount::new(DEFAULT_MAX_TEMP_BYTES);
        let mut stmt = c.prepare(SORT).unwrap();
        let peak = charged_to(&account, || {
            let mut rows = stmt.raw_query();
            let mut peak = 0;
            let mut n = 0;
            while rows.next().unwrap().is_some() {
                peak = peak.max(account.used());
                n += 1;
            }
            assert_eq!(n, 200_000);
            peak
        });
        assert!(peak > 2 * MIB, "the sort spilled only {peak} bytes");
        assert!(!account.take_refused());
        // The sorter's files live until the statement is finalized, outside the charged call.
        drop(stmt);
        assert_eq!(account.used(), 0);
    }

    #[test]
    fn a_write_past_the_cap_is_refused_as_a_full_disk() {
        let c = connection();
        let account = TempAccount::new(MIB);
        let err = charged_to(&account, || run(&c, SORT)).unwrap_err();
        assert_eq!(err.sqlite_error_code(), Some(rusqlite::ErrorCode::DiskFull));
        assert!(account.take_refused());
        assert!(!account.take_refused(), "the refusal is taken once");
        assert!(account.used() <= MIB);
        // A new query under a larger cap on the same account runs to its end.
        account.start_query(DEFAULT_MAX_TEMP_BYTES);
        assert_eq!(charged_to(&account, || run(&c, SORT)).unwrap(), 200_000);
        assert_eq!(account.used(), 0);
    }

    #[test]
    fn files_are_charged_to_the_account_that_opened_them_on_any_thread() {
        // Two connections on two threads, each with its own account: neither sees the other's
        // bytes, and the process's counter sees both.
        let handles: Vec<_> = [MIB / 2, DEFAULT_MAX_TEMP_BYTES]
            .into_iter()
            .map(|cap| {
                std::thread::spawn(move || {
                    let c = connection();
                    let account = TempAccount::new(cap);
                    let outcome = charged_to(&account, || run(&c, SORT));
                    (outcome.is_ok(), account.take_refused(), account.used())
                })
            })
            .collect();
        let outcomes: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(outcomes, vec![(false, true, 0), (true, false, 0)]);
    }

    #[test]
    fn a_file_opened_with_no_account_is_capped_at_the_default() {
        let c = connection();
        assert!(current().is_none());
        assert_eq!(run(&c, SORT).unwrap(), 200_000);
        let (_, peak) = temp_usage();
        assert!(peak > 0);
    }

    #[test]
    fn a_database_file_is_the_default_vfs_own_object() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sqlite");
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
        let c = Connection::open_with_flags_and_vfs(&path, flags, vfs_name().unwrap()).unwrap();
        c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1), (2);")
            .unwrap();
        let account = TempAccount::new(0);
        // Writing the database itself (and its journal) charges nothing, even to a cap of 0.
        charged_to(&account, || c.execute("INSERT INTO t VALUES (3)", [])).unwrap();
        assert_eq!(account.used(), 0);
        assert_eq!(run(&c, "SELECT * FROM t").unwrap(), 3);
    }

    #[test]
    fn sizes_read_as_mib() {
        assert_eq!(describe_bytes(8 * MIB), "8 MiB");
        assert_eq!(describe_bytes(DEFAULT_MAX_TEMP_BYTES), "1024 MiB");
        assert_eq!(describe_bytes(1000), "1000 bytes");
    }

    #[test]
    fn the_temp_dir_is_one_sqlite_would_use() {
        let dir = temp_dir().expect("a writable temporary directory");
        assert!(dir.is_dir());
    }
}
