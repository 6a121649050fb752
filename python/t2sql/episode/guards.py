"""Re-draft and repetition / collapse guards: pure functions over an episode's turns, counted in the metrics and,
when their preset penalty is nonzero, reward terms (`reward_terms()`). What each counts and its preset fields:
docs/recipe_extras.md, "Re-draft and repetition guards (`t2sql/episode/guards.py`)"."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from t2sql import sqltext
from t2sql.episode.presets import Preset
from t2sql.episode.reward import RewardTerm, TermResult, Trajectory

# Trigrams for turn-to-turn similarity: long enough that two different turns on the same schema
# rarely share most of them, short enough that small edits do not hide a copy.
TURN_SHINGLE_N = 3

_WORD_OR_MARK = re.compile(r"\w+|[^\w\s]")
# Case-sensitive, like t2sql.episode.parsing.parse_solution: only what the parser treats as a block counts.
_SOLUTION_TAG = re.compile(r"<(/?)solution>")
# A tool-call block as t2sql.episode.prompt parses it (an unclosed one runs to the end of the turn).
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.S)


# ---------------------------------------------------------------- tool queries


def normalize_sql(query: str) -> str:
    """The form two tool queries are compared in (see the module doc): t2sql.sqltext's tokens,
    lower-cased except '...' string literals, one space where the query had whitespace or a
    comment between two tokens."""
    out: list[str] = []
    last = None
    for t in sqltext.tokens(query):
        if last is not None and t.start > last:
            out.append(" ")
        out.append(t.text if t.text.startswith("'") else t.text.lower())
        last = t.end
    return "".join(out).rstrip("; ").strip()


def repeated_tool_queries(queries: Iterable[str]) -> int:
    """How many tool queries repeat an earlier query of the same episode (after normalize_sql)."""
    seen: set[str] = set()
    repeats = 0
    for q in queries:
        key = normalize_sql(q or "")
        if not key:
            continue
        if key in seen:
            repeats += 1
        seen.add(key)
    return repeats


# ---------------------------------------------------------------- solution re-drafts


def solution_redrafts(visible_turns: Iterable[str]) -> int:
    """`<solution>` openings after the first complete block of the same turn, summed over turns."""
    total = 0
    for text in visible_turns:
        complete = False
        opened = False
        for m in _SOLUTION_TAG.finditer(text or ""):
            closing = m.group(1) == "/"
            if not closing:
                if complete:
                    total += 1
                opened = True
            elif opened:
                complete = True
    return total


# ---------------------------------------------------------------- repetition inside a turn


def words(text: str) -> list[str]:
    """Lower-cased word runs and single punctuation marks, the tokens every guard counts in."""
    return _WORD_OR_MARK.findall((text or "").lower())


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    if n < 1:
        raise ValueError(f"n-gram size must be >= 1, got {n}")
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def ngram_repetition(text: str, n: int) -> tuple[float, int]:
    """(share of the turn's n-grams that repeat an earlier one, number of n-grams)."""
    grams = ngrams(words(text), n)
    if not grams:
        return 0.0, 0
    return 1.0 - len(set(grams)) / len(grams), len(grams)


# ---------------------------------------------------------------- repetition across turns


def turn_similarity(a: str, b: str, n: int = TURN_SHINGLE_N) -> float:
    """Jaccard similarity of two turns' word n-gram sets (token equality when either is too short)."""
    ta, tb = words(a), words(b)
    if len(ta) < n or len(tb) < n:
        return 1.0 if ta == tb and ta else 0.0
    sa, sb = set(ngrams(ta, n)), set(ngrams(tb, n))
    return len(sa & sb) / len(sa | sb)


def without_tool_calls(text: str) -> str:
    return _TOOL_CALL_BLOCK.sub(" ", text or "")


def repeated_turns(turns: Sequence[str], threshold: float, n: int = TURN_SHINGLE_N) -> tuple[int, float]:
    """(turns whose similarity to some earlier turn is >= threshold, highest similarity seen)."""
    count, highest = 0, 0.0
    for i in range(1, len(turns)):
        best = max(turn_similarity(turns[i], turns[j], n) for j in range(i))
        highest = max(highest, best)
        if best >= threshold:
            count += 1
    return count, highest


# ---------------------------------------------------------------- one report per episode


@dataclass(frozen=True)
class GuardReport:
    repeated_tool_queries: int
    solution_redrafts: int
    repetitive_turns: int
    max_ngram_repetition: float
    repeated_turns: int
    max_turn_similarity: float

    def to_metrics(self) -> dict[str, float]:
        """The named counts for the episode's metrics (prefixed so they group in a dashboard)."""
        return {f"guard_{k}": float(v) for k, v in asdict(self).items()}


def check_turns(
    texts: Sequence[str],
    visible: Sequence[str],
    tool_queries: Sequence[str],
    *,
    ngram_n: int,
    ngram_share: float,
    min_ngrams: int,
    turn_similarity_threshold: float,
) -> GuardReport:
    """Every guard over one episode: raw turn texts (<think> included), visible texts, tool queries."""
    if not 0.0 < ngram_share <= 1.0:
        raise ValueError(f"ngram_share must be in (0, 1], got {ngram_share}")
    if not 0.0 < turn_similarity_threshold <= 1.0:
        raise ValueError(f"turn_similarity_threshold must be in (0, 1], got {turn_similarity_threshold}")
    repetitive, worst = 0, 0.0
    for text in texts:
        share, count = ngram_repetition(text, ngram_n)
        if count >= min_ngrams:
            worst = max(worst, share)
            if share >= ngram_share:
                repetitive += 1
    similar, highest = repeated_turns([without_tool_calls(t) for t in texts], turn_similarity_threshold)
    return GuardReport(
        repeated_tool_queries=repeated_tool_queries(tool_queries),
        solution_redrafts=solution_redrafts(visible),
        repetitive_turns=repetitive,
        max_ngram_repetition=round(worst, 6),
        repeated_turns=similar,
        max_turn_similarity=round(highest, 6),
    )


def guard_report(trajectory: Trajectory, preset: Preset) -> GuardReport:
    """The report for a t2sql.episode.reward.Trajectory under a preset's thresholds."""
    texts = trajectory.texts or trajectory.visible  # raw text when the episode kept it
    return _cached_report(
        tuple(texts),
        tuple(trajectory.visible),
        tuple(trajectory.tool_queries),
        preset.reward.repetition_ngram_n,
        preset.reward.repetition_ngram_share,
        preset.reward.repetition_min_ngrams,
        preset.reward.repeated_turn_similarity,
    )


@functools.lru_cache(maxsize=256)
def _cached_report(texts, visible, tool_queries, ngram_n, ngram_share, min_ngrams, similarity) -> GuardReport:
    # The four guard terms ask for the same report: compute it once.
    return check_turns(
        texts,
        visible,
        tool_queries,
        ngram_n=ngram_n,
        ngram_share=ngram_share,
        min_ngrams=min_ngrams,
        turn_similarity_threshold=similarity,
    )


# ---------------------------------------------------------------- reward terms

# term name -> (preset switch holding the penalty per event, GuardReport field counting the events)
GUARD_TERMS: dict[str, tuple[str, str]] = {
    "repeated_tool_queries": ("repeated_tool_query_penalty", "repeated_tool_queries"),
    "solution_redrafts": ("redraft_penalty", "solution_redrafts"),
    "ngram_repetition": ("ngram_repetition_penalty", "repetitive_turns"),
    "repeated_turns": ("repeated_turn_penalty", "repeated_turns"),
}


def reward_terms() -> list[RewardTerm]:
    """One t2sql.episode.reward.RewardTerm per guard: minus the preset's penalty per counted event.
    Each returns the whole report's named counts as its metrics, so they reach the episode's
    metrics through the score (a preset with every guard off logs none: nothing was scored)."""
    def make(switch: str, field: str):
        def term(trajectory: Trajectory, preset: Preset) -> TermResult:
            report = guard_report(trajectory, preset)
            return TermResult(-getattr(preset.reward, switch) * getattr(report, field), report.to_metrics())

        return term

    return [RewardTerm(name, make(switch, field), switch=switch) for name, (switch, field) in GUARD_TERMS.items()]
