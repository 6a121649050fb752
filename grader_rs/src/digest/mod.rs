//! Streaming digests of a query result: multiset, ordered, set and subset
//! (docs/grader.md#set-and-subset-at-the-releases-scale).
//!
//! A row key is XXH3-128, keyed with a process secret, over the row's canonical encoding
//! (canon.rs); with `ColumnOrder::Ignore` over its cells' encodings sorted, so a row compares as
//! the multiset of its cells. The multiset digest is (rows, columns, Σ keys mod 2^128) — a sum,
//! never an XOR, so duplicates count. The ordered digest chains the keys through a streaming hash.
//! The set digest is (distinct rows, Σ distinct keys): its keys are de-duplicated in bounded
//! memory, partitioned by their top bits and spilled to disk past the grading memory budget
//! (`distinct`, `crate::spill`). A subset gold keeps its distinct keys (`keyset`); a subset
//! prediction is checked against them. Rows are never stored.
//!
//! One concept per file: `method` (how two results are compared), `secret` (the process
//! secret keying the row hashes), `accumulator` (the streaming digest), `distinct` (distinct
//! keys in bounded memory), `keyset` (a subset gold's keys), `wire` (a digest's bytes), `aggregate` (the accumulator as a SQLite aggregate; the module's only `unsafe`).

use std::sync::Arc;

mod accumulator;
mod aggregate;
pub mod distinct;
pub mod keyset;
mod method;
mod secret;
mod wire;

pub use accumulator::{Accumulator, DigestSpec, Stop};
pub use aggregate::{function_name, register, AggregateShared};
pub use keyset::GoldKeys;
pub use method::{
    method_name, resolve_method, ColumnOrder, Method, ResolvedMethod, SubsetOp, COLUMN_ORDERS,
};
pub use secret::{secret, secret_id, set_secret};

/// A result's digest: what grading compares, what the gold cache stores (`wire`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    pub method: ResolvedMethod,
    pub float_digits: Option<u32>,
    pub column_order: ColumnOrder,
    /// Rows (distinct rows for the set and subset methods).
    pub rows: u64,
    pub columns: u32,
    /// The comparison key: Σ row keys (multiset, set, subset) or the chained hash (ordered).
    pub key: u128,
    /// Σ row keys for ordered digests too: tells "same rows, other order" from "other rows".
    pub unordered_key: u128,
    pub secret_id: u64,
    /// A subset gold's distinct row keys (in memory or on disk past the budget); None otherwise.
    pub gold_keys: Option<Arc<GoldKeys>>,
    /// A subset gold whose keys spilled to disk carries its SQL instead of its keys when it
    /// travels as bytes (the gold cache, worker processes): a grade against such a digest runs
    /// the gold again to recollect them, so no copy ever holds 16 B per distinct row in memory.
    pub gold_sql: Option<Arc<str>>,
}
