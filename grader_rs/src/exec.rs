//! Run one checked statement: the tool preview the model sees, or a streaming digest.

use std::time::Instant;

use rusqlite::types::ValueRef;

use std::sync::Arc;

use crate::digest::{Accumulator, Digest, DigestSpec, GoldKeys, ResolvedMethod, Stop};
use crate::error::{GradeError, Result};
use crate::guard::{Budget, GuardedConnection};

/// Widest result digested inside SQLite's VM (one aggregate argument per column); wider
/// results take the host loop.
const MAX_AGGREGATE_COLUMNS: usize = 100;

// ---- the tool path ---------------------------------------------------------------------

/// What a tool call's preview may show. The core has no default preview: every caller names one
/// (the episode's are its preset's, t2sql.episode.presets), so its numbers live in one place.
#[derive(Debug, Clone, Copy)]
pub struct ToolOptions {
    pub max_rows: usize,
    pub max_cell_chars: usize,
    pub max_chars: usize,
    pub count_cap: u64,
}

#[cfg(test)]
impl ToolOptions {
    /// A preview for the core's own tests; Python never sees it.
    pub const FOR_TESTS: ToolOptions = ToolOptions {
        max_rows: 50,
        max_cell_chars: 120,
        max_chars: 4000,
        count_cap: 10000,
    };
}

#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

#[derive(Debug, Clone)]
pub struct ToolOutput {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
    pub row_count: u64,
    pub row_count_capped: bool,
    pub truncated: bool,
    pub elapsed_s: f64,
    pub text: String,
}

fn to_cell(v: ValueRef<'_>) -> Cell {
    match v {
        ValueRef::Null => Cell::Null,
        ValueRef::Integer(i) => Cell::Int(i),
        ValueRef::Real(x) => Cell::Real(x),
        ValueRef::Text(t) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Cell::Blob(b.to_vec()),
    }
}

/// Run `sql` for the model: keep the first `max_rows` rows, count the rest up to `count_cap`.
pub fn run_tool(
    gc: &GuardedConnection,
    sql: &str,
    opts: ToolOptions,
    budget: &Budget,
) -> Result<ToolOutput> {
    let start = Instant::now();
    let (mut stmt, _) = gc.prepare_checked(sql)?;
    let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
    let n = columns.len();
    gc.arm(budget)?;
    let mut rows_out = Vec::new();
    let mut count: u64 = 0;
    let mut capped = false;
    let outcome = (|| {
        let mut rows = stmt.raw_query();
        while let Some(row) = rows.next()? {
            if rows_out.len() < opts.max_rows {
                rows_out.push(
                    (0..n)
                        .map(|i| to_cell(row.get_ref_unwrap(i)))
                        .collect::<Vec<_>>(),
                );
            }
            count += 1;
            if count >= opts.count_cap {
                // Is there one more row? Then the count is "cap+".
                capped = rows.next()?.is_some();
                break;
            }
        }
        Ok::<(), rusqlite::Error>(())
    })();
    gc.disarm();
    outcome.map_err(|e| gc.classify_with(e, budget))?;
    let (text, truncated) = render(&columns, &rows_out, count, capped, opts);
    Ok(ToolOutput {
        columns,
        rows: rows_out,
        row_count: count,
        row_count_capped: capped,
        truncated,
        elapsed_s: start.elapsed().as_secs_f64(),
        text,
    })
}

fn render_cell(c: &Cell, max_chars: usize, cut: &mut bool) -> String {
    let s = match c {
        Cell::Null => "NULL".to_string(),
        Cell::Int(i) => i.to_string(),
        Cell::Real(x) => format!("{x:?}"),
        Cell::Text(t) => t.replace('\n', "\\n"),
        Cell::Blob(b) => {
            let hex: String = b.iter().take(32).map(|x| format!("{x:02x}")).collect();
            format!(
                "x'{hex}{}' ({} bytes)",
                if b.len() > 32 { "…" } else { "" },
                b.len()
            )
        }
    };
    if s.chars().count() > max_chars {
        *cut = true;
        let mut t: String = s.chars().take(max_chars).collect();
        t.push('…');
        t
    } else {
        s
    }
}

