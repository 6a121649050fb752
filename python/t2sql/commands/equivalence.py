"""`t2sql equivalence --measure`: how often the equivalence check refutes known-wrong rewrites of
gold queries (and never a known-equivalent one).

False-positive pairs are derived from gold queries by edits that change a query's meaning but, on a
given database, often not its result; only the edits whose result still matches the gold on the
real database are kept (those are the matches a grader would wrongly call correct). Some kept pairs
are equivalent under the schema's constraints (dropping DISTINCT over a primary key, say), so the
share refuted is a lower bound on the share of truly different pairs caught. Equivalent rewrites
must never be refuted."""

from __future__ import annotations

import concurrent.futures
import io
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import t2sql
from t2sql import sqltext
from t2sql.episode.presets import get_preset
from t2sql.errors import EquivalenceError, PresetError
from t2sql.progress import Progress
from t2sql.serving.equivalence import EquivalenceChecker, EquivalenceConfig
from t2sql.tasks import database_path

MUTATIONS: dict[str, str] = {
    "drop_distinct": "DISTINCT removed (the data has no duplicates there)",
    "add_distinct": "DISTINCT added to the outer SELECT (the result has no duplicates)",
    "add_limit": "LIMIT n appended, n = the gold's row count",
    "count_star": "COUNT(col) -> COUNT(*) (col has no NULLs there)",
    "comparison_flip": ">= <-> >, <= <-> < (no row equals the constant)",
    "constant_shift": "a compared integer constant moved by 1 (selects the same rows)",
    "drop_conjunct": "one WHERE conjunct dropped (it filtered nothing)",
    "left_join": "INNER JOIN -> LEFT JOIN (every row has a partner; not when WHERE filters the joined table)",
    "like_for_eq": "= 'text' -> LIKE 'text' (case never differs; copies cannot show it)",
}


REWRITES: dict[str, str] = {
    "self": "the gold against itself",
    "wrapped": "SELECT * FROM (gold)",
    "conjuncts_reordered": "the WHERE conjuncts in reverse order",
    "aliases_renamed": "every table alias renamed",
}


def _masked(sql: str) -> tuple[str, list[int]]:
    """`sql` with the inside of string literals and quoted identifiers blanked, and its comments
    blanked (same length), and the parenthesis depth at every position (t2sql.sqltext's tokens)."""
    out = [" " if not ch.isspace() else ch for ch in sql]  # blank unless a token covers it
    depth = [0] * len(sql)
    after = 0  # the depth after the previous token
    last = 0
    for t in sqltext.tokens(sql):
        depth[last:t.start] = [after] * (t.start - last)
        depth[t.start:t.end] = [t.depth] * (t.end - t.start)
        if t.kind == "quoted":
            out[t.start] = sql[t.start]
            if t.end - 1 > t.start:
                out[t.end - 1] = sql[t.end - 1]
        else:
            out[t.start:t.end] = sql[t.start:t.end]
        after = t.depth + 1 if t.kind == "open" else t.depth
        last = t.end
    depth[last:] = [after] * (len(sql) - last)
    return "".join(out), depth


def _words(masked: str, depth: list[int], word: str, at_depth: int | None = 0):
    """Start positions of `word` (case-insensitive, whole word) at the given depth (None: any)."""
    import re

    for m in re.finditer(rf"(?<![\w.]){word}(?!\w)", masked, re.I):
        if at_depth is None or depth[m.start()] == at_depth:
            yield m.start()


def _where_clause(sql: str) -> tuple[int, int] | None:
    """(start, end) of the outer query's WHERE condition, without the keyword."""
    masked, depth = _masked(sql)
    starts = list(_words(masked, depth, "WHERE"))
    if len(starts) != 1:
        return None
    start = starts[0] + len("WHERE")
    end = len(sql)
    for kw in sqltext.CLAUSE_KEYWORDS:
        for pos in _words(masked, depth, kw):
            if pos > start:
                end = min(end, pos)
    return start, end


