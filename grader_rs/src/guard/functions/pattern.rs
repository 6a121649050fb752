//! LIKE and GLOB: SQLite's `patternCompare` rule for rule, asking the deadline as it goes. Its
//! cost is the string's length times the pattern's in the worst case (`x LIKE '%aaaa…b'`: 10 s
//! for 1 MiB under the 10,000-byte pattern limit), which no linear matcher of the same rules
//! avoids; so the work is counted and the query stops at its deadline or cancel like any other.
//!
//! Rules, as SQLite 3.54 has them: the pattern and the string are read up to their first NUL, a
//! character at a time (`utf8_read`); LIKE folds ASCII letters only, `_` is one character, `%` any
//! run; an ESCAPE character must be a single character (else "ESCAPE expression must be a single
//! character") and takes away the wildcard it equals; GLOB has `*`, `?` and `[...]` classes (`^`
//! inverts, `a-z` ranges, `]` first is literal); a pattern longer than LIKE_PATTERN_LENGTH bytes is
//! "LIKE or GLOB pattern too complex"; NULL anywhere gives NULL (after the escape's checks).
//!
//! SQLite recurses at each wildcard, but a call that has passed a wildcard never answers "no
//! match, try further" (only "match" or "no match at all"), so only the latest wildcard's search
//! is ever resumed: this port keeps that one search and no stack.

use std::ffi::c_int;

use rusqlite::ffi;

use super::{at, c_string, guarded, skip_utf8, utf8_read, Call, Stopped, Ticker};

/// What the pattern's special characters are.
#[derive(Clone, Copy)]
struct Rules {
    /// `%` or `*` (0 when the ESCAPE character is it).
    many: u32,
    /// `_` or `?` (0 when the ESCAPE character is it).
    one: u32,
    /// `[` for GLOB, 0 for LIKE.
    set: u32,
    /// LIKE folds ASCII case.
    fold: bool,
}

const LIKE: Rules = Rules {
    many: '%' as u32,
    one: '_' as u32,
    set: 0,
    fold: true,
};
const GLOB: Rules = Rules {
    many: '*' as u32,
    one: '?' as u32,
    set: '[' as u32,
    fold: false,
};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Outcome {
    Match,
    NoMatch,
    /// No match, and no later start of the wildcard's search can match either.
    NoWildcardMatch,
}

pub(super) unsafe extern "C" fn like(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    guarded(ctx, argv, |call| matches(call, argc, LIKE))
}

pub(super) unsafe extern "C" fn glob(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    guarded(ctx, argv, |call| matches(call, argc, GLOB))
}

/// SQLite's `likeFunc`: the pattern is the first argument, the string the second.
fn matches(call: &Call, argc: c_int, rules: Rules) {
    if call.bytes(0) > call.limit(ffi::SQLITE_LIMIT_LIKE_PATTERN_LENGTH) {
        return call.result_error(c"LIKE or GLOB pattern too complex");
    }
    let mut rules = rules;
    let escape = if argc == 3 {
        let Some(escape) = call.text(2) else {
            return;
        };
        let escape = c_string(escape);
        if char_count(escape) != 1 {
            return call.result_error(c"ESCAPE expression must be a single character");
        }
        let e = utf8_read(escape, &mut 0);
        if e == rules.many {
            rules.many = 0;
        }
        if e == rules.one {
            rules.one = 0;
        }
        e
    } else {
        rules.set
    };
    let (Some(pattern), Some(string)) = (call.text(0), call.text(1)) else {
        return;
    };
    let mut ticker = Ticker::new(&call.data().control);
    match compare(
        c_string(pattern),
        c_string(string),
        rules,
        escape,
        &mut ticker,
    ) {
        Ok(outcome) => call.result_int((outcome == Outcome::Match) as c_int),
        Err(Stopped) => call.result_stopped(),
    }
}

/// SQLite's `sqlite3Utf8CharLen`: characters (a lead byte and its continuation bytes).
fn char_count(s: &[u8]) -> usize {
    let mut i = 0;
    let mut n = 0;
    while i < s.len() {
        skip_utf8(s, &mut i);
        n += 1;
    }
    n
}

/// Where the search after a wildcard looks next.
enum Search {
    /// For an ASCII character (either case when folding); the match goes on at `next` in the pattern.
    Byte { stops: [u8; 2], next: usize },
    /// For a character past ASCII, compared exactly.
    Char { c: u32, next: usize },
    /// A `[...]` class right after `*`: the match is tried from each character, the pattern
    /// starting at the `[` (`class`).
    Class { class: usize },
}

/// What one match attempt ended in: an answer, or a wildcard whose search takes over.
enum Attempt {
    Done(Outcome),
    Wildcard(Search),
}

