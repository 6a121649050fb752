//! Exactness: each replacement against SQLite's own built-in on a connection without it, for
//! arguments of every type (NULL, integers, reals, text with multi-byte and invalid UTF-8, blobs,
//! empty values, NUL bytes) and for the operators queries write (`LIKE ... ESCAPE`, `GLOB`).
//! Same value, same type, same error message. And the stop: a call past its deadline ends the
//! query as a timeout.

use std::sync::Arc;

use proptest::prelude::*;
use rusqlite::limits::Limit;
use rusqlite::types::ValueRef;
use rusqlite::Connection;

use super::super::deadline::RunControl;
use super::register;

/// An argument, and how it is bound: raw text goes in as a blob cast to TEXT, so text that is not
/// UTF-8 reaches the function as text.
#[derive(Debug, Clone)]
enum Arg {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    RawText(Vec<u8>),
    Blob(Vec<u8>),
}

impl Arg {
    fn placeholder(&self, n: usize) -> String {
        match self {
            Arg::RawText(_) => format!("CAST(?{n} AS TEXT)"),
            _ => format!("?{n}"),
        }
    }
    fn bind(&self) -> rusqlite::types::Value {
        use rusqlite::types::Value;
        match self {
            Arg::Null => Value::Null,
            Arg::Int(i) => Value::Integer(*i),
            Arg::Real(r) => Value::Real(*r),
            Arg::Text(t) => Value::Text(t.clone()),
            Arg::RawText(b) | Arg::Blob(b) => Value::Blob(b.clone()),
        }
    }
}

/// What a query answered: (type, bytes of the value) or the error's message.
type Answer = Result<(&'static str, Vec<u8>), String>;

fn answer(conn: &Connection, sql: &str, args: &[Arg]) -> Answer {
    let values: Vec<_> = args.iter().map(Arg::bind).collect();
    conn.query_row(sql, rusqlite::params_from_iter(values), |row| {
        Ok(match row.get_ref(0)? {
            ValueRef::Null => ("null", vec![]),
            ValueRef::Integer(i) => ("integer", i.to_string().into_bytes()),
            ValueRef::Real(r) => ("real", r.to_bits().to_string().into_bytes()),
            ValueRef::Text(t) => ("text", t.to_vec()),
            ValueRef::Blob(b) => ("blob", b.to_vec()),
        })
    })
    .map_err(|e| match e {
        rusqlite::Error::SqliteFailure(_, Some(m)) => m,
        other => other.to_string(),
    })
}

/// SQLite as it comes, and SQLite with the replacements, both with `limits`.
fn pair(limits: &[(Limit, i32)]) -> (Connection, Connection) {
    let builtin = Connection::open_in_memory().unwrap();
    let replaced = Connection::open_in_memory().unwrap();
    register(&replaced, &Arc::new(RunControl::new())).unwrap();
    for conn in [&builtin, &replaced] {
        for (limit, value) in limits {
            conn.set_limit(*limit, *value).unwrap();
        }
    }
    (builtin, replaced)
}

fn same(conns: &(Connection, Connection), template: &str, args: &[Arg]) {
    let holes: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, a)| a.placeholder(i + 1))
        .collect();
    let mut sql = template.to_string();
    for (i, hole) in holes.iter().enumerate().rev() {
        sql = sql.replace(&format!("${}", i + 1), hole);
    }
    let want = answer(&conns.0, &sql, args);
    let got = answer(&conns.1, &sql, args);
    assert_eq!(got, want, "{sql} with {args:?}");
}

/// Characters that mean something to one of the functions, multi-byte ones, and plain letters.
const CHARS: &[char] = &[
    '%',
    '_',
    '*',
    '?',
    '[',
    ']',
    '^',
    '-',
    '\\',
    '!',
    'a',
    'A',
    'b',
    'B',
    'z',
    ' ',
    '0',
    '9',
    'f',
    'F',
    'g',
    'é',
    'É',
    'ß',
    '漢',
    '\u{10348}',
    '\u{FFFD}',
    '\0',
];
/// Bytes for blobs and for text that is not UTF-8: ASCII that matters, continuation bytes,
/// lead bytes of every length (0xF8..0xFF lead nothing valid), NUL.
const BYTES: &[u8] = &[
    0x00, b'%', b'_', b'*', b'?', b'[', b']', b'^', b'-', b'a', b'A', b'b', b' ', b'0', b'f', 0x80,
    0x9F, 0xBF, 0xC0, 0xC3, 0xA9, 0xDF, 0xE0, 0xED, 0xA0, 0xEF, 0xF0, 0xF4, 0xF8, 0xFC, 0xFE, 0xFF,
];

fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(CHARS), 0..max).prop_map(|v| v.into_iter().collect())
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(BYTES), 0..max)
}

/// Any argument, mostly text.
fn arg(max: usize) -> impl Strategy<Value = Arg> {
    prop_oneof![
        1 => Just(Arg::Null),
        1 => (-20i64..200).prop_map(Arg::Int),
        1 => prop::sample::select(&[0.0, -1.5, 2.25, 1e300, f64::NAN][..]).prop_map(Arg::Real),
        6 => text(max).prop_map(Arg::Text),
        2 => bytes(max).prop_map(Arg::RawText),
        2 => bytes(max).prop_map(Arg::Blob),
    ]
}

/// Text or NULL, for an ESCAPE: mostly one character, sometimes none or two.
fn escape() -> impl Strategy<Value = Arg> {
    prop_oneof![
        6 => prop::sample::select(CHARS).prop_map(|c| Arg::Text(c.to_string())),
        1 => text(3).prop_map(Arg::Text),
        1 => bytes(2).prop_map(Arg::RawText),
        1 => Just(Arg::Null),
        1 => (0i64..10).prop_map(Arg::Int),
    ]
}

/// Patterns and strings dense in what LIKE and GLOB treat specially.
const PATTERN_CHARS: &[char] = &[
    '%', '_', '!', '*', '?', '[', ']', '^', '-', 'a', 'A', 'é', 'É',
];

fn dense(max: usize) -> impl Strategy<Value = Arg> {
    prop::collection::vec(prop::sample::select(PATTERN_CHARS), 0..max)
        .prop_map(|v| Arg::Text(v.into_iter().collect()))
}

