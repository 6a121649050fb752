//! Perturbed in-memory copies of a database, for the equivalence check: a prediction that
//! matches the gold on the real database but differs on a perturbed copy is not equivalent.
//!
//! Copies are made by the core with its own SQL on a private in-memory connection (the
//! model's SQL never touches them while they are writable), then hardened like any other
//! connection, with `query_only` on and writes to main refused. Each perturbation keeps the
//! database a valid state of its schema as far as SQLite enforces it:
//! - `sample`: about a third of each table's rows deleted (foreign keys, which SQLite does not
//!   enforce here, may dangle; queries equal only under referential integrity can be told apart);
//! - `duplicate`: about a third of each table's rows inserted again under a fresh primary key
//!   (the next rowid, a number above the largest, or the text key + "~dup"), so each copy is a
//!   new entity with the same attributes; rows that would break a UNIQUE constraint are skipped;
//! - `shuffle`: in each table, the values of one column that is neither a key nor under a
//!   UNIQUE index are permuted across rows;
//! - `nullify`: in each table, about a third of the values of one nullable column that is
//!   neither a key nor under a UNIQUE index become NULL (tells COUNT(col) from COUNT(*), a
//!   missing IS NOT NULL, inner from outer joins).
//!
//! Rows are chosen by a keyed hash of the rowid: the same seed gives the same copy.

use std::time::Duration;

use rusqlite::backup::Backup;
use rusqlite::functions::FunctionFlags;
use rusqlite::{Connection, OpenFlags};

use crate::error::{GradeError, Result};
use crate::guard::GuardedConnection;

/// Largest database copied into memory by default.
pub const DEFAULT_MAX_BYTES: u64 = 256 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perturbation {
    Sample,
    Duplicate,
    Shuffle,
    Nullify,
}

impl Perturbation {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "sample" => Some(Perturbation::Sample),
            "duplicate" => Some(Perturbation::Duplicate),
            "shuffle" => Some(Perturbation::Shuffle),
            "nullify" => Some(Perturbation::Nullify),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Perturbation::Sample => "sample",
            Perturbation::Duplicate => "duplicate",
            Perturbation::Shuffle => "shuffle",
            Perturbation::Nullify => "nullify",
        }
    }
}

/// splitmix64 of seed and value: a deterministic, well-spread choice per row.
fn mix(seed: u64, x: u64) -> u64 {
    let mut z = seed ^ x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

struct Column {
    name: String,
    decl_type: String,
    pk: bool,
    not_null: bool,
}

fn columns(conn: &Connection, table: &str) -> rusqlite::Result<Vec<Column>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT name, type, pk, \"notnull\" FROM pragma_table_info({})",
        sql_str(table)
    ))?;
    let rows = stmt.query_map([], |r| {
        Ok(Column {
            name: r.get(0)?,
            decl_type: r.get::<_, String>(1)?.to_ascii_uppercase(),
            pk: r.get::<_, i64>(2)? > 0,
            not_null: r.get::<_, i64>(3)? != 0,
        })
    })?;
    rows.collect()
}

fn unique_columns(conn: &Connection, table: &str) -> rusqlite::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stmt = conn.prepare(&format!(
        "SELECT ii.name FROM pragma_index_list({t}) AS il, pragma_index_info(il.name) AS ii WHERE il.\"unique\"",
        t = sql_str(table)
    ))?;
    for name in stmt.query_map([], |r| r.get::<_, Option<String>>(0))? {
        if let Some(n) = name? {
            out.push(n);
        }
    }
    Ok(out)
}

/// One column of `table`, chosen by `seed`, that is neither a key nor under a UNIQUE index
/// (and nullable, when `nullable`), quoted for SQL; None when there is none.
fn pick_free_column(
    conn: &Connection,
    table: &str,
    cols: &[Column],
    seed: u64,
    index: usize,
    nullable: bool,
) -> rusqlite::Result<Option<String>> {
    let unique = unique_columns(conn, table)?;
    let candidates: Vec<&Column> = cols
        .iter()
        .filter(|c| {
            let keyed = c.pk || unique.iter().any(|u| u.eq_ignore_ascii_case(&c.name));
            let nullable_ok = !nullable || !c.not_null;
            !keyed && nullable_ok
        })
        .collect();
    if candidates.is_empty() {
        return Ok(None);
    }
    Ok(Some(quote(
        &candidates[(mix(seed, index as u64) % candidates.len() as u64) as usize].name,
    )))
}

