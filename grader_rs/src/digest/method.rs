//! The grading method (`Semantics`) and the column order: their names and their parsing.

/// How two results are compared (a task's `grading_method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// Rows in any order, duplicates counted.
    Multiset,
    /// Rows in the same order (`list` in the recipe's task files).
    Ordered,
    /// Distinct rows, in any order (BIRD's metric).
    Set,
    /// The prediction's distinct rows are each a gold row, and there are exactly `n` of them
    /// (`exact`) or at least `n`; `n` is capped at the gold's distinct row count.
    Subset { exact: bool, n: u64 },
}

impl Semantics {
    pub fn name(self) -> String {
        match self {
            Semantics::Multiset => "multiset".into(),
            Semantics::Ordered => "ordered".into(),
            Semantics::Set => "set".into(),
            Semantics::Subset { exact: true, n } => format!("subset,=,{n}"),
            Semantics::Subset { exact: false, n } => format!("subset,>=,{n}"),
        }
    }

    /// Read a method leniently: case and spaces do not matter; `list` is `ordered`;
    /// `subset,=,N` / `subset,>=,N` (also `==`). A bare `subset` (no count) is an error.
    pub fn parse(s: &str) -> Result<Self, String> {
        let compact: String = s
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_lowercase();
        match compact.as_str() {
            "multiset" => return Ok(Semantics::Multiset),
            "ordered" | "list" => return Ok(Semantics::Ordered),
            "set" => return Ok(Semantics::Set),
            "subset" => {
                return Err("\"subset\" without a count: write subset,=,N or subset,>=,N".into())
            }
            _ => {}
        }
        let parts: Vec<&str> = compact.split(',').collect();
        if let ["subset", op, n] = parts.as_slice() {
            let exact = match *op {
                "=" | "==" => true,
                ">=" => false,
                _ => return Err(format!("{s:?}: the comparison must be = or >=")),
            };
            return match n.parse::<u64>() {
                Ok(n) if n >= 1 => Ok(Semantics::Subset { exact, n }),
                _ => Err(format!(
                    "{s:?}: the count must be a whole number of rows, at least 1"
                )),
            };
        }
        Err(format!(
            "unknown grading method {s:?}: use multiset, set, ordered (list), subset,=,N or subset,>=,N"
        ))
    }

    /// Set and subset digests keep their distinct row keys.
    pub(super) fn keeps_distinct(self) -> bool {
        matches!(self, Semantics::Set | Semantics::Subset { .. })
    }
}

/// Whether a row's cells are compared in their column order, or as a multiset of cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ColumnOrder {
    #[default]
    Strict,
    Ignore,
}

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

    #[test]
    fn methods_parse_leniently_and_name_themselves() {
        assert_eq!(Semantics::parse(" Multiset"), Ok(Semantics::Multiset));
        assert_eq!(Semantics::parse("LIST"), Ok(Semantics::Ordered));
        assert_eq!(
            Semantics::parse("subset, = ,5"),
            Ok(Semantics::Subset { exact: true, n: 5 })
        );
        assert_eq!(
            Semantics::parse("subset,==,2"),
            Ok(Semantics::Subset { exact: true, n: 2 })
        );
        assert_eq!(
            Semantics::parse("Subset,>=,10"),
            Ok(Semantics::Subset {
                exact: false,
                n: 10
            })
        );
        for bad in [
            "subset",
            "subset,=,0",
            "subset,<,3",
            "subset,=,x",
            "bag",
            "",
        ] {
            assert!(Semantics::parse(bad).is_err(), "{bad:?}");
        }
        for s in ["multiset", "ordered", "set", "subset,=,5", "subset,>=,1"] {
            assert_eq!(Semantics::parse(s).unwrap().name(), s);
        }
    }
}