/// A pattern and a string made from it (each character kept, dropped, doubled or changed), so
/// near-matches, where the rules decide, are common.
fn pattern_and_string() -> impl Strategy<Value = (Arg, Arg)> {
    let chars = prop::collection::vec(
        (
            prop::sample::select(PATTERN_CHARS),
            0u8..8,
            prop::sample::select(PATTERN_CHARS),
        ),
        0..9,
    );
    chars.prop_map(|v| {
        let pattern: String = v.iter().map(|(c, _, _)| *c).collect();
        let mut string = String::new();
        for (c, how, other) in v {
            match how {
                0 => {}
                1 => string.extend([c, c]),
                2 => string.push(other),
                _ => string.push(c),
            }
        }
        (Arg::Text(pattern), Arg::Text(string))
    })
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 3000,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn instr_is_sqlites(h in arg(24), n in arg(4)) {
        let conns = pair(&[]);
        same(&conns, "SELECT instr($1, $2)", &[h, n]);
    }

    #[test]
    fn replace_is_sqlites(s in arg(24), p in arg(3), r in arg(4)) {
        // A small LENGTH limit, so results past it are refused the same way.
        let conns = pair(&[(Limit::SQLITE_LIMIT_LENGTH, 40)]);
        same(&conns, "SELECT replace($1, $2, $3)", &[s, p, r]);
    }

    #[test]
    fn like_is_sqlites(p in arg(10), s in arg(14), e in escape()) {
        let conns = pair(&[(Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 12)]);
        same(&conns, "SELECT $2 LIKE $1", &[p.clone(), s.clone()]);
        same(&conns, "SELECT $2 NOT LIKE $1", &[p.clone(), s.clone()]);
        same(&conns, "SELECT like($1, $2)", &[p.clone(), s.clone()]);
        same(&conns, "SELECT $2 LIKE $1 ESCAPE $3", &[p.clone(), s.clone(), e.clone()]);
        same(&conns, "SELECT like($1, $2, $3)", &[p, s, e]);
    }

    #[test]
    fn like_on_dense_patterns_is_sqlites(p in dense(8), s in dense(10), (q, t) in pattern_and_string(),
                                         e in prop::sample::select(&["!", "%", "_", "a", "é"][..])) {
        let conns = pair(&[]);
        let e = Arg::Text(e.to_string());
        for (p, s) in [(p, s), (q, t)] {
            same(&conns, "SELECT $2 LIKE $1", &[p.clone(), s.clone()]);
            same(&conns, "SELECT $2 LIKE $1 ESCAPE $3", &[p, s, e.clone()]);
        }
    }

    #[test]
    fn glob_on_dense_patterns_is_sqlites(p in dense(8), s in dense(10), (q, t) in pattern_and_string()) {
        let conns = pair(&[]);
        same(&conns, "SELECT $2 GLOB $1", &[p, s]);
        same(&conns, "SELECT $2 GLOB $1", &[q, t]);
    }

    #[test]
    fn glob_is_sqlites(p in arg(10), s in arg(14)) {
        let conns = pair(&[(Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 12)]);
        same(&conns, "SELECT $2 GLOB $1", &[p.clone(), s.clone()]);
        same(&conns, "SELECT glob($1, $2)", &[p, s]);
    }

    #[test]
    fn trims_are_sqlites(s in arg(16), set in arg(6)) {
        let conns = pair(&[]);
        for f in ["trim", "ltrim", "rtrim"] {
            same(&conns, &format!("SELECT {f}($1, $2)"), &[s.clone(), set.clone()]);
        }
    }

    #[test]
    fn unhex_is_sqlites(h in arg(16), pass in arg(6)) {
        let conns = pair(&[]);
        same(&conns, "SELECT unhex($1, $2)", &[h, pass]);
    }

    /// Hex text with separators, so the result is not almost always NULL.
    #[test]
    fn unhex_of_hex_with_separators_is_sqlites(
        parts in prop::collection::vec((prop::sample::select(&["ab", "0F", "9", "", "c3a9"][..]),
                                        prop::sample::select(&["", " ", "-", "é", "\u{10348}", "x"][..])), 0..8),
        pass in prop::sample::select(&["", " ", " -", "é -", "\u{10348}", "-é\u{10348} "][..]),
    ) {
        let conns = pair(&[]);
        let hex: String = parts.iter().map(|(h, sep)| format!("{h}{sep}")).collect();
        same(&conns, "SELECT unhex($1, $2)", &[Arg::Text(hex), Arg::Text(pass.to_string())]);
    }
}

/// Patterns that take SQLite's slow paths: several wildcards, classes after `*`, escapes
/// after `%`, against strings long enough for the searches to resume.
#[test]
fn wildcard_searches_match_sqlites_on_longer_strings() {
    let conns = pair(&[]);
    let strings = [
        "aXbXcabcXbc",
        "ééaé漢aéb",
        "a%b_c[d]e*f?g",
        "abababababababababab",
        "",
        "xyz",
    ];
    let patterns = [
        "%a%b%c", "%a_c%", "%ab%ab%b", "%é%b", "%漢_é%", "%!%%", "%!_%", "a%", "%", "%%_%_", "_%_",
        "a!_b%", "aX!_%", "%b!_c%", "!%b%", "%a%%", "_!%", "%_a!",
    ];
    // (A pattern with `!_` not right after `%` is what tells an escaped `_` from a wildcard; the
    // strings above hold `_`, and "aXb..." holds other characters where it stands.)
    let globs = [
        "*[a-c]*[c]",
        "*[^a]*",
        "*[]]*",
        "*[a-]*",
        "*?b*",
        "a*b*c*",
        "*[é-漢]*",
        "*[",
        "[",
        "*",
    ];
    for s in strings {
        for p in patterns {
            for e in ["!", "%", "_", "a"] {
                same(
                    &conns,
                    "SELECT $2 LIKE $1 ESCAPE $3",
                    &[
                        Arg::Text(p.into()),
                        Arg::Text(s.into()),
                        Arg::Text(e.into()),
                    ],
                );
            }
            same(
                &conns,
                "SELECT $2 LIKE $1",
                &[Arg::Text(p.into()), Arg::Text(s.into())],
            );
        }
        for g in globs {
            same(
                &conns,
                "SELECT $2 GLOB $1",
                &[Arg::Text(g.into()), Arg::Text(s.into())],
            );
        }
    }
}

