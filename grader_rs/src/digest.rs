//! Streaming digests of a query result: multiset, ordered, set and subset (grader.md §2).
//!
//! A row key is XXH3-128, keyed with a process secret, over the row's canonical encoding
//! (canon.rs); with `ColumnOrder::Ignore` over its cells' encodings sorted, so a row compares as
//! the multiset of its cells. The multiset digest is (rows, columns, Σ keys mod 2^128) — a sum,
//! never an XOR, so duplicates count. The ordered digest chains the keys through a streaming hash.
//! The set digest de-duplicates keys in a hash set (16 B per distinct row, capped). A subset
//! gold keeps its distinct keys (sorted); a subset prediction is checked row by row against them.
//! Rows are never stored: memory is O(1) except for the distinct keys of set and subset.

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

/// How two results are compared (a task's `grading_method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// Rows in any order, duplicates counted.
    Multiset,
    /// Rows in the same order (`list` in the recipe's task files).
    Ordered,
    /// Distinct rows, in any order (BIRD's metric).
    Set,
    /// The prediction's distinct rows are each a gold row, and there are exactly `n` of them
    /// (`exact`) or at least `n`; `n` is capped at the gold's distinct row count.
    Subset { exact: bool, n: u64 },
}

impl Semantics {
    pub fn name(self) -> String {
        match self {
            Semantics::Multiset => "multiset".into(),
            Semantics::Ordered => "ordered".into(),
            Semantics::Set => "set".into(),
            Semantics::Subset { exact: true, n } => format!("subset,=,{n}"),
            Semantics::Subset { exact: false, n } => format!("subset,>=,{n}"),
        }
    }

    /// Read a method leniently: case and spaces do not matter; `list` is `ordered`;
    /// `subset,=,N` / `subset,>=,N` (also `==`). A bare `subset` (no count) is an error.
    pub fn parse(s: &str) -> Result<Self, String> {
        let compact: String = s
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_lowercase();
        match compact.as_str() {
            "multiset" => return Ok(Semantics::Multiset),
            "ordered" | "list" => return Ok(Semantics::Ordered),
            "set" => return Ok(Semantics::Set),
            "subset" => {
                return Err("\"subset\" without a count: write subset,=,N or subset,>=,N".into())
            }
            _ => {}
        }
        let parts: Vec<&str> = compact.split(',').collect();
        if let ["subset", op, n] = parts.as_slice() {
            let exact = match *op {
                "=" | "==" => true,
                ">=" => false,
                _ => return Err(format!("{s:?}: the comparison must be = or >=")),
            };
            return match n.parse::<u64>() {
                Ok(n) if n >= 1 => Ok(Semantics::Subset { exact, n }),
                _ => Err(format!(
                    "{s:?}: the count must be a whole number of rows, at least 1"
                )),
            };
        }
        Err(format!(
            "unknown grading method {s:?}: use multiset, set, ordered (list), subset,=,N or subset,>=,N"
        ))
    }

    fn keeps_distinct(self) -> bool {
        matches!(self, Semantics::Set | Semantics::Subset { .. })
    }
}

/// Whether a row's cells are compared in their column order, or as a multiset of cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ColumnOrder {
    #[default]
    Strict,
    Ignore,
}

