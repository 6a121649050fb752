//! SQLite's JSON functions whose one call could outrun the deadline, bounded. Measured on the
//! development VM with a 1 s deadline (docs/grader.md#guarantees): a call that looks up or edits
//! k paths costs k passes over its document (999 paths over 15 MiB: over 30 s); `json_patch`
//! looks each key of the patch up among the target's (two 256 KiB objects: 5 s, quadratic);
//! `json_array`/`json_object` build their whole text before checking its length (999 copies of a
//! 15 MiB value: 1.3 s, stopped by the heap limit, not the value limit); `json_pretty` writes the
//! indentation of each line once per level (a 1 MiB array 998 levels deep: 2 s, heap limit).
//! Every other JSON function (json, jsonb, json_valid, json_type, json_quote, json_error_position,
//! json_array_length, ->, ->>, the aggregates, json_each, json_tree) is linear in one call, at most
//! 0.45 s at the value limit, and stays SQLite's.
//!
//! `bounded` checks a call's work against its bound, an SQL error past it that says what to do,
//! and hands a call within it to SQLite's own built-in (builtin.rs), so its result is SQLite's.
//! `pretty` is `json_pretty` itself: SQLite's canonical text of the document (`json()`, linear)
//! laid out line by line as SQLite lays it out, asking the deadline as it writes, and stopping
//! once the text passes the value limit. Both ask the deadline and cancel at every call, so a
//! statement of many such calls stops between two of them.

use std::ffi::{c_int, CString};

use rusqlite::ffi;

use super::builtin::{self, Failure, Shape};
use super::{c_string, guarded, Call, Stopped, Ticker};

/// `json_extract`, `json_remove`: each path after the document is a pass over it.
pub(super) const PATHS: u8 = 1;
/// `json_set`, `json_insert`, `json_replace`, `json_array_insert`: each (path, value) pair after
/// the document is a pass over it and an edit that moves what follows.
pub(super) const EDITS: u8 = 2;
/// `json_array`, `json_object`: every argument goes into one text, checked against the value
/// limit only once whole.
pub(super) const BUILDS: u8 = 3;
/// `json_patch`: each key of the patch is looked for among the target's.
pub(super) const PATCH: u8 = 4;

/// The most passes × bytes one call of PATHS or EDITS may take, in value limits: two (32 MiB at
/// the 16 MiB limit) cost at most 0.2 s on the development VM (counting 16M one-byte JSONB nulls
/// for `$[#-1]`, the densest pass: 6 ns a byte).
const PASSES_IN_LIMITS: u64 = 2;

/// The most (target bytes × patch bytes) one `json_patch` may take: 2^27 costs at most 0.2 s on
/// the development VM (JSONB objects of 3-byte entries, every patch key compared with every
/// target key: 7 ns a comparison). A patch of a dozen bytes still merges into a 16 MiB document.
const PATCH_WORK: u64 = 1 << 27;

/// The most text SQLite's printer may write for a blob that is not well-formed JSONB, counted at
/// its worst (every byte a line at the deepest level): 128 MiB is under 0.2 s.
const MALFORMED_PRINT: usize = 128 << 20;

/// SQLite's JSON_MAX_DEPTH: json_pretty refuses to indent a 1000th level.
const MAX_DEPTH: usize = 1000;

/// Bytes of one argument's text or blob (numbers and NULL count nothing).
fn bytes(v: *mut ffi::sqlite3_value) -> u64 {
    // SAFETY: a protected value of the current call.
    unsafe {
        match ffi::sqlite3_value_type(v) {
            ffi::SQLITE_TEXT | ffi::SQLITE_BLOB => ffi::sqlite3_value_bytes(v).max(0) as u64,
            _ => 0,
        }
    }
}

pub(super) unsafe extern "C" fn bounded(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    guarded(ctx, argv, |call| {
        if call.should_stop() {
            return call.result_stopped();
        }
        let args = call.args(argc);
        let data = call.data();
        match past_bound(call, data.name, data.flags, args) {
            Some(message) => call.result_error(&message),
            None => builtin::forward(call, data.name, args),
        }
    })
}

