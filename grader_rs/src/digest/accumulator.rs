//! The streaming digest of a result, one row at a time: `Accumulator` under a `DigestSpec`.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use rusqlite::types::ValueRef;
use xxhash_rust::xxh3::{xxh3_128_with_seed, Xxh3};

use super::{secret, secret_id, ColumnOrder, Digest, Semantics};
use crate::canon;

/// Most distinct rows a set digest keeps before giving up: 16 B per key, about 300 MiB with
/// the hash table's slack at the cap. Multiset and ordered digests need no such memory.
pub const SET_CAP: usize = 10_000_000;

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

#[cfg(test)]
pub(super) mod test {
    use super::*;

    pub(in crate::digest) fn digest_of(rows: &[Vec<ValueRef<'_>>], semantics: Semantics) -> Digest {
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

    pub(in crate::digest) fn subset_gold(rows: &[i64], n: u64) -> Digest {
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
}