impl ColumnOrder {
    pub fn name(self) -> &'static str {
        match self {
            ColumnOrder::Strict => "strict",
            ColumnOrder::Ignore => "ignore",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_lowercase().as_str() {
            "strict" => Some(ColumnOrder::Strict),
            "ignore" => Some(ColumnOrder::Ignore),
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
    pub column_order: ColumnOrder,
    /// Rows (distinct rows for set and subset semantics).
    pub rows: u64,
    pub columns: u32,
    /// The comparison key: Σ row keys (multiset, set, subset) or the chained hash (ordered).
    pub key: u128,
    /// Σ row keys for ordered digests too: tells "same rows, other order" from "other rows".
    pub unordered_key: u128,
    pub secret_id: u64,
    /// A subset gold's distinct row keys, sorted (16 B per distinct row); None otherwise.
    pub gold_keys: Option<Arc<Vec<u128>>>,
}

// ---- the wire format (the gold cache on disk, worker processes) ------------------------

const WIRE_MAGIC: &[u8; 4] = b"T2D2";
/// The first format: multiset, ordered and set digests, columns in order.
const WIRE_MAGIC_V1: &[u8; 4] = b"T2D1";
const WIRE_V1_LEN: usize = 4 + 1 + 1 + 8 + 4 + 16 + 16 + 8;
const WIRE_HEAD_LEN: usize = 4 + 1 + 8 + 1 + 1 + 8 + 4 + 16 + 16 + 8 + 8;

impl Digest {
    /// A fixed little-endian layout: magic, method (tag and subset count), float digits,
    /// column order, counts, keys, secret id, then a subset gold's distinct keys.
    pub fn to_bytes(&self) -> Vec<u8> {
        let keys = self.gold_keys.as_deref().map_or(&[][..], |k| k.as_slice());
        let mut b = Vec::with_capacity(WIRE_HEAD_LEN + 16 * keys.len());
        b.extend_from_slice(WIRE_MAGIC);
        let (tag, n) = match self.semantics {
            Semantics::Multiset => (0u8, 0u64),
            Semantics::Ordered => (1, 0),
            Semantics::Set => (2, 0),
            Semantics::Subset { exact: true, n } => (3, n),
            Semantics::Subset { exact: false, n } => (4, n),
        };
        b.push(tag);
        b.extend_from_slice(&n.to_le_bytes());
        b.push(self.float_digits.map_or(255, |x| x as u8));
        b.push(match self.column_order {
            ColumnOrder::Strict => 0,
            ColumnOrder::Ignore => 1,
        });
        b.extend_from_slice(&self.rows.to_le_bytes());
        b.extend_from_slice(&self.columns.to_le_bytes());
        b.extend_from_slice(&self.key.to_le_bytes());
        b.extend_from_slice(&self.unordered_key.to_le_bytes());
        b.extend_from_slice(&self.secret_id.to_le_bytes());
        b.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for k in keys {
            b.extend_from_slice(&k.to_le_bytes());
        }
        b
    }

    /// Read `to_bytes`' layout (and the first format, T2D1); every field is validated.
    pub fn from_bytes(data: &[u8]) -> Result<Self, String> {
        let u64_at = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().unwrap());
        let u128_at = |i: usize| u128::from_le_bytes(data[i..i + 16].try_into().unwrap());
        let digits = |d: u8| match d {
            255 => Ok(None),
            d if d >= 1 && u32::from(d) <= canon::MAX_FLOAT_DIGITS => Ok(Some(u32::from(d))),
            _ => Err("bad float_digits".to_string()),
        };
        if data.len() == WIRE_V1_LEN && &data[..4] == WIRE_MAGIC_V1 {
            let semantics = match data[4] {
                0 => Semantics::Multiset,
                1 => Semantics::Ordered,
                2 => Semantics::Set,
                _ => return Err("unknown semantics".into()),
            };
            return Ok(Digest {
                semantics,
                float_digits: digits(data[5])?,
                column_order: ColumnOrder::Strict,
                rows: u64_at(6),
                columns: u32::from_le_bytes(data[14..18].try_into().unwrap()),
                key: u128_at(18),
                unordered_key: u128_at(34),
                secret_id: u64_at(50),
                gold_keys: None,
            });
        }
        if data.len() < WIRE_HEAD_LEN || &data[..4] != WIRE_MAGIC {
            return Err("wrong length or header".into());
        }
        let n = u64_at(5);
        let semantics = match data[4] {
            0 => Semantics::Multiset,
            1 => Semantics::Ordered,
            2 => Semantics::Set,
            3 if n >= 1 => Semantics::Subset { exact: true, n },
            4 if n >= 1 => Semantics::Subset { exact: false, n },
            _ => return Err("unknown grading method".into()),
        };
        let column_order = match data[14] {
            0 => ColumnOrder::Strict,
            1 => ColumnOrder::Ignore,
            _ => return Err("bad column order".into()),
        };
        let nkeys = u64_at(WIRE_HEAD_LEN - 8) as usize;
        if data.len() != WIRE_HEAD_LEN + 16 * nkeys {
            return Err("wrong length for its keys".into());
        }
        let is_subset = matches!(semantics, Semantics::Subset { .. });
        if !is_subset && nkeys > 0 {
            return Err("row keys on a digest that keeps none".into());
        }
        let gold_keys = is_subset.then(|| {
            Arc::new(
                (0..nkeys)
                    .map(|i| u128_at(WIRE_HEAD_LEN + 16 * i))
                    .collect::<Vec<u128>>(),
            )
        });
        if let Some(keys) = &gold_keys {
            if keys.len() as u64 != u64_at(15) || keys.windows(2).any(|w| w[0] >= w[1]) {
                return Err("subset keys are not the gold's sorted distinct rows".into());
            }
        }
        Ok(Digest {
            semantics,
            float_digits: digits(data[13])?,
            column_order,
            rows: u64_at(15),
            columns: u32::from_le_bytes(data[23..27].try_into().unwrap()),
            key: u128_at(27),
            unordered_key: u128_at(43),
            secret_id: u64_at(59),
            gold_keys,
        })
    }
}

/// Options of one digest computation.
#[derive(Debug, Clone, Copy)]
pub struct DigestSpec {
    pub semantics: Semantics,
    pub float_digits: Option<u32>,
    pub column_order: ColumnOrder,
    /// Stop once the result has more rows than this (the gold's count): early exit.
    pub row_limit: Option<u64>,
}

/// Why accumulation stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    RowLimit,
    SetTooLarge,
    /// A subset prediction's row is not one of the gold's rows.
    NotInGold,
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
    /// A subset prediction checks each row against these (the gold's keys, sorted).
    gold_keys: Option<Arc<Vec<u128>>>,
    buf: Vec<u8>,
    /// ColumnOrder::Ignore: where each cell's encoding ends in `buf`, and a buffer to sort into.
    cell_ends: Vec<usize>,
    sorted: Vec<u8>,
}