#[test]
fn functions_sqlite_does_not_replace_are_its_own() {
    // The one-argument trim and unhex, and every other built-in, stay SQLite's.
    let names: Vec<_> = super::replaced().collect();
    assert!(names.contains(&("trim", 2)) && !names.contains(&("trim", 1)));
    assert!(names.contains(&("unhex", 2)) && !names.contains(&("unhex", 1)));
    let conns = pair(&[]);
    let listed = |conn: &Connection| -> Vec<(String, i64, i64)> {
        let mut stmt = conn
            .prepare("SELECT name, narg, builtin FROM pragma_function_list ORDER BY 1, 2, 3")
            .unwrap();
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)));
        rows.unwrap().collect::<rusqlite::Result<_>>().unwrap()
    };
    let (builtin, replaced) = (listed(&conns.0), listed(&conns.1));
    // Functions a connection defines (builtin = 0): the extensions' (FTS, R*Tree), and ours.
    let mine: Vec<_> = replaced
        .iter()
        .filter(|f| f.2 == 0 && !builtin.contains(f))
        .collect();
    assert_eq!(mine.len(), names.len(), "{mine:?}");
    for (name, n, _) in mine {
        assert!(names.contains(&(name.as_str(), *n as i32)), "{name}/{n}");
        assert!(
            builtin.iter().any(|(b, bn, _)| b == name && bn == n),
            "{name}/{n}"
        );
    }
}

#[test]
#[ignore = "a timing probe, run by hand: cargo test --release -- --ignored --nocapture speed"]
fn speed_against_the_builtins() {
    let conns = pair(&[]);
    for conn in [&conns.0, &conns.1] {
        conn.execute_batch(
            "CREATE TABLE t(d TEXT); WITH RECURSIVE n(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM n \
             WHERE x < 999999) INSERT INTO t SELECT printf('row-%08d', x) FROM n;",
        )
        .unwrap();
    }
    for q in [
        "SELECT count(*) FROM t WHERE d LIKE '%0012345%'",
        "SELECT count(*) FROM t WHERE d LIKE 'ROW-0001%'",
        "SELECT count(*) FROM t WHERE d GLOB '*12[3-5]4*'",
        "SELECT count(*) FROM t WHERE instr(d, '999') > 0",
        "SELECT sum(length(replace(d, '0', 'xy'))) FROM t",
        "SELECT sum(length(trim(d, 'row-'))) FROM t",
        "SELECT count(*) FROM t WHERE d > 'row-00500000'",
    ] {
        let mut best = [f64::MAX; 2];
        for _ in 0..5 {
            for (k, conn) in [&conns.0, &conns.1].iter().enumerate() {
                let t = std::time::Instant::now();
                let _: i64 = conn.query_row(q, [], |r| r.get(0)).unwrap();
                best[k] = best[k].min(t.elapsed().as_secs_f64());
            }
        }
        println!(
            "{q}: builtin {:.1} ms, replaced {:.1} ms ({:.2}x)",
            best[0] * 1e3,
            best[1] * 1e3,
            best[1] / best[0]
        );
    }
}

// ---- JSON: the bounded functions are SQLite's own below their bounds, json_pretty is laid out
// as SQLite lays it out.

