//! `trim`/`ltrim`/`rtrim(X, Y)` and `unhex(X, Y)`: functions that take a set of characters Y. SQLite
//! looks through all of Y for each character of X (quadratic: 10 s for 64 KiB each). Here a table
//! answers for single bytes at once, which is every set of ASCII characters; a set with longer
//! characters is looked through in SQLite's order, with the deadline asked as it goes.
//!
//! SQLite's rules, kept: Y is read up to its first NUL and split with `SQLITE_SKIP_UTF8` (a lead
//! byte and every continuation byte after it); `trim` strips, from each side asked for, the first
//! character of Y, in Y's order, that the remaining text starts (ends) with, byte for byte, and
//! returns TEXT; `unhex` lets characters of Y (compared as `sqlite3Utf8Read` reads them, all of
//! Y's bytes) stand between pairs of hex digits, returns a BLOB, and NULL for anything else.

use std::ffi::c_int;

use rusqlite::ffi;

use super::{at, c_string, guarded, skip_utf8, utf8_read, Stopped, Ticker};

/// No character of the set is this byte.
const NONE: u32 = u32::MAX;

/// The set of characters of `trim`, in SQLite's order.
struct TrimSet<'a> {
    set: &'a [u8],
    /// For each byte, the index of the first one-byte character of the set that is it.
    single: [u32; 256],
    /// Whether the set has characters of more than one byte.
    wide: bool,
}

impl<'a> TrimSet<'a> {
    fn new(set: &'a [u8]) -> Self {
        let mut single = [NONE; 256];
        let mut wide = false;
        let (mut i, mut index) = (0usize, 0u32);
        while i < set.len() {
            let start = i;
            skip_utf8(set, &mut i);
            if i - start == 1 {
                let b = set[start] as usize;
                single[b] = single[b].min(index);
            } else {
                wide = true;
            }
            index += 1;
        }
        TrimSet { set, single, wide }
    }

    /// Bytes to strip from the front (`front`) or the back of `text`: the first character of the
    /// set, in its order, that `text` starts (ends) with; None when none does.
    fn strip(
        &self,
        text: &[u8],
        front: bool,
        ticker: &mut Ticker<'_>,
    ) -> Result<Option<usize>, Stopped> {
        let edge = if front { text[0] } else { text[text.len() - 1] };
        let first_single = self.single[edge as usize];
        if !self.wide {
            return Ok((first_single != NONE).then_some(1));
        }
        // A longer character wins if it comes before the first single byte that matches.
        let (mut i, mut index) = (0usize, 0u32);
        while i < self.set.len() && index < first_single {
            let start = i;
            skip_utf8(self.set, &mut i);
            let c = &self.set[start..i];
            ticker.spend(c.len() as u64)?;
            let hit = if front {
                text.starts_with(c)
            } else {
                text.ends_with(c)
            };
            if c.len() > 1 && hit {
                return Ok(Some(c.len()));
            }
            index += 1;
        }
        Ok((first_single != NONE).then_some(1))
    }
}

/// `trim(X, Y)`, `ltrim(X, Y)`, `rtrim(X, Y)`: the user data's flags say which sides.
pub(super) unsafe extern "C" fn trim(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    guarded(ctx, argv, |call| {
        if call.kind(0) == ffi::SQLITE_NULL {
            return;
        }
        let Some(text) = call.text(0) else {
            return;
        };
        let Some(set) = call.text(1) else {
            return;
        };
        let set = TrimSet::new(c_string(set));
        let flags = call.data().flags;
        let mut ticker = Ticker::new(&call.data().control);
        let (mut start, mut end) = (0usize, text.len());
        for front in [true, false] {
            if flags & if front { 1 } else { 2 } == 0 || set.set.is_empty() {
                continue;
            }
            while start < end {
                match set.strip(&text[start..end], front, &mut ticker) {
                    Ok(Some(n)) if front => start += n,
                    Ok(Some(n)) => end -= n,
                    Ok(None) => break,
                    Err(Stopped) => return call.result_stopped(),
                }
            }
        }
        call.result_text(&text[start..end]);
    })
}

/// `unhex(X, Y)`.
pub(super) unsafe extern "C" fn unhex(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    guarded(ctx, argv, |call| {
        let hex = call.text(0);
        let pass = call.text(1);
        let (Some(hex), Some(pass)) = (hex, pass) else {
            return;
        };
        let hex = c_string(hex);
        // ASCII characters of the set, by code point; the rest are looked for in the set itself.
        let mut ascii = [false; 128];
        let mut i = 0;
        while i < pass.len() {
            let c = utf8_read(pass, &mut i);
            if c < 0x80 {
                ascii[c as usize] = true;
            }
        }
        let mut ticker = Ticker::new(&call.data().control);
        let mut contains = |ch: u32| -> Result<bool, Stopped> {
            if ch < 0x80 {
                return Ok(ascii[ch as usize]);
            }
            let mut i = 0;
            while i < pass.len() {
                ticker.spend(1)?;
                if utf8_read(pass, &mut i) == ch {
                    return Ok(true);
                }
            }
            Ok(false)
        };
        let mut out = Vec::with_capacity(hex.len() / 2 + 1);
        let mut k = 0usize;
        loop {
            let mut c = at(hex, k);
            if c == 0 {
                break;
            }
            while !c.is_ascii_hexdigit() {
                let ch = utf8_read(hex, &mut k);
                match contains(ch) {
                    Ok(true) => {}
                    Ok(false) => return, // NULL
                    Err(Stopped) => return call.result_stopped(),
                }
                c = at(hex, k);
                if c == 0 {
                    return call.result_blob(&out);
                }
            }
            let d = at(hex, k + 1);
            k += 2;
            if !d.is_ascii_hexdigit() {
                return; // NULL
            }
            out.push(hex_value(c) << 4 | hex_value(d));
        }
        call.result_blob(&out);
    })
}

/// SQLite's `sqlite3HexToInt` for a hex digit.
fn hex_value(h: u8) -> u8 {
    (h + 9 * (1 & (h >> 6))) & 0xF
}
