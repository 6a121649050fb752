//! The distinct values of a one-column query and how many rows hold each, counted in a bounded hash
//! as the rows stream: what `GROUP BY v COLLATE BINARY` gives (mining's column facts), without
//! SQLite's sort of every row (it groups by sorting, however few the values). Past `max_bytes` of
//! groups it stops and answers None: the caller groups in SQL instead.

use std::collections::HashMap;

use rusqlite::types::{Value, ValueRef};

use crate::error::{GradeError, Result};
use crate::guard::{Budget, GuardedConnection};
use crate::rows::{bind, owned};

/// One group: a value of it (every value of a group reads the same as text or blob; numbers equal
/// as integer and real are one group), its rows, and the storage classes its rows hold
/// (`CLASSES`' bits).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub value: Value,
    pub rows: u64,
    pub classes: u8,
}

/// SQLite's storage classes other than NULL, by bit, as `typeof` names them.
pub const CLASSES: [&str; 4] = ["integer", "real", "text", "blob"];

/// What one group costs against `max_bytes` besides its key and value: the map's entry, about.
const GROUP_OVERHEAD: usize = 96;

/// The groups of `sql`'s one column (NULLs skipped, as GROUP BY's WHERE v IS NOT NULL does), in
/// the order first met; None when they pass `max_bytes`.
pub fn tally(
    gc: &GuardedConnection,
    sql: &str,
    params: &[Value],
    max_bytes: usize,
    budget: &Budget,
) -> Result<Option<Vec<Group>>> {
    let (mut stmt, _) = gc.prepare_checked(sql)?;
    if stmt.column_count() != 1 {
        return Err(GradeError::Invalid(format!(
            "a tally counts one column; the query returns {}",
            stmt.column_count()
        )));
    }
    bind(&mut stmt, params)?;
    gc.arm(budget)?;
    let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut bytes = 0usize;
    let mut key = Vec::new();
    let outcome = (|| {
        let mut rows = stmt.raw_query();
        while let Some(row) = rows.next()? {
            let v = row.get_ref_unwrap(0);
            let Some(class) = key_of(v, &mut key) else {
                continue;
            };
            if let Some(&at) = index.get(key.as_slice()) {
                let g = &mut groups[at];
                g.rows += 1;
                g.classes |= 1 << class;
                continue;
            }
            bytes = bytes.saturating_add(2 * key.len() + GROUP_OVERHEAD);
            if bytes > max_bytes {
                return Ok(false);
            }
            index.insert(key.clone(), groups.len());
            groups.push(Group {
                value: owned(v),
                rows: 1,
                classes: 1 << class,
            });
        }
        Ok::<bool, rusqlite::Error>(true)
    })();
    gc.disarm();
    let whole = outcome.map_err(|e| gc.classify_with(e, budget))?;
    Ok(whole.then_some(groups))
}

/// Write into `key` what makes two values one group, and answer the value's class (its bit in
/// CLASSES), or None for NULL. A real with an integer's value is that integer (SQLite compares
/// 1 and 1.0, and 0.0 and -0.0, as equal); texts and blobs by their bytes, apart from each other.
fn key_of(v: ValueRef<'_>, key: &mut Vec<u8>) -> Option<u8> {
    key.clear();
    // 2^63 as a float: a real at or past it, or below -2^63, is no i64.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    let class = match v {
        ValueRef::Null => return None,
        ValueRef::Integer(i) => {
            key.push(0);
            key.extend_from_slice(&i.to_le_bytes());
            0
        }
        ValueRef::Real(x) => {
            if x.fract() == 0.0 && (-LIMIT..LIMIT).contains(&x) {
                key.push(0);
                key.extend_from_slice(&(x as i64).to_le_bytes());
            } else {
                key.push(1);
                key.extend_from_slice(&x.to_bits().to_le_bytes());
            }
            1
        }
        ValueRef::Text(t) => {
            key.push(2);
            key.extend_from_slice(t);
            2
        }
        ValueRef::Blob(b) => {
            key.push(3);
            key.extend_from_slice(b);
            3
        }
    };
    Some(class)
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::memdb::{build, TableRows};
    use crate::rows::{rows, RowsLimits};

    fn db(values: Vec<Value>) -> GuardedConnection {
        build(
            "t",
            &["CREATE TABLE t (v)".into()],
            &[TableRows {
                name: "t".into(),
                columns: vec!["v".into()],
                rows: values.into_iter().map(|v| vec![v]).collect(),
            }],
            false,
            &Budget::new(5.0),
        )
        .unwrap()
    }

    #[test]
    fn groups_as_group_by_binary_does() {
        let values = vec![
            Value::Integer(1),
            Value::Real(1.0),
            Value::Real(-0.0),
            Value::Integer(0),
            Value::Real(1.5),
            Value::Text("a".into()),
            Value::Text("A".into()),
            Value::Text("a".into()),
            Value::Blob(b"a".to_vec()),
            Value::Null,
            Value::Integer(i64::MAX),
            Value::Real(9_223_372_036_854_775_808.0),
            Value::Integer(9_007_199_254_740_993),
            Value::Real(9_007_199_254_740_992.0),
        ];
        let gc = db(values);
        let budget = Budget::new(5.0);
        let got = tally(&gc, "SELECT v FROM t", &[], 1 << 20, &budget)
            .unwrap()
            .unwrap();
        let grouped = rows(
            &gc,
            "SELECT count(*), min(typeof(v)) = max(typeof(v)) FROM t WHERE v IS NOT NULL \
             GROUP BY v COLLATE BINARY",
            &[],
            RowsLimits::DEFAULT,
            &budget,
        )
        .unwrap();
        assert_eq!(got.len(), grouped.len());
        let mut counts: Vec<u64> = got.iter().map(|g| g.rows).collect();
        let mut want: Vec<u64> = grouped
            .iter()
            .map(|r| match r[0] {
                Value::Integer(n) => n as u64,
                _ => unreachable!(),
            })
            .collect();
        counts.sort();
        want.sort();
        assert_eq!(counts, want);
        let one = got.iter().find(|g| g.value == Value::Integer(1)).unwrap();
        assert_eq!((one.rows, one.classes), (2, 0b11));
        let a = got
            .iter()
            .find(|g| g.value == Value::Text("a".into()))
            .unwrap();
        assert_eq!((a.rows, a.classes), (2, 0b100));
    }

    #[test]
    fn past_max_bytes_it_answers_none_and_bad_queries_fail() {
        let gc = db((0..1000).map(Value::Integer).collect());
        let budget = Budget::new(5.0);
        assert!(tally(&gc, "SELECT v FROM t", &[], 10_000, &budget)
            .unwrap()
            .is_none());
        assert_eq!(
            tally(&gc, "SELECT v % 3 FROM t", &[], 10_000, &budget)
                .unwrap()
                .unwrap()
                .len(),
            3
        );
        assert!(matches!(
            tally(&gc, "SELECT v, v FROM t", &[], 10_000, &budget),
            Err(GradeError::Invalid(_))
        ));
        assert!(matches!(
            tally(&gc, "DELETE FROM t", &[], 10_000, &budget),
            Err(GradeError::Unsafe(_))
        ));
        let slow =
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x % 7 FROM c";
        assert!(matches!(
            tally(&gc, slow, &[], 10_000, &Budget::new(0.2)),
            Err(GradeError::Timeout(_))
        ));
    }
}
