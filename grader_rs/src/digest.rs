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

use rusqlite::functions::{Aggregate, Context, FunctionFlags};
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

/// Most distinct rows a set digest keeps before giving up (16 B each: 64 MiB).
pub const SET_CAP: usize = 4_000_000;

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

struct DigestAggregate(Arc<AggregateShared>);

impl Aggregate<Accumulator, Option<i64>> for DigestAggregate {
    fn init(&self, _ctx: &mut Context<'_>) -> rusqlite::Result<Accumulator> {
        let (spec, columns) = self.0.spec.lock().unwrap().ok_or_else(|| {
            rusqlite::Error::UserFunctionError("digest aggregate used outside grading".into())
        })?;
        Ok(Accumulator::new(spec, columns))
    }

    fn step(&self, ctx: &mut Context<'_>, acc: &mut Accumulator) -> rusqlite::Result<()> {
        let n = ctx.len();
        acc.add_row((0..n).map(|i| ctx.get_raw(i))).map_err(|stop| {
            *self.0.stopped.lock().unwrap() = Some(stop);
            rusqlite::Error::UserFunctionError("t2sql digest stopped early".into())
        })
    }

    fn finalize(
        &self,
        _ctx: &mut Context<'_>,
        acc: Option<Accumulator>,
    ) -> rusqlite::Result<Option<i64>> {
        let acc = match acc {
            Some(a) => a,
            None => {
                let (spec, columns) = self.0.spec.lock().unwrap().ok_or_else(|| {
                    rusqlite::Error::UserFunctionError(
                        "digest aggregate used outside grading".into(),
                    )
                })?;
                Accumulator::new(spec, columns)
            }
        };
        *self.0.result.lock().unwrap() = Some(acc.finish());
        // The digest travels through the shared state; SQL sees NULL.
        Ok(None)
    }
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

/// Register the digest aggregate on `conn`; returns its name and the state it shares with
/// the host.
pub fn register(conn: &Connection) -> rusqlite::Result<(String, Arc<AggregateShared>)> {
    let shared = Arc::new(AggregateShared::default());
    let name = function_name();
    conn.create_aggregate_function(
        name.as_str(),
        -1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DIRECTONLY,
        DigestAggregate(Arc::clone(&shared)),
    )?;
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
