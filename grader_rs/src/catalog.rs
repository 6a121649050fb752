//! What a database file declares about its tables (columns, keys, indexes, foreign keys), read
//! with SQLite's table-valued pragmas for the equivalence check's mining.
//!
//! The policy refuses every pragma to a query (a model could change settings with one), so these
//! reads never pass through it: they run on a connection of their own, opened and hardened like
//! any other (`GuardedConnection::open`: read-only, limits, deadline, cancel, temporary-disk cap),
//! whose authorizer is narrower still: it allows reading `sqlite_master` and exactly the pragmas
//! in `CATALOG_PRAGMAS` (their eponymous tables, and the PRAGMA each runs while stepping), and
//! nothing else, not even a function. The SQL is fixed here; the one input, a table or index
//! name, is a bound parameter. So no text a model writes can reach this connection, and this
//! connection can do nothing but read the schema.

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::types::Value;

use crate::error::{GradeError, Result};
use crate::guard::{Budget, GuardedConnection};
use crate::rows::{self, RowsLimits};

/// The pragmas a catalog read may name, each read as `pragma_<name>(?)` (`table_list`: no
/// argument). Their columns are SQLite's.
pub const CATALOG_PRAGMAS: [&str; 5] = [
    "table_list",
    "table_info",
    "index_list",
    "index_info",
    "foreign_key_list",
];

/// Rows of one catalog read at most (columns of the widest table SQLite allows, and then some).
const CATALOG_LIMITS: RowsLimits = RowsLimits {
    max_rows: 100_000,
    max_bytes: 64 * 1024 * 1024,
};

/// A connection that reads a database's catalog, and nothing else.
pub struct Catalog {
    gc: GuardedConnection,
}

fn allowed_table(name: &str) -> bool {
    if name.eq_ignore_ascii_case("sqlite_master") || name.eq_ignore_ascii_case("sqlite_schema") {
        return true;
    }
    name.len() > 7
        && name[..7].eq_ignore_ascii_case("pragma_")
        && CATALOG_PRAGMAS
            .iter()
            .any(|p| p.eq_ignore_ascii_case(&name[7..]))
}

/// The catalog connection's authorizer: reads of sqlite_master and the allowed pragmas' tables,
/// the PRAGMA those run, SELECT; everything else refused.
fn authorize_catalog(ctx: AuthContext<'_>) -> Authorization {
    match ctx.action {
        AuthAction::Select => Authorization::Allow,
        AuthAction::Read { table_name, .. } if allowed_table(table_name) => Authorization::Allow,
        AuthAction::Pragma { pragma_name, .. }
            if CATALOG_PRAGMAS
                .iter()
                .any(|p| p.eq_ignore_ascii_case(pragma_name)) =>
        {
            Authorization::Allow
        }
        _ => Authorization::Deny,
    }
}

impl Catalog {
    /// Open `path` as `GuardedConnection::open` does, with the catalog's authorizer instead.
    pub fn open(path: &str, immutable: bool) -> Result<Self> {
        let mut gc = GuardedConnection::open(path, immutable)?;
        gc.conn
            .authorizer(Some(authorize_catalog))
            .map_err(|e| GradeError::Database(format!("cannot open database {path}: {e}")))?;
        Ok(Catalog { gc })
    }

    /// The rows of `pragma_<pragma>(arg)` (no argument for `table_list`), under `budget`.
    pub fn read(
        &self,
        pragma: &str,
        arg: Option<&str>,
        budget: &Budget,
    ) -> Result<Vec<Vec<Value>>> {
        let Some(name) = CATALOG_PRAGMAS
            .iter()
            .find(|p| p.eq_ignore_ascii_case(pragma))
        else {
            return Err(GradeError::Invalid(format!(
                "no catalog pragma {pragma:?}; the catalog reads {}",
                CATALOG_PRAGMAS.join(", ")
            )));
        };
        let (sql, params) = match (*name, arg) {
            ("table_list", None) => (
                "SELECT * FROM pragma_table_list WHERE schema = 'main'".to_string(),
                vec![],
            ),
            ("table_list", Some(_)) => {
                return Err(GradeError::Invalid("table_list takes no argument".into()))
            }
            (_, Some(a)) => (
                format!("SELECT * FROM pragma_{name}(?1)"),
                vec![Value::Text(a.to_string())],
            ),
            (_, None) => {
                return Err(GradeError::Invalid(format!(
                    "{name} takes a table or index name"
                )))
            }
        };
        let mut stmt = self
            .gc
            .conn
            .prepare(&sql)
            .map_err(|e| GradeError::Sql(e.to_string()))?;
        rows::read(&self.gc, &mut stmt, &params, CATALOG_LIMITS, budget)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn file() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sqlite");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE p (id INTEGER PRIMARY KEY, code TEXT UNIQUE COLLATE NOCASE);
             CREATE TABLE c (id INTEGER, p_id INTEGER REFERENCES p(nope), PRIMARY KEY (id));
             CREATE UNIQUE INDEX c_expr ON c (lower(id));",
        )
        .unwrap();
        drop(conn);
        let path = path.to_str().unwrap().to_string();
        (dir, path)
    }

    #[test]
    fn reads_the_allowed_pragmas_with_a_bound_name() {
        let (_dir, path) = file();
        let cat = Catalog::open(&path, true).unwrap();
        let budget = Budget::new(5.0);
        let tables = cat.read("table_list", None, &budget).unwrap();
        let names: Vec<&Value> = tables.iter().map(|r| &r[1]).collect();
        assert!(names.contains(&&Value::Text("p".into())));
        let info = cat.read("table_info", Some("p"), &budget).unwrap();
        assert_eq!(info.len(), 2);
        let fks = cat.read("foreign_key_list", Some("c"), &budget).unwrap();
        assert_eq!(fks[0][4], Value::Text("nope".into())); // "to": as declared
                                                           // A name is data, never SQL.
        let odd = cat.read(
            "table_info",
            Some("p') UNION SELECT 1,2,3,4,5,6 --"),
            &budget,
        );
        assert_eq!(odd.unwrap().len(), 0);
    }

    #[test]
    fn nothing_else_runs_there() {
        let (_dir, path) = file();
        let cat = Catalog::open(&path, true).unwrap();
        let budget = Budget::new(5.0);
        assert!(matches!(
            cat.read("query_only", Some("0"), &budget),
            Err(GradeError::Invalid(_))
        ));
        for bad in [
            "SELECT * FROM p",
            "SELECT load_extension('x')",
            "PRAGMA query_only = 0",
            "SELECT * FROM pragma_compile_options",
        ] {
            assert!(cat.gc.conn.prepare(bad).is_err(), "{bad}");
        }
    }
}