def _conjuncts(sql: str) -> tuple[int, int, list[str]] | None:
    """The outer WHERE's top-level AND conjuncts, or None when it has a top-level OR or BETWEEN."""
    span = _where_clause(sql)
    if span is None:
        return None
    start, end = span
    masked, depth = _masked(sql)
    body_masked = masked[start:end]
    body_depth = depth[start:end]
    if list(_words(body_masked, body_depth, "OR")) or list(_words(body_masked, body_depth, "BETWEEN")):
        return None
    cuts = list(_words(body_masked, body_depth, "AND"))
    parts, last = [], 0
    for c in cuts:
        parts.append(sql[start + last:start + c].strip())
        last = c + len("AND")
    parts.append(sql[start + last:end].strip())
    if any(not p for p in parts):
        return None
    return start, end, parts


def _tail_space(sql: str, end: int) -> str:
    return " " if end < len(sql) else ""


def returns_one_row(sql: str) -> bool:
    """The outer query always returns exactly one row: aggregates without GROUP BY (or no FROM).
    A heuristic over the text (DISTINCT or LIMIT n added to such a query changes nothing)."""
    import re

    masked, depth = _masked(sql.strip())
    selects = list(_words(masked, depth, "SELECT"))
    if not selects or list(_words(masked, depth, "GROUP")) or any(
            list(_words(masked, depth, kw)) for kw in ("UNION", "EXCEPT", "INTERSECT", "LIMIT", "HAVING")):
        return False
    froms = [p for p in _words(masked, depth, "FROM") if p > selects[0]]
    if not froms:
        return True
    select_list = masked[selects[0] + 6:froms[0]]
    if re.search(r"(?<!\w)SELECT(?!\w)", select_list, re.I):
        return False
    return re.search(r"(?<![\w.])(COUNT|SUM|AVG|MIN|MAX|TOTAL|GROUP_CONCAT)\s*\(", select_list, re.I) is not None


def derive_mutations(gold: str, row_count: int | None) -> list[tuple[str, str]]:
    """(category, predicted SQL) candidates from one gold query (not yet checked on the data)."""
    import re

    gold = gold.strip().rstrip(";").strip()
    masked, depth = _masked(gold)
    out: list[tuple[str, str]] = []
    for m in re.finditer(r"(?<!\w)DISTINCT\s+", masked, re.I):
        out.append(("drop_distinct", gold[:m.start()] + gold[m.end():]))
    selects = list(_words(masked, depth, "SELECT"))
    # DISTINCT or LIMIT added to a query that always returns one row would mean the same thing.
    one_row = returns_one_row(gold) or (row_count == 1 and re.search(r"(?<!\w)LIMIT\s+1(?!\d)", masked, re.I))
    if selects and not one_row and not re.match(r"\s*DISTINCT\b", masked[selects[0] + 6:], re.I):
        p = selects[0] + 6
        out.append(("add_distinct", gold[:p] + " DISTINCT" + gold[p:]))
    if row_count and not one_row and not list(_words(masked, depth, "LIMIT")):
        out.append(("add_limit", f"{gold} LIMIT {row_count}"))
    for m in re.finditer(r"(?<!\w)COUNT\s*\(\s*(?!\*|DISTINCT\b)([^()]+?)\s*\)", masked, re.I):
        out.append(("count_star", gold[:m.start()] + "COUNT(*)" + gold[m.end():]))
    flips = {">=": ">", "<=": "<", ">": ">=", "<": "<="}
    for m in re.finditer(r"(?<![<>!=])(>=|<=|>|<)(?![>=])", masked):
        out.append(("comparison_flip", gold[:m.start()] + flips[m.group(1)] + gold[m.end():]))
    for m in re.finditer(r"(?<![<>!])(>=|<=|>|<|=)\s*(-?\d+)(?![\w.])", masked):
        value = int(gold[m.start(2):m.end(2)])
        for shifted in (value - 1, value + 1):
            out.append(("constant_shift", gold[:m.start(2)] + str(shifted) + gold[m.end(2):]))
    parts = _conjuncts(gold)
    if parts is not None:
        start, end, conj = parts
        if len(conj) == 1:
            w = max(i for i in _words(masked, depth, "WHERE"))
            out.append(("drop_conjunct", (gold[:w].rstrip() + _tail_space(gold, end) + gold[end:].lstrip()).strip()))
        else:
            for i in range(len(conj)):
                rest = " AND ".join(c for j, c in enumerate(conj) if j != i)
                out.append(("drop_conjunct", gold[:start] + " " + rest + _tail_space(gold, end) + gold[end:].lstrip()))
    first_where = min(_words(masked, depth, "WHERE", None), default=len(masked))
    for m in re.finditer(r"(?<!\w)(INNER\s+JOIN|(?<!LEFT )(?<!OUTER )(?<!CROSS )JOIN)(?!\w)", masked, re.I):
        # A WHERE that filters on the joined table rejects the NULL rows a LEFT JOIN adds: the
        # edit would mean the same thing, so it is no false positive.
        alias = re.match(r"\s+([\w`\"]+)(?:\s+(?:AS\s+)?([A-Za-z_]\w*))?", masked[m.end():], re.I)
        names = {g.strip('`"').lower() for g in (alias.groups() if alias else ()) if g}
        after_where = masked[first_where:].lower()
        if any(re.search(rf"(?<![\w.]){re.escape(n)}\s*\.", after_where) for n in names - {"on", "where"}):
            continue
        out.append(("left_join", gold[:m.start()] + "LEFT JOIN" + gold[m.end():]))
    for m in re.finditer(r"(?<![<>!])=\s*'", masked):
        out.append(("like_for_eq", gold[:m.start()] + "LIKE " + gold[m.end() - 1:]))
    seen, unique = {gold}, []
    for cat, sql in out:
        if sql not in seen:
            seen.add(sql)
            unique.append((cat, sql))
    return unique


