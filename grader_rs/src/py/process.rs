//! The process-wide settings and counters, in one place: whatever the binding sets for the whole
//! process rather than for one call (the hash secret keying every row hash, SQLite's heap limit,
//! the grading memory and its spill directory) and what the process reads back (SQLite's version,
//! the spill and temporary-disk usage, SQLite's temporary directory). Per-call settings travel in
//! `ToolLimits` and `GradeSpec` instead.

use pyo3::prelude::*;

use super::args::int;
use super::errors::invalid;
use crate::checked::Int;
use crate::digest;
use crate::guard;

#[pyfunction]
pub(crate) fn sqlite_version() -> &'static str {
    rusqlite::version()
}

/// Set the process's grading memory: bytes of row keys one set or subset digest holds before it
/// spills, and the directory its spill files go to (None: the system's); returns the previous
/// (bytes, directory).
#[pyfunction]
#[pyo3(signature = (bytes, tmp_dir = None))]
pub(crate) fn set_grade_memory(
    bytes: Int,
    tmp_dir: Option<std::path::PathBuf>,
) -> PyResult<(u64, Option<std::path::PathBuf>)> {
    let bytes: u64 = int("bytes", &bytes)?;
    let previous = crate::spill::set_grade_memory(crate::spill::GradeMemory { bytes, tmp_dir })
        .map_err(invalid)?;
    Ok((previous.bytes, previous.tmp_dir.clone()))
}

/// The process's grading memory: (bytes, spill directory or None).
#[pyfunction]
pub(crate) fn grade_memory() -> (u64, Option<std::path::PathBuf>) {
    let m = crate::spill::grade_memory();
    (m.bytes, m.tmp_dir.clone())
}

/// (bytes the live spill files hold now, the most they held at once); `reset` starts the peak
/// over from now.
#[pyfunction]
#[pyo3(signature = (*, reset = false))]
pub(crate) fn spill_usage(reset: bool) -> (u64, u64) {
    let usage = crate::spill::spill_usage();
    if reset {
        crate::spill::reset_spill_peak();
    }
    usage
}

/// (bytes the process's SQLite temporary files hold now, the most they held at once); `reset`
/// starts the peak over from now.
#[pyfunction]
#[pyo3(signature = (*, reset = false))]
pub(crate) fn temp_usage(reset: bool) -> (u64, u64) {
    let usage = crate::tempfiles::temp_usage();
    if reset {
        crate::tempfiles::reset_temp_peak();
    }
    usage
}

/// The directory SQLite puts its temporary files in (SQLITE_TMPDIR, TMPDIR, /var/tmp, /usr/tmp,
/// /tmp or ., the first this process may write), or None when none is writable.
#[pyfunction]
pub(crate) fn sqlite_temp_dir() -> Option<std::path::PathBuf> {
    crate::tempfiles::temp_dir()
}

/// Set SQLite's process-wide hard heap limit in bytes (0 = none); returns the previous one.
#[pyfunction]
pub(crate) fn set_heap_limit(bytes: Int) -> PyResult<i64> {
    Ok(guard::set_heap_limit(int("bytes", &bytes)?))
}

/// Key every row hash with this secret from now on (a disk cache shared by processes sets it).
#[pyfunction]
pub(crate) fn set_hash_secret(secret: &[u8]) -> PyResult<()> {
    if secret.len() < 16 {
        return Err(invalid("the hash secret must be at least 16 bytes".into()));
    }
    digest::set_secret(secret);
    Ok(())
}

#[pyfunction]
pub(crate) fn hash_secret_id() -> String {
    format!("{:016x}", digest::secret_id())
}
