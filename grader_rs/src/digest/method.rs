//! The grading method, parsed once here: `ResolvedMethod` (how two results are compared), `Method`
//! (the method as a task or a flag names it, before the gold is known: a `ResolvedMethod` or `auto`),
//! `SubsetOp` (a subset's comparison), and the column order. Their names, their forms and their
//! one parser; everything else (the verdicts, the Python binding, the prompt's words through the
//! binding) reads the parsed value.

use crate::error::{GradeError, Result};
use crate::sqltext;

/// Defines `SubsetOp` from one table, a row per operator: its variant, the symbol a canonical
/// method name writes, the other spellings the parser reads, the prompt's words for its count
/// ("return exactly 5 distinct rows"), and its tag in the digest's wire format. `ALL`, `symbol`,
/// `parse`, `words` and the wire tag all read this table; what a row means for a grade is the
/// exhaustive matches on the variant (`holds`, and the verdict's early stop and words in compare.rs),
/// which the compiler asks for when a row is added. A wire tag is on disk in gold caches: never
/// change or reuse one (0-2 are the other methods', wire.rs).
macro_rules! subset_ops {
    ($($(#[$doc:meta])* $variant:ident: $symbol:literal, also [$($also:literal),*], words $words:literal,
       tag $tag:literal;)+) => {
        /// How a subset prediction's distinct gold rows are counted against the method's count.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum SubsetOp {
            $($(#[$doc])* $variant,)+
        }

        impl SubsetOp {
            /// Every operator, in the order the method forms list them.
            pub const ALL: &'static [SubsetOp] = &[$(SubsetOp::$variant),+];

            /// The operator as a canonical method name writes it.
            pub fn symbol(self) -> &'static str {
                match self {
                    $(SubsetOp::$variant => $symbol,)+
                }
            }

            /// The prompt's words for the count ("exactly", "at least").
            pub fn words(self) -> &'static str {
                match self {
                    $(SubsetOp::$variant => $words,)+
                }
            }

            /// The method's tag in the digest's wire format.
            pub(super) fn tag(self) -> u8 {
                match self {
                    $(SubsetOp::$variant => $tag,)+
                }
            }

            fn parse(op: &str) -> Option<Self> {
                match op {
                    $($symbol $(| $also)* => Some(SubsetOp::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

subset_ops! {
    /// `subset,=,N` (also written `==`): exactly N.
    Exactly: "=", also ["=="], words "exactly", tag 3;
    /// `subset,>=,N`: at least N.
    AtLeast: ">=", also [], words "at least", tag 4;
}

impl SubsetOp {
    /// The operator whose wire tag is `tag`, if any.
    pub(super) fn from_tag(tag: u8) -> Option<Self> {
        Self::ALL.iter().copied().find(|op| op.tag() == tag)
    }

    /// Whether a prediction with `rows` distinct gold rows meets a need of `need` rows.
    pub fn holds(self, rows: u64, need: u64) -> bool {
        match self {
            SubsetOp::Exactly => rows == need,
            SubsetOp::AtLeast => rows >= need,
        }
    }
}

/// `items` as a message lists them: "a", "a or b", "a, b or c".
fn one_of(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [only] => only.clone(),
        [head @ .., last] => format!("{} or {last}", head.join(", ")),
    }
}

/// A subset method's name with its count written as given (a number, or N in the forms).
fn subset_name(op: SubsetOp, count: impl std::fmt::Display) -> String {
    format!("subset,{},{count}", op.symbol())
}

/// How two results are compared (a task's `grading_method`, resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResolvedMethod {
    /// Rows in any order, duplicates counted.
    Multiset,
    /// Rows in the same order (`list` in the recipe's task files).
    Ordered,
    /// Distinct rows, in any order (BIRD's metric).
    Set,
    /// The prediction's distinct rows are each a gold row, and their count compares with `n` as `op`
    /// says (exactly, at least, ...); `n` is capped at the gold's distinct row count.
    Subset { op: SubsetOp, n: u64 },
}

impl ResolvedMethod {
    pub fn name(self) -> String {
        match self {
            ResolvedMethod::Subset { op, n } => subset_name(op, n),
            other => other.kind().into(),
        }
    }

    /// The method's kind without its count: multiset, ordered, set or subset.
    pub fn kind(self) -> &'static str {
        match self {
            ResolvedMethod::Multiset => "multiset",
            ResolvedMethod::Ordered => "ordered",
            ResolvedMethod::Set => "set",
            ResolvedMethod::Subset { .. } => "subset",
        }
    }

    /// Read a method leniently: case and spaces do not matter; `list` is `ordered`;
    /// `subset,OP,N` with OP a `SubsetOp` symbol (or another spelling of it, `==`); a bare `subset` (no count) is `subset,>=,1`,
    /// the least a subset asks (BIRD-Verified's two bare ones are one-row golds: docs/episode.md).
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let compact: String = s
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_lowercase();
        match compact.as_str() {
            "multiset" => return Ok(ResolvedMethod::Multiset),
            "ordered" | "list" => return Ok(ResolvedMethod::Ordered),
            "set" => return Ok(ResolvedMethod::Set),
            "subset" => {
                return Ok(ResolvedMethod::Subset {
                    op: SubsetOp::AtLeast,
                    n: 1,
                })
            }
            _ => {}
        }
        let parts: Vec<&str> = compact.split(',').collect();
        if let ["subset", op, n] = parts.as_slice() {
            let Some(op) = SubsetOp::parse(op) else {
                let symbols: Vec<String> =
                    SubsetOp::ALL.iter().map(|op| op.symbol().into()).collect();
                return Err(format!(
                    "{s:?}: the comparison must be {}",
                    one_of(&symbols)
                ));
            };
            return match n.parse::<u64>() {
                Ok(n) if n >= 1 => Ok(ResolvedMethod::Subset { op, n }),
                _ => Err(format!(
                    "{s:?}: the count must be a whole number of rows, at least 1"
                )),
            };
        }
        let mut forms: Vec<String> = ["multiset", "set", "ordered (list)"]
            .map(String::from)
            .into();
        forms.extend(SubsetOp::ALL.iter().map(|op| subset_name(*op, "N")));
        Err(format!(
            "unknown grading method {s:?}: use {}",
            one_of(&forms)
        ))
    }

    /// Set and subset digests keep their distinct row keys.
    pub(super) fn keeps_distinct(self) -> bool {
        matches!(self, ResolvedMethod::Set | ResolvedMethod::Subset { .. })
    }
}

/// A grading method as a task or a flag names it: a `ResolvedMethod`, or `auto`, which is resolved
/// against the gold query (ordered when its outermost query has ORDER BY, else multiset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Auto,
    Named(ResolvedMethod),
}

impl Method {
    /// The name of the method resolved against the gold rather than named outright.
    pub const AUTO: &'static str = "auto";

    /// Read a name as `ResolvedMethod::parse` does, `auto` (any case, any spaces) included; an
    /// unreadable name is an Invalid error saying what is wrong.
    pub fn parse(name: &str) -> Result<Self> {
        if name.trim().eq_ignore_ascii_case(Self::AUTO) {
            return Ok(Method::Auto);
        }
        ResolvedMethod::parse(name)
            .map(Method::Named)
            .map_err(GradeError::Invalid)
    }

    /// The canonical name: `auto`, or the resolved method's name ("list" reads back as "ordered").
    pub fn name(self) -> String {
        match self {
            Method::Auto => Self::AUTO.into(),
            Method::Named(s) => s.name(),
        }
    }

    /// The kind without a count: auto, multiset, ordered, set or subset.
    pub fn kind(self) -> &'static str {
        match self {
            Method::Auto => Self::AUTO,
            Method::Named(s) => s.kind(),
        }
    }

    /// The resolved method this method grades `gold_sql` by.
    pub fn resolve_against(self, gold_sql: &str) -> ResolvedMethod {
        match self {
            Method::Named(s) => s,
            Method::Auto => {
                let ordered = sqltext::first_statement(gold_sql)
                    .is_some_and(|s| sqltext::has_outer_order_by(s.text));
                if ordered {
                    ResolvedMethod::Ordered
                } else {
                    ResolvedMethod::Multiset
                }
            }
        }
    }

    /// `resolve_against` where the gold may not be known yet: `auto` without a gold is an Invalid
    /// error (it cannot be resolved).
    pub fn resolve(self, gold_sql: Option<&str>) -> Result<ResolvedMethod> {
        match (self, gold_sql) {
            (_, Some(gold)) => Ok(self.resolve_against(gold)),
            (Method::Named(s), None) => Ok(s),
            (Method::Auto, None) => Err(GradeError::Invalid(
                "grading method \"auto\" needs the gold SQL (it is ordered when the gold's outermost \
                 query has ORDER BY, else multiset): pass gold_sql"
                    .into(),
            )),
        }
    }

    /// Every form a grading method takes, as messages show them: one per `ResolvedMethod` variant (a
    /// subset once per operator, its count written N), then `auto`. The one list of them; Python
    /// reads it as METHODS.
    pub fn forms() -> Vec<String> {
        let mut forms = Vec::new();
        for kind in [
            ResolvedMethod::Multiset,
            ResolvedMethod::Ordered,
            ResolvedMethod::Set,
            ResolvedMethod::Subset {
                op: SubsetOp::Exactly,
                n: 1,
            },
        ] {
            // Adding a variant fails to compile here until its form is listed.
            match kind {
                ResolvedMethod::Multiset | ResolvedMethod::Ordered | ResolvedMethod::Set => {
                    forms.push(kind.name())
                }
                ResolvedMethod::Subset { .. } => {
                    forms.extend(SubsetOp::ALL.iter().map(|op| subset_name(*op, "N")))
                }
            }
        }
        forms.push(Self::AUTO.into());
        forms
    }
}

/// A grading method by name, resolved against its gold when there is one: `auto` = ordered when
/// the gold's outermost query has ORDER BY, else multiset (an Invalid error without a gold);
/// otherwise `ResolvedMethod::parse` (lenient: case, spaces, `list` = ordered).
pub fn resolve_method(gold_sql: Option<&str>, name: &str) -> Result<ResolvedMethod> {
    Method::parse(name)?.resolve(gold_sql)
}

/// The canonical name of a method as a task or a flag writes it, before any gold is known: `auto`
/// stays `auto`, every other name is read as `resolve_method` reads it ("list" -> "ordered").
pub fn method_name(name: &str) -> Result<String> {
    Method::parse(name).map(Method::name)
}

/// Whether a row's cells are compared in their column order, or as a multiset of cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ColumnOrder {
    #[default]
    Strict,
    Ignore,
}

