//! The grading memory budget, and the temporary disk a set or subset digest spills to past it.
//!
//! One process-wide setting (like SQLite's heap limit): how many bytes of row keys one digest may
//! hold in memory, and the directory its spill files go to. A spill file is anonymous (created
//! unlinked, `O_TMPFILE` where the file system has it): the kernel frees it when the digest is
//! dropped, when a grade is cancelled or times out, and when the process dies, so no exit path
//! leaves one behind. The bytes all spill files hold now, and the most they held at once, are
//! counted for the bench.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The default memory budget of one digest's row keys.
pub const DEFAULT_MEMORY_BYTES: u64 = 32 * 1024 * 1024;
/// The smallest budget accepted: a few thousand keys (tests force spills with it).
pub const MIN_MEMORY_BYTES: u64 = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GradeMemory {
    /// Bytes of row keys one digest holds in memory before it spills.
    pub bytes: u64,
    /// Where spill files go; None: the system's temporary directory.
    pub tmp_dir: Option<PathBuf>,
}

impl Default for GradeMemory {
    fn default() -> Self {
        GradeMemory {
            bytes: DEFAULT_MEMORY_BYTES,
            tmp_dir: None,
        }
    }
}

static SETTING: RwLock<Option<Arc<GradeMemory>>> = RwLock::new(None);

/// The process's grading memory setting.
pub fn grade_memory() -> Arc<GradeMemory> {
    if let Some(m) = SETTING.read().unwrap().as_ref() {
        return Arc::clone(m);
    }
    static DEFAULT: std::sync::OnceLock<Arc<GradeMemory>> = std::sync::OnceLock::new();
    Arc::clone(DEFAULT.get_or_init(|| Arc::new(GradeMemory::default())))
}

/// Set the process's grading memory (digests started afterwards use it); returns the previous.
pub fn set_grade_memory(memory: GradeMemory) -> Result<Arc<GradeMemory>, String> {
    if memory.bytes < MIN_MEMORY_BYTES {
        return Err(format!(
            "the grading memory budget must be at least {} KiB, not {} bytes",
            MIN_MEMORY_BYTES / 1024,
            memory.bytes
        ));
    }
    if let Some(dir) = &memory.tmp_dir {
        if !dir.is_dir() {
            return Err(format!(
                "the temporary directory {} does not exist or is not a directory",
                dir.display()
            ));
        }
    }
    let previous = grade_memory();
    *SETTING.write().unwrap() = Some(Arc::new(memory));
    Ok(previous)
}

static SPILLED_NOW: AtomicU64 = AtomicU64::new(0);
static SPILLED_PEAK: AtomicU64 = AtomicU64::new(0);

/// (bytes all live spill files hold now, the most they held at once since the last reset).
pub fn spill_usage() -> (u64, u64) {
    (
        SPILLED_NOW.load(Ordering::Relaxed),
        SPILLED_PEAK.load(Ordering::Relaxed),
    )
}

