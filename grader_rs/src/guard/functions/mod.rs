//! SQLite's built-in functions that could outrun the deadline inside one VM step, replaced on every
//! guarded connection (the same name and argument count override the built-in). The deadline is a
//! progress handler between VM steps; one call of SQLite's `instr()` over 16 MiB ran for half an
//! hour inside one step. Each replacement gives the built-in's result, errors and NULLs exactly
//! (tested against it), and either runs in linear time (`search`: `instr`, `replace` by
//! `memchr::memmem`), or asks the call's deadline and cancel token as it works (`pattern`: LIKE and
//! GLOB, `charset`: `trim`/`ltrim`/`rtrim` and `unhex` with a character set), stopping the query
//! as a timeout or a cancel, or bounds the call's work and hands it to SQLite's own built-in on a
//! connection of the core's (`json`: the JSON functions whose cost grows faster than their input;
//! `builtin`: that connection). Bound with SQLite's C API, like the digest aggregate.

use std::ffi::{c_int, c_void, CString};
use std::sync::Arc;

use rusqlite::{ffi, Connection};

use super::deadline::RunControl;

mod builtin;
mod charset;
mod json;
mod pattern;
mod search;
#[cfg(test)]
mod test;

/// How much work (bytes or characters looked at) a replacement does between two looks at the
/// deadline: tens of microseconds.
const TICK_UNITS: u64 = 1 << 16;

/// What a replacement gets with each call: the connection's deadline and cancel token, its name
/// (the built-in a JSON replacement hands a bounded call to) and its variant (`trim`'s sides,
/// the bound a JSON function's work gets).
struct Data {
    control: Arc<RunControl>,
    name: &'static str,
    flags: u8,
}

type XFunc = unsafe extern "C" fn(*mut ffi::sqlite3_context, c_int, *mut *mut ffi::sqlite3_value);

/// One replaced built-in: its name and argument count (-1: any), implementation, variant, and
/// the subtype flags SQLite gives the built-in (JSON functions read and set the subtype that
/// marks JSON text).
struct Replacement {
    name: &'static str,
    args: c_int,
    func: XFunc,
    flags: u8,
    subtypes: c_int,
}

const fn plain(name: &'static str, args: c_int, func: XFunc, flags: u8) -> Replacement {
    Replacement {
        name,
        args,
        func,
        flags,
        subtypes: 0,
    }
}

/// A JSON function whose one call could outrun the deadline: bounded by `json::bounded` under
/// `bound`, then SQLite's own. `reads`/`sets`: the built-in reads / sets subtypes. Any argument
/// count, as the built-in, but json_patch's two.
const fn json_fn(name: &'static str, bound: u8, reads: bool, sets: bool) -> Replacement {
    let read = if reads { ffi::SQLITE_SUBTYPE } else { 0 };
    let set = if sets { ffi::SQLITE_RESULT_SUBTYPE } else { 0 };
    Replacement {
        name,
        args: if bound == json::PATCH { 2 } else { -1 },
        func: json::bounded,
        flags: bound,
        subtypes: read | set,
    }
}

/// The one-argument forms of trim and unhex are linear already and stay SQLite's; so do the JSON
/// functions whose one call is linear in its arguments (json.rs says which and why).
const REPLACED: [Replacement; 29] = [
    plain("instr", 2, search::instr, 0),
    plain("replace", 3, search::replace, 0),
    plain("like", 2, pattern::like, 0),
    plain("like", 3, pattern::like, 0),
    plain("glob", 2, pattern::glob, 0),
    plain("trim", 2, charset::trim, 3),
    plain("ltrim", 2, charset::trim, 1),
    plain("rtrim", 2, charset::trim, 2),
    plain("unhex", 2, charset::unhex, 0),
    json_fn("json_extract", json::PATHS, false, true),
    json_fn("jsonb_extract", json::PATHS, false, false),
    json_fn("json_remove", json::PATHS, false, true),
    json_fn("jsonb_remove", json::PATHS, false, false),
    json_fn("json_set", json::EDITS, true, true),
    json_fn("jsonb_set", json::EDITS, true, false),
    json_fn("json_insert", json::EDITS, true, true),
    json_fn("jsonb_insert", json::EDITS, true, false),
    json_fn("json_replace", json::EDITS, true, true),
    json_fn("jsonb_replace", json::EDITS, true, false),
    json_fn("json_array_insert", json::EDITS, true, true),
    json_fn("jsonb_array_insert", json::EDITS, true, false),
    json_fn("json_array", json::BUILDS, true, true),
    json_fn("jsonb_array", json::BUILDS, true, true),
    json_fn("json_object", json::BUILDS, true, true),
    json_fn("jsonb_object", json::BUILDS, true, true),
    json_fn("json_patch", json::PATCH, false, true),
    json_fn("jsonb_patch", json::PATCH, false, false),
    plain("json_pretty", 1, json::pretty, 0),
    plain("json_pretty", 2, json::pretty, 0),
];

