//! The digest as an aggregate inside SQLite's VM, bound with SQLite's C API: every `unsafe`
//! of the digest lives here.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use rusqlite::ffi;
use rusqlite::types::ValueRef;
use rusqlite::Connection;

use super::{Accumulator, DigestSpec, GoldKeys, Stop};

/// State shared between the host and the aggregate registered on one connection.
#[derive(Default)]
pub struct AggregateShared {
    pub spec: Mutex<Option<(DigestSpec, u32)>>,
    /// A subset prediction's gold keys, for the run under way.
    pub gold_keys: Mutex<Option<Arc<GoldKeys>>>,
    /// The accumulator once every row is in: the host finishes it outside the VM, where the
    /// deadline and the cancel token still reach the end of a spilled digest.
    pub result: Mutex<Option<Accumulator>>,
    pub stopped: Mutex<Option<Stop>>,
}

// The aggregate is bound with SQLite's C API directly: it runs once per result row, and the
// generic wrapper's per-call boxing and context set-up cost more than the digest itself.

/// Read a SQLite value as a `ValueRef` borrowed for the duration of the step call.
///
/// # Safety
/// `v` must be a valid `sqlite3_value` for the current call.
#[inline]
unsafe fn value_ref<'a>(v: *mut ffi::sqlite3_value) -> ValueRef<'a> {
    unsafe {
        match ffi::sqlite3_value_type(v) {
            ffi::SQLITE_INTEGER => ValueRef::Integer(ffi::sqlite3_value_int64(v)),
            ffi::SQLITE_FLOAT => ValueRef::Real(ffi::sqlite3_value_double(v)),
            ffi::SQLITE_TEXT => {
                // text first, then bytes (SQLite's documented order for a stable length)
                let p = ffi::sqlite3_value_text(v);
                let n = ffi::sqlite3_value_bytes(v) as usize;
                ValueRef::Text(if p.is_null() || n == 0 {
                    &[]
                } else {
                    std::slice::from_raw_parts(p, n)
                })
            }
            ffi::SQLITE_BLOB => {
                let p = ffi::sqlite3_value_blob(v) as *const u8;
                let n = ffi::sqlite3_value_bytes(v) as usize;
                ValueRef::Blob(if p.is_null() || n == 0 {
                    &[]
                } else {
                    std::slice::from_raw_parts(p, n)
                })
            }
            _ => ValueRef::Null,
        }
    }
}

/// The slot SQLite keeps per aggregate invocation: a pointer to our accumulator.
type Slot = *mut Accumulator;

unsafe fn fail(ctx: *mut ffi::sqlite3_context, msg: &std::ffi::CStr) {
    unsafe { ffi::sqlite3_result_error(ctx, msg.as_ptr(), -1) }
}

unsafe extern "C" fn digest_step(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    unsafe {
        let shared = &*(ffi::sqlite3_user_data(ctx) as *const AggregateShared);
        let slot =
            ffi::sqlite3_aggregate_context(ctx, std::mem::size_of::<Slot>() as c_int) as *mut Slot;
        if slot.is_null() {
            ffi::sqlite3_result_error_nomem(ctx);
            return;
        }
        if (*slot).is_null() {
            let Some((spec, columns)) = *shared.spec.lock().unwrap() else {
                return fail(ctx, c"digest aggregate used outside grading");
            };
            let gold_keys = shared.gold_keys.lock().unwrap().clone();
            *slot = Box::into_raw(Box::new(Accumulator::new(spec, columns, gold_keys)));
        }
        let acc = &mut **slot;
        let args = std::slice::from_raw_parts(argv, argc.max(0) as usize);
        if let Err(stop) = acc.add_row(args.iter().map(|&v| value_ref(v))) {
            *shared.stopped.lock().unwrap() = Some(stop);
            fail(ctx, c"t2sql digest stopped early");
        }
    }
}

unsafe extern "C" fn digest_final(ctx: *mut ffi::sqlite3_context) {
    unsafe {
        let shared = &*(ffi::sqlite3_user_data(ctx) as *const AggregateShared);
        // Size 0: returns the slot if a step allocated it, else NULL (no rows).
        let slot = ffi::sqlite3_aggregate_context(ctx, 0) as *mut Slot;
        let acc = if slot.is_null() || (*slot).is_null() {
            None
        } else {
            let b = Box::from_raw(*slot);
            *slot = std::ptr::null_mut();
            Some(*b)
        };
        let acc = match acc {
            Some(a) => a,
            None => match *shared.spec.lock().unwrap() {
                Some((spec, columns)) => {
                    Accumulator::new(spec, columns, shared.gold_keys.lock().unwrap().clone())
                }
                None => return fail(ctx, c"digest aggregate used outside grading"),
            },
        };
        *shared.result.lock().unwrap() = Some(acc);
        ffi::sqlite3_result_null(ctx);
    }
}

