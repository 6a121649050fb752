//! Scanning SQL text without parsing it: where the first statement ends, what keyword it
//! starts with, and whether its outermost SELECT has an ORDER BY.
//!
//! The scanner knows SQLite's lexical rules for the parts that can hide a `;` or a keyword:
//! quoted strings and identifiers ('…', "…", `…`, […]) and comments (-- and /* */, the latter
//! running to the end of the text when unterminated, as in SQLite). Safety never rests on it
//! alone: SQLite prepares the cut text, and `guard` checks the prepared statement.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Word,
    Quoted,
    Semicolon,
    OpenParen,
    CloseParen,
    Other,
}

#[derive(Debug, Clone, Copy)]
pub struct Token {
    pub kind: TokenKind,
    pub start: usize,
    pub end: usize,
}

/// Iterator over the significant tokens of `sql` (whitespace and comments skipped).
pub struct Tokens<'a> {
    bytes: &'a [u8],
    pos: usize,
}

pub fn tokens(sql: &str) -> Tokens<'_> {
    Tokens {
        bytes: sql.as_bytes(),
        pos: 0,
    }
}

impl Iterator for Tokens<'_> {
    type Item = Token;

    fn next(&mut self) -> Option<Token> {
        let b = self.bytes;
        loop {
            let i = self.pos;
            if i >= b.len() {
                return None;
            }
            let c = b[i];
            if c.is_ascii_whitespace() {
                self.pos += 1;
                continue;
            }
            if c == b'-' && b.get(i + 1) == Some(&b'-') {
                self.pos = memchr(b, i + 2, b'\n').map_or(b.len(), |p| p + 1);
                continue;
            }
            if c == b'/' && b.get(i + 1) == Some(&b'*') {
                self.pos = find_pair(b, i + 2, b'*', b'/').map_or(b.len(), |p| p + 2);
                continue;
            }
            let (kind, end) = match c {
                b'\'' | b'"' | b'`' => (TokenKind::Quoted, quoted_end(b, i, c)),
                b'[' => (
                    TokenKind::Quoted,
                    memchr(b, i + 1, b']').map_or(b.len(), |p| p + 1),
                ),
                b';' => (TokenKind::Semicolon, i + 1),
                b'(' => (TokenKind::OpenParen, i + 1),
                b')' => (TokenKind::CloseParen, i + 1),
                c if is_word_byte(c) => {
                    let mut j = i + 1;
                    while j < b.len() && is_word_byte(b[j]) {
                        j += 1;
                    }
                    (TokenKind::Word, j)
                }
                _ => (TokenKind::Other, i + 1),
            };
            self.pos = end;
            return Some(Token {
                kind,
                start: i,
                end,
            });
        }
    }
}

fn is_word_byte(c: u8) -> bool {
    // Identifier characters; bytes >= 0x80 (UTF-8 letters) count as in SQLite.
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

fn memchr(b: &[u8], from: usize, needle: u8) -> Option<usize> {
    b.get(from..)?
        .iter()
        .position(|&x| x == needle)
        .map(|p| p + from)
}

fn find_pair(b: &[u8], from: usize, x: u8, y: u8) -> Option<usize> {
    (from..b.len().saturating_sub(1)).find(|&k| b[k] == x && b[k + 1] == y)
}

/// End of a quoted token starting at `start`; a doubled quote is an escaped quote.
fn quoted_end(b: &[u8], start: usize, q: u8) -> usize {
    let mut j = start + 1;
    while j < b.len() {
        if b[j] == q {
            if b.get(j + 1) == Some(&q) {
                j += 2;
                continue;
            }
            return j + 1;
        }
        j += 1;
    }
    b.len()
}

/// The first statement of `sql`, split from what follows it.
#[derive(Debug, PartialEq, Eq)]
pub struct FirstStatement<'a> {
    /// Text from the first significant token to the end of the last one before `;` or the end:
    /// no leading or trailing comment, no trailing `;`.
    pub text: &'a str,
    /// The first word, upper-cased ("" when the statement starts with something else).
    pub keyword: String,
    /// True when anything but `;`, whitespace and comments follows the first statement.
    pub more_statements: bool,
    /// The text after the `;` that ends the first statement ("" when no `;` ends it).
    pub rest: &'a str,
}