fn sql_str(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// An in-memory copy of `src`'s database with `kind` applied under `seed`, hardened.
pub fn perturbed_copy(
    src: &GuardedConnection,
    kind: Perturbation,
    seed: u64,
    max_bytes: u64,
) -> Result<GuardedConnection> {
    let size = std::fs::metadata(&src.path).map(|m| m.len()).unwrap_or(0);
    if size > max_bytes {
        return Err(GradeError::Invalid(format!(
            "database {} is {size} bytes, above the {max_bytes}-byte cap for perturbed in-memory copies",
            src.path
        )));
    }
    let fail = |e: rusqlite::Error| {
        GradeError::Database(format!("cannot make a perturbed copy of {}: {e}", src.path))
    };
    // Through the core's VFS, so the copy's queries are capped on temporary disk like any other.
    let vfs = crate::tempfiles::vfs_name().map_err(GradeError::Database)?;
    let mut dst =
        Connection::open_in_memory_with_flags_and_vfs(OpenFlags::default(), vfs).map_err(fail)?;
    Backup::new(&src.conn, &mut dst)
        .and_then(|b| b.run_to_completion(4096, Duration::ZERO, None))
        .map_err(fail)?;
    // Foreign keys stay unenforced here, as in the source (the bundled build turns them on by
    // default): a sample may leave references dangling, and no cascade rewrites other tables.
    dst.pragma_update(None, "foreign_keys", false)
        .map_err(fail)?;
    dst.pragma_update(None, "temp_store", "MEMORY")
        .map_err(fail)?;
    dst.create_scalar_function(
        "t2sql_mix",
        2,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            let seed: i64 = ctx.get(0)?;
            let x: i64 = ctx.get(1)?;
            Ok((mix(seed as u64, x as u64) >> 1) as i64)
        },
    )
    .map_err(fail)?;
    let tables: Vec<String> = {
        let mut stmt = dst
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name")
            .map_err(fail)?;
        let names = stmt.query_map([], |r| r.get(0)).map_err(fail)?;
        names.collect::<rusqlite::Result<_>>().map_err(fail)?
    };
    for (index, table) in tables.iter().enumerate() {
        let t = quote(table);
        // WITHOUT ROWID tables (no rowid to key the choice on) are left as they are.
        if dst
            .prepare(&format!("SELECT rowid FROM {t} LIMIT 0"))
            .is_err()
        {
            continue;
        }
        let cols = columns(&dst, table).map_err(fail)?;
        // Each table draws its rows independently (the same rowids in two tables are not
        // chosen together); the constant is the bytes of "table".
        let seed_sql = (mix(seed, index as u64 ^ 0x74_61_62_6c_65) >> 1) as i64;
        // A table-level failure (a CHECK constraint, say) leaves that table unperturbed.
        let _ = match kind {
            Perturbation::Sample => dst.execute(
                &format!("DELETE FROM {t} WHERE t2sql_mix(?1, rowid) % 3 = 0"),
                [seed_sql],
            ),
            Perturbation::Duplicate => {
                let pk_count = cols.iter().filter(|c| c.pk).count();
                let first_pk = cols.iter().position(|c| c.pk);
                let names: Vec<String> = cols.iter().map(|c| quote(&c.name)).collect();
                let values: Vec<String> = cols
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let name = quote(&c.name);
                        if c.pk && pk_count == 1 && c.decl_type == "INTEGER" {
                            // The rowid alias: NULL takes the next free key.
                            "NULL".into()
                        } else if Some(i) == first_pk {
                            // Any other key gets a fresh value above (or beside) every existing one,
                            // so the copy is a new entity with the same attributes.
                            format!(
                                "CASE WHEN typeof({name}) IN ('integer', 'real') \
                                 THEN {name} + (SELECT max({name}) FROM {t}) + 1 \
                                 ELSE CAST({name} AS TEXT) || '~dup' END"
                            )
                        } else {
                            name
                        }
                    })
                    .collect();
                dst.execute(
                    &format!(
                        "INSERT OR IGNORE INTO {t} ({}) SELECT {} FROM {t} WHERE t2sql_mix(?1, rowid) % 3 = 0 ORDER BY rowid",
                        names.join(", "),
                        values.join(", ")
                    ),
                    [seed_sql],
                )
            }
            Perturbation::Nullify => {
                let Some(c) =
                    pick_free_column(&dst, table, &cols, seed, index, true).map_err(fail)?
                else {
                    continue;
                };
                dst.execute(
                    &format!("UPDATE {t} SET {c} = NULL WHERE t2sql_mix(?1, rowid) % 3 = 0"),
                    [seed_sql],
                )
            }
            Perturbation::Shuffle => {
                let Some(c) =
                    pick_free_column(&dst, table, &cols, seed, index, false).map_err(fail)?
                else {
                    continue;
                };
                dst.execute_batch(&format!(
                    "CREATE TEMP TABLE t2sql_pos AS SELECT rowid AS r, row_number() OVER (ORDER BY rowid) AS k FROM {t};
                     CREATE TEMP TABLE t2sql_val AS SELECT {c} AS v, row_number() OVER (ORDER BY t2sql_mix({seed_sql}, rowid), rowid) AS k FROM {t};
                     CREATE INDEX temp.t2sql_pos_r ON t2sql_pos(r);
                     CREATE INDEX temp.t2sql_val_k ON t2sql_val(k);"
                ))
                .map_err(fail)?;
                let done = dst.execute(
                    &format!("UPDATE {t} SET {c} = (SELECT v FROM t2sql_val WHERE k = (SELECT k FROM t2sql_pos WHERE r = {t}.rowid))"),
                    [],
                );
                dst.execute_batch("DROP TABLE temp.t2sql_pos; DROP TABLE temp.t2sql_val;")
                    .map_err(fail)?;
                done
            }
        };
    }
    GuardedConnection::harden(dst, format!("{}#{}:{seed}", src.path, kind.name()), true)
}

