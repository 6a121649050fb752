//! A subset gold's distinct row keys: `GoldKeys`, in memory or spilled to disk.
//!
//! In memory when they fit a quarter of the grading memory budget: sorted, with a directory on
//! their top bits, so a prediction's row is looked up where it can only be (a few keys to
//! compare) and its coverage is a bitset over the gold's keys — no second set. Past that they
//! stay in the spill file they were collected in, one list of segments per partition; a
//! prediction is then collected on its own (`DistinctKeys`) and checked one partition at a time.

use super::distinct::{partition_of, KeyTable, Segments, PARTITIONS, PARTITION_BITS};
use super::Stop;
use crate::spill::SpillFile;

#[derive(Debug)]
pub enum GoldKeys {
    Memory(SortedKeys),
    Spilled {
        file: SpillFile,
        segments: Vec<Segments>,
        count: u64,
    },
}

/// Sorted distinct keys, and where each value of their top `bits` bits starts.
#[derive(Debug)]
pub struct SortedKeys {
    keys: Vec<u128>,
    bits: u32,
    starts: Vec<u32>,
}

impl SortedKeys {
    /// `keys` must be sorted and distinct.
    pub fn new(keys: Vec<u128>) -> Self {
        // About two keys per directory entry.
        let bits = (usize::BITS - (keys.len() / 2).leading_zeros()).clamp(1, 26);
        let mut starts = vec![0u32; (1 << bits) + 1];
        let mut i = 0usize;
        for (b, start) in starts.iter_mut().enumerate() {
            while i < keys.len() && ((keys[i] >> (128 - bits)) as usize) < b {
                i += 1;
            }
            *start = i as u32;
        }
        SortedKeys { keys, bits, starts }
    }

    /// The key's place among the gold's keys, if it is one.
    #[inline]
    pub fn index_of(&self, key: u128) -> Option<usize> {
        let b = (key >> (128 - self.bits)) as usize;
        let (lo, hi) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        self.keys[lo..hi]
            .iter()
            .position(|&k| k == key)
            .map(|i| lo + i)
    }

    pub fn keys(&self) -> &[u128] {
        &self.keys
    }
}

impl GoldKeys {
    pub fn count(&self) -> u64 {
        match self {
            GoldKeys::Memory(s) => s.keys.len() as u64,
            GoldKeys::Spilled { count, .. } => *count,
        }
    }

    /// The distinct keys of partition `p`, in no order.
    pub fn partition(&self, p: usize, out: &mut Vec<u128>) -> Result<(), Stop> {
        self.partition_with_repeats(p, out)?;
        if let GoldKeys::Spilled { .. } = self {
            KeyTable::default().dedup(out);
        }
        Ok(())
    }

    /// The keys of partition `p`, in no order; a spilled gold's may repeat (across segments).
    fn partition_with_repeats(&self, p: usize, out: &mut Vec<u128>) -> Result<(), Stop> {
        out.clear();
        match self {
            GoldKeys::Memory(s) if s.bits >= PARTITION_BITS => {
                let shift = s.bits - PARTITION_BITS;
                let (lo, hi) = (p << shift, (p + 1) << shift);
                let (a, b) = (s.starts[lo] as usize, s.starts[hi] as usize);
                out.extend_from_slice(&s.keys[a..b]);
            }
            GoldKeys::Memory(s) => out.extend(s.keys.iter().filter(|&&k| partition_of(k) == p)),
            GoldKeys::Spilled { file, segments, .. } => {
                for &(start, n) in &segments[p] {
                    file.read_into(start, n, out).map_err(Stop::Spill)?;
                }
            }
        }
        Ok(())
    }

    /// Every key, sorted (the wire format's order): one partition at a time from disk.
    pub fn sorted(&self) -> Result<Vec<u128>, Stop> {
        match self {
            GoldKeys::Memory(s) => Ok(s.keys.clone()),
            GoldKeys::Spilled { count, .. } => {
                let mut all = Vec::with_capacity(*count as usize);
                let mut part = Vec::new();
                for p in 0..PARTITIONS {
                    self.partition(p, &mut part)?;
                    part.sort_unstable();
                    all.extend_from_slice(&part);
                }
                Ok(all)
            }
        }
    }

    /// Check a prediction's distinct keys, one batch at a time (`DistinctKeys::for_each_batch`):
    /// each must be a gold key. `table` and `gold` are scratch kept across batches.
    pub fn check_batch(
        &self,
        partition: Option<usize>,
        batch: &mut [u128],
        table: &mut KeyTable,
        gold: &mut Vec<u128>,
    ) -> Result<(), Stop> {
        let mut check = |p: usize, keys: &[u128]| -> Result<(), Stop> {
            // The table takes each key once: the gold's keys need no de-duplication first.
            self.partition_with_repeats(p, gold)?;
            table.reset(gold.len());
            for &k in gold.iter() {
                table.insert(k);
            }
            match keys.iter().all(|&k| table.contains(k)) {
                true => Ok(()),
                false => Err(Stop::NotInGold),
            }
        };
        match partition {
            Some(p) => check(p, batch),
            None => {
                batch.sort_unstable();
                for run in batch.chunk_by(|a, b| partition_of(*a) == partition_of(*b)) {
                    check(partition_of(run[0]), run)?;
                }
                Ok(())
            }
        }
    }
}

impl PartialEq for GoldKeys {
    fn eq(&self, other: &Self) -> bool {
        self.count() == other.count()
            && match (self.sorted(), other.sorted()) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            }
    }
}
impl Eq for GoldKeys {}

/// Which of the gold's keys a prediction has produced: one bit per gold key.
pub struct Coverage {
    bits: Vec<u64>,
    pub count: u64,
}

impl Coverage {
    pub fn new(gold: &SortedKeys) -> Self {
        Coverage {
            bits: vec![0; gold.keys.len().div_ceil(64)],
            count: 0,
        }
    }

    /// Mark gold key `i`; true when it is new.
    #[inline]
    pub fn mark(&mut self, i: usize) -> bool {
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        let new = self.bits[word] & bit == 0;
        self.bits[word] |= bit;
        self.count += new as u64;
        new
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn sorted_keys_find_each_key_and_nothing_else() {
        for n in [0usize, 1, 2, 3, 100, 5000] {
            let mut keys: Vec<u128> = (0..n as u64)
                .map(|i| xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes()))
                .collect();
            keys.sort_unstable();
            let s = SortedKeys::new(keys.clone());
            for (i, &k) in keys.iter().enumerate() {
                assert_eq!(s.index_of(k), Some(i));
            }
            assert_eq!(s.index_of(12345), None);
            assert_eq!(s.index_of(u128::MAX), None);
            // Partition by partition, the same keys.
            let gold = GoldKeys::Memory(s);
            let mut all = Vec::new();
            let mut part = Vec::new();
            for p in 0..PARTITIONS {
                gold.partition(p, &mut part).unwrap();
                assert!(part.iter().all(|&k| partition_of(k) == p));
                all.extend_from_slice(&part);
            }
            assert_eq!(all, keys);
        }
    }
}
