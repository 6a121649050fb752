//! Streaming digests of a query result: multiset, ordered and set (grader.md §2).
//!
//! A row key is XXH3-128, keyed with a process secret, over the row's canonical encoding
//! (canon.rs). The multiset digest is (rows, columns, Σ keys mod 2^128) — a sum, never an
//! XOR, so duplicates count. The ordered digest chains the keys through a streaming hash.
//! The set digest de-duplicates keys in a hash set (16 B per distinct row, capped).
//! Rows are never stored: memory is O(1) except for the set's distinct keys.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::ffi::{c_int, c_void};

use rusqlite::ffi;
use rusqlite::types::ValueRef;
use rusqlite::Connection;
use xxhash_rust::xxh3::{xxh3_128_with_seed, xxh3_64_with_seed, Xxh3};

use crate::canon;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Semantics {
    Multiset,
    Ordered,
    Set,
}

impl Semantics {
    pub fn name(self) -> &'static str {
        match self {
            Semantics::Multiset => "multiset",
            Semantics::Ordered => "ordered",
            Semantics::Set => "set",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "multiset" => Some(Semantics::Multiset),
            "ordered" => Some(Semantics::Ordered),
            "set" => Some(Semantics::Set),
            _ => None,
        }
    }
}

/// Most distinct rows a set digest keeps before giving up: 16 B per key, about 300 MiB with
/// the hash table's slack at the cap. Multiset and ordered digests need no such memory.
pub const SET_CAP: usize = 10_000_000;

// ---- the process secret --------------------------------------------------------------

static SECRET: AtomicU64 = AtomicU64::new(0);
static SECRET_INIT: std::sync::Once = std::sync::Once::new();

/// The seed keying every row hash. Random per process unless `set_secret` fixed it (a disk
/// cache shared by several processes does that).
pub fn secret() -> u64 {
    SECRET_INIT.call_once(|| {
        if SECRET.load(Ordering::Relaxed) == 0 {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b).expect("OS random source");
            SECRET.store(u64::from_le_bytes(b) | 1, Ordering::Relaxed);
        }
    });
    SECRET.load(Ordering::Relaxed)
}

pub fn set_secret(bytes: &[u8]) {
    SECRET_INIT.call_once(|| {});
    SECRET.store(
        xxh3_64_with_seed(bytes, 0x7432_7371_6c5f_6b65) | 1,
        Ordering::Relaxed,
    );
}

/// A public name for the secret (a hash of it), to tell digests of different secrets apart.
pub fn secret_id() -> u64 {
    xxh3_64_with_seed(&secret().to_le_bytes(), 0x6964)
}

// ---- digests -------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    pub semantics: Semantics,
    pub float_digits: Option<u32>,
    /// Rows (distinct rows for set semantics).
    pub rows: u64,
    pub columns: u32,
    /// The comparison key: Σ row keys (multiset, set) or the chained hash (ordered).
    pub key: u128,
    /// Σ row keys for ordered digests too: tells "same rows, other order" from "other rows".
    pub unordered_key: u128,
    pub secret_id: u64,
}

/// Options of one digest computation.
#[derive(Debug, Clone, Copy)]
pub struct DigestSpec {
    pub semantics: Semantics,
    pub float_digits: Option<u32>,
    /// Stop once the result has more rows than this (the gold's count): early exit.
    pub row_limit: Option<u64>,
}

/// Why accumulation stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    RowLimit,
    SetTooLarge,
}

/// Hash set hasher for keys that are already uniform hashes: take the low 64 bits.
#[derive(Default)]
pub struct KeyHasher(u64);
impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(b);
        }
    }
    fn write_u128(&mut self, i: u128) {
        self.0 = i as u64;
    }
}

pub struct Accumulator {
    spec: DigestSpec,
    seed: u64,
    columns: u32,
    rows: u64,
    sum: u128,
    chain: Option<Box<Xxh3>>,
    set: Option<HashSet<u128, BuildHasherDefault<KeyHasher>>>,
    buf: Vec<u8>,
}

impl Accumulator {
    pub fn new(spec: DigestSpec, columns: u32) -> Self {
        let seed = secret();
        Accumulator {
            spec,
            seed,
            columns,
            rows: 0,
            sum: 0,
            chain: (spec.semantics == Semantics::Ordered).then(|| Box::new(Xxh3::with_seed(seed))),
            set: (spec.semantics == Semantics::Set).then(HashSet::default),
            buf: Vec::with_capacity(256),
        }
    }

