//! SQLite's process-wide hard heap limit: a default every process gets when its first connection
//! opens, unless a caller chose one first (`set_heap_limit`).

use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::ffi;

/// Whether someone chose the heap limit: then the default is never installed over it.
static HEAP_LIMIT_CHOSEN: AtomicBool = AtomicBool::new(false);

/// Process-wide hard heap limit (`sqlite3_hard_heap_limit64`); returns the previous value.
pub fn set_heap_limit(bytes: i64) -> i64 {
    HEAP_LIMIT_CHOSEN.store(true, Ordering::SeqCst);
    unsafe { ffi::sqlite3_hard_heap_limit64(bytes) }
}

/// Default heap limit for the whole process, set when the first connection opens.
pub const DEFAULT_HEAP_LIMIT: i64 = 2 * 1024 * 1024 * 1024;

/// Install DEFAULT_HEAP_LIMIT, once per process, unless a caller chose a limit first.
pub(super) fn install_default() {
    static HEAP_LIMIT: std::sync::Once = std::sync::Once::new();
    HEAP_LIMIT.call_once(|| {
        if !HEAP_LIMIT_CHOSEN.load(Ordering::SeqCst) {
            unsafe { ffi::sqlite3_hard_heap_limit64(DEFAULT_HEAP_LIMIT) };
        }
    });
}