unsafe extern "C" fn drop_shared(p: *mut c_void) {
    unsafe { drop(Arc::from_raw(p as *const AggregateShared)) }
}

/// The random-per-process name of the digest aggregate: the model cannot guess it, and the
/// authorizer refuses it anywhere but in the core's own wrapper.
pub fn function_name() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).expect("OS random source");
        format!("t2sql_digest_{:016x}", u64::from_le_bytes(b))
    })
    .clone()
}

/// Register the digest aggregate on `conn` (`sqlite3_create_function_v2`); returns its name
/// and the state it shares with the host. SQLITE_DIRECTONLY keeps it out of views/triggers.
pub fn register(conn: &Connection) -> rusqlite::Result<(String, Arc<AggregateShared>)> {
    let shared = Arc::new(AggregateShared::default());
    let name = function_name();
    let cname = std::ffi::CString::new(name.clone()).expect("no NUL in name");
    let user_data = Arc::into_raw(Arc::clone(&shared)) as *mut c_void;
    let rc = unsafe {
        ffi::sqlite3_create_function_v2(
            conn.handle(),
            cname.as_ptr(),
            -1,
            ffi::SQLITE_UTF8 | ffi::SQLITE_DIRECTONLY,
            user_data,
            None,
            Some(digest_step),
            Some(digest_final),
            Some(drop_shared),
        )
    };
    if rc != ffi::SQLITE_OK {
        // On failure SQLite has already called the destructor on user_data.
        return Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(rc),
            Some("cannot register digest".into()),
        ));
    }
    Ok((name, shared))
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::digest::{ColumnOrder, ResolvedMethod};

    fn spec(method: ResolvedMethod) -> DigestSpec {
        DigestSpec {
            method,
            float_digits: Some(12),
            column_order: ColumnOrder::Strict,
            row_limit: None,
        }
    }

    const ROWS: &str = "SELECT * FROM (VALUES (1, 'x'), (2, NULL), (3, 2.5), (3, x'00ff'))";

    #[test]
    fn the_aggregate_digests_what_the_accumulator_digests_and_only_while_grading() {
        let conn = Connection::open_in_memory().unwrap();
        let (name, shared) = register(&conn).unwrap();
        assert_eq!(name, function_name());
        assert!(name.starts_with("t2sql_digest_"));
        let sql = format!("WITH q(a, b) AS ({ROWS}) SELECT {name}(a, b) FROM q");
        // Outside a run (no spec set) the aggregate refuses to work.
        let err = conn.query_row(&sql, [], |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("outside grading"), "{err}");

        *shared.spec.lock().unwrap() = Some((spec(ResolvedMethod::Multiset), 2));
        conn.query_row(&sql, [], |_| Ok(())).unwrap();
        let in_vm = shared.result.lock().unwrap().take().unwrap();
        let in_vm = in_vm.finish(&|| false).unwrap();
        let mut host = Accumulator::new(spec(ResolvedMethod::Multiset), 2, None);
        let mut stmt = conn.prepare(ROWS).unwrap();
        let mut rows = stmt.raw_query();
        while let Some(r) = rows.next().unwrap() {
            host.add_row((0..2).map(|i| r.get_ref_unwrap(i))).unwrap();
        }
        assert_eq!(in_vm, host.finish(&|| false).unwrap());
        assert_eq!(in_vm.rows, 4);

        // No rows: the digest of an empty result, from the spec alone.
        let empty = format!("WITH q(a, b) AS ({ROWS} WHERE 0) SELECT {name}(a, b) FROM q");
        conn.query_row(&empty, [], |_| Ok(())).unwrap();
        let none = shared.result.lock().unwrap().take().unwrap();
        assert_eq!(
            none.finish(&|| false).unwrap(),
            Accumulator::new(spec(ResolvedMethod::Multiset), 2, None)
                .finish(&|| false)
                .unwrap()
        );
    }

    #[test]
    fn an_early_stop_fails_the_statement_and_says_why() {
        let conn = Connection::open_in_memory().unwrap();
        let (name, shared) = register(&conn).unwrap();
        let limited = DigestSpec {
            row_limit: Some(1),
            ..spec(ResolvedMethod::Multiset)
        };
        *shared.spec.lock().unwrap() = Some((limited, 2));
        let sql = format!("WITH q(a, b) AS ({ROWS}) SELECT {name}(a, b) FROM q");
        let err = conn.query_row(&sql, [], |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("stopped early"), "{err}");
        assert_eq!(*shared.stopped.lock().unwrap(), Some(Stop::RowLimit));
    }
}