/// Why this call is more work than one call may do, or None. Calls SQLite refuses at once for
/// their argument count (an even count for json_set, an odd one for json_object) go to it.
fn past_bound(
    call: &Call,
    name: &str,
    bound: u8,
    args: &[*mut ffi::sqlite3_value],
) -> Option<CString> {
    let limit = call.limit(ffi::SQLITE_LIMIT_LENGTH) as u64;
    let n = args.len() as u64;
    let total = || args.iter().map(|&v| bytes(v)).sum::<u64>();
    let passes_cap = PASSES_IN_LIMITS * limit;
    let message = match bound {
        PATHS if n >= 3 && (n - 1) * total() > passes_cap => format!(
            "{name}() with {} paths over {} bytes of arguments is more work than one call may do \
             (paths x bytes at most {passes_cap}); look up fewer paths per call",
            n - 1,
            total()
        ),
        EDITS if n >= 5 && n % 2 == 1 && (n - 1) / 2 * total() > passes_cap => format!(
            "{name}() with {} edits over {} bytes of arguments is more work than one call may do \
             (edits x bytes at most {passes_cap}); make fewer edits per call",
            (n - 1) / 2,
            total()
        ),
        BUILDS if !(name.ends_with("_object") && n % 2 == 1) && total() > limit => format!(
            "{name}() over {} bytes of arguments is more than one call may build from (at most \
             the value limit, {limit} bytes); build smaller values",
            total()
        ),
        PATCH if n == 2 && bytes(args[0]) * bytes(args[1]) > PATCH_WORK => format!(
            "{name}() of {} bytes with a patch of {} bytes is more work than one call may do \
             (the two sizes multiplied at most {PATCH_WORK}); patch a smaller document or with \
             fewer keys",
            bytes(args[0]),
            bytes(args[1])
        ),
        _ => return None,
    };
    Some(CString::new(message).unwrap_or_default())
}

pub(super) unsafe extern "C" fn pretty(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    guarded(ctx, argv, |call| {
        if call.should_stop() {
            return call.result_stopped();
        }
        let args = call.args(argc);
        let limit = call.limit(ffi::SQLITE_LIMIT_LENGTH);
        if call.kind(0) == ffi::SQLITE_BLOB && malformed_jsonb(args[0], limit) {
            // A blob SQLite takes for JSONB but that is not well-formed: SQLite prints what it
            // can and stops where it notices; only its own printer says what, and only for a
            // blob small enough that its worst print is bounded.
            let indent = if argc == 2 { call.bytes(1) } else { 4 };
            let worst = call.bytes(0).saturating_mul(MAX_DEPTH * indent.max(1) + 16);
            if worst > MALFORMED_PRINT {
                return call.result_error(c"malformed JSON");
            }
            return builtin::forward(call, "json_pretty", args);
        }
        // SQLite reads the indent as C text: NULL or absent is four spaces.
        let indent: Vec<u8> = match (argc == 2).then(|| call.text(1)).flatten() {
            Some(text) => c_string(text).to_vec(),
            None => b"    ".to_vec(),
        };
        // The canonical text may be longer than the document (JSONB renders up to 6x): the own
        // connection's limit is the largest, and the laid-out text is checked against `limit`.
        builtin::run(
            &Shape::Sql("SELECT json(?1)"),
            &args[..1],
            usize::MAX,
            |outcome| {
                let text = match outcome {
                    Err(failure) => return failure.report(call),
                    // SAFETY: the own statement's value, read before it is reset.
                    Ok(v) => match unsafe { super::text_of(v) } {
                        None if unsafe { ffi::sqlite3_value_type(v) } == ffi::SQLITE_NULL => return,
                        None => return call.result_nomem(),
                        Some(text) => text,
                    },
                };
                let mut ticker = Ticker::new(&call.data().control);
                match lay_out(text, &indent, limit, &mut ticker) {
                    Ok(Some(out)) => call.result_text(&out),
                    Ok(None) => call.result_toobig(),
                    Err(Halt::TooDeep) => call.result_error(c"JSON nested too deep"),
                    Err(Halt::Malformed) => call.result_error(c"malformed JSON"),
                    Err(Halt::Stopped) => call.result_stopped(),
                }
            },
        )
    })
}

/// Whether SQLite takes `v` (a blob) for JSONB that is not well-formed: its superficial check
/// passes and its strict one does not.
fn malformed_jsonb(v: *mut ffi::sqlite3_value, limit: usize) -> bool {
    let sql = Shape::Sql("SELECT json_valid(?1, 4) AND NOT json_valid(?1, 8)");
    builtin::run(
        &sql,
        &[v],
        limit,
        |outcome: Result<_, Failure>| match outcome {
            // SAFETY: the own statement's value.
            Ok(v) => (unsafe { ffi::sqlite3_value_int(v) }) != 0,
            Err(_) => false,
        },
    )
}

enum Halt {
    TooDeep,
    Malformed,
    Stopped,
}

impl From<Stopped> for Halt {
    fn from(_: Stopped) -> Self {
        Halt::Stopped
    }
}

/// The pretty text being written, up to `limit` bytes; past them only that it is too long is kept.
struct Pretty<'a> {
    out: Vec<u8>,
    limit: usize,
    over: bool,
    indent: &'a [u8],
    /// `indent` repeated as often as the deepest line so far needed (at most `limit` bytes).
    indents: Vec<u8>,
}