/// JSON text: nested arrays and objects (keys repeat), numbers, strings with escapes and
/// multi-byte characters, and now and then JSON5 (hex, leading dots, single quotes, bare keys,
/// trailing commas, comments, Infinity).
fn json_text(depth: u32) -> BoxedStrategy<String> {
    let scalar = prop::sample::select(
        &[
            "null",
            "true",
            "false",
            "0",
            "-0",
            "1",
            "-17",
            "12345678901234567890",
            "1.5",
            "-2.25e-3",
            "1e300",
            "\"\"",
            "\"a\"",
            "\"é\\n\\u00e9\\\"\\\\\"",
            "\"\\ud834\\udd1e\"",
            "\"漢 x\"",
            "0x1F",
            ".5",
            "+3",
            "Infinity",
            "'q'",
            "\"\\x41\"",
            "NaN",
        ][..],
    )
    .prop_map(str::to_string)
    .boxed();
    if depth == 0 {
        return scalar;
    }
    let inner = json_text(depth - 1);
    let key = prop::sample::select(&["\"a\"", "\"b\"", "\"\"", "\"é\"", "c", "'d'"][..]);
    let sep = prop::sample::select(&[",", ", ", " ,\n", ",/*c*/"][..]);
    prop_oneof![
        3 => scalar,
        1 => (prop::collection::vec(inner.clone(), 0..4), sep.clone(), any::<bool>()).prop_map(
            |(items, sep, trailing)| {
                let tail = if trailing && !items.is_empty() { "," } else { "" };
                format!("[{}{tail}]", items.join(sep))
            }
        ),
        1 => (prop::collection::vec((key, inner), 0..4), sep).prop_map(|(items, sep)| {
            let items: Vec<String> = items.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
            format!("{{{}}}", items.join(sep))
        }),
    ]
    .boxed()
}

/// A document argument: JSON text, its JSONB (made in the query: `jsonb(?)`), or something else.
fn json_doc() -> impl Strategy<Value = (Arg, bool)> {
    prop_oneof![
        6 => (json_text(3), any::<bool>()).prop_map(|(t, as_blob)| (Arg::Text(t), as_blob)),
        1 => arg(8).prop_map(|a| (a, false)),
        1 => Just((Arg::Text("{\"a\":[1,2,{\"b\":null}],\"c\":\"x\"}".into()), false)),
    ]
}

fn json_path() -> impl Strategy<Value = Arg> {
    prop_oneof![
        8 => prop::sample::select(
            &["$", "$.a", "$.b", "$.c", "$.\"a\"", "$[0]", "$[1]", "$[#]", "$[#-1]", "$.a[0]",
              "$.a[1].b", "$.é", "$.a.b.c", "$[2]", "$.x"][..]
        )
        .prop_map(|p| Arg::Text(p.to_string())),
        1 => prop::sample::select(&["a", "$.", "$[", "$[x]", "", "$a"][..]).prop_map(|p| Arg::Text(p.into())),
        1 => Just(Arg::Null),
        1 => (0i64..3).prop_map(Arg::Int),
    ]
}

/// A value to insert: an SQL value, or JSON (`json(?)`, which marks it JSON text by its subtype).
fn json_value() -> impl Strategy<Value = (Arg, bool)> {
    prop_oneof![
        2 => arg(6).prop_map(|a| (a, false)),
        2 => json_text(2).prop_map(|t| (Arg::Text(t), true)),
    ]
}

/// `$N`, or `jsonb($N)` / `json($N)` when the flag says so.
fn wrap(n: usize, flag: bool, with: &str) -> String {
    if flag {
        format!("{with}(${n})")
    } else {
        format!("${n}")
    }
}