    /// Add one row, given its cells in column order.
    #[inline]
    pub fn add_row<'v>(&mut self, cells: impl Iterator<Item = ValueRef<'v>>) -> Result<(), Stop> {
        self.buf.clear();
        for v in cells {
            canon::encode(&mut self.buf, v, self.spec.float_digits);
        }
        let key = xxh3_128_with_seed(&self.buf, self.seed);
        match &mut self.set {
            None => {
                self.rows += 1;
                self.sum = self.sum.wrapping_add(key);
                if let Some(chain) = &mut self.chain {
                    chain.update(&key.to_le_bytes());
                }
            }
            Some(set) => {
                if set.insert(key) {
                    self.rows += 1;
                    self.sum = self.sum.wrapping_add(key);
                    if set.len() > SET_CAP {
                        return Err(Stop::SetTooLarge);
                    }
                }
            }
        }
        match self.spec.row_limit {
            Some(limit) if self.rows > limit => Err(Stop::RowLimit),
            _ => Ok(()),
        }
    }

    pub fn finish(self) -> Digest {
        let key = match &self.chain {
            Some(chain) => chain.digest128(),
            None => self.sum,
        };
        Digest {
            semantics: self.spec.semantics,
            float_digits: self.spec.float_digits,
            rows: self.rows,
            columns: self.columns,
            key,
            unordered_key: self.sum,
            secret_id: secret_id(),
        }
    }
}

// ---- the digest as an aggregate inside SQLite's VM ------------------------------------

/// State shared between the host and the aggregate registered on one connection.
#[derive(Default)]
pub struct AggregateShared {
    pub spec: Mutex<Option<(DigestSpec, u32)>>,
    pub result: Mutex<Option<Digest>>,
    pub stopped: Mutex<Option<Stop>>,
}

// The aggregate is bound with SQLite's C API directly: it runs once per result row, and the
// generic wrapper's per-call boxing and context set-up cost more than the digest itself.

/// Read a SQLite value as a `ValueRef` borrowed for the duration of the step call.
///
/// # Safety
/// `v` must be a valid `sqlite3_value` for the current call.
#[inline]
unsafe fn value_ref<'a>(v: *mut ffi::sqlite3_value) -> ValueRef<'a> {
    unsafe {
        match ffi::sqlite3_value_type(v) {
            ffi::SQLITE_INTEGER => ValueRef::Integer(ffi::sqlite3_value_int64(v)),
            ffi::SQLITE_FLOAT => ValueRef::Real(ffi::sqlite3_value_double(v)),
            ffi::SQLITE_TEXT => {
                // text first, then bytes (SQLite's documented order for a stable length)
                let p = ffi::sqlite3_value_text(v);
                let n = ffi::sqlite3_value_bytes(v) as usize;
                ValueRef::Text(if p.is_null() || n == 0 {
                    &[]
                } else {
                    std::slice::from_raw_parts(p, n)
                })
            }
            ffi::SQLITE_BLOB => {
                let p = ffi::sqlite3_value_blob(v) as *const u8;
                let n = ffi::sqlite3_value_bytes(v) as usize;
                ValueRef::Blob(if p.is_null() || n == 0 {
                    &[]
                } else {
                    std::slice::from_raw_parts(p, n)
                })
            }
            _ => ValueRef::Null,
        }
    }
}

/// The slot SQLite keeps per aggregate invocation: a pointer to our accumulator.
type Slot = *mut Accumulator;

unsafe fn fail(ctx: *mut ffi::sqlite3_context, msg: &std::ffi::CStr) {
    unsafe { ffi::sqlite3_result_error(ctx, msg.as_ptr(), -1) }
}

unsafe extern "C" fn digest_step(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    unsafe {
        let shared = &*(ffi::sqlite3_user_data(ctx) as *const AggregateShared);
        let slot =
            ffi::sqlite3_aggregate_context(ctx, std::mem::size_of::<Slot>() as c_int) as *mut Slot;
        if slot.is_null() {
            ffi::sqlite3_result_error_nomem(ctx);
            return;
        }
        if (*slot).is_null() {
            let Some((spec, columns)) = *shared.spec.lock().unwrap() else {
                return fail(ctx, c"digest aggregate used outside grading");
            };
            *slot = Box::into_raw(Box::new(Accumulator::new(spec, columns)));
        }
        let acc = &mut **slot;
        let args = std::slice::from_raw_parts(argv, argc.max(0) as usize);
        if let Err(stop) = acc.add_row(args.iter().map(|&v| value_ref(v))) {
            *shared.stopped.lock().unwrap() = Some(stop);
            fail(ctx, c"t2sql digest stopped early");
        }
    }
}

unsafe extern "C" fn digest_final(ctx: *mut ffi::sqlite3_context) {
    unsafe {
        let shared = &*(ffi::sqlite3_user_data(ctx) as *const AggregateShared);
        // Size 0: returns the slot if a step allocated it, else NULL (no rows).
        let slot = ffi::sqlite3_aggregate_context(ctx, 0) as *mut Slot;
        let acc = if slot.is_null() || (*slot).is_null() {
            None
        } else {
            let b = Box::from_raw(*slot);
            *slot = std::ptr::null_mut();
            Some(*b)
        };
        let digest = match acc {
            Some(a) => a.finish(),
            None => match *shared.spec.lock().unwrap() {
                Some((spec, columns)) => Accumulator::new(spec, columns).finish(),
                None => return fail(ctx, c"digest aggregate used outside grading"),
            },
        };
        *shared.result.lock().unwrap() = Some(digest);
        ffi::sqlite3_result_null(ctx);
    }
}

unsafe extern "C" fn drop_shared(p: *mut c_void) {
    unsafe { drop(Arc::from_raw(p as *const AggregateShared)) }
}

