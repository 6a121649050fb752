//! The distinct row keys of a result, in bounded memory: `DistinctKeys`.
//!
//! Keys are uniform 128-bit hashes, so their top bits split them evenly: keys are appended to
//! one of 256 partitions by their top byte (sequential writes, no hash table over the whole
//! result). When the partitions hold the memory budget's worth of keys they go to an anonymous
//! spill file as one segment per partition, de-duplicated first (in a table small enough for the
//! CPU's cache) when a sampled partition repeats itself or an early stop needs the count. At the
//! end each partition (its segments and what is still in memory) is de-duplicated on its own, so
//! memory is one partition's keys, whatever the result's size. Under a small row limit (a
//! prediction against a small gold) every key is checked as it comes instead, so the stop comes at
//! the first distinct key past the limit. Nothing is sorted but a subset gold's keys, once.

use std::sync::Arc;

use super::Stop;
use crate::spill::{GradeMemory, SpillFile};

pub const PARTITION_BITS: u32 = 8;
pub const PARTITIONS: usize = 1 << PARTITION_BITS;

#[inline]
pub fn partition_of(key: u128) -> usize {
    (key >> (128 - PARTITION_BITS)) as usize
}

/// Keys appended before they are spread over the partitions (small results never are).
const PENDING: usize = 1 << 15;

/// An open-addressing set of keys for one partition or one batch: the slot is the key's low
/// bits (already uniform), 0 marks an empty slot and the key 0 is kept aside.
#[derive(Default)]
pub struct KeyTable {
    slots: Vec<u128>,
    mask: usize,
    has_zero: bool,
}

impl KeyTable {
    /// Empty the table and size it for `n` keys (at most half full).
    pub fn reset(&mut self, n: usize) {
        let size = (2 * n).next_power_of_two().max(16);
        self.slots.clear();
        self.slots.resize(size, 0);
        self.mask = size - 1;
        self.has_zero = false;
    }