impl Accumulator {
    /// `gold_keys`: for a subset prediction, the gold's distinct keys; None for a gold or
    /// any other method.
    pub fn new(spec: DigestSpec, columns: u32, gold_keys: Option<Arc<Vec<u128>>>) -> Self {
        let seed = secret();
        Accumulator {
            spec,
            seed,
            columns,
            rows: 0,
            sum: 0,
            chain: (spec.semantics == Semantics::Ordered).then(|| Box::new(Xxh3::with_seed(seed))),
            set: spec.semantics.keeps_distinct().then(HashSet::default),
            gold_keys,
            buf: Vec::with_capacity(256),
            cell_ends: Vec::new(),
            sorted: Vec::new(),
        }
    }

    /// Add one row, given its cells in column order.
    #[inline]
    pub fn add_row<'v>(&mut self, cells: impl Iterator<Item = ValueRef<'v>>) -> Result<(), Stop> {
        self.buf.clear();
        // One loop over the cells whatever the column order (one call site for the iterator,
        // which keeps it inlined); ignoring the order only records where each cell ends.
        let unordered = self.spec.column_order == ColumnOrder::Ignore;
        if unordered {
            self.cell_ends.clear();
        }
        for v in cells {
            canon::encode(&mut self.buf, v, self.spec.float_digits);
            if unordered {
                self.cell_ends.push(self.buf.len());
            }
        }
        if unordered {
            self.sort_cells();
        }
        let key = xxh3_128_with_seed(&self.buf, self.seed);
        if self.gold_keys.is_some() && !self.is_gold_row(key) {
            return Err(Stop::NotInGold);
        }
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

    /// The row as the multiset of its cells: the cells' encodings (in `buf`, ending at
    /// `cell_ends`), sorted. Each encoding is type-tagged and length-prefixed, so their
    /// concatenation is unambiguous. Out of line: the strict path stays small.
    #[inline(never)]
    fn sort_cells(&mut self) {
        let mut cells: Vec<&[u8]> = Vec::with_capacity(self.cell_ends.len());
        let mut start = 0;
        for &end in &self.cell_ends {
            cells.push(&self.buf[start..end]);
            start = end;
        }
        cells.sort_unstable();
        self.sorted.clear();
        for c in cells {
            self.sorted.extend_from_slice(c);
        }
        std::mem::swap(&mut self.buf, &mut self.sorted);
    }

    #[inline(never)]
    fn is_gold_row(&self, key: u128) -> bool {
        self.gold_keys
            .as_ref()
            .is_some_and(|gold| gold.binary_search(&key).is_ok())
    }

    pub fn finish(self) -> Digest {
        let key = match &self.chain {
            Some(chain) => chain.digest128(),
            None => self.sum,
        };
        // A subset gold keeps its keys; a subset prediction (checked against them) does not.
        let gold_keys = match (&self.spec.semantics, &self.gold_keys, self.set) {
            (Semantics::Subset { .. }, None, Some(set)) => {
                let mut keys: Vec<u128> = set.into_iter().collect();
                keys.sort_unstable();
                Some(Arc::new(keys))
            }
            _ => None,
        };
        Digest {
            semantics: self.spec.semantics,
            float_digits: self.spec.float_digits,
            column_order: self.spec.column_order,
            rows: self.rows,
            columns: self.columns,
            key,
            unordered_key: self.sum,
            secret_id: secret_id(),
            gold_keys,
        }
    }
}