/// The text the model sees: a header, the preview rows, and a footer with the true count.
pub fn render(
    columns: &[String],
    rows: &[Vec<Cell>],
    count: u64,
    capped: bool,
    opts: ToolOptions,
) -> (String, bool) {
    let mut cut = false;
    let mut lines = Vec::with_capacity(rows.len() + 2);
    lines.push(columns.join(" | "));
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .map(|c| render_cell(c, opts.max_cell_chars, &mut cut))
            .collect();
        lines.push(cells.join(" | "));
    }
    let total = if capped {
        format!("{count}+")
    } else {
        count.to_string()
    };
    let shown = rows.len() as u64;
    let mut footer = if shown < count || capped {
        cut = true;
        format!("({total} rows, first {shown} shown)")
    } else {
        format!("({total} row{})", if count == 1 { "" } else { "s" })
    };
    let cut_footer = format!(
        "(output cut at {} characters; {total} rows in all)",
        opts.max_chars
    );
    let reserve = footer.len().max(cut_footer.len());
    let mut text = String::new();
    for (i, line) in lines.iter().enumerate() {
        // Keep room for the footer; stop at a whole line.
        if text.len() + line.len() + 1 + reserve > opts.max_chars && i > 0 {
            cut = true;
            footer = cut_footer;
            break;
        }
        text.push_str(line);
        text.push('\n');
    }
    text.push_str(&footer);
    if text.len() > opts.max_chars {
        // A single header line longer than the budget: cut it on a character boundary.
        let mut end = opts.max_chars.saturating_sub(1);
        while end > 0 && !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
        cut = true;
    }
    (text, cut)
}

/// Step through the result of `sql` without reading a value: the row count, and the lower
/// bound on the time any grader can take for this query (the benchmark's "limit").
pub fn count_rows(gc: &GuardedConnection, sql: &str, budget: &Budget) -> Result<u64> {
    let (mut stmt, _) = gc.prepare_checked(sql)?;
    gc.arm(budget)?;
    let mut count = 0u64;
    let outcome = (|| {
        let mut rows = stmt.raw_query();
        while rows.next()?.is_some() {
            count += 1;
        }
        Ok::<(), rusqlite::Error>(())
    })();
    gc.disarm();
    outcome.map_err(|e| gc.classify_with(e, budget))?;
    Ok(count)
}

// ---- the grading path ------------------------------------------------------------------

/// How a digest run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Run {
    Done(Digest),
    /// The result has another column count than expected: nothing was stepped.
    OtherColumns {
        columns: u32,
    },
    /// The result passed the row limit: stepping stopped there.
    TooManyRows {
        columns: u32,
    },
    /// A subset prediction produced a row that is not a gold row: stepping stopped there.
    ForeignRow,
}

/// Digest the result of `sql`. `expect_columns` and `spec.row_limit` give the early exits;
/// `gold_keys` (a subset prediction) the third: a row that is not a gold row.
pub fn digest(
    gc: &GuardedConnection,
    sql: &str,
    spec: DigestSpec,
    expect_columns: Option<u32>,
    gold_keys: Option<Arc<GoldKeys>>,
    budget: &Budget,
) -> Result<Run> {
    let (stmt, text) = gc.prepare_checked(sql)?;
    let n = stmt.column_count();
    let columns = n as u32;
    if let Some(c) = expect_columns {
        if c != columns {
            return Ok(Run::OtherColumns { columns });
        }
    }
    if spec.method == ResolvedMethod::Ordered || n > MAX_AGGREGATE_COLUMNS {
        host_loop(gc, stmt, spec, columns, gold_keys, budget)
    } else {
        drop(stmt);
        in_vm(gc, text, spec, columns, gold_keys, budget)
    }
}