/// Every column order, in the order messages list them (Python reads their names as COLUMN_ORDERS).
pub const COLUMN_ORDERS: [ColumnOrder; 2] = [ColumnOrder::Strict, ColumnOrder::Ignore];

impl ColumnOrder {
    pub fn name(self) -> &'static str {
        match self {
            ColumnOrder::Strict => "strict",
            ColumnOrder::Ignore => "ignore",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_lowercase().as_str() {
            "strict" => Some(ColumnOrder::Strict),
            "ignore" => Some(ColumnOrder::Ignore),
            _ => None,
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    /// A simple gold without ORDER BY: `auto` reads it as multiset.
    const GOLD: &str = "SELECT id, name FROM t";

    fn subset(op: SubsetOp, n: u64) -> ResolvedMethod {
        ResolvedMethod::Subset { op, n }
    }

    #[test]
    fn methods_parse_leniently_and_name_themselves() {
        assert_eq!(
            ResolvedMethod::parse(" Multiset"),
            Ok(ResolvedMethod::Multiset)
        );
        assert_eq!(ResolvedMethod::parse("LIST"), Ok(ResolvedMethod::Ordered));
        assert_eq!(
            ResolvedMethod::parse("subset, = ,5"),
            Ok(subset(SubsetOp::Exactly, 5))
        );
        assert_eq!(
            ResolvedMethod::parse("subset,==,2"),
            Ok(subset(SubsetOp::Exactly, 2))
        );
        assert_eq!(
            ResolvedMethod::parse("Subset,>=,10"),
            Ok(subset(SubsetOp::AtLeast, 10))
        );
        // A bare subset is the least a subset asks: at least one distinct gold row.
        assert_eq!(
            ResolvedMethod::parse(" Subset "),
            Ok(subset(SubsetOp::AtLeast, 1))
        );
        assert_eq!(
            ResolvedMethod::parse("subset").unwrap().name(),
            "subset,>=,1"
        );
        for bad in [
            "subset,",
            "subset,>=",
            "subset,=,0",
            "subset,<,3",
            "subset,=,x",
            "bag",
            "",
        ] {
            assert!(ResolvedMethod::parse(bad).is_err(), "{bad:?}");
        }
        for s in ["multiset", "ordered", "set", "subset,=,5", "subset,>=,1"] {
            assert_eq!(ResolvedMethod::parse(s).unwrap().name(), s);
        }
    }

    #[test]
    fn a_subset_operator_counts_exactly_or_at_least() {
        assert!(SubsetOp::Exactly.holds(3, 3));
        assert!(!SubsetOp::Exactly.holds(4, 3));
        assert!(SubsetOp::AtLeast.holds(4, 3));
        assert!(!SubsetOp::AtLeast.holds(2, 3));
    }

    #[test]
    fn the_subset_table_reads_back_every_row() {
        let (mut words, mut tags) = (
            std::collections::HashSet::new(),
            std::collections::HashSet::new(),
        );
        let comparison = ResolvedMethod::parse("subset,<,3").unwrap_err();
        let unknown = ResolvedMethod::parse("bag").unwrap_err();
        for &op in SubsetOp::ALL {
            assert_eq!(SubsetOp::parse(op.symbol()), Some(op));
            assert_eq!(SubsetOp::from_tag(op.tag()), Some(op));
            // 0-2 are multiset, ordered and set on the wire; no two rows share words or a tag.
            assert!(op.tag() > 2, "{op:?}");
            assert!(words.insert(op.words()) && tags.insert(op.tag()), "{op:?}");
            assert_eq!(
                ResolvedMethod::parse(&subset_name(op, 4)),
                Ok(subset(op, 4))
            );
            // The messages list the table.
            assert!(
                comparison.contains(&format!(" {}", op.symbol())),
                "{comparison}"
            );
            assert!(unknown.contains(&subset_name(op, "N")), "{unknown}");
        }
        assert_eq!(SubsetOp::parse("=="), Some(SubsetOp::Exactly));
        assert_eq!(SubsetOp::from_tag(2), None);
    }

    #[test]
    fn auto_is_ordered_only_when_the_outer_query_orders() {
        let ordered = resolve_method(Some("SELECT id FROM t ORDER BY id"), "auto").unwrap();
        assert_eq!(ordered, ResolvedMethod::Ordered);
        let inner = "SELECT id FROM (SELECT id FROM t ORDER BY id LIMIT 3)";
        assert_eq!(
            resolve_method(Some(inner), "auto").unwrap(),
            ResolvedMethod::Multiset
        );
        assert_eq!(
            resolve_method(Some(GOLD), " AUTO ").unwrap(),
            ResolvedMethod::Multiset
        );
        assert_eq!(
            resolve_method(Some(GOLD), "list").unwrap(),
            ResolvedMethod::Ordered
        );
        assert!(matches!(
            resolve_method(Some(GOLD), "bag"),
            Err(GradeError::Invalid(_))
        ));
    }

    #[test]
    fn auto_needs_the_gold_and_other_names_do_not() {
        assert_eq!(
            resolve_method(Some("SELECT id FROM t ORDER BY id"), "Auto").unwrap(),
            ResolvedMethod::Ordered
        );
        assert_eq!(
            resolve_method(Some(GOLD), "auto").unwrap(),
            ResolvedMethod::Multiset
        );
        match resolve_method(None, " auto ") {
            Err(GradeError::Invalid(m)) => assert!(m.contains("needs the gold SQL"), "{m}"),
            other => panic!("expected Invalid, got {other:?}"),
        }
        assert_eq!(
            resolve_method(None, "subset, >=, 4").unwrap(),
            subset(SubsetOp::AtLeast, 4)
        );
        // An unreadable name gets the same message with or without the gold.
        for bad in ["bag", "subset,=", "subset,<,3"] {
            let (a, b) = (resolve_method(None, bad), resolve_method(Some(GOLD), bad));
            match (a, b) {
                (Err(GradeError::Invalid(a)), Err(GradeError::Invalid(b))) => assert_eq!(a, b),
                other => panic!("expected two Invalid errors, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_method_name_is_canonical_and_auto_stays_auto() {
        assert_eq!(method_name(" List ").unwrap(), "ordered");
        assert_eq!(method_name(" Subset, =,5").unwrap(), "subset,=,5");
        assert_eq!(method_name("subset,==,5").unwrap(), "subset,=,5");
        assert_eq!(method_name("AUTO").unwrap(), "auto");
        assert_eq!(method_name(" subset ").unwrap(), "subset,>=,1");
        assert!(matches!(
            method_name("subset,=,"),
            Err(GradeError::Invalid(_))
        ));
        assert!(matches!(method_name("bag"), Err(GradeError::Invalid(_))));
    }

    #[test]
    fn a_parsed_method_knows_its_kind() {
        let kinds = [
            ("auto", "auto"),
            ("List", "ordered"),
            ("multiset", "multiset"),
            ("SET", "set"),
            ("subset,==,2", "subset"),
        ];
        for (name, kind) in kinds {
            assert_eq!(Method::parse(name).unwrap().kind(), kind, "{name}");
        }
    }

    #[test]
    fn the_method_forms_are_what_the_parser_reads_and_names() {
        let forms = Method::forms();
        // The forms as they have always been listed, a subset once per row of the table, auto last.
        assert_eq!(
            forms[..5],
            ["multiset", "ordered", "set", "subset,=,N", "subset,>=,N"]
        );
        assert_eq!(forms.len(), 4 + SubsetOp::ALL.len());
        assert_eq!(forms.last().map(String::as_str), Some("auto"));
        for form in &forms {
            // Every form parses (N as a count), and a parsed method's name is its form again.
            let named = form.replace('N', "3");
            assert_eq!(
                Method::parse(&named).unwrap().name().replace('3', "N"),
                *form
            );
        }
        for alias in ["list", "subset,==,2", " MULTISET "] {
            let name = resolve_method(Some(GOLD), alias).unwrap().name();
            assert!(forms.contains(&name.replace('2', "N")), "{alias}: {name}");
        }
    }

    #[test]
    fn the_column_orders_parse_from_their_names() {
        for order in COLUMN_ORDERS {
            assert_eq!(ColumnOrder::parse(order.name()), Some(order));
            // Adding a variant fails here until it is listed.
            match order {
                ColumnOrder::Strict | ColumnOrder::Ignore => {}
            }
        }
        let names: Vec<&str> = COLUMN_ORDERS.iter().map(|o| o.name()).collect();
        assert_eq!(names, ["strict", "ignore"]);
    }
}
