//! The authorizer: what a prepared statement may touch. Reads and SELECTs pass; writes, PRAGMA
//! (table-valued ones included), ATTACH, transactions, schema changes and the functions that reach
//! outside the database are refused, the first refusal kept to say why.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};

/// Functions that reach outside the database.
const DENIED_FUNCTIONS: [&str; 2] = ["load_extension", "fts3_tokenizer"];

/// What the authorizer denied while the last statement was prepared.
#[derive(Default)]
pub struct AuthState {
    denied: Mutex<Option<String>>,
    /// The digest aggregate may appear only in the wrapper the core writes itself.
    pub(super) allow_digest_fn: AtomicBool,
    /// The connection's file is writable (an in-memory copy): refuse writes to main too.
    pub(super) writable: bool,
}

impl AuthState {
    pub(super) fn new(writable: bool) -> Self {
        AuthState {
            writable,
            ..AuthState::default()
        }
    }
    fn deny(&self, what: String) -> Authorization {
        let mut d = self.denied.lock().unwrap();
        if d.is_none() {
            *d = Some(what);
        }
        Authorization::Deny
    }
    pub(super) fn take_denied(&self) -> Option<String> {
        self.denied.lock().unwrap().take()
    }
}

pub(super) fn authorize(auth: &AuthState, digest_fn: &str, ctx: AuthContext<'_>) -> Authorization {
    use AuthAction as A;
    match ctx.action {
        // Table-valued pragmas (pragma_table_info, …) are eponymous virtual tables: their reads
        // are refused here, at prepare time; the PRAGMA they run at step time is refused below.
        A::Read { table_name, .. } if is_pragma_table(table_name) => {
            auth.deny(format!("{table_name}()"))
        }
        A::Select | A::Read { .. } | A::Recursive => Authorization::Allow,
        A::Function { function_name } => {
            let denied = DENIED_FUNCTIONS
                .iter()
                .any(|f| f.eq_ignore_ascii_case(function_name));
            let digest_off = function_name.eq_ignore_ascii_case(digest_fn)
                && !auth.allow_digest_fn.load(Ordering::Relaxed);
            if denied || digest_off {
                auth.deny(format!("function {function_name}()"))
            } else {
                Authorization::Allow
            }
        }
        // The first use of an eponymous virtual table (json_each) may report a write to main's
        // schema; writes to main cannot happen on a read-only connection anyway.
        // (An in-memory database the core built is writable: there, writes to main are refused too.)
        A::Insert { .. } | A::Update { .. } | A::Delete { .. }
            if ctx.database_name == Some("main") && !auth.writable =>
        {
            Authorization::Allow
        }
        A::Insert { table_name } | A::Delete { table_name } => {
            auth.deny(format!("write to {table_name}"))
        }
        A::Update { table_name, .. } => auth.deny(format!("write to {table_name}")),
        A::Pragma { pragma_name, .. } => auth.deny(format!("PRAGMA {pragma_name}")),
        A::Attach { .. } => auth.deny("ATTACH (also VACUUM INTO)".into()),
        A::Detach { .. } => auth.deny("DETACH".into()),
        A::Transaction { .. } => auth.deny("transactions".into()),
        A::Savepoint { .. } => auth.deny("savepoints".into()),
        A::Analyze { .. } => auth.deny("ANALYZE".into()),
        A::Reindex { .. } => auth.deny("REINDEX".into()),
        A::AlterTable { .. } => auth.deny("ALTER TABLE".into()),
        other => auth.deny(action_name(&other)),
    }
}

fn is_pragma_table(name: &str) -> bool {
    name.len() > 7 && name[..7].eq_ignore_ascii_case("pragma_")
}

/// The action as SQL words: `DropTable { .. }` is "DROP TABLE", `CreateTempTrigger` "CREATE TEMP
/// TRIGGER" (CREATE/DROP of any object, TEMP and virtual tables included, and anything unknown).
fn action_name(a: &AuthAction<'_>) -> String {
    let debug = format!("{a:?}");
    let name = debug.split([' ', '{', '(']).next().unwrap_or("action");
    let mut words = String::new();
    for (i, ch) in name.char_indices() {
        if i > 0 && ch.is_ascii_uppercase() {
            words.push(' ');
        }
        words.push(ch.to_ascii_uppercase());
    }
    words
}