_NOT_ALIASES = {"WHERE", "ON", "INNER", "LEFT", "RIGHT", "JOIN", "GROUP", "ORDER", "LIMIT", "USING",
                "CROSS", "NATURAL", "OUTER", "UNION", "EXCEPT", "INTERSECT", "HAVING", "AS", "WINDOW"}


def derive_rewrites(gold: str) -> list[tuple[str, str]]:
    """(category, SQL) rewrites of one gold query that mean the same thing on every database."""
    import re

    gold = gold.strip().rstrip(";").strip()
    out = [("self", gold), ("wrapped", f"SELECT * FROM ({gold})")]
    parts = _conjuncts(gold)
    if parts is not None and len(parts[2]) > 1:
        start, end, conj = parts
        out.append(("conjuncts_reordered",
                    gold[:start] + " " + " AND ".join(reversed(conj)) + _tail_space(gold, end) + gold[end:].lstrip()))
    masked, _ = _masked(gold)
    aliases = []
    for m in re.finditer(r"(?<!\w)(?:FROM|JOIN)\s+[\w`\"]+\s+(?:AS\s+)?([A-Za-z_]\w*)", masked, re.I):
        if m.group(1).upper() not in _NOT_ALIASES and m.group(1) not in aliases:
            aliases.append(m.group(1))
    if aliases:
        renamed, masked_now = gold, masked
        for a in aliases:
            new = f"alias_{a}"
            pattern = rf"(?<![\w.]){re.escape(a)}(?=\s*\.)|(?<=\s){re.escape(a)}(?=\s*(?:$|[\s,)]))"
            pieces, last = [], 0
            for m in re.finditer(pattern, masked_now, re.I):
                pieces.append(renamed[last:m.start()] + new)
                last = m.end()
            renamed = "".join(pieces) + renamed[last:]
            masked_now, _ = _masked(renamed)
        if renamed != gold:
            out.append(("aliases_renamed", renamed))
    return out