/// Step in the host and digest each row (the only path with a defined row order).
fn host_loop(
    gc: &GuardedConnection,
    mut stmt: rusqlite::Statement<'_>,
    spec: DigestSpec,
    columns: u32,
    gold_keys: Option<Arc<GoldKeys>>,
    budget: &Budget,
) -> Result<Run> {
    let n = columns as usize;
    let mut acc = Accumulator::new(spec, columns, gold_keys);
    gc.arm(budget)?;
    let mut stop = None;
    let outcome = (|| {
        let mut rows = stmt.raw_query();
        while let Some(row) = rows.next()? {
            if let Err(s) = acc.add_row((0..n).map(|i| row.get_ref_unwrap(i))) {
                stop = Some(s);
                break;
            }
        }
        Ok::<(), rusqlite::Error>(())
    })();
    // The end of a digest that spilled runs under the same deadline: before disarming.
    let finished = match (&outcome, stop) {
        (_, Some(s)) => Some(Err(s)),
        (Ok(()), None) => Some(acc.finish(&|| gc.interrupted())),
        (Err(_), None) => None,
    };
    gc.disarm();
    outcome.map_err(|e| gc.classify_with(e, budget))?;
    conclude(
        finished.expect("an Ok outcome is finished"),
        columns,
        gc,
        budget,
    )
}

/// What a digest's end (or its early stop) means for the run.
fn conclude(
    finished: std::result::Result<Digest, Stop>,
    columns: u32,
    gc: &GuardedConnection,
    budget: &Budget,
) -> Result<Run> {
    match finished {
        Ok(digest) => Ok(Run::Done(digest)),
        Err(Stop::RowLimit) => Ok(Run::TooManyRows { columns }),
        Err(Stop::NotInGold) => Ok(Run::ForeignRow),
        Err(Stop::Interrupted) => Err(gc.stop_error(budget)),
        Err(Stop::Spill(message)) => Err(GradeError::Spill(message)),
    }
}