#[cfg(test)]
mod test {
    use super::*;

    fn fixture() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sqlite");
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE person(id INTEGER PRIMARY KEY, name TEXT, city TEXT, email TEXT UNIQUE);
             WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 300)
             INSERT INTO person SELECT x, 'name' || (x % 50), 'city' || (x % 7), 'e' || x FROM n;",
        )
        .unwrap();
        (dir, path.to_string_lossy().into_owned())
    }

    fn count(gc: &GuardedConnection, sql: &str) -> i64 {
        gc.conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn each_kind_changes_the_data_deterministically_and_leaves_the_file_alone() {
        let (_dir, path) = fixture();
        let before = std::fs::read(&path).unwrap();
        let src = GuardedConnection::open(&path, true).unwrap();
        let sample = perturbed_copy(&src, Perturbation::Sample, 7, DEFAULT_MAX_BYTES).unwrap();
        let n = count(&sample, "SELECT count(*) FROM person");
        assert!(n > 150 && n < 260, "sampled {n} of 300");
        let again = perturbed_copy(&src, Perturbation::Sample, 7, DEFAULT_MAX_BYTES).unwrap();
        assert_eq!(n, count(&again, "SELECT count(*) FROM person"));
        let other = perturbed_copy(&src, Perturbation::Sample, 8, DEFAULT_MAX_BYTES).unwrap();
        assert_ne!(
            count(&sample, "SELECT sum(id) FROM person"),
            count(&other, "SELECT sum(id) FROM person")
        );

        let dup = perturbed_copy(&src, Perturbation::Duplicate, 7, DEFAULT_MAX_BYTES).unwrap();
        // UNIQUE(email) forbids exact copies: the duplicate keeps every constraint.
        assert_eq!(count(&dup, "SELECT count(*) FROM person"), 300);

        let shuf = perturbed_copy(&src, Perturbation::Shuffle, 7, DEFAULT_MAX_BYTES).unwrap();
        assert_eq!(count(&shuf, "SELECT count(*) FROM person"), 300);
        // One non-key column was permuted: its multiset is kept, its pairing with id is not.
        let moved = count(&shuf, "SELECT count(*) FROM person WHERE name <> 'name' || (id % 50) OR city <> 'city' || (id % 7)");
        assert!(moved > 100, "only {moved} rows changed");

        let nulled = perturbed_copy(&src, Perturbation::Nullify, 7, DEFAULT_MAX_BYTES).unwrap();
        assert_eq!(count(&nulled, "SELECT count(*) FROM person"), 300);
        let nulls = count(
            &nulled,
            "SELECT count(*) FROM person WHERE name IS NULL OR city IS NULL",
        );
        assert!(nulls > 50 && nulls < 150, "{nulls} rows got a NULL");
        assert_eq!(
            count(
                &nulled,
                "SELECT count(*) FROM person WHERE email IS NULL OR id IS NULL"
            ),
            0
        );
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn duplicates_appear_where_no_unique_constraint_forbids_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sqlite");
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
             WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 90)
             INSERT INTO t SELECT x, 'v' || x FROM n;",
        )
        .unwrap();
        drop(c);
        let src = GuardedConnection::open(path.to_str().unwrap(), true).unwrap();
        let dup = perturbed_copy(&src, Perturbation::Duplicate, 3, DEFAULT_MAX_BYTES).unwrap();
        let n = count(&dup, "SELECT count(*) FROM t");
        assert!(n > 100 && n < 150, "{n}");
        assert_eq!(count(&dup, "SELECT count(DISTINCT v) FROM t"), 90);
    }

    #[test]
    fn text_and_composite_keys_get_fresh_values_and_references_may_dangle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.sqlite");
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "PRAGMA foreign_keys = ON;
             CREATE TABLE atom(id TEXT PRIMARY KEY, element TEXT);
             CREATE TABLE bond(a TEXT REFERENCES atom(id) ON DELETE CASCADE, b INTEGER, kind TEXT, PRIMARY KEY (a, b));
             WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 90)
             INSERT INTO atom SELECT 'A' || x, 'e' || (x % 5) FROM n;
             WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 90)
             INSERT INTO bond SELECT 'A' || x, x % 3, 'k' FROM n;",
        )
        .unwrap();
        drop(c);
        let src = GuardedConnection::open(path.to_str().unwrap(), true).unwrap();
        let dup = perturbed_copy(&src, Perturbation::Duplicate, 5, DEFAULT_MAX_BYTES).unwrap();
        let atoms = count(&dup, "SELECT count(*) FROM atom");
        assert!(atoms > 100, "{atoms} atoms: text keys were not duplicated");
        assert!(count(&dup, "SELECT count(*) FROM atom WHERE id LIKE '%~dup'") > 10);
        assert!(
            count(&dup, "SELECT count(*) FROM bond") > 100,
            "composite keys were not duplicated"
        );
        // Sampling the referenced table cascades nowhere: references may dangle.
        let sample = perturbed_copy(&src, Perturbation::Sample, 5, DEFAULT_MAX_BYTES).unwrap();
        assert!(count(&sample, "SELECT count(*) FROM atom") < 80);
        assert!(
            count(
                &sample,
                "SELECT count(*) FROM bond WHERE a NOT IN (SELECT id FROM atom)"
            ) > 5
        );
    }

    #[test]
    fn copies_are_read_only_and_capped() {
        let (_dir, path) = fixture();
        let src = GuardedConnection::open(&path, true).unwrap();
        let copy = perturbed_copy(&src, Perturbation::Sample, 1, DEFAULT_MAX_BYTES).unwrap();
        assert!(matches!(
            copy.prepare_checked("DELETE FROM person"),
            Err(GradeError::Unsafe(_))
        ));
        assert!(copy.conn.execute("DELETE FROM person", []).is_err());
        assert!(matches!(
            perturbed_copy(&src, Perturbation::Sample, 1, 10),
            Err(GradeError::Invalid(_))
        ));
    }
}
