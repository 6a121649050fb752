//! The streaming digest of a result, one row at a time: `Accumulator` under a `DigestSpec`.

use std::sync::Arc;

use rusqlite::types::ValueRef;
use xxhash_rust::xxh3::{xxh3_128_with_seed, Xxh3};

use super::distinct::{partition_of, DistinctKeys, KeyTable, PARTITIONS};
use super::keyset::{Coverage, GoldKeys, SortedKeys};
use super::{secret, secret_id, ColumnOrder, Digest, ResolvedMethod};
use crate::canon;
use crate::spill::{grade_memory, SpillFile};

/// Options of one digest computation.
#[derive(Debug, Clone, Copy)]
pub struct DigestSpec {
    pub method: ResolvedMethod,
    pub float_digits: Option<u32>,
    pub column_order: ColumnOrder,
    /// Stop once the result has more rows than this (the gold's count): early exit.
    pub row_limit: Option<u64>,
}

/// Why accumulation stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    RowLimit,
    /// A subset prediction's row is not one of the gold's rows.
    NotInGold,
    /// The deadline passed or the cancel token fired while the digest was being finished.
    Interrupted,
    /// The spill file could not be written or read (the message says where and what to do).
    Spill(String),
}

/// How rows are counted: all of them, or the distinct ones (set and subset).
enum Rows {
    /// Multiset and ordered: every row counts.
    All,
    /// Set, a subset gold, and a subset prediction checked against a gold kept on disk (then at
    /// the end, partition by partition): the distinct keys, collected in bounded memory.
    Collect(Box<DistinctKeys>, Option<Arc<GoldKeys>>),
    /// A subset prediction against a gold kept in memory: each row looked up as it comes,
    /// the distinct ones counted as bits over the gold's keys.
    Cover(Arc<GoldKeys>, Coverage),
}

pub struct Accumulator {
    spec: DigestSpec,
    seed: u64,
    columns: u32,
    rows: u64,
    sum: u128,
    chain: Option<Box<Xxh3>>,
    distinct: Rows,
    buf: Vec<u8>,
    /// ColumnOrder::Ignore: where each cell's encoding ends in `buf`, and a buffer to sort into.
    cell_ends: Vec<usize>,
    sorted: Vec<u8>,
}

