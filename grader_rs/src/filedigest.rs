//! A file's content digest: XXH3-128 of its bytes, streamed. What the equivalence check keys its
//! caches by (a database's invariants and suite hold for this content, never for a name, size or
//! mtime that another file can share).

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};

use xxhash_rust::xxh3::Xxh3;

use crate::error::{GradeError, Result};

/// Bytes read at a time.
const CHUNK: usize = 1 << 20;

/// The XXH3-128 of the regular file at `path`, as 32 hex digits. A FIFO or a device is refused
/// unopened (a read would block or never end); `cancel` stops the read between chunks.
pub fn file_digest(path: &str, cancel: Option<&AtomicBool>) -> Result<String> {
    let unreadable = |e: std::io::Error| GradeError::Database(format!("cannot read {path}: {e}"));
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if !meta.is_file() {
        return Err(GradeError::Database(format!(
            "{path} is not a regular file; only a file's content has a digest"
        )));
    }
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(GradeError::Cancelled);
        }
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(unreadable(e)),
        };
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:032x}", hasher.digest128()))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn same_content_same_digest_and_any_byte_changes_it() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        let mut bytes = vec![7u8; 3 * CHUNK + 5];
        std::fs::write(&a, &bytes).unwrap();
        std::fs::write(&b, &bytes).unwrap();
        let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
        assert_eq!(file_digest(a, None).unwrap(), file_digest(b, None).unwrap());
        assert_eq!(
            file_digest(a, None).unwrap(),
            format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&bytes))
        );
        bytes[2 * CHUNK + 1] = 8;
        std::fs::write(b, &bytes).unwrap();
        assert_ne!(file_digest(a, None).unwrap(), file_digest(b, None).unwrap());
        let dir_path = dir.path().to_str().unwrap();
        assert!(matches!(
            file_digest(dir_path, None),
            Err(GradeError::Database(_))
        ));
        let cancelled = AtomicBool::new(true);
        assert_eq!(file_digest(a, Some(&cancelled)), Err(GradeError::Cancelled));
    }
}