/// Split off the first statement. `None` when the text holds no token at all.
pub fn first_statement(sql: &str) -> Option<FirstStatement<'_>> {
    let mut toks = tokens(sql);
    let first = toks.next()?;
    if first.kind == TokenKind::Semicolon {
        // Nothing before the first `;`: an empty statement; look for anything else.
        let rest = &sql[first.end..];
        let more = toks.any(|t| t.kind != TokenKind::Semicolon);
        return Some(FirstStatement {
            text: "",
            keyword: String::new(),
            more_statements: more,
            rest,
        });
    }
    let mut last_end = first.end;
    let mut more = false;
    let mut rest = "";
    for t in toks.by_ref() {
        if t.kind == TokenKind::Semicolon {
            rest = &sql[t.end..];
            more = toks.any(|t| t.kind != TokenKind::Semicolon);
            break;
        }
        last_end = t.end;
    }
    let keyword = if first.kind == TokenKind::Word {
        sql[first.start..first.end].to_ascii_uppercase()
    } else {
        String::new()
    };
    Some(FirstStatement {
        text: &sql[first.start..last_end],
        keyword,
        more_statements: more,
        rest,
    })
}

/// The word that says what a statement SQLite has parsed does, upper-cased: its first word, past
/// `EXPLAIN [QUERY PLAN]` and past a `WITH [RECURSIVE]` clause's common table expressions
/// (`name [(columns)] AS [NOT] [MATERIALIZED] (...)`, comma-separated), so
/// `WITH x AS (SELECT 1) DELETE FROM t` is a DELETE. "" when the statement starts with something
/// else. Only meaningful for text SQLite parsed: a CTE may be named like a keyword (`replace`).
pub fn verb(stmt: &str) -> String {
    let mut toks = tokens(stmt).peekable();
    let word =
        |t: &Token| (t.kind == TokenKind::Word).then(|| stmt[t.start..t.end].to_ascii_uppercase());
    let next_word = |toks: &mut std::iter::Peekable<Tokens<'_>>| toks.next().and_then(|t| word(&t));
    let mut first = next_word(&mut toks).unwrap_or_default();
    if first == "EXPLAIN" {
        first = next_word(&mut toks).unwrap_or_default();
        if first == "QUERY" {
            next_word(&mut toks); // PLAN
            first = next_word(&mut toks).unwrap_or_default();
        }
    }
    if first != "WITH" {
        return first;
    }
    // Skip a parenthesised group whose `(` is the next token.
    fn skip_group(toks: &mut std::iter::Peekable<Tokens<'_>>) {
        let mut depth = 0i32;
        for t in toks.by_ref() {
            match t.kind {
                TokenKind::OpenParen => depth += 1,
                TokenKind::CloseParen => depth -= 1,
                _ => {}
            }
            if depth <= 0 {
                return;
            }
        }
    }
    if toks.peek().and_then(word).as_deref() == Some("RECURSIVE") {
        toks.next();
    }
    loop {
        toks.next(); // the CTE's name
        if toks.peek().is_some_and(|t| t.kind == TokenKind::OpenParen) {
            skip_group(&mut toks); // its column names
        }
        // AS [NOT] [MATERIALIZED], up to the body's `(`.
        while toks.peek().is_some_and(|t| t.kind == TokenKind::Word) {
            toks.next();
        }
        skip_group(&mut toks);
        match toks.peek() {
            Some(t) if t.kind == TokenKind::Other && &stmt[t.start..t.end] == "," => {
                toks.next();
            }
            _ => return toks.next().and_then(|t| word(&t)).unwrap_or_default(),
        }
    }
}