impl Accumulator {
    /// `gold_keys`: for a subset prediction, the gold's distinct keys; None for a gold or
    /// any other method.
    pub fn new(spec: DigestSpec, columns: u32, gold_keys: Option<Arc<GoldKeys>>) -> Self {
        let seed = secret();
        let distinct = if !spec.method.keeps_distinct() {
            Rows::All
        } else {
            match gold_keys {
                Some(gold) => match &*gold {
                    GoldKeys::Memory(keys) => {
                        let coverage = Coverage::new(keys);
                        Rows::Cover(gold, coverage)
                    }
                    GoldKeys::Spilled { .. } => Rows::Collect(
                        Box::new(DistinctKeys::new(grade_memory(), spec.row_limit)),
                        Some(gold),
                    ),
                },
                None => Rows::Collect(
                    Box::new(DistinctKeys::new(grade_memory(), spec.row_limit)),
                    None,
                ),
            }
        };
        Accumulator {
            spec,
            seed,
            columns,
            rows: 0,
            sum: 0,
            chain: (spec.method == ResolvedMethod::Ordered)
                .then(|| Box::new(Xxh3::with_seed(seed))),
            distinct,
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
        match &mut self.distinct {
            Rows::All => {
                self.rows += 1;
                self.sum = self.sum.wrapping_add(key);
                if let Some(chain) = &mut self.chain {
                    chain.update(&key.to_le_bytes());
                }
            }
            Rows::Collect(keys, _) => return keys.push(key),
            Rows::Cover(gold, coverage) => {
                let GoldKeys::Memory(gold) = &**gold else {
                    unreachable!("coverage is over a gold kept in memory")
                };
                match gold.index_of(key) {
                    None => return Err(Stop::NotInGold),
                    Some(i) if coverage.mark(i) => {
                        self.rows += 1;
                        self.sum = self.sum.wrapping_add(key);
                    }
                    Some(_) => return Ok(()),
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

    /// The digest. Distinct keys that spilled are counted here, one partition at a time, and a
    /// subset prediction against a gold on disk is checked here: `should_stop` (the deadline,
    /// the cancel token) is asked between partitions.
    pub fn finish(self, should_stop: &dyn Fn() -> bool) -> Result<Digest, Stop> {
        let subset = matches!(self.spec.method, ResolvedMethod::Subset { .. });
        let (rows, sum, gold_keys) = match self.distinct {
            Rows::All | Rows::Cover(..) => (self.rows, self.sum, None),
            Rows::Collect(keys, None) if subset => {
                let (gold, count, sum) = keep_gold_keys(*keys, should_stop)?;
                (count, sum, Some(Arc::new(gold)))
            }
            Rows::Collect(keys, gold) => {
                let (mut count, mut sum) = (0u64, 0u128);
                let (mut table, mut scratch) = (KeyTable::default(), Vec::new());
                keys.for_each_batch(should_stop, |p, batch| {
                    if let Some(gold) = &gold {
                        gold.check_batch(p, batch, &mut table, &mut scratch)?;
                    }
                    count += batch.len() as u64;
                    sum = batch.iter().fold(sum, |s, &k| s.wrapping_add(k));
                    Ok(())
                })?;
                if matches!(self.spec.row_limit, Some(limit) if count > limit) {
                    return Err(Stop::RowLimit);
                }
                (count, sum, None)
            }
        };
        let key = match &self.chain {
            Some(chain) => chain.digest128(),
            None => sum,
        };
        Ok(Digest {
            method: self.spec.method,
            float_digits: self.spec.float_digits,
            column_order: self.spec.column_order,
            rows,
            columns: self.columns,
            key,
            unordered_key: sum,
            secret_id: secret_id(),
            gold_keys,
            gold_sql: None,
        })
    }
}

/// A subset gold's distinct keys as its store, with their count and sum: in memory (sorted)
/// when they fit a quarter of the budget, else in the spill file they were collected in.
fn keep_gold_keys(
    keys: DistinctKeys,
    should_stop: &dyn Fn() -> bool,
) -> Result<(GoldKeys, u64, u128), Stop> {
    let memory = keys.memory();
    if keys.has_spilled() {
        let (file, segments) = keys.into_spilled()?;
        let mut gold = GoldKeys::Spilled {
            file,
            segments,
            count: 0,
        };
        let (mut n, mut sum) = (0u64, 0u128);
        let mut part = Vec::new();
        for p in 0..PARTITIONS {
            if should_stop() {
                return Err(Stop::Interrupted);
            }
            gold.partition(p, &mut part)?;
            n += part.len() as u64;
            sum = part.iter().fold(sum, |s, &k| s.wrapping_add(k));
        }
        if let GoldKeys::Spilled { count, .. } = &mut gold {
            *count = n;
        }
        return Ok((gold, n, sum));
    }
    let mut all = Vec::new();
    keys.for_each_batch(should_stop, |_, batch| {
        // Batches come in partition order (or as one batch): sorted each, all are in order.
        batch.sort_unstable();
        all.extend_from_slice(batch);
        Ok(())
    })?;
    let (n, sum) = (
        all.len() as u64,
        all.iter().fold(0u128, |s, &k| s.wrapping_add(k)),
    );
    if all.len() <= DistinctKeys::in_memory_key_cap(&memory) {
        return Ok((GoldKeys::Memory(SortedKeys::new(all)), n, sum));
    }
    // Too many to keep beside a prediction's own: to disk, one segment per partition.
    let mut file = SpillFile::create(&memory).map_err(Stop::Spill)?;
    let mut segments = vec![Vec::new(); PARTITIONS];
    for run in all.chunk_by(|a, b| partition_of(*a) == partition_of(*b)) {
        let start = file.append(run).map_err(Stop::Spill)?;
        segments[partition_of(run[0])].push((start, run.len() as u64));
    }
    let gold = GoldKeys::Spilled {
        file,
        segments,
        count: n,
    };
    Ok((gold, n, sum))
}

#[cfg(test)]
pub(super) mod test {
    use super::*;

    pub(in crate::digest) fn digest_of(
        rows: &[Vec<ValueRef<'_>>],
        method: ResolvedMethod,
    ) -> Digest {
        let spec = DigestSpec {
            method,
            float_digits: Some(12),
            column_order: ColumnOrder::Strict,
            row_limit: None,
        };
        let mut acc = Accumulator::new(spec, 2, None);
        for r in rows {
            acc.add_row(r.iter().copied()).unwrap();
        }
        acc.finish(&|| false).unwrap()
    }

    use ValueRef::{Integer as I, Text as T};

    #[test]
    fn multiset_ignores_order_counts_duplicates() {
        let a = digest_of(
            &[vec![I(1), T(b"x")], vec![I(2), T(b"y")]],
            ResolvedMethod::Multiset,
        );
        let b = digest_of(
            &[vec![I(2), T(b"y")], vec![I(1), T(b"x")]],
            ResolvedMethod::Multiset,
        );
        assert_eq!(a, b);
        let c = digest_of(
            &[
                vec![I(1), T(b"x")],
                vec![I(1), T(b"x")],
                vec![I(2), T(b"y")],
            ],
            ResolvedMethod::Multiset,
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
            ResolvedMethod::Multiset,
        );
        let e = digest_of(
            &[vec![I(2), T(b"y")], vec![I(1), T(b"x")]],
            ResolvedMethod::Multiset,
        );
        assert_ne!(d.key, e.key);
    }

    #[test]
    fn row_key_is_not_a_sum_of_cells() {
        // {(1,"x"),(2,"y")} must differ from {(1,"y"),(2,"x")}.
        let a = digest_of(
            &[vec![I(1), T(b"x")], vec![I(2), T(b"y")]],
            ResolvedMethod::Multiset,
        );
        let b = digest_of(
            &[vec![I(1), T(b"y")], vec![I(2), T(b"x")]],
            ResolvedMethod::Multiset,
        );
        assert_eq!(a.rows, b.rows);
        assert_ne!(a.key, b.key);
    }

    #[test]
    fn ordered_sees_order_set_ignores_duplicates() {
        let rows = [vec![I(1), T(b"x")], vec![I(2), T(b"y")]];
        let rev = [vec![I(2), T(b"y")], vec![I(1), T(b"x")]];
        let a = digest_of(&rows, ResolvedMethod::Ordered);
        let b = digest_of(&rev, ResolvedMethod::Ordered);
        assert_ne!(a.key, b.key);
        assert_eq!(a.unordered_key, b.unordered_key);
        let dup = [
            vec![I(1), T(b"x")],
            vec![I(2), T(b"y")],
            vec![I(2), T(b"y")],
        ];
        assert_eq!(
            digest_of(&rows, ResolvedMethod::Set),
            digest_of(&dup, ResolvedMethod::Set)
        );
        assert_ne!(
            digest_of(&rows, ResolvedMethod::Multiset).key,
            digest_of(&dup, ResolvedMethod::Multiset).key
        );
    }

    #[test]
    fn row_limit_stops_early() {
        let spec = DigestSpec {
            method: ResolvedMethod::Multiset,
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
            method: ResolvedMethod::Multiset,
            float_digits: Some(12),
            column_order,
            row_limit: None,
        };
        let run = |order, rows: &[Vec<ValueRef<'_>>]| {
            let mut acc = Accumulator::new(spec(order), 2, None);
            for r in rows {
                acc.add_row(r.iter().copied()).unwrap();
            }
            acc.finish(&|| false).unwrap().key
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
            acc.finish(&|| false).unwrap().key
        };
        let mut single = Accumulator::new(spec(ColumnOrder::Ignore), 1, None);
        single.add_row([I(1)].into_iter()).unwrap();
        assert_ne!(
            one(ColumnOrder::Ignore),
            single.finish(&|| false).unwrap().key
        );
    }

    pub(in crate::digest) fn subset_gold(rows: &[i64], n: u64) -> Digest {
        let spec = DigestSpec {
            method: ResolvedMethod::Subset {
                op: crate::digest::SubsetOp::Exactly,
                n,
            },
            float_digits: None,
            column_order: ColumnOrder::Strict,
            row_limit: None,
        };
        let mut acc = Accumulator::new(spec, 1, None);
        for &r in rows {
            acc.add_row([I(r)].into_iter()).unwrap();
        }
        acc.finish(&|| false).unwrap()
    }

    #[test]
    fn a_subset_gold_keeps_its_distinct_keys_and_a_prediction_is_checked_against_them() {
        let gold = subset_gold(&[1, 2, 2, 3], 2);
        assert_eq!(gold.rows, 3);
        let keys = gold.gold_keys.clone().unwrap();
        assert_eq!(keys.count(), 3);
        let GoldKeys::Memory(sorted) = &*keys else {
            panic!("three keys are kept in memory")
        };
        assert!(sorted.keys().windows(2).all(|w| w[0] < w[1]));
        let spec = DigestSpec {
            method: gold.method,
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
        assert!(ok.finish(&|| false).unwrap().gold_keys.is_none());
    }
}