/// SQLite as it comes and SQLite with the replacements, with a LENGTH limit small enough that
/// results past it are refused alike.
fn json_pair() -> (Connection, Connection) {
    pair(&[(Limit::SQLITE_LIMIT_LENGTH, 600)])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn json_paths_are_sqlites((doc, blob) in json_doc(), paths in prop::collection::vec(json_path(), 0..4)) {
        let conns = json_pair();
        let mut args = vec![doc];
        args.extend(paths);
        let holes: Vec<String> = (2..=args.len()).map(|n| format!("${n}")).collect();
        let d = wrap(1, blob, "jsonb");
        for f in ["json_extract", "jsonb_extract", "json_remove", "jsonb_remove"] {
            let sep = if holes.is_empty() { "" } else { ", " };
            same(&conns, &format!("SELECT {f}({d}{sep}{})", holes.join(", ")), &args);
        }
    }

    #[test]
    fn json_edits_are_sqlites((doc, blob) in json_doc(),
                              pairs in prop::collection::vec((json_path(), json_value()), 0..4),
                              odd in any::<bool>()) {
        let conns = json_pair();
        let mut args = vec![doc];
        let mut holes = vec![wrap(1, blob, "jsonb")];
        for (path, (value, is_json)) in pairs {
            args.push(path);
            holes.push(format!("${}", args.len()));
            args.push(value);
            holes.push(wrap(args.len(), is_json, "json"));
        }
        if odd && holes.len() > 1 {
            holes.pop();  // a path without its value: SQLite's argument-count error
        }
        for f in ["json_set", "jsonb_set", "json_insert", "jsonb_insert", "json_replace",
                  "jsonb_replace", "json_array_insert", "jsonb_array_insert"] {
            same(&conns, &format!("SELECT {f}({})", holes.join(", ")), &args);
        }
    }

    #[test]
    fn json_builders_are_sqlites(values in prop::collection::vec(json_value(), 0..5),
                                 labels in prop::collection::vec(arg(4), 0..5)) {
        let conns = json_pair();
        let args: Vec<Arg> = values.iter().map(|(a, _)| a.clone()).chain(labels.iter().cloned()).collect();
        let vals: Vec<String> = values.iter().enumerate().map(|(i, (_, j))| wrap(i + 1, *j, "json")).collect();
        for f in ["json_array", "jsonb_array"] {
            same(&conns, &format!("SELECT {f}({})", vals.join(", ")), &args);
        }
        // Labels after the values; as many pairs as both have, then maybe one label alone.
        let mut holes = vec![];
        for (i, v) in vals.iter().enumerate().take(labels.len()) {
            holes.push(format!("${}", values.len() + i + 1));
            holes.push(v.clone());
        }
        if labels.len() > values.len() {
            holes.push(format!("${}", values.len() + values.len() + 1));
        }
        for f in ["json_object", "jsonb_object"] {
            same(&conns, &format!("SELECT {f}({})", holes.join(", ")), &args);
        }
        // Results that carry the JSON subtype into another replaced function, and back out.
        same(&conns, &format!("SELECT json_array(json_array({0}), json_object('k', json_array({0})), \
                               json_extract(json_array({0}), '$'), json_extract(json_array({0}), '$[0]', '$[1]'))",
                              vals.join(", ")), &args);
    }

    #[test]
    fn json_patch_is_sqlites((target, tb) in json_doc(), (patch, pb) in json_doc()) {
        let conns = json_pair();
        for f in ["json_patch", "jsonb_patch"] {
            same(&conns, &format!("SELECT {f}({}, {})", wrap(1, tb, "jsonb"), wrap(2, pb, "jsonb")),
                 &[target.clone(), patch.clone()]);
        }
    }

    #[test]
    fn json_pretty_is_sqlites((doc, blob) in json_doc(), indent in prop_oneof![
        Just(Arg::Null), text(3).prop_map(Arg::Text), Just(Arg::Text("\t".into())),
        Just(Arg::Text(" \0 ".into())), (0i64..30).prop_map(Arg::Int), bytes(3).prop_map(Arg::RawText)]) {
        let conns = json_pair();
        let d = wrap(1, blob, "jsonb");
        same(&conns, &format!("SELECT json_pretty({d})"), std::slice::from_ref(&doc));
        same(&conns, &format!("SELECT json_pretty({d}, $2)"), &[doc, indent]);
    }

    /// Blobs that SQLite may take for JSONB, well-formed or not.
    #[test]
    fn json_pretty_of_any_blob_is_sqlites(blob in prop::collection::vec(any::<u8>(), 0..24),
                                          (doc, _) in json_doc()) {
        let conns = json_pair();
        same(&conns, "SELECT json_pretty($1)", &[Arg::Blob(blob.clone())]);
        // A well-formed JSONB with bytes changed.
        same(&conns, "SELECT json_pretty(CAST(substr(jsonb($1), 1, length(jsonb($1)) - 1) || $2 AS BLOB))",
             &[doc, Arg::Blob(blob)]);
    }
}

#[test]
fn json_pretty_refuses_a_thousandth_level_as_sqlite_does() {
    let conns = pair(&[]);
    for depth in [998, 999, 1000] {
        for inner in ["", "1"] {
            let doc = format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth));
            for sql in [
                "SELECT json_pretty($1)",
                "SELECT json_pretty(jsonb($1), '')",
            ] {
                same(&conns, sql, &[Arg::Text(doc.clone())]);
            }
        }
    }
    // Past the value limit with a level too deep further on: SQLite's answer is the depth.
    let conns = pair(&[(Limit::SQLITE_LIMIT_LENGTH, 5000)]);
    let doc = format!(
        "[{}, {}1{}]",
        "1,".repeat(3000) + "1",
        "[".repeat(1000),
        "]".repeat(1000)
    );
    same(&conns, "SELECT json_pretty($1)", &[Arg::Text(doc)]);
}