    /// Insert `key`; true when it was not there.
    #[inline]
    pub fn insert(&mut self, key: u128) -> bool {
        if key == 0 {
            return !std::mem::replace(&mut self.has_zero, true);
        }
        let mut i = key as usize & self.mask;
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                self.slots[i] = key;
                return true;
            }
            if slot == key {
                return false;
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub fn contains(&self, key: u128) -> bool {
        if key == 0 {
            return self.has_zero;
        }
        let mut i = key as usize & self.mask;
        loop {
            let slot = self.slots[i];
            if slot == key {
                return true;
            }
            if slot == 0 {
                return false;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Keep the first occurrence of each key of `keys`, in place (order otherwise kept).
    pub fn dedup(&mut self, keys: &mut Vec<u128>) {
        if keys.len() < 2 {
            return;
        }
        self.reset(keys.len());
        let mut kept = 0;
        for i in 0..keys.len() {
            let k = keys[i];
            if self.insert(k) {
                keys[kept] = k;
                kept += 1;
            }
        }
        keys.truncate(kept);
    }
}

/// When a result's first keys are first de-duplicated: just past the row limit, if any.
fn first_drain(row_limit: Option<u64>, pending_cap: usize) -> usize {
    match row_limit {
        Some(limit) => limit.saturating_add(1).min(pending_cap as u64) as usize,
        None => pending_cap,
    }
}

/// Where one spilled partition's keys lie in the spill file: (first key, count) per segment.
pub type Segments = Vec<(u64, u64)>;

/// The distinct keys of a result as they stream in.
pub struct DistinctKeys {
    memory: Arc<GradeMemory>,
    /// Keys held in the partitions before a flush.
    cap: usize,
    pending_cap: usize,
    /// `pending`'s length at which it is next de-duplicated: past a large row limit, then each
    /// time the kept keys double.
    drain_at: usize,
    pending: Vec<u128>,
    /// Whether a full `pending` is de-duplicated before it is spread (worth it while it finds
    /// duplicates: a result of few distinct rows then never grows).
    dedup_pending: bool,
    /// Empty until the first spread.
    parts: Vec<Vec<u128>>,
    in_parts: usize,
    spill: Option<SpillFile>,
    /// For each partition, its segments in the spill file.
    segments: Vec<Segments>,
    /// Stop once more than this many distinct keys are known.
    row_limit: Option<u64>,
    /// Keys pushed, repeats included.
    pushed: u64,
    /// Keys go straight to their partitions (once batches are seen not to repeat themselves).
    direct: bool,
    /// Under a small row limit: the distinct keys seen, checked one by one (never more than
    /// the limit and one, so never past half full).
    exact: Option<KeyTable>,
    table: KeyTable,
}

impl DistinctKeys {
    pub fn new(memory: Arc<GradeMemory>, row_limit: Option<u64>) -> Self {
        // A partition's Vec may hold up to twice its keys (growth), hence / 32 and not / 16.
        let cap = (memory.bytes / 32).max(1024) as usize;
        let pending_cap = PENDING.min(cap / 4);
        DistinctKeys {
            memory,
            cap,
            pending_cap,
            drain_at: first_drain(row_limit, pending_cap),
            pending: Vec::new(),
            dedup_pending: true,
            parts: Vec::new(),
            in_parts: 0,
            spill: None,
            segments: Vec::new(),
            row_limit,
            pushed: 0,
            direct: false,
            exact: row_limit
                .filter(|&limit| limit < (pending_cap / 2) as u64)
                .map(|limit| {
                    let mut seen = KeyTable::default();
                    seen.reset(limit as usize + 1);
                    seen
                }),
            table: KeyTable::default(),
        }
    }

    /// Keys a subset gold may keep in memory (a quarter of the budget); more stay on disk.
    pub fn in_memory_key_cap(memory: &GradeMemory) -> usize {
        (memory.bytes / 64) as usize
    }

    #[inline]
    pub fn push(&mut self, key: u128) -> Result<(), Stop> {
        if let Some(seen) = &mut self.exact {
            // A small limit: every key checked as it comes, so the stop is at the first
            // distinct key past it (a DISTINCT over a huge join yields its few rows early).
            if seen.insert(key) {
                self.pending.push(key);
                if self.pending.len() as u64 > self.row_limit.unwrap_or(u64::MAX) {
                    return Err(Stop::RowLimit);
                }
            }
            return Ok(());
        }
        self.pushed += 1;
        if self.direct {
            self.parts[partition_of(key)].push(key);
            self.in_parts += 1;
            if self.in_parts >= self.cap {
                return self.flush();
            }
            return Ok(());
        }
        self.pending.push(key);
        if self.pending.len() >= self.drain_at {
            self.drain_pending()?;
        }
        Ok(())
    }

    #[inline(never)]
    fn drain_pending(&mut self) -> Result<(), Stop> {
        if self.dedup_pending {
            let before = self.pending.len();
            self.table.dedup(&mut self.pending);
            let kept = self.pending.len();
            if self.parts.is_empty() && self.spill.is_none() {
                self.check_limit(kept as u64)?;
            }
            if kept <= self.pending_cap / 2 {
                // Room again (this result repeats itself): keep it here, de-duplicated again
                // once it has doubled, so each key costs a constant.
                self.drain_at = (2 * kept)
                    .max(first_drain(self.row_limit, self.pending_cap))
                    .min(self.pending_cap);
                return Ok(());
            }
            // Few duplicates within a batch: spreading without this pass is cheaper.
            self.dedup_pending = kept < before - before / 4;
        }
        self.drain_at = self.pending_cap;
        self.spread();
        // Batches that do not repeat themselves go straight to their partitions from now on.
        self.direct = !self.dedup_pending;
        if self.in_parts >= self.cap {
            self.flush()?;
        }
        Ok(())
    }

    fn spread(&mut self) {
        if self.parts.is_empty() {
            // Sized for a flush's share and a quarter more: no copies as they grow.
            let share = self.cap / PARTITIONS;
            self.parts = (0..PARTITIONS)
                .map(|_| Vec::with_capacity(share + share / 4 + 16))
                .collect();
        }
        for &k in &self.pending {
            self.parts[partition_of(k)].push(k);
        }
        self.in_parts += self.pending.len();
        self.pending.clear();
    }

    /// `distinct`: the size of a de-duplicated batch, so at least the result's distinct keys.
    fn check_limit(&self, distinct: u64) -> Result<(), Stop> {
        match self.row_limit {
            Some(limit) if distinct > limit => Err(Stop::RowLimit),
            _ => Ok(()),
        }
    }

    /// The partitions hold the budget's worth: spill them, de-duplicated first when they repeat
    /// or an early stop needs their count (and kept, when that leaves them under half of it).
    fn flush(&mut self) -> Result<(), Stop> {
        // A pass over every partition is worth it when the keys repeat (it saves disk), or to
        // tell an early stop (the keys pushed so far could pass the limit). One partition, a
        // uniform sample of the keys, says whether they repeat.
        let before = self.parts[0].len();
        self.table.dedup(&mut self.parts[0]);
        let repeats = before - self.parts[0].len() > before / 16;
        let bound_needed = self.row_limit.is_some_and(|limit| self.pushed > limit);
        if !(repeats || bound_needed) {
            return self.spill_parts();
        }
        let mut distinct = 0;
        for part in &mut self.parts {
            self.table.dedup(part);
            distinct += part.len();
        }
        self.in_parts = distinct;
        self.check_limit(distinct as u64)?;
        if distinct > self.cap / 2 {
            self.spill_parts()?;
        }
        Ok(())
    }

    fn spill_parts(&mut self) -> Result<(), Stop> {
        if self.spill.is_none() {
            self.spill = Some(SpillFile::create(&self.memory).map_err(Stop::Spill)?);
            self.segments = vec![Vec::new(); PARTITIONS];
        }
        let file = self.spill.as_mut().unwrap();
        for (p, part) in self.parts.iter_mut().enumerate() {
            if part.is_empty() {
                continue;
            }
            let start = file.append(part).map_err(Stop::Spill)?;
            self.segments[p].push((start, part.len() as u64));
            part.clear();
        }
        self.in_parts = 0;
        Ok(())
    }

    pub fn memory(&self) -> Arc<GradeMemory> {
        Arc::clone(&self.memory)
    }

    pub fn has_spilled(&self) -> bool {
        self.spill.is_some()
    }

    /// Hand every distinct key to `each`, a batch at a time: `Some(p)` when the batch is all of
    /// partition `p` (batches come in partition order), `None` for one batch of a small result
    /// in no order. `should_stop` is asked between partitions (deadline, cancel).
    pub fn for_each_batch(
        mut self,
        should_stop: &dyn Fn() -> bool,
        mut each: impl FnMut(Option<usize>, &mut Vec<u128>) -> Result<(), Stop>,
    ) -> Result<(), Stop> {
        if self.parts.is_empty() && self.spill.is_none() {
            if self.exact.is_none() {
                // (Under a small limit `pending` holds each key once already.)
                self.table.dedup(&mut self.pending);
            }
            self.check_limit(self.pending.len() as u64)?;
            let mut keys = std::mem::take(&mut self.pending);
            return each(None, &mut keys);
        }
        self.spread();
        if self.spill.is_some() {
            // What is still in memory joins the file first: then only one partition at a time
            // is in memory (its keys and its table), not that one beside every other's rest.
            self.spill_parts()?;
            self.parts.iter_mut().for_each(|part| *part = Vec::new());
        }
        let mut batch = Vec::new();
        for p in 0..PARTITIONS {
            if should_stop() {
                return Err(Stop::Interrupted);
            }
            batch.clear();
            if let Some(file) = &self.spill {
                for &(start, count) in &self.segments[p] {
                    file.read_into(start, count, &mut batch)
                        .map_err(Stop::Spill)?;
                }
            }
            batch.append(&mut self.parts[p]);
            self.parts[p] = Vec::new(); // give its memory back as we go
            self.table.dedup(&mut batch);
            each(Some(p), &mut batch)?;
        }
        Ok(())
    }

    /// Spill what is still in memory and give the file and each partition's segments: a
    /// subset gold too large to keep in memory keeps them as its key store.
    pub fn into_spilled(mut self) -> Result<(SpillFile, Vec<Segments>), Stop> {
        if !self.pending.is_empty() {
            self.spread();
        }
        if !self.parts.is_empty() {
            for part in &mut self.parts {
                self.table.dedup(part);
            }
            self.spill_parts()?;
        }
        let file = match self.spill.take() {
            Some(f) => f,
            None => SpillFile::create(&self.memory).map_err(Stop::Spill)?,
        };
        Ok((file, std::mem::take(&mut self.segments)))
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::spill::MIN_MEMORY_BYTES;

    fn key(i: u64) -> u128 {
        xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes())
    }

    fn tiny(dir: &std::path::Path) -> Arc<GradeMemory> {
        Arc::new(GradeMemory {
            bytes: MIN_MEMORY_BYTES,
            tmp_dir: Some(dir.to_path_buf()),
        })
    }

    fn count_and_sum(d: DistinctKeys) -> (u64, u128) {
        let (mut n, mut sum) = (0u64, 0u128);
        d.for_each_batch(&|| false, |_, keys| {
            n += keys.len() as u64;
            sum = keys.iter().fold(sum, |s, &k| s.wrapping_add(k));
            Ok(())
        })
        .unwrap();
        (n, sum)
    }

    #[test]
    fn distinct_keys_are_counted_once_whether_or_not_they_spill() {
        let dir = tempfile::tempdir().unwrap();
        // 40,000 distinct keys, each three times, the repeats far apart: a 64 KiB budget
        // (2,048 keys) spills many segments; the default budget does not spill at all.
        let n = 40_000u64;
        let expect_sum = (0..n).fold(0u128, |s, i| s.wrapping_add(key(i)));
        for memory in [tiny(dir.path()), Arc::new(GradeMemory::default())] {
            let mut d = DistinctKeys::new(Arc::clone(&memory), None);
            for round in 0..3 {
                for i in 0..n {
                    d.push(key((i * 7919 + round) % n)).unwrap();
                }
            }
            assert_eq!(d.has_spilled(), memory.bytes == MIN_MEMORY_BYTES);
            assert_eq!(count_and_sum(d), (n, expect_sum));
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        }
    }

    #[test]
    fn a_row_limit_stops_once_more_distinct_keys_are_known() {
        let dir = tempfile::tempdir().unwrap();
        // A limit under the budget's keys stops at the first batch past it; one above it is
        // only known at the end (Accumulator::finish checks the count).
        let mut d = DistinctKeys::new(tiny(dir.path()), Some(1000));
        let mut pushed = 0;
        let stopped = (0..100_000u64).map(key).try_for_each(|k| {
            pushed += 1;
            d.push(k)
        });
        assert_eq!(stopped, Err(Stop::RowLimit));
        assert!(pushed <= 4096, "stopped after {pushed} keys");
        // A small limit stops at the first distinct key past it, repeats or not.
        for limit in [1u64, 10, 200] {
            let mut d = DistinctKeys::new(tiny(dir.path()), Some(limit));
            let mut pushed = 0u64;
            let stopped = (0..100_000u64).map(|i| key(i / 3)).try_for_each(|k| {
                pushed += 1;
                d.push(k)
            });
            assert_eq!(stopped, Err(Stop::RowLimit));
            assert_eq!(pushed, 3 * limit + 1, "limit {limit}");
        }
        // Many repeats of few keys never reach it.
        let mut d = DistinctKeys::new(tiny(dir.path()), Some(10));
        for i in 0..100_000u64 {
            d.push(key(i % 10)).unwrap();
        }
        assert!(!d.has_spilled());
        assert_eq!(count_and_sum(d).0, 10);
    }

    #[test]
    fn the_key_zero_is_a_key_like_any_other() {
        let mut t = KeyTable::default();
        let mut keys = vec![0, 5, 0, 5, 7];
        t.dedup(&mut keys);
        assert_eq!(keys, vec![0, 5, 7]);
        assert!(t.contains(0) && t.contains(7) && !t.contains(6));
    }

    #[test]
    fn interrupting_the_end_stops_between_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = DistinctKeys::new(tiny(dir.path()), None);
        for i in 0..50_000u64 {
            d.push(key(i)).unwrap();
        }
        assert!(d.has_spilled());
        let r = d.for_each_batch(&|| true, |_, _| Ok(()));
        assert_eq!(r, Err(Stop::Interrupted));
    }
}
