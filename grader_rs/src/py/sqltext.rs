//! `sql_tokens`: the core's SQL scanner (`crate::sqltext`) for Python, so every scan of SQL text
//! in t2sql splits it the same way (quotes, comments, words).

use pyo3::prelude::*;

use crate::sqltext::{self, TokenKind};

fn kind_name(kind: TokenKind) -> &'static str {
    match kind {
        TokenKind::Word => "word",
        TokenKind::Quoted => "quoted",
        TokenKind::Semicolon => "semicolon",
        TokenKind::OpenParen => "open",
        TokenKind::CloseParen => "close",
        TokenKind::Other => "other",
    }
}

/// The significant tokens of `sql` (whitespace and comments skipped) as (kind, start, end), with
/// start and end in characters (Python string indices), not bytes.
#[pyfunction]
pub(crate) fn sql_tokens(sql: &str) -> Vec<(&'static str, usize, usize)> {
    let mut out = Vec::new();
    let (mut byte_at, mut char_at) = (0usize, 0usize);
    for t in sqltext::tokens(sql) {
        // Tokens start and end on character boundaries: bytes >= 0x80 only occur inside words
        // and quoted tokens, which the scanner never splits.
        char_at += sql[byte_at..t.start].chars().count();
        let len = sql[t.start..t.end].chars().count();
        out.push((kind_name(t.kind), char_at, char_at + len));
        byte_at = t.end;
        char_at += len;
    }
    out
}