/// Digest inside SQLite's VM: wrap the checked statement as
/// `WITH q(c0,…) AS (<stmt>) SELECT digest(c0,…) FROM q`, the aggregate runs per row with no
/// round trip to the host, and the deadline still holds: the progress handler runs inside the VM
/// (docs/grader.md#guarantees, "deadline").
fn in_vm(
    gc: &GuardedConnection,
    text: &str,
    spec: DigestSpec,
    columns: u32,
    gold_keys: Option<Arc<GoldKeys>>,
    budget: &Budget,
) -> Result<Run> {
    let names: Vec<String> = (0..columns).map(|i| format!("c{i}")).collect();
    let list = names.join(",");
    // `text` ends at its last token (no trailing comment can swallow the newline and paren).
    let wrapper = format!(
        "WITH t2sql_q({list}) AS (\n{text}\n)\nSELECT {}({list}) FROM t2sql_q",
        gc.digest_fn
    );
    let mut stmt = gc.prepare_wrapper(&wrapper)?;
    let shared = &gc.aggregate;
    *shared.spec.lock().unwrap() = Some((spec, columns));
    *shared.gold_keys.lock().unwrap() = gold_keys;
    *shared.result.lock().unwrap() = None;
    *shared.stopped.lock().unwrap() = None;
    gc.arm(budget)?;
    let outcome = (|| {
        let mut rows = stmt.raw_query();
        rows.next()?;
        Ok::<(), rusqlite::Error>(())
    })();
    // Taken whatever happened, so a stopped run's accumulator (and its spill file) goes now.
    let stop = shared.stopped.lock().unwrap().take();
    let acc = shared.result.lock().unwrap().take();
    let finished = match (&outcome, stop) {
        (_, Some(s)) => Some(Err(s)),
        (Ok(()), None) => acc.map(|a| a.finish(&|| gc.interrupted())),
        (Err(_), None) => None,
    };
    gc.disarm();
    *shared.spec.lock().unwrap() = None;
    *shared.gold_keys.lock().unwrap() = None;
    match (outcome, finished) {
        (_, Some(finished)) => conclude(finished, columns, gc, budget),
        (Err(e), None) => Err(gc.classify_with(e, budget)),
        (Ok(()), None) => Err(GradeError::Sql("digest produced no result".into())),
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::digest::ColumnOrder;

    fn opts() -> ToolOptions {
        ToolOptions {
            max_rows: 2,
            max_cell_chars: 5,
            max_chars: 1000,
            count_cap: 10,
        }
    }

    #[test]
    fn render_shows_counts_and_cuts_cells() {
        let cols = vec!["a".to_string(), "b".to_string()];
        let rows = vec![
            vec![Cell::Int(1), Cell::Text("abcdefgh".into())],
            vec![Cell::Null, Cell::Real(1.5)],
        ];
        let (text, cut) = render(&cols, &rows, 7, false, opts());
        assert_eq!(
            text,
            "a | b\n1 | abcde…\nNULL | 1.5\n(7 rows, first 2 shown)"
        );
        assert!(cut);
        let (text, cut) = render(
            &cols,
            &rows[..1],
            1,
            false,
            ToolOptions {
                max_cell_chars: 50,
                ..opts()
            },
        );
        assert_eq!(text, "a | b\n1 | abcdefgh\n(1 row)");
        assert!(!cut);
        let (text, _) = render(&cols, &rows, 10, true, opts());
        assert!(text.ends_with("(10+ rows, first 2 shown)"), "{text}");
    }

    #[test]
    fn digest_in_the_vm_equals_the_host_loop() {
        use crate::guard::GuardedConnection;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sqlite");
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE t(a, b, c);
             WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 500)
             INSERT INTO t SELECT x, x / 7.0, CASE x % 4 WHEN 0 THEN NULL WHEN 1 THEN 't' || x
                                               WHEN 2 THEN x'00ff' ELSE x * 1.0 END FROM n;",
        )
        .unwrap();
        drop(c);
        let gc = GuardedConnection::open(path.to_str().unwrap(), true).unwrap();
        let budget = Budget::new(10.0);
        for method in [
            ResolvedMethod::Multiset,
            ResolvedMethod::Set,
            ResolvedMethod::Subset {
                op: crate::digest::SubsetOp::Exactly,
                n: 3,
            },
        ] {
            for digits in [None, Some(12), Some(3)] {
                for column_order in [ColumnOrder::Strict, ColumnOrder::Ignore] {
                    let spec = DigestSpec {
                        method,
                        float_digits: digits,
                        column_order,
                        row_limit: None,
                    };
                    let (stmt, text) = gc.prepare_checked("SELECT a, b, c FROM t").unwrap();
                    let host = host_loop(&gc, stmt, spec, 3, None, &budget).unwrap();
                    let vm = in_vm(&gc, text, spec, 3, None, &budget).unwrap();
                    assert_eq!(host, vm, "{method:?} {digits:?} {column_order:?}");
                    let via_digest =
                        digest(&gc, "SELECT a, b, c FROM t", spec, None, None, &budget).unwrap();
                    assert_eq!(via_digest, vm);
                }
            }
        }
        // Early exit in the VM path too.
        let spec = DigestSpec {
            method: ResolvedMethod::Multiset,
            float_digits: Some(12),
            column_order: ColumnOrder::Strict,
            row_limit: Some(10),
        };
        assert_eq!(
            digest(&gc, "SELECT a, b, c FROM t", spec, None, None, &budget).unwrap(),
            Run::TooManyRows { columns: 3 }
        );
        assert_eq!(
            digest(&gc, "SELECT a FROM t", spec, Some(3), None, &budget).unwrap(),
            Run::OtherColumns { columns: 1 }
        );
    }

    #[test]
    fn render_respects_max_chars() {
        let cols = vec!["x".to_string()];
        let rows: Vec<Vec<Cell>> = (0..50).map(|i| vec![Cell::Int(i)]).collect();
        let o = ToolOptions {
            max_rows: 50,
            max_cell_chars: 10,
            max_chars: 60,
            count_cap: 100,
        };
        let (text, cut) = render(&cols, &rows, 50, false, o);
        assert!(cut);
        assert!(text.len() <= 60, "{} chars: {text}", text.len());
        assert!(text.contains("50 rows in all"));
    }
}
