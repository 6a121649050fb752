//! SQLite's own built-in functions, called on a connection of the core's own where nothing
//! replaces them: how a replacement that only bounds a call's work (json.rs) hands the call, once
//! bounded, to the built-in it shadows. One in-memory connection per thread, its statements kept
//! prepared. Arguments go in as they are, without a copy (type, bytes, and the subtype that tells
//! JSON text from a string); the result comes back with its subtype, or as the built-in's error with
//! its code and message. Nothing here asks the deadline: callers bound the work first.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, CStr, CString};
use std::ptr;

use rusqlite::{ffi, Connection};

use super::Call;

/// Prepared statements kept per thread; past it they are all finalized and prepared again.
const KEPT_STATEMENTS: usize = 64;

/// The function that carries an argument's subtype across: `t2sql_subtype(X, N)` is X with subtype N.
const SUBTYPE_FN: &CStr = c"t2sql_subtype";

thread_local! {
    static OWN: RefCell<Option<Own>> = const { RefCell::new(None) };
}

/// The thread's connection and its prepared statements (finalized before it closes).
struct Own {
    conn: Connection,
    statements: HashMap<Shape, *mut ffi::sqlite3_stmt>,
}

/// What a statement of the own connection runs: fixed SQL of the core's, or a built-in called
/// with `args` arguments, the ones listed carrying their subtype (argument index, subtype).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) enum Shape {
    Sql(&'static str),
    Call {
        name: &'static str,
        args: usize,
        subtypes: Vec<(usize, u32)>,
    },
}

impl Shape {
    /// `SELECT name(?1, ...)`: an argument with a subtype S is `t2sql_subtype(?N, S)`, so the
    /// built-in reads it as it would have read the caller's (JSON text from another JSON function
    /// has 'J').
    fn sql(&self) -> String {
        let (name, args, subtypes) = match self {
            Shape::Sql(sql) => return sql.to_string(),
            Shape::Call {
                name,
                args,
                subtypes,
            } => (name, *args, subtypes),
        };
        let mut sql = format!("SELECT {name}(");
        for n in 1..=args {
            if n > 1 {
                sql.push_str(", ");
            }
            match subtypes.iter().find(|(i, _)| *i + 1 == n) {
                Some((_, subtype)) => sql.push_str(&format!(
                    "{}(?{n}, {subtype})",
                    SUBTYPE_FN.to_str().unwrap_or_default()
                )),
                None => sql.push_str(&format!("?{n}")),
            }
        }
        sql.push(')');
        sql
    }
}

impl Own {
    fn open() -> Option<Own> {
        let conn = Connection::open_in_memory().ok()?;
        // SAFETY: a function with no user data, on the connection just opened.
        let rc = unsafe {
            ffi::sqlite3_create_function_v2(
                conn.handle(),
                SUBTYPE_FN.as_ptr(),
                2,
                ffi::SQLITE_UTF8 | ffi::SQLITE_RESULT_SUBTYPE,
                ptr::null_mut(),
                Some(with_subtype),
                None,
                None,
                None,
            )
        };
        (rc == ffi::SQLITE_OK).then_some(Own {
            conn,
            statements: HashMap::new(),
        })
    }

    fn statement(&mut self, shape: &Shape) -> Result<*mut ffi::sqlite3_stmt, Failure> {
        if let Some(stmt) = self.statements.get(shape) {
            return Ok(*stmt);
        }
        let sql = shape.sql();
        if self.statements.len() >= KEPT_STATEMENTS {
            self.finalize_all();
        }
        let db = unsafe { self.conn.handle() };
        let mut stmt = ptr::null_mut();
        // SAFETY: the SQL's bytes and length are given; the statement is finalized in Drop.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                db,
                sql.as_ptr().cast(),
                sql.len() as c_int,
                ffi::SQLITE_PREPARE_PERSISTENT,
                &mut stmt,
                ptr::null_mut(),
            )
        };
        if rc != ffi::SQLITE_OK || stmt.is_null() {
            return Err(Failure::of(db, rc));
        }
        self.statements.insert(shape.clone(), stmt);
        Ok(stmt)
    }

    fn finalize_all(&mut self) {
        for (_, stmt) in self.statements.drain() {
            unsafe { ffi::sqlite3_finalize(stmt) };
        }
    }
}

impl Drop for Own {
    fn drop(&mut self) {
        self.finalize_all();
    }
}

/// `t2sql_subtype(X, N)`: X with subtype N.
unsafe extern "C" fn with_subtype(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    unsafe {
        ffi::sqlite3_result_value(ctx, *argv);
        ffi::sqlite3_result_subtype(ctx, ffi::sqlite3_value_int(*argv.add(1)) as u32);
    }
}

/// A built-in's error: its code and message, as SQLite gave them.
pub(super) struct Failure {
    code: c_int,
    message: CString,
}

impl Failure {
    fn of(db: *mut ffi::sqlite3, rc: c_int) -> Failure {
        // SAFETY: errmsg is a NUL-terminated string owned by the connection, copied at once.
        let message = unsafe { CStr::from_ptr(ffi::sqlite3_errmsg(db)) }.to_owned();
        let code = match unsafe { ffi::sqlite3_errcode(db) } {
            ffi::SQLITE_OK => rc,
            code => code,
        };
        Failure { code, message }
    }