@dataclass
class MeasureRow:
    kind: str  # "mutation" | "rewrite"
    category: str
    candidates: int = 0  # derived
    kept: int = 0  # match on the real database (the pairs measured)
    refuted: int = 0
    skipped: int = 0  # check skipped (too large, no informative copy, ...)
    by_copy: dict[str, int] = field(default_factory=dict)  # refuting copy kind -> pairs
    by_db: dict[str, list[int]] = field(default_factory=dict)  # db_id -> [pairs, refuted]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure(rows: list[dict[str, Any]], db_root: str, config: EquivalenceConfig, *, concurrency: int = 2,
            examples: int = 3, progress: bool = True) -> dict[str, Any]:
    """Derive the pairs from every gold in `rows` (BIRD questions), keep those that match on the
    real database, run the check on them; per category: pairs, refuted, refuting copy kind."""

    local = threading.local()

    def original(path: str):
        dbs = getattr(local, "dbs", None)
        if dbs is None:
            dbs = local.dbs = {}
        if path not in dbs:
            dbs[path] = t2sql.Database(path)
        return dbs[path]

    checker = EquivalenceChecker()
    table: dict[tuple[str, str], MeasureRow] = {}
    for cat in MUTATIONS:
        table[("mutation", cat)] = MeasureRow("mutation", cat)
    for cat in REWRITES:
        table[("rewrite", cat)] = MeasureRow("rewrite", cat)
    refuted_rewrites: list[dict[str, Any]] = []
    not_matching_rewrites: list[dict[str, Any]] = []
    samples: dict[str, list[dict[str, Any]]] = {}
    missed: dict[str, list[dict[str, Any]]] = {}
    lock = threading.Lock()
    check_times: list[float] = []

    def one(row: dict[str, Any]) -> None:
        db_path = str(database_path(db_root, row["db_id"]))
        gold = row["SQL"]
        db = original(db_path)
        try:
            n = db.count_rows(gold, config.spec.timeout_s)
        except t2sql.T2sqlError:
            n = None
        pairs = [("mutation", c, s) for c, s in derive_mutations(gold, n)]
        pairs += [("rewrite", c, s) for c, s in derive_rewrites(gold)]
        for kind, cat, pred in pairs:
            v = db.grade(pred, gold, config.spec)
            entry = {"question_id": row.get("question_id"), "db_id": row["db_id"], "gold": gold, "pred": pred}
            with lock:
                table[(kind, cat)].candidates += 1
            if v.outcome != "match":
                if kind == "rewrite":
                    with lock:
                        not_matching_rewrites.append({**entry, "outcome": v.outcome, "detail": v.detail})
                continue
            report = checker.check_sync(db_path, pred, gold, config)
            with lock:
                check_times.append(report.elapsed_s)
                r = table[(kind, cat)]
                r.kept += 1
                per_db = r.by_db.setdefault(row["db_id"], [0, 0])
                per_db[0] += 1
                per_db[1] += int(report.refuted)
                if report.skipped_reason:
                    r.skipped += 1
                if report.refuted:
                    r.refuted += 1
                    copy_kind = report.refuting_copy.split(":")[0]
                    r.by_copy[copy_kind] = r.by_copy.get(copy_kind, 0) + 1
                    if kind == "rewrite":
                        refuted_rewrites.append({**entry, "copy": report.refuting_copy, "detail": report.detail})
                    elif len(samples.setdefault(cat, [])) < examples:
                        samples[cat].append({**entry, "copy": report.refuting_copy, "detail": report.detail})
                elif kind == "mutation" and len(missed.setdefault(cat, [])) < examples:
                    missed[cat].append(entry)

    started = time.perf_counter()
    try:
        with Progress(len(rows), "equivalence", stream=None if progress else io.StringIO()) as bar:
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                for fut in concurrent.futures.as_completed([pool.submit(one, r) for r in rows]):
                    fut.result()
                    bar.advance()
        cache = checker.cache.stats()
    finally:
        checker.close()
    return {
        "config": config.to_dict(),
        "questions": len(rows),
        "rows": [r.to_dict() for r in table.values()],
        "refuted_rewrites": refuted_rewrites,
        "rewrites_not_matching": not_matching_rewrites,
        "examples_refuted": samples,
        "examples_missed": missed,
        "copy_cache": cache,
        "check_s": _quantiles(check_times),
        "elapsed_s": round(time.perf_counter() - started, 2),
    }


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"median": 0.0, "p95": 0.0, "max": 0.0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median": round(pick(0.5), 4), "p95": round(pick(0.95), 4), "max": round(ordered[-1], 4)}