/// Start the peak over from what is held now.
pub fn reset_spill_peak() {
    SPILLED_PEAK.store(SPILLED_NOW.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Why spilling failed: the message names the directory and what to do.
pub type SpillError = String;

fn spill_error(dir: &std::path::Path, e: std::io::Error) -> SpillError {
    let what = if e.raw_os_error() == Some(libc::ENOSPC) {
        "the disk is full".to_string()
    } else {
        e.to_string()
    };
    format!(
        "a set or subset digest past its memory budget could not spill to {} ({what}): free space \
         there, point the temporary directory elsewhere (--tmp-dir), or raise --grade-memory-mb",
        dir.display()
    )
}

/// An anonymous, append-only file of 16-byte keys, read back by ranges.
#[derive(Debug)]
pub struct SpillFile {
    file: File,
    dir: PathBuf,
    /// Keys written so far (the file's length / 16).
    len: u64,
}

/// Keys are written and read in blocks of this many bytes.
const IO_BLOCK: usize = 1 << 16;

impl SpillFile {
    pub fn create(memory: &GradeMemory) -> Result<Self, SpillError> {
        let dir = memory.tmp_dir.clone().unwrap_or_else(std::env::temp_dir);
        let file = tempfile::tempfile_in(&dir).map_err(|e| spill_error(&dir, e))?;
        Ok(SpillFile { file, dir, len: 0 })
    }

    /// Append `keys`; returns the index of the first one.
    pub fn append(&mut self, keys: &[u128]) -> Result<u64, SpillError> {
        let start = self.len;
        for chunk in keys.chunks(IO_BLOCK / 16) {
            self.file
                .write_all_at(key_bytes(chunk), self.len * 16)
                .map_err(|e| spill_error(&self.dir, e))?;
            self.len += chunk.len() as u64;
            add_spilled(16 * chunk.len() as u64);
        }
        Ok(start)
    }

    /// Append the keys at `[start, start + count)` to `out`.
    pub fn read_into(&self, start: u64, count: u64, out: &mut Vec<u128>) -> Result<(), SpillError> {
        let from = out.len();
        out.resize(from + count as usize, 0);
        for (i, chunk) in out[from..].chunks_mut(IO_BLOCK / 16).enumerate() {
            let at = start + (i * IO_BLOCK / 16) as u64;
            self.file
                .read_exact_at(key_bytes_mut(chunk), at * 16)
                .map_err(|e| spill_error(&self.dir, e))?;
        }
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        SPILLED_NOW.fetch_sub(16 * self.len, Ordering::Relaxed);
    }
}

// A spill file holds keys in the machine's own byte order (it never outlives the process), so
// they are written and read as the bytes they are in memory: no conversion per key, which cost
// as much as de-duplicating them. `u128` has no padding and every bit pattern is a valid value.

fn key_bytes(keys: &[u128]) -> &[u8] {
    // SAFETY: the slice's memory is `16 * len` initialised bytes, and u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(keys.as_ptr().cast::<u8>(), std::mem::size_of_val(keys)) }
}

fn key_bytes_mut(keys: &mut [u128]) -> &mut [u8] {
    // SAFETY: as key_bytes; any bytes written make valid u128 values.
    unsafe {
        std::slice::from_raw_parts_mut(keys.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(keys))
    }
}

fn add_spilled(bytes: u64) {
    let now = SPILLED_NOW.fetch_add(bytes, Ordering::Relaxed) + bytes;
    SPILLED_PEAK.fetch_max(now, Ordering::Relaxed);
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn a_spill_file_reads_back_what_it_wrote_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let memory = GradeMemory {
            bytes: MIN_MEMORY_BYTES,
            tmp_dir: Some(dir.path().to_path_buf()),
        };
        let keys: Vec<u128> = (0..10_000u128).map(|i| i * 0x1234_5678_9abc_def1).collect();
        let mut f = SpillFile::create(&memory).unwrap();
        assert_eq!(f.append(&keys[..7000]).unwrap(), 0);
        assert_eq!(f.append(&keys[7000..]).unwrap(), 7000);
        assert_eq!(f.len(), 10_000);
        let (now, peak) = spill_usage();
        assert!(now >= 160_000 && peak >= now);
        let mut back = Vec::new();
        f.read_into(6990, 20, &mut back).unwrap();
        assert_eq!(back, keys[6990..7010]);
        back.clear();
        f.read_into(0, 10_000, &mut back).unwrap();
        assert_eq!(back, keys);
        // Anonymous: nothing in the directory while it lives, nothing after.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        drop(f);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_spill_into_a_missing_directory_says_where_and_what_to_do() {
        let memory = GradeMemory {
            bytes: MIN_MEMORY_BYTES,
            tmp_dir: Some(PathBuf::from("/nonexistent/t2sql-spill")),
        };
        let e = SpillFile::create(&memory).unwrap_err();
        assert!(
            e.contains("/nonexistent/t2sql-spill") && e.contains("--tmp-dir"),
            "{e}"
        );
        assert!(set_grade_memory(memory).is_err());
        assert!(set_grade_memory(GradeMemory {
            bytes: 100,
            tmp_dir: None
        })
        .is_err());
    }
}