    fn internal(message: &CStr) -> Failure {
        Failure {
            code: ffi::SQLITE_ERROR,
            message: message.to_owned(),
        }
    }

    /// Make it the call's result, as the built-in would have.
    pub(super) fn report(&self, call: &Call) {
        match self.code & 0xff {
            ffi::SQLITE_TOOBIG => call.result_toobig(),
            ffi::SQLITE_NOMEM => call.result_nomem(),
            _ => {
                call.result_error(&self.message);
                call.result_error_code(self.code);
            }
        }
    }
}

/// Run `shape` (one `SELECT` of one column, with `?1`, `?2`, ... for `args`) on the thread's own
/// connection under a LENGTH limit of `length`, and hand its value to `then` (valid only inside
/// it) or the error.
pub(super) fn run<R>(
    shape: &Shape,
    args: &[*mut ffi::sqlite3_value],
    length: usize,
    then: impl FnOnce(Result<*mut ffi::sqlite3_value, Failure>) -> R,
) -> R {
    OWN.with(|cell| {
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return then(Err(Failure::internal(
                c"t2sql: a built-in was called again while it ran",
            )));
        };
        if slot.is_none() {
            *slot = Own::open();
        }
        let Some(own) = slot.as_mut() else {
            return then(Err(Failure {
                code: ffi::SQLITE_NOMEM,
                message: CString::default(),
            }));
        };
        let stmt = match own.statement(shape) {
            Ok(stmt) => stmt,
            Err(failure) => return then(Err(failure)),
        };
        let db = unsafe { own.conn.handle() };
        unsafe {
            ffi::sqlite3_limit(
                db,
                ffi::SQLITE_LIMIT_LENGTH,
                length.min(i32::MAX as usize) as c_int,
            )
        };
        // SAFETY: the arguments are protected values of the caller's current call, alive and
        // unchanged until it returns; they are bound without a copy and unbound below.
        let outcome = match unsafe { bind_all(stmt, args) } {
            Err(rc) => then(Err(Failure::of(db, rc))),
            Ok(()) => match unsafe { ffi::sqlite3_step(stmt) } {
                ffi::SQLITE_ROW => then(Ok(unsafe { ffi::sqlite3_column_value(stmt, 0) })),
                rc => then(Err(Failure::of(db, rc))),
            },
        };
        unsafe {
            ffi::sqlite3_reset(stmt);
            ffi::sqlite3_clear_bindings(stmt);
        }
        outcome
    })
}

/// Bind each argument as it is: its type and bytes, the text and blob bytes not copied.
unsafe fn bind_all(
    stmt: *mut ffi::sqlite3_stmt,
    args: &[*mut ffi::sqlite3_value],
) -> Result<(), c_int> {
    for (i, &v) in args.iter().enumerate() {
        let n = i as c_int + 1;
        let rc = unsafe {
            match ffi::sqlite3_value_type(v) {
                ffi::SQLITE_INTEGER => {
                    ffi::sqlite3_bind_int64(stmt, n, ffi::sqlite3_value_int64(v))
                }
                ffi::SQLITE_FLOAT => {
                    ffi::sqlite3_bind_double(stmt, n, ffi::sqlite3_value_double(v))
                }
                ffi::SQLITE_TEXT => {
                    let p = ffi::sqlite3_value_text(v);
                    let len = ffi::sqlite3_value_bytes(v);
                    if p.is_null() {
                        ffi::SQLITE_NOMEM
                    } else {
                        ffi::sqlite3_bind_text64(
                            stmt,
                            n,
                            p.cast(),
                            len as u64,
                            ffi::SQLITE_STATIC(),
                            ffi::SQLITE_UTF8 as u8,
                        )
                    }
                }
                ffi::SQLITE_BLOB => {
                    let p = ffi::sqlite3_value_blob(v);
                    let len = ffi::sqlite3_value_bytes(v);
                    if len == 0 {
                        ffi::sqlite3_bind_zeroblob(stmt, n, 0)
                    } else if p.is_null() {
                        ffi::SQLITE_NOMEM
                    } else {
                        ffi::sqlite3_bind_blob64(stmt, n, p, len as u64, ffi::SQLITE_STATIC())
                    }
                }
                _ => ffi::sqlite3_bind_null(stmt, n),
            }
        };
        if rc != ffi::SQLITE_OK {
            return Err(rc);
        }
    }
    Ok(())
}

/// The built-in `name` called with the caller's arguments, its result or error made the call's.
pub(super) fn forward(call: &Call, name: &'static str, args: &[*mut ffi::sqlite3_value]) {
    let mut subtypes = Vec::new();
    for (i, &v) in args.iter().enumerate() {
        // SAFETY: a protected value of the caller's current call.
        let (kind, subtype) =
            unsafe { (ffi::sqlite3_value_type(v), ffi::sqlite3_value_subtype(v)) };
        if subtype != 0 && kind != ffi::SQLITE_NULL {
            subtypes.push((i, subtype));
        }
    }
    let shape = Shape::Call {
        name,
        args: args.len(),
        subtypes,
    };
    run(
        &shape,
        args,
        call.limit(ffi::SQLITE_LIMIT_LENGTH),
        |outcome| match outcome {
            // SAFETY: the statement's current value, copied by SQLite with its subtype.
            Ok(value) => call.result_value(value),
            Err(failure) => failure.report(call),
        },
    )
}
