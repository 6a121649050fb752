//! `instr(X, Y)` and `replace(X, Y, Z)` in linear time: SQLite compares the needle at every
//! position of the haystack (quadratic: 6 s for 1 MiB, half an hour at the 16 MiB value limit);
//! here `memchr::memmem` (two-way, linear) finds it. Results as SQLite's: `instr` counts
//! characters of text (a position is a byte that does not continue a UTF-8 character, or the
//! first byte) and bytes of two blobs; `replace` returns TEXT, leaves the input alone for an empty
//! pattern (or one whose first byte is NUL), and refuses a result past the LENGTH limit.

use std::ffi::c_int;

use memchr::memmem;
use rusqlite::ffi;

use super::{guarded, is_continuation, text_of};

pub(super) unsafe extern "C" fn instr(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    guarded(ctx, argv, |call| {
        let (kind_h, kind_n) = (call.kind(0), call.kind(1));
        if kind_h == ffi::SQLITE_NULL || kind_n == ffi::SQLITE_NULL {
            return;
        }
        let (len_h, len_n) = (call.bytes(0), call.bytes(1));
        if len_n == 0 {
            return call.result_int(1);
        }
        let blob = ffi::SQLITE_BLOB;
        let found = if kind_h == blob && kind_n == blob {
            let h = unsafe { blob_of(call.arg(0), len_h) };
            let n = unsafe { blob_of(call.arg(1), len_n) };
            match (h, n) {
                (Some(h), Some(n)) => position(h, n, false),
                _ => return call.result_nomem(),
            }
        } else if kind_h != blob && kind_n != blob {
            match (call.text(0), call.text(1)) {
                (Some(h), Some(n)) => position(h, n, true),
                _ => return call.result_nomem(),
            }
        } else {
            // One blob, one text: both read as text from copies, so the arguments keep their type.
            unsafe {
                let (h, n) = (
                    ffi::sqlite3_value_dup(call.arg(0)),
                    ffi::sqlite3_value_dup(call.arg(1)),
                );
                let found = match (text_of(h), text_of(n)) {
                    (Some(h), Some(n)) => Some(position(h, n, true)),
                    _ => None,
                };
                ffi::sqlite3_value_free(h);
                ffi::sqlite3_value_free(n);
                match found {
                    Some(f) => f,
                    None => return call.result_nomem(),
                }
            }
        };
        call.result_int(found);
    })
}

/// The blob of `v`, which has `len` bytes: None when SQLite could not give it (an empty blob
/// has no pointer and is empty).
unsafe fn blob_of<'a>(v: *mut ffi::sqlite3_value, len: usize) -> Option<&'a [u8]> {
    unsafe {
        let p = ffi::sqlite3_value_blob(v) as *const u8;
        match (p.is_null(), len) {
            (_, 0) => Some(&[]),
            (true, _) => None,
            (false, _) => Some(std::slice::from_raw_parts(p, len)),
        }
    }
}

/// SQLite's instr result: 1 + the positions before the first match (0 for none). In text SQLite
/// tries the first byte and each byte that does not continue a character, so a needle that starts
/// with a continuation byte can only match at the very start.
fn position(haystack: &[u8], needle: &[u8], text: bool) -> c_int {
    if needle.len() > haystack.len() {
        return 0;
    }
    if text && is_continuation(needle[0]) {
        return haystack.starts_with(needle) as c_int;
    }
    let Some(at) = memmem::find(haystack, needle) else {
        return 0;
    };
    if !text || at == 0 {
        return at as c_int + 1;
    }
    let starts = haystack[1..at]
        .iter()
        .filter(|&&b| !is_continuation(b))
        .count();
    2 + starts as c_int
}

pub(super) unsafe extern "C" fn replace(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    guarded(ctx, argv, |call| {
        let Some(input) = call.text(0) else {
            return;
        };
        let Some(pattern) = call.text(1) else {
            return;
        };
        if pattern.first().copied().unwrap_or(0) == 0 {
            return call.result_text(input);
        }
        let Some(replacement) = call.text(2) else {
            return;
        };
        let limit = call.limit(ffi::SQLITE_LIMIT_LENGTH);
        // SQLite allocates the input's size plus its terminator first, under the LENGTH limit.
        if input.len() + 1 > limit {
            return call.result_toobig();
        }
        let grows = replacement.len().saturating_sub(pattern.len());
        let finder = memmem::Finder::new(pattern);
        let mut out = Vec::with_capacity(input.len());
        let (mut from, mut size) = (0usize, input.len());
        while let Some(found) = finder.find(&input[from..]) {
            size += grows;
            if size > limit {
                return call.result_toobig();
            }
            out.extend_from_slice(&input[from..from + found]);
            out.extend_from_slice(replacement);
            from += found + pattern.len();
        }
        out.extend_from_slice(&input[from..]);
        call.result_text(&out);
    })
}