impl Pretty<'_> {
    fn fits(&mut self, n: usize) -> bool {
        if !self.over && self.out.len().saturating_add(n) > self.limit {
            self.over = true;
            self.out = Vec::new();
        }
        !self.over
    }

    fn push(&mut self, bytes: &[u8], ticker: &mut Ticker) -> Result<(), Stopped> {
        ticker.spend(bytes.len() as u64 + 1)?;
        if self.fits(bytes.len()) {
            self.out.extend_from_slice(bytes);
        }
        Ok(())
    }

    /// A line break and `depth` indents.
    fn line(&mut self, depth: usize, ticker: &mut Ticker) -> Result<(), Stopped> {
        let width = depth.saturating_mul(self.indent.len());
        if !self.fits(width.saturating_add(1)) {
            return ticker.spend(1);
        }
        while self.indents.len() < width {
            self.indents.extend_from_slice(self.indent);
        }
        self.out.push(b'\n');
        self.out.extend_from_slice(&self.indents[..width]);
        ticker.spend(width as u64 + 1)
    }
}

/// SQLite's `jsonTranslateBlobToPrettyText` over `text`, the canonical JSON SQLite's `json()`
/// wrote for the document (no whitespace outside strings): an empty array or object stays `[]`
/// or `{}`; otherwise each element goes on its own line, indented once per level, with `": "`
/// after a key, and a 1000th level of a non-empty array or object is an error. None when the
/// result passes `limit` bytes (the rest is still read for a level too deep, SQLite's answer then).
fn lay_out(
    text: &[u8],
    indent: &[u8],
    limit: usize,
    ticker: &mut Ticker,
) -> Result<Option<Vec<u8>>, Halt> {
    let mut pretty = Pretty {
        out: Vec::with_capacity(text.len().min(limit) + 16),
        limit,
        over: false,
        indent,
        indents: Vec::new(),
    };
    let mut depth = 0usize;
    let mut i = 0;
    while i < text.len() && !pretty.over {
        match text[i] {
            b'"' => {
                let end = string_end(text, i).ok_or(Halt::Malformed)?;
                pretty.push(&text[i..end], ticker)?;
                i = end;
            }
            open @ (b'[' | b'{') => {
                let close = if open == b'[' { b']' } else { b'}' };
                if text.get(i + 1) == Some(&close) {
                    pretty.push(&text[i..i + 2], ticker)?;
                    i += 2;
                    continue;
                }
                pretty.push(&text[i..i + 1], ticker)?;
                depth += 1;
                if depth >= MAX_DEPTH {
                    return Err(Halt::TooDeep);
                }
                pretty.line(depth, ticker)?;
                i += 1;
            }
            b']' | b'}' => {
                depth = depth.checked_sub(1).ok_or(Halt::Malformed)?;
                pretty.line(depth, ticker)?;
                pretty.push(&text[i..i + 1], ticker)?;
                i += 1;
            }
            b',' => {
                pretty.push(b",", ticker)?;
                pretty.line(depth, ticker)?;
                i += 1;
            }
            b':' => {
                pretty.push(b": ", ticker)?;
                i += 1;
            }
            _ => {
                // A number, true, false or null: up to the next comma or closing bracket.
                let end = text[i..]
                    .iter()
                    .position(|b| matches!(b, b',' | b']' | b'}' | b':'))
                    .map_or(text.len(), |k| i + k);
                pretty.push(&text[i..end], ticker)?;
                i = end;
            }
        }
    }
    if pretty.over {
        deepest_from(text, i, depth, ticker)?;
        return Ok(None);
    }
    Ok(Some(pretty.out))
}

/// The rest of `text` from `i`, at `depth`, read only for a non-empty level too deep: a byte at
/// a time, the deadline asked every 64 KiB.
fn deepest_from(
    text: &[u8],
    mut i: usize,
    mut depth: usize,
    ticker: &mut Ticker,
) -> Result<(), Halt> {
    while i < text.len() {
        let stop = text.len().min(i + (1 << 16));
        while i < stop {
            match text[i] {
                b'"' => i = string_end(text, i).ok_or(Halt::Malformed)? - 1,
                b'[' | b'{' if matches!(text.get(i + 1), Some(b']' | b'}')) => i += 1,
                b'[' | b'{' => {
                    depth += 1;
                    if depth >= MAX_DEPTH {
                        return Err(Halt::TooDeep);
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
            i += 1;
        }
        ticker.spend(1 << 16)?;
    }
    Ok(())
}

/// One past the closing quote of the string that opens at `start`.
fn string_end(text: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', &text[i..])?;
        if text[i] == b'"' {
            return Some(i + 1);
        }
        i += 2;
        if i > text.len() {
            return None;
        }
    }
}