/// The built-ins this module replaces, as (name, argument count; -1 for any).
pub fn replaced() -> impl Iterator<Item = (&'static str, c_int)> {
    REPLACED.iter().map(|r| (r.name, r.args))
}

unsafe extern "C" fn drop_data(p: *mut c_void) {
    unsafe { drop(Box::from_raw(p as *mut Data)) }
}

/// Register every replacement on `conn`, each asking `control` for the call's deadline. Innocuous
/// and deterministic like the built-ins, so views and CHECK constraints that use them still work
/// with the schema untrusted.
pub(super) fn register(conn: &Connection, control: &Arc<RunControl>) -> rusqlite::Result<()> {
    for r in &REPLACED {
        let data = Box::into_raw(Box::new(Data {
            control: Arc::clone(control),
            name: r.name,
            flags: r.flags,
        }));
        let cname = CString::new(r.name).expect("no NUL in a function name");
        // SAFETY: `data` is freed by `drop_data`, which SQLite calls when the function is replaced
        // or the connection closes, and also when registering fails.
        let rc = unsafe {
            ffi::sqlite3_create_function_v2(
                conn.handle(),
                cname.as_ptr(),
                r.args,
                ffi::SQLITE_UTF8 | ffi::SQLITE_DETERMINISTIC | ffi::SQLITE_INNOCUOUS | r.subtypes,
                data as *mut c_void,
                Some(r.func),
                None,
                None,
                Some(drop_data),
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(rusqlite::Error::SqliteFailure(
                ffi::Error::new(rc),
                Some(format!("cannot register {}()", r.name)),
            ));
        }
    }
    Ok(())
}

/// The deadline or the cancel token stopped a replacement.
struct Stopped;

/// Counts a replacement's work and asks the deadline every TICK_UNITS of it.
struct Ticker<'a> {
    control: &'a RunControl,
    left: u64,
}

impl<'a> Ticker<'a> {
    fn new(control: &'a RunControl) -> Self {
        Ticker {
            control,
            left: TICK_UNITS,
        }
    }

    #[inline]
    fn spend(&mut self, units: u64) -> Result<(), Stopped> {
        if units < self.left {
            self.left -= units;
            return Ok(());
        }
        self.left = TICK_UNITS;
        if self.control.should_stop() {
            Err(Stopped)
        } else {
            Ok(())
        }
    }
}

/// One call's context and arguments, read the way SQLite's own functions read them.
struct Call {
    ctx: *mut ffi::sqlite3_context,
    args: *mut *mut ffi::sqlite3_value,
}

impl Call {
    fn arg(&self, i: usize) -> *mut ffi::sqlite3_value {
        // SAFETY: SQLite passes as many arguments as the function was registered with; callers
        // index within that count.
        unsafe { *self.args.add(i) }
    }

    fn data(&self) -> &Data {
        // SAFETY: the user data is the `Data` registered with the function, alive while it is.
        unsafe { &*(ffi::sqlite3_user_data(self.ctx) as *const Data) }
    }

    /// The call's arguments.
    fn args(&self, argc: c_int) -> &[*mut ffi::sqlite3_value] {
        // SAFETY: SQLite passes `argc` arguments.
        unsafe { std::slice::from_raw_parts(self.args, argc.max(0) as usize) }
    }

    /// Whether the armed call's deadline has passed or its cancel token fired.
    fn should_stop(&self) -> bool {
        self.data().control.should_stop()
    }

    fn kind(&self, i: usize) -> c_int {
        unsafe { ffi::sqlite3_value_type(self.arg(i)) }
    }

    fn bytes(&self, i: usize) -> usize {
        unsafe { ffi::sqlite3_value_bytes(self.arg(i)) as usize }
    }

    /// `sqlite3_value_text` (NULL for a NULL or out of memory), as bytes: its length is
    /// `sqlite3_value_bytes` taken after it, as SQLite's functions take it.
    fn text(&self, i: usize) -> Option<&[u8]> {
        unsafe { text_of(self.arg(i)) }
    }

    /// A run-time limit of the call's connection.
    fn limit(&self, which: c_int) -> usize {
        unsafe {
            let db = ffi::sqlite3_context_db_handle(self.ctx);
            ffi::sqlite3_limit(db, which, -1).max(0) as usize
        }
    }

    fn result_int(&self, v: c_int) {
        unsafe { ffi::sqlite3_result_int(self.ctx, v) }
    }

    /// A TEXT result (SQLite copies it; past the LENGTH limit it is "string or blob too big").
    fn result_text(&self, s: &[u8]) {
        unsafe {
            ffi::sqlite3_result_text64(
                self.ctx,
                s.as_ptr().cast(),
                s.len() as u64,
                ffi::SQLITE_TRANSIENT(),
                ffi::SQLITE_UTF8 as u8,
            )
        }
    }