/// Whether the statement's outermost query ends in ORDER BY (a top-level ORDER BY, outside
/// every parenthesis: CTE bodies, subqueries, window definitions and aggregate arguments are
/// nested). This is what makes the `auto` method choose ordered comparison.
pub fn has_outer_order_by(stmt: &str) -> bool {
    let mut depth = 0i32;
    let mut prev_order = false;
    for t in tokens(stmt) {
        match t.kind {
            TokenKind::OpenParen => depth += 1,
            TokenKind::CloseParen => depth -= 1,
            TokenKind::Semicolon => break,
            TokenKind::Word if depth == 0 => {
                let w = &stmt[t.start..t.end];
                if prev_order && w.eq_ignore_ascii_case("BY") {
                    return true;
                }
                prev_order = w.eq_ignore_ascii_case("ORDER");
                continue;
            }
            _ => {}
        }
        prev_order = false;
    }
    false
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn first_statement_strips_comments_and_semicolons() {
        let s = first_statement("  -- hi\n /* x */ select 1 -- tail\n ; ;  -- more\n").unwrap();
        assert_eq!(s.text, "select 1");
        assert_eq!(s.keyword, "SELECT");
        assert!(!s.more_statements);
    }

    #[test]
    fn second_statement_is_seen_past_strings_and_comments() {
        let s = first_statement("SELECT ';' /* ; */; DROP TABLE t").unwrap();
        assert_eq!(s.text, "SELECT ';'");
        assert!(s.more_statements);
        assert!(
            !first_statement("SELECT \"a;b\", [c;d], `e;f`")
                .unwrap()
                .more_statements
        );
        assert!(!first_statement("SELECT 'it''s;'").unwrap().more_statements);
    }

    #[test]
    fn unterminated_comment_runs_to_the_end() {
        let s = first_statement("SELECT 1 /* ; DELETE FROM t").unwrap();
        assert_eq!(s.text, "SELECT 1");
        assert!(!s.more_statements);
    }

    #[test]
    fn empty_and_comment_only_text() {
        assert!(first_statement("").is_none());
        assert!(first_statement("  -- only a comment").is_none());
        assert!(first_statement("/* c */").is_none());
        let s = first_statement(";").unwrap();
        assert_eq!(s.text, "");
        assert!(!s.more_statements);
        assert!(first_statement("; SELECT 1").unwrap().more_statements);
    }

    #[test]
    fn keyword_is_upper_cased_word_only() {
        assert_eq!(
            first_statement("with x as (select 1) select * from x")
                .unwrap()
                .keyword,
            "WITH"
        );
        assert_eq!(first_statement("(SELECT 1)").unwrap().keyword, "");
        assert_eq!(first_statement("values(1)").unwrap().keyword, "VALUES");
    }

    #[test]
    fn the_rest_is_what_follows_the_first_semicolon() {
        let s = first_statement("SELECEL 1; DROP TABLE t; -- c").unwrap();
        assert_eq!(s.rest, " DROP TABLE t; -- c");
        assert_eq!(first_statement(s.rest).unwrap().rest, " -- c");
        assert_eq!(first_statement("SELECT 1").unwrap().rest, "");
        assert_eq!(first_statement(";; x").unwrap().rest, "; x");
    }

    #[test]
    fn the_verb_looks_past_explain_and_common_table_expressions() {
        assert_eq!(verb("select 1"), "SELECT");
        assert_eq!(verb("DROP TABLE t"), "DROP");
        assert_eq!(verb("EXPLAIN QUERY PLAN DELETE FROM t"), "DELETE");
        assert_eq!(verb("explain select 1"), "SELECT");
        assert_eq!(verb("WITH x AS (SELECT 1) DELETE FROM t"), "DELETE");
        assert_eq!(
            verb("WITH RECURSIVE replace(a, b) AS NOT MATERIALIZED (SELECT 1, 2), \"y\" AS (VALUES (1)) SELECT * FROM replace"),
            "SELECT"
        );
        assert_eq!(
            verb("with x as (select ';') insert into t select * from x"),
            "INSERT"
        );
        assert_eq!(verb("WITH x AS (SELECT 1) VALUES (2)"), "VALUES");
        assert_eq!(verb("(SELECT 1)"), "");
        assert_eq!(verb(""), "");
        assert_eq!(verb("WITH"), "");
    }

    #[test]
    fn outer_order_by_only_at_depth_zero() {
        assert!(has_outer_order_by("SELECT a FROM t ORDER BY a"));
        assert!(has_outer_order_by(
            "select a from t order\n by a desc limit 3"
        ));
        assert!(has_outer_order_by(
            "SELECT a FROM t UNION SELECT b FROM u ORDER BY 1"
        ));
        assert!(!has_outer_order_by(
            "SELECT a FROM (SELECT a FROM t ORDER BY a)"
        ));
        assert!(!has_outer_order_by(
            "WITH x AS (SELECT a FROM t ORDER BY a) SELECT * FROM x"
        ));
        assert!(!has_outer_order_by(
            "SELECT rank() OVER (ORDER BY a) FROM t"
        ));
        assert!(!has_outer_order_by(
            "SELECT group_concat(a ORDER BY b) FROM t"
        ));
        assert!(!has_outer_order_by("SELECT 'ORDER BY' FROM t"));
        assert!(!has_outer_order_by("SELECT a AS \"order\", b AS by FROM t"));
        assert!(!has_outer_order_by("SELECT a FROM t -- ORDER BY a"));
    }
}