/// Calls past their bound are an SQL error that says what to do; calls within it are SQLite's.
#[test]
fn json_calls_past_their_bounds_are_refused() {
    let conns = pair(&[(Limit::SQLITE_LIMIT_LENGTH, 1000)]);
    let refused = |sql: &str, word: &str| {
        let sql = &format!("{sql} AS r"); // the expression is not the column's name: it is long
        let got = answer(&conns.1, sql, &[]);
        assert!(
            matches!(&got, Err(m) if m.contains(word) && m.contains("one call")),
            "{sql}: {got:?}"
        );
        assert!(
            answer(&conns.0, sql, &[]).is_ok() || word == "build",
            "{sql}"
        );
    };
    let doc = format!("'[{}1]'", "1,".repeat(200)); // 403 bytes
    refused(
        &format!("SELECT json_extract({doc}, '$[0]', '$[1]', '$[2]', '$[3]', '$[4]')"),
        "paths",
    );
    refused(
        &format!("SELECT json_remove({doc}, '$[0]', '$[1]', '$[2]', '$[3]', '$[4]')"),
        "paths",
    );
    refused(
        &format!("SELECT json_set({doc}, '$[0]', 1, '$[1]', 2, '$[2]', 3, '$[3]', 4, '$[4]', 5)"),
        "edits",
    );
    refused(&format!("SELECT json_array({doc}, {doc}, {doc})"), "build");
    refused(
        &format!("SELECT json_object('a', {doc}, 'b', {doc}, 'c', {doc})"),
        "build",
    );
    // Within the bound: SQLite's answer.
    same(
        &conns,
        &format!("SELECT json_extract({doc}, '$[0]', '$[#-1]')"),
        &[],
    );
    same(&conns, &format!("SELECT json_array({doc}, {doc})"), &[]);
    // An argument count SQLite refuses is SQLite's error whatever the sizes.
    same(
        &conns,
        &format!("SELECT json_set({doc}, '$[0]', 1, '$[1]', 2, '$[2]', 3, '$[3]')"),
        &[],
    );
    same(
        &conns,
        &format!("SELECT json_object('a', {doc}, 'b', {doc}, 'c')"),
        &[],
    );
    // json_patch: the product of the two sizes.
    let conns = pair(&[]);
    let big = format!("'{{{}\"z\":0}}'", "\"y\":0,".repeat(3000)); // 18 KB
    let got = answer(&conns.1, &format!("SELECT json_patch({big}, {big})"), &[]);
    assert!(matches!(&got, Err(m) if m.contains("patch")), "{got:?}");
    same(
        &conns,
        &format!("SELECT json_patch({big}, '{{\"y\":null,\"w\":[1]}}')"),
        &[],
    );
}

/// A JSON call made after the deadline stops the statement as a timeout, however small.
#[test]
fn a_json_call_past_the_deadline_stops_the_statement() {
    let conn = Connection::open_in_memory().unwrap();
    let gc = super::super::GuardedConnection::harden(conn, "memory".into(), true).unwrap();
    for sql in [
        "SELECT json_extract('[1]', '$[0]')",
        "SELECT json_pretty('[1]')",
    ] {
        gc.arm(&super::super::Budget::new(0.0)).unwrap();
        let got = gc
            .conn
            .query_row(sql, [], |r| r.get::<_, rusqlite::types::Value>(0));
        gc.disarm();
        let interrupted = rusqlite::ErrorCode::OperationInterrupted;
        assert!(
            matches!(&got, Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == interrupted),
            "{sql}: {got:?}"
        );
        gc.arm(&super::super::Budget::new(10.0)).unwrap();
        assert!(
            gc.conn
                .query_row(sql, [], |r| r.get::<_, rusqlite::types::Value>(0))
                .is_ok(),
            "{sql}"
        );
        gc.disarm();
    }
}