/// The random-per-process name of the digest aggregate: the model cannot guess it, and the
/// authorizer refuses it anywhere but in the core's own wrapper.
pub fn function_name() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).expect("OS random source");
        format!("t2sql_digest_{:016x}", u64::from_le_bytes(b))
    })
    .clone()
}

/// Register the digest aggregate on `conn` (`sqlite3_create_function_v2`); returns its name
/// and the state it shares with the host. SQLITE_DIRECTONLY keeps it out of views/triggers.
pub fn register(conn: &Connection) -> rusqlite::Result<(String, Arc<AggregateShared>)> {
    let shared = Arc::new(AggregateShared::default());
    let name = function_name();
    let cname = std::ffi::CString::new(name.clone()).expect("no NUL in name");
    let user_data = Arc::into_raw(Arc::clone(&shared)) as *mut c_void;
    let rc = unsafe {
        ffi::sqlite3_create_function_v2(
            conn.handle(),
            cname.as_ptr(),
            -1,
            ffi::SQLITE_UTF8 | ffi::SQLITE_DIRECTONLY,
            user_data,
            None,
            Some(digest_step),
            Some(digest_final),
            Some(drop_shared),
        )
    };
    if rc != ffi::SQLITE_OK {
        // On failure SQLite has already called the destructor on user_data.
        return Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(rc),
            Some("cannot register digest".into()),
        ));
    }
    Ok((name, shared))
}

#[cfg(test)]
mod test {
    use super::*;

    fn digest_of(rows: &[Vec<ValueRef<'_>>], semantics: Semantics) -> Digest {
        let spec = DigestSpec {
            semantics,
            float_digits: Some(12),
            row_limit: None,
        };
        let mut acc = Accumulator::new(spec, 2);
        for r in rows {
            acc.add_row(r.iter().copied()).unwrap();
        }
        acc.finish()
    }

    use ValueRef::{Integer as I, Text as T};

    #[test]
    fn multiset_ignores_order_counts_duplicates() {
        let a = digest_of(
            &[vec![I(1), T(b"x")], vec![I(2), T(b"y")]],
            Semantics::Multiset,
        );
        let b = digest_of(
            &[vec![I(2), T(b"y")], vec![I(1), T(b"x")]],
            Semantics::Multiset,
        );
        assert_eq!(a, b);
        let c = digest_of(
            &[
                vec![I(1), T(b"x")],
                vec![I(1), T(b"x")],
                vec![I(2), T(b"y")],
            ],
            Semantics::Multiset,
        );
        assert_ne!(a.key, c.key);
        // XOR would cancel a pair of duplicates; the sum does not.
        let d = digest_of(
            &[
                vec![I(2), T(b"y")],
                vec![I(1), T(b"x")],
                vec![I(1), T(b"x")],
                vec![I(1), T(b"x")],
            ],
            Semantics::Multiset,
        );
        let e = digest_of(
            &[vec![I(2), T(b"y")], vec![I(1), T(b"x")]],
            Semantics::Multiset,
        );
        assert_ne!(d.key, e.key);
    }

    #[test]
    fn row_key_is_not_a_sum_of_cells() {
        // {(1,"x"),(2,"y")} must differ from {(1,"y"),(2,"x")}.
        let a = digest_of(
            &[vec![I(1), T(b"x")], vec![I(2), T(b"y")]],
            Semantics::Multiset,
        );
        let b = digest_of(
            &[vec![I(1), T(b"y")], vec![I(2), T(b"x")]],
            Semantics::Multiset,
        );
        assert_eq!(a.rows, b.rows);
        assert_ne!(a.key, b.key);
    }

    #[test]
    fn ordered_sees_order_set_ignores_duplicates() {
        let rows = [vec![I(1), T(b"x")], vec![I(2), T(b"y")]];
        let rev = [vec![I(2), T(b"y")], vec![I(1), T(b"x")]];
        let a = digest_of(&rows, Semantics::Ordered);
        let b = digest_of(&rev, Semantics::Ordered);
        assert_ne!(a.key, b.key);
        assert_eq!(a.unordered_key, b.unordered_key);
        let dup = [
            vec![I(1), T(b"x")],
            vec![I(2), T(b"y")],
            vec![I(2), T(b"y")],
        ];
        assert_eq!(
            digest_of(&rows, Semantics::Set),
            digest_of(&dup, Semantics::Set)
        );
        assert_ne!(
            digest_of(&rows, Semantics::Multiset).key,
            digest_of(&dup, Semantics::Multiset).key
        );
    }

    #[test]
    fn row_limit_stops_early() {
        let spec = DigestSpec {
            semantics: Semantics::Multiset,
            float_digits: None,
            row_limit: Some(2),
        };
        let mut acc = Accumulator::new(spec, 1);
        assert!(acc.add_row([I(1)].into_iter()).is_ok());
        assert!(acc.add_row([I(1)].into_iter()).is_ok());
        assert_eq!(acc.add_row([I(1)].into_iter()), Err(Stop::RowLimit));
    }
}
