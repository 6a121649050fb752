//! The wire format of a digest (the gold cache on disk, worker processes).

use std::sync::Arc;

use super::keyset::SortedKeys;
use super::{ColumnOrder, Digest, GoldKeys, ResolvedMethod, Stop, SubsetOp};
use crate::canon;

const WIRE_MAGIC: &[u8; 4] = b"T2D2";
/// The first format: multiset, ordered and set digests, columns in order.
const WIRE_MAGIC_V1: &[u8; 4] = b"T2D1";
const WIRE_V1_LEN: usize = 4 + 1 + 1 + 8 + 4 + 16 + 16 + 8;
const WIRE_HEAD_LEN: usize = 4 + 1 + 8 + 1 + 1 + 8 + 4 + 16 + 16 + 8 + 8;
/// In the key count's place: no keys follow but the gold's SQL (its length, then UTF-8), for a
/// subset gold too large to carry its keys (Digest::gold_sql).
const KEYS_BY_SQL: u64 = u64::MAX;

impl Digest {
    /// A fixed little-endian layout: magic, method (tag: 0 multiset, 1 ordered, 2 set, a subset its
    /// operator's, `SubsetOp::tag`; and the subset count), float digits,
    /// column order, counts, keys, secret id, then a subset gold's distinct keys, sorted (read
    /// back from disk for a gold that spilled; the error is that read's).
    pub fn to_bytes(&self) -> Result<Vec<u8>, String> {
        let by_sql = match (self.gold_keys.as_deref(), &self.gold_sql) {
            (Some(GoldKeys::Spilled { .. }) | None, Some(sql)) => Some(sql),
            _ => None,
        };
        let keys = match (self.gold_keys.as_deref(), by_sql) {
            (Some(gold), None) => gold.sorted().map_err(|stop| match stop {
                Stop::Spill(m) => m,
                other => format!("{other:?}"),
            })?,
            _ => Vec::new(),
        };
        let mut b = Vec::with_capacity(WIRE_HEAD_LEN + 16 * keys.len());
        b.extend_from_slice(WIRE_MAGIC);
        let (tag, n) = match self.method {
            ResolvedMethod::Multiset => (0u8, 0u64),
            ResolvedMethod::Ordered => (1, 0),
            ResolvedMethod::Set => (2, 0),
            ResolvedMethod::Subset { op, n } => (op.tag(), n),
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
        if let Some(sql) = by_sql {
            b.extend_from_slice(&KEYS_BY_SQL.to_le_bytes());
            b.extend_from_slice(&(sql.len() as u64).to_le_bytes());
            b.extend_from_slice(sql.as_bytes());
            return Ok(b);
        }
        b.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for k in keys {
            b.extend_from_slice(&k.to_le_bytes());
        }
        Ok(b)
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
            let method = match data[4] {
                0 => ResolvedMethod::Multiset,
                1 => ResolvedMethod::Ordered,
                2 => ResolvedMethod::Set,
                _ => return Err("unknown grading method".into()),
            };
            return Ok(Digest {
                method,
                float_digits: digits(data[5])?,
                column_order: ColumnOrder::Strict,
                rows: u64_at(6),
                columns: u32::from_le_bytes(data[14..18].try_into().unwrap()),
                key: u128_at(18),
                unordered_key: u128_at(34),
                secret_id: u64_at(50),
                gold_keys: None,
                gold_sql: None,
            });
        }
        if data.len() < WIRE_HEAD_LEN || &data[..4] != WIRE_MAGIC {
            return Err("wrong length or header".into());
        }
        let n = u64_at(5);
        let method = match data[4] {
            0 => ResolvedMethod::Multiset,
            1 => ResolvedMethod::Ordered,
            2 => ResolvedMethod::Set,
            tag => match SubsetOp::from_tag(tag) {
                Some(op) if n >= 1 => ResolvedMethod::Subset { op, n },
                _ => return Err("unknown grading method".into()),
            },
        };
        let column_order = match data[14] {
            0 => ColumnOrder::Strict,
            1 => ColumnOrder::Ignore,
            _ => return Err("bad column order".into()),
        };
        let is_subset = matches!(method, ResolvedMethod::Subset { .. });
        let mut gold_sql = None;
        let mut nkeys = u64_at(WIRE_HEAD_LEN - 8);
        if nkeys == KEYS_BY_SQL {
            let tail = &data[WIRE_HEAD_LEN..];
            let len = tail
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
            let sql = match len {
                Some(n) if is_subset && n.checked_add(8) == Some(tail.len() as u64) => {
                    std::str::from_utf8(&tail[8..])
                        .map_err(|_| "the gold SQL is not UTF-8".to_string())?
                }
                _ => return Err("wrong length for its gold SQL".into()),
            };
            gold_sql = Some(Arc::from(sql));
            nkeys = 0;
        } else if data.len() as u64 != WIRE_HEAD_LEN as u64 + 16 * nkeys.min(u64::MAX / 32) {
            return Err("wrong length for its keys".into());
        }
        let nkeys = nkeys as usize;
        if !is_subset && nkeys > 0 {
            return Err("row keys on a digest that keeps none".into());
        }
        let gold_keys = match is_subset && gold_sql.is_none() {
            false => None,
            true => {
                let keys: Vec<u128> = (0..nkeys)
                    .map(|i| u128_at(WIRE_HEAD_LEN + 16 * i))
                    .collect();
                if keys.len() as u64 != u64_at(15) || keys.windows(2).any(|w| w[0] >= w[1]) {
                    return Err("subset keys are not the gold's sorted distinct rows".into());
                }
                Some(Arc::new(GoldKeys::Memory(SortedKeys::new(keys))))
            }
        };
        Ok(Digest {
            method,
            float_digits: digits(data[13])?,
            column_order,
            rows: u64_at(15),
            columns: u32::from_le_bytes(data[23..27].try_into().unwrap()),
            key: u128_at(27),
            unordered_key: u128_at(43),
            secret_id: u64_at(59),
            gold_keys,
            gold_sql,
        })
    }
}

