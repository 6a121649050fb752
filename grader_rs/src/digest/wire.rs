//! The wire format of a digest (the gold cache on disk, worker processes).

use std::sync::Arc;

use super::{ColumnOrder, Digest, Semantics};
use crate::canon;

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

#[cfg(test)]
mod test {
    use rusqlite::types::ValueRef::{Integer as I, Text as T};

    use super::*;
    use crate::digest::accumulator::test::{digest_of, subset_gold};

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