// ---- the digest as an aggregate inside SQLite's VM ------------------------------------

/// State shared between the host and the aggregate registered on one connection.
#[derive(Default)]
pub struct AggregateShared {
    pub spec: Mutex<Option<(DigestSpec, u32)>>,
    /// A subset prediction's gold keys, for the run under way.
    pub gold_keys: Mutex<Option<Arc<Vec<u128>>>>,
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
            let gold_keys = shared.gold_keys.lock().unwrap().clone();
            *slot = Box::into_raw(Box::new(Accumulator::new(spec, columns, gold_keys)));
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
                Some((spec, columns)) => {
                    Accumulator::new(spec, columns, shared.gold_keys.lock().unwrap().clone())
                        .finish()
                }
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
            column_order: ColumnOrder::Strict,
            row_limit: None,
        };
        let mut acc = Accumulator::new(spec, 2, None);
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
            column_order: ColumnOrder::Strict,
            row_limit: Some(2),
        };
        let mut acc = Accumulator::new(spec, 1, None);
        assert!(acc.add_row([I(1)].into_iter()).is_ok());
        assert!(acc.add_row([I(1)].into_iter()).is_ok());
        assert_eq!(acc.add_row([I(1)].into_iter()), Err(Stop::RowLimit));
    }

    #[test]
    fn methods_parse_leniently_and_name_themselves() {
        assert_eq!(Semantics::parse(" Multiset"), Ok(Semantics::Multiset));
        assert_eq!(Semantics::parse("LIST"), Ok(Semantics::Ordered));
        assert_eq!(
            Semantics::parse("subset, = ,5"),
            Ok(Semantics::Subset { exact: true, n: 5 })
        );
        assert_eq!(
            Semantics::parse("subset,==,2"),
            Ok(Semantics::Subset { exact: true, n: 2 })
        );
        assert_eq!(
            Semantics::parse("Subset,>=,10"),
            Ok(Semantics::Subset {
                exact: false,
                n: 10
            })
        );
        for bad in [
            "subset",
            "subset,=,0",
            "subset,<,3",
            "subset,=,x",
            "bag",
            "",
        ] {
            assert!(Semantics::parse(bad).is_err(), "{bad:?}");
        }
        for s in ["multiset", "ordered", "set", "subset,=,5", "subset,>=,1"] {
            assert_eq!(Semantics::parse(s).unwrap().name(), s);
        }
    }

    #[test]
    fn ignoring_column_order_compares_rows_as_multisets_of_cells() {
        let spec = |column_order| DigestSpec {
            semantics: Semantics::Multiset,
            float_digits: Some(12),
            column_order,
            row_limit: None,
        };
        let run = |order, rows: &[Vec<ValueRef<'_>>]| {
            let mut acc = Accumulator::new(spec(order), 2, None);
            for r in rows {
                acc.add_row(r.iter().copied()).unwrap();
            }
            acc.finish().key
        };
        let ab = [vec![I(1), T(b"x")], vec![I(2), T(b"y")]];
        let ba = [vec![T(b"x"), I(1)], vec![T(b"y"), I(2)]];
        assert_eq!(run(ColumnOrder::Ignore, &ab), run(ColumnOrder::Ignore, &ba));
        assert_ne!(run(ColumnOrder::Strict, &ab), run(ColumnOrder::Strict, &ba));
        // Cells stay with their row: {(1,y),(2,x)} is another result.
        let swapped = [vec![I(1), T(b"y")], vec![I(2), T(b"x")]];
        assert_ne!(
            run(ColumnOrder::Ignore, &ab),
            run(ColumnOrder::Ignore, &swapped)
        );
        // A multiset of cells, not a set: (1,1) is not (1).
        let one = |order| {
            let mut acc = Accumulator::new(spec(order), 2, None);
            acc.add_row([I(1), I(1)].into_iter()).unwrap();
            acc.finish().key
        };
        let mut single = Accumulator::new(spec(ColumnOrder::Ignore), 1, None);
        single.add_row([I(1)].into_iter()).unwrap();
        assert_ne!(one(ColumnOrder::Ignore), single.finish().key);
    }

    fn subset_gold(rows: &[i64], n: u64) -> Digest {
        let spec = DigestSpec {
            semantics: Semantics::Subset { exact: true, n },
            float_digits: None,
            column_order: ColumnOrder::Strict,
            row_limit: None,
        };
        let mut acc = Accumulator::new(spec, 1, None);
        for &r in rows {
            acc.add_row([I(r)].into_iter()).unwrap();
        }
        acc.finish()
    }

    #[test]
    fn a_subset_gold_keeps_its_distinct_keys_and_a_prediction_is_checked_against_them() {
        let gold = subset_gold(&[1, 2, 2, 3], 2);
        assert_eq!(gold.rows, 3);
        let keys = gold.gold_keys.clone().unwrap();
        assert_eq!(keys.len(), 3);
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        let spec = DigestSpec {
            semantics: gold.semantics,
            float_digits: None,
            column_order: ColumnOrder::Strict,
            row_limit: Some(2),
        };
        let mut pred = Accumulator::new(spec, 1, Some(keys.clone()));
        assert!(pred.add_row([I(3)].into_iter()).is_ok());
        assert!(pred.add_row([I(3)].into_iter()).is_ok()); // a repeat is not a new distinct row
        assert!(pred.add_row([I(1)].into_iter()).is_ok());
        assert_eq!(pred.add_row([I(2)].into_iter()), Err(Stop::RowLimit)); // a third distinct row
        let mut foreign = Accumulator::new(spec, 1, Some(keys));
        assert_eq!(foreign.add_row([I(9)].into_iter()), Err(Stop::NotInGold));
        // A prediction does not carry keys of its own.
        let mut ok = Accumulator::new(spec, 1, gold.gold_keys.clone());
        ok.add_row([I(1)].into_iter()).unwrap();
        assert!(ok.finish().gold_keys.is_none());
    }

    #[test]
    fn wire_format_round_trips_and_refuses_damage() {
        let set = digest_of(&[vec![I(1), T(b"x")], vec![I(2), T(b"y")]], Semantics::Set);
        for d in [set, subset_gold(&[4, 5, 6], 2), subset_gold(&[], 1)] {
            let bytes = d.to_bytes();
            assert_eq!(Digest::from_bytes(&bytes).unwrap(), d);
            assert!(Digest::from_bytes(&bytes[..bytes.len() - 1]).is_err());
            let mut bad = bytes.clone();
            bad[4] = 9;
            assert!(Digest::from_bytes(&bad).is_err());
            let mut bad = bytes.clone();
            bad[13] = 0; // float_digits 0
            assert!(Digest::from_bytes(&bad).is_err());
        }
        // Subset keys out of order are refused.
        let mut d = subset_gold(&[4, 5, 6], 2);
        let mut keys = (*d.gold_keys.clone().unwrap()).clone();
        keys.reverse();
        d.gold_keys = Some(Arc::new(keys));
        assert!(Digest::from_bytes(&d.to_bytes()).is_err());
        // The first format still reads: a multiset digest, columns in order.
        let m = digest_of(&[vec![I(1), T(b"x")]], Semantics::Multiset);
        let mut v1 = b"T2D1".to_vec();
        v1.push(0);
        v1.push(12);
        v1.extend_from_slice(&m.rows.to_le_bytes());
        v1.extend_from_slice(&m.columns.to_le_bytes());
        v1.extend_from_slice(&m.key.to_le_bytes());
        v1.extend_from_slice(&m.unordered_key.to_le_bytes());
        v1.extend_from_slice(&m.secret_id.to_le_bytes());
        assert_eq!(Digest::from_bytes(&v1).unwrap(), m);
        // ... and knows no subset: it has no place for the count.
        v1[4] = 3;
        assert!(Digest::from_bytes(&v1).is_err());
    }
}