def format_measurement(result: dict[str, Any]) -> str:
    lines = [f"equivalence check on {result['questions']} gold queries "
             f"({result['config']['copies']} copies, seed {result['config']['seed']}, {result['elapsed_s']}s)", ""]
    head = f"{'kind':<9} {'category':<20} {'derived':>7} {'pairs':>6} {'refuted':>8} {'share':>6}  by copy"
    lines += [head, "-" * len(head)]
    totals: dict[str, list[int]] = {}
    for r in result["rows"]:
        share = f"{r['refuted'] / r['kept']:.1%}" if r["kept"] else "-"
        by = ", ".join(f"{k} {v}" for k, v in sorted(r["by_copy"].items())) or "-"
        lines.append(f"{r['kind']:<9} {r['category']:<20} {r['candidates']:>7} {r['kept']:>6} {r['refuted']:>8} "
                     f"{share:>6}  {by}")
        t = totals.setdefault(r["kind"], [0, 0, 0])
        t[0] += r["candidates"]
        t[1] += r["kept"]
        t[2] += r["refuted"]
    lines.append("-" * len(head))
    for kind, (c, k, f) in totals.items():
        share = f"{f / k:.1%}" if k else "-"
        lines.append(f"{kind:<9} {'all':<20} {c:>7} {k:>6} {f:>8} {share:>6}")
    per_db: dict[str, list[int]] = {}
    for r in result["rows"]:
        if r["kind"] == "mutation":
            for db_id, (k, f) in r["by_db"].items():
                t = per_db.setdefault(db_id, [0, 0])
                t[0] += k
                t[1] += f
    for db_id, (k, f) in sorted(per_db.items()):
        lines.append(f"{'mutation':<9} {'db ' + db_id:<20} {'':>7} {k:>6} {f:>8} {f / k if k else 0:>6.1%}")
    skipped_total = sum(r["skipped"] for r in result["rows"])
    lines.append("")
    t = result["check_s"]
    lines.append(f"time per check (copy builds included): median {t['median'] * 1000:.1f} ms, "
                 f"p95 {t['p95'] * 1000:.1f} ms, max {t['max']:.2f} s; copies built in "
                 f"{result['copy_cache']['build_s']:.1f} s")
    lines.append(f"checks skipped: {skipped_total}; rewrites that did not match on the real database: "
                 f"{len(result['rewrites_not_matching'])}; copy cache: {result['copy_cache']}")
    for item in result["refuted_rewrites"][:10]:
        lines.append(f"REFUTED REWRITE q{item['question_id']} ({item['copy']}): {item['pred']}")
    return "\n".join(lines)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--measure", action="store_true",
                        help="measure the check on BIRD-layout data (the only mode for now)")
    parser.add_argument("--data", required=True, help="BIRD questions (dev.json: question_id, db_id, SQL)")
    parser.add_argument("--db-root", required=True, help="databases at <db-root>/<db_id>/<db_id>.sqlite")
    parser.add_argument("--preset", default=None, help="t2sql preset for copies, seed, caps and semantics")
    parser.add_argument("--copies", type=int, default=None, help="override the preset's equivalence_copies")
    parser.add_argument("--seed", type=int, default=None, help="override the preset's equivalence_seed")
    parser.add_argument("--db", action="append", default=[], metavar="DB_ID", help="only these databases")
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the full result as JSON on stdout")


def run(args: Any) -> int:
    import json
    import sys

    if not args.measure:
        print("t2sql equivalence: nothing to do; pass --measure (the check itself runs inside episodes)",
              file=sys.stderr)
        return 2
    try:
        preset = get_preset(args.preset)
        changes = {}
        if args.copies is not None:
            changes["equivalence_copies"] = args.copies
        if args.seed is not None:
            changes["equivalence_seed"] = args.seed
        config = EquivalenceConfig.from_preset(preset.replace(**changes) if changes else preset)
        with open(args.data, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, list):
            raise EquivalenceError(f"{args.data}: expected a JSON list of BIRD questions")
    except (OSError, json.JSONDecodeError, PresetError, EquivalenceError) as e:
        print(f"t2sql equivalence: {e}", file=sys.stderr)
        return 2
    rows = []
    for i, row in enumerate(data):
        if not isinstance(row, dict) or not isinstance(row.get("SQL"), str) or not isinstance(row.get("db_id"), str):
            print(f"{args.data}: entry {i} skipped: needs string fields db_id and SQL", file=sys.stderr)
            continue
        if args.db and row["db_id"] not in args.db:
            continue
        rows.append(row)
    if args.limit is not None:
        rows = rows[: args.limit]
    missing = sorted({r["db_id"] for r in rows
                      if not database_path(args.db_root, r["db_id"]).is_file()})
    if missing:
        print(f"t2sql equivalence: no database for {', '.join(missing)} under {args.db_root} "
              "(expected <db-root>/<db_id>/<db_id>.sqlite)", file=sys.stderr)
        return 2
    result = measure(rows, args.db_root, config, concurrency=args.concurrency)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(format_measurement(result))
    return 0