/// SQLite's `patternCompare` without its recursion (see the module's note).
fn compare(
    pattern: &[u8],
    string: &[u8],
    rules: Rules,
    escape: u32,
    ticker: &mut Ticker<'_>,
) -> Result<Outcome, Stopped> {
    let (mut p, mut s) = (0usize, 0usize);
    // The live wildcard search, where it resumes in the string, and whether it has started.
    let mut search: Option<(Search, usize, bool)> = None;
    loop {
        match attempt(pattern, string, rules, escape, &mut p, &mut s, ticker)? {
            Attempt::Done(Outcome::NoMatch) if search.is_some() => {}
            Attempt::Done(outcome) => return Ok(outcome),
            Attempt::Wildcard(next) => search = Some((next, s, false)),
        }
        let (kind, resume, started) = search.as_mut().expect("a live search");
        match kind {
            Search::Byte { stops, next } => {
                // strcspn for either stop byte (a NUL ends the string), then one byte past it.
                let rest = string.get(*resume..).unwrap_or(&[]);
                let found = memchr::memchr3(stops[0], stops[1], 0, rest);
                ticker.spend(found.map_or(rest.len(), |k| k + 1) as u64)?;
                let Some(k) = found.filter(|&k| rest[k] != 0) else {
                    return Ok(Outcome::NoWildcardMatch);
                };
                *resume += k + 1;
                (p, s) = (*next, *resume);
            }
            Search::Char { c, next } => loop {
                ticker.spend(1)?;
                let c2 = utf8_read(string, resume);
                if c2 == 0 {
                    return Ok(Outcome::NoWildcardMatch);
                }
                if c2 == *c {
                    (p, s) = (*next, *resume);
                    break;
                }
            },
            Search::Class { class } => {
                if *started {
                    skip_utf8(string, resume);
                }
                ticker.spend(1)?;
                if at(string, *resume) == 0 {
                    return Ok(Outcome::NoWildcardMatch);
                }
                (p, s) = (*class, *resume);
            }
        }
        *started = true;
    }
}

/// One run of `patternCompare`'s main loop from pattern position `p` and string position `s`.
#[inline]
fn attempt(
    pattern: &[u8],
    string: &[u8],
    rules: Rules,
    escape: u32,
    p: &mut usize,
    s: &mut usize,
    ticker: &mut Ticker<'_>,
) -> Result<Attempt, Stopped> {
    loop {
        // One unit per pattern character: each reads at most one character of the string.
        ticker.spend(1)?;
        let mut c = utf8_read(pattern, p);
        if c == 0 {
            let end = at(string, *s) == 0;
            return Ok(Attempt::Done(if end {
                Outcome::Match
            } else {
                Outcome::NoMatch
            }));
        }
        if c == rules.many {
            // Past every further `%` and `_` (each `_` takes one character of the string).
            loop {
                c = utf8_read(pattern, p);
                if c == rules.many {
                    continue;
                }
                if c == rules.one && rules.one != 0 {
                    if utf8_read(string, s) == 0 {
                        return Ok(Attempt::Done(Outcome::NoWildcardMatch));
                    }
                    continue;
                }
                break;
            }
            if c == 0 {
                return Ok(Attempt::Done(Outcome::Match));
            }
            if c == escape {
                if rules.set == 0 {
                    c = utf8_read(pattern, p);
                    if c == 0 {
                        return Ok(Attempt::Done(Outcome::NoWildcardMatch));
                    }
                } else {
                    // `[` is one byte: the class starts just before `p`.
                    return Ok(Attempt::Wildcard(Search::Class { class: *p - 1 }));
                }
            }
            return Ok(Attempt::Wildcard(if c < 0x80 {
                let b = c as u8;
                let stops = if rules.fold {
                    [b.to_ascii_uppercase(), b.to_ascii_lowercase()]
                } else {
                    [b, b]
                };
                Search::Byte { stops, next: *p }
            } else {
                Search::Char { c, next: *p }
            }));
        }
        let mut escaped = false;
        if c == escape {
            if rules.set == 0 {
                c = utf8_read(pattern, p);
                if c == 0 {
                    return Ok(Attempt::Done(Outcome::NoMatch));
                }
                escaped = true;
            } else {
                if !class_matches(pattern, string, p, s, ticker)? {
                    return Ok(Attempt::Done(Outcome::NoMatch));
                }
                continue;
            }
        }
        let c2 = utf8_read(string, s);
        if c == c2 {
            continue;
        }
        if rules.fold && c < 0x80 && c2 < 0x80 && (c as u8).eq_ignore_ascii_case(&(c2 as u8)) {
            continue;
        }
        if c == rules.one && !escaped && c2 != 0 {
            continue;
        }
        return Ok(Attempt::Done(Outcome::NoMatch));
    }
}

/// GLOB's `[...]` (its `[` already read) against the string's next character.
fn class_matches(
    pattern: &[u8],
    string: &[u8],
    p: &mut usize,
    s: &mut usize,
    ticker: &mut Ticker<'_>,
) -> Result<bool, Stopped> {
    let c = utf8_read(string, s);
    if c == 0 {
        return Ok(false);
    }
    let (mut prior, mut seen, mut invert) = (0u32, false, false);
    let mut c2 = utf8_read(pattern, p);
    if c2 == '^' as u32 {
        invert = true;
        c2 = utf8_read(pattern, p);
    }
    if c2 == ']' as u32 {
        if c == ']' as u32 {
            seen = true;
        }
        c2 = utf8_read(pattern, p);
    }
    while c2 != 0 && c2 != ']' as u32 {
        ticker.spend(1)?;
        let after = at(pattern, *p);
        if c2 == '-' as u32 && after != b']' && after != 0 && prior > 0 {
            c2 = utf8_read(pattern, p);
            if c >= prior && c <= c2 {
                seen = true;
            }
            prior = 0;
        } else {
            if c == c2 {
                seen = true;
            }
            prior = c2;
        }
        c2 = utf8_read(pattern, p);
    }
    Ok(c2 != 0 && seen != invert)
}