    /// A BLOB result (an empty one is an empty BLOB, not NULL: the pointer is never null).
    fn result_blob(&self, b: &[u8]) {
        unsafe {
            ffi::sqlite3_result_blob64(
                self.ctx,
                b.as_ptr().cast(),
                b.len() as u64,
                ffi::SQLITE_TRANSIENT(),
            )
        }
    }

    fn result_error(&self, message: &std::ffi::CStr) {
        unsafe { ffi::sqlite3_result_error(self.ctx, message.as_ptr(), -1) }
    }

    /// A value from another statement as the result (SQLite copies it, subtype included; past
    /// the LENGTH limit it is "string or blob too big").
    fn result_value(&self, v: *mut ffi::sqlite3_value) {
        unsafe { ffi::sqlite3_result_value(self.ctx, v) }
    }

    fn result_error_code(&self, code: c_int) {
        unsafe { ffi::sqlite3_result_error_code(self.ctx, code) }
    }

    fn result_toobig(&self) {
        unsafe { ffi::sqlite3_result_error_toobig(self.ctx) }
    }

    fn result_nomem(&self) {
        unsafe { ffi::sqlite3_result_error_nomem(self.ctx) }
    }

    /// Stop the statement: the connection's classification then names the timeout or the cancel
    /// that `should_stop` recorded.
    fn result_stopped(&self) {
        unsafe { ffi::sqlite3_result_error_code(self.ctx, ffi::SQLITE_INTERRUPT) }
    }
}

/// `sqlite3_value_text` of `v` with its length.
///
/// # Safety
/// `v` must be a valid protected value of the current call.
unsafe fn text_of<'a>(v: *mut ffi::sqlite3_value) -> Option<&'a [u8]> {
    unsafe {
        let p = ffi::sqlite3_value_text(v);
        if p.is_null() {
            return None;
        }
        let n = ffi::sqlite3_value_bytes(v) as usize;
        Some(std::slice::from_raw_parts(p, n))
    }
}

/// Text as a C function sees it: up to its first NUL byte.
fn c_string(s: &[u8]) -> &[u8] {
    match memchr::memchr(0, s) {
        Some(end) => &s[..end],
        None => s,
    }
}

/// Run a replacement's body; a panic (a bug) becomes an SQL error, never an unwind into SQLite.
fn guarded(
    ctx: *mut ffi::sqlite3_context,
    args: *mut *mut ffi::sqlite3_value,
    body: impl FnOnce(&Call),
) {
    let call = Call { ctx, args };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&call))).is_err() {
        call.result_error(c"t2sql: internal error in a built-in function replacement");
    }
}

/// SQLite's `sqlite3Utf8Trans1`: the payload bits of a UTF-8 lead byte 0xC0..=0xFF.
fn lead_bits(lead: u8) -> u32 {
    match lead {
        0xC0..=0xDF => (lead & 0x1F) as u32,
        0xE0..=0xEF => (lead & 0x0F) as u32,
        0xF0..=0xF7 => (lead & 0x07) as u32,
        0xF8..=0xFB => (lead & 0x03) as u32,
        0xFC..=0xFD => (lead & 0x01) as u32,
        _ => 0,
    }
}

/// The byte at `i` of a text SQLite reads as NUL-terminated: 0 at and past its end.
#[inline]
fn at(s: &[u8], i: usize) -> u8 {
    s.get(i).copied().unwrap_or(0)
}

#[inline]
fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// SQLite's `sqlite3Utf8Read`: the character at `*i`, moving past it. A lead byte takes every
/// continuation byte that follows (however many); an invalid result reads as U+FFFD; the end
/// reads as 0 (and moves one past it, as SQLite's pointer does).
#[inline]
fn utf8_read(s: &[u8], i: &mut usize) -> u32 {
    let lead = at(s, *i);
    *i += 1;
    if lead < 0xC0 {
        return lead as u32;
    }
    let mut c = lead_bits(lead);
    while is_continuation(at(s, *i)) {
        c = (c << 6).wrapping_add((at(s, *i) & 0x3F) as u32);
        *i += 1;
    }
    if c < 0x80 || (c & 0xFFFF_F800) == 0xD800 {
        0xFFFD
    } else {
        c
    }
}

/// SQLite's `SQLITE_SKIP_UTF8`: past one character (a lead byte and its continuation bytes).
#[inline]
fn skip_utf8(s: &[u8], i: &mut usize) {
    let lead = at(s, *i);
    *i += 1;
    if lead >= 0xC0 {
        while is_continuation(at(s, *i)) {
            *i += 1;
        }
    }
}