#[cfg(test)]
mod test {
    use rusqlite::types::ValueRef::{Integer as I, Text as T};

    use super::*;
    use crate::digest::accumulator::test::{digest_of, subset_gold};
    use crate::digest::secret_id;

    #[test]
    fn wire_format_round_trips_and_refuses_damage() {
        let set = digest_of(
            &[vec![I(1), T(b"x")], vec![I(2), T(b"y")]],
            ResolvedMethod::Set,
        );
        for d in [set, subset_gold(&[4, 5, 6], 2), subset_gold(&[], 1)] {
            let bytes = d.to_bytes().unwrap();
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
        let d = subset_gold(&[4, 5, 6], 2);
        let mut bytes = d.to_bytes().unwrap();
        let keys_at = bytes.len() - 3 * 16;
        let (first, last) = (keys_at..keys_at + 16, keys_at + 32..keys_at + 48);
        let a: Vec<u8> = bytes[first.clone()].to_vec();
        let z: Vec<u8> = bytes[last.clone()].to_vec();
        bytes[first].copy_from_slice(&z);
        bytes[last].copy_from_slice(&a);
        assert!(Digest::from_bytes(&bytes).is_err());
        // The first format still reads: a multiset digest, columns in order.
        let m = digest_of(&[vec![I(1), T(b"x")]], ResolvedMethod::Multiset);
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

    /// Gold caches on disk hold these bytes: each method's tag and count read back as they always
    /// have, whatever is added to the subset operators' table.
    #[test]
    fn the_method_tags_on_disk_do_not_change() {
        let pinned = [
            (0u8, 0u64, ResolvedMethod::Multiset),
            (1, 0, ResolvedMethod::Ordered),
            (2, 0, ResolvedMethod::Set),
            (
                3,
                7,
                ResolvedMethod::Subset {
                    op: SubsetOp::Exactly,
                    n: 7,
                },
            ),
            (
                4,
                2,
                ResolvedMethod::Subset {
                    op: SubsetOp::AtLeast,
                    n: 2,
                },
            ),
        ];
        for (tag, n, method) in pinned {
            // A digest of no rows (no keys follow), written out by hand.
            let mut b = WIRE_MAGIC.to_vec();
            b.push(tag);
            b.extend_from_slice(&n.to_le_bytes());
            b.push(12); // float digits
            b.push(0); // columns in order
            b.extend_from_slice(&0u64.to_le_bytes()); // rows
            b.extend_from_slice(&1u32.to_le_bytes()); // columns
            b.extend_from_slice(&[0; 32]); // key, unordered key
            b.extend_from_slice(&secret_id().to_le_bytes());
            b.extend_from_slice(&0u64.to_le_bytes()); // no keys
            let d = Digest::from_bytes(&b).unwrap();
            assert_eq!(d.method, method, "tag {tag}");
            assert_eq!(d.to_bytes().unwrap(), b, "tag {tag}");
        }
    }

    #[test]
    fn every_subset_operator_round_trips() {
        for op in SubsetOp::ALL {
            let method = ResolvedMethod::Subset { op: *op, n: 2 };
            let d = Digest {
                method,
                ..subset_gold(&[4, 5, 6], 2)
            };
            let bytes = d.to_bytes().unwrap();
            assert_eq!(Digest::from_bytes(&bytes).unwrap(), d, "{op:?}");
        }
    }
}
