"""The evidence rules, "enumerated" (the recipe's) and "coverage", as `preset.reward.evidence_rule` chooses: whether an
episode restated and checked the task's evidence. The rules exactly: docs/episode.md, "The evidence rules, exactly"."""

from __future__ import annotations

import re
from dataclasses import dataclass

# English function words plus BIRD's evidence boilerplate ("X refers to Y", "commonsense evidence").
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most
    my myself no nor not now of off on once only or other our ours ourselves out over own same she should
    so some such than that the their theirs them themselves then there these they this those through to
    too under until up very was we were what when where which while who whom why will with would you your
    yours yourself yourselves also eg ie etc
    refer refers referred referring refer's mean means meaning meant denote denotes stands
    commonsense evidence
    """.split()
)


_TOKEN = re.compile(r"\d+(?:\.\d+)+|\w+")


def content_tokens(text: str) -> frozenset[str]:
    """The content tokens of a text (see the module doc for the exact rule)."""
    return frozenset(t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS)


def coverage(evidence: str, text: str) -> float:
    """Share of the evidence's content tokens that appear in `text` (1.0 when there are none)."""
    wanted = content_tokens(evidence)
    if not wanted:
        return 1.0
    return len(wanted & content_tokens(text)) / len(wanted)


def evidence_pieces(evidence: str) -> list[str]:
    """The recipe's evidence pieces: the evidence split on ';', blank pieces dropped."""
    return [piece.strip() for piece in evidence.split(";") if piece.strip()]


def evidence_label_lines(pieces: list[str], kind: str, answer: str) -> str:
    """The recipe's labelled lines, one per piece: `<kind> of external knowledge i (<piece>): <answer>`
    for kind "Requirement" or "Verification" (what the prompt asks for and `evidence_labels` counts)."""
    return "".join(f"{kind} of external knowledge {i} ({piece}): {answer}\n" for i, piece in enumerate(pieces, 1))


# "Requirement of external knowledge 2 (" / "Verification of external knowledge 2 (": any case,
# any spacing (also around the number and before the parenthesis).
_LABEL = re.compile(r"(requirement|verification)\s+of\s+external\s+knowledge\s*(\d+)\s*\(", re.IGNORECASE)


def evidence_labels(text: str, kind: str, pieces: int) -> int:
    """How many of the labels `<kind> of external knowledge i (` for i = 1..pieces `text` holds
    (each number counts once: writing label 1 five times is one label)."""
    found = {int(m.group(2)) for m in _LABEL.finditer(text) if m.group(1).lower() == kind}
    return len(found & set(range(1, pieces + 1)))


@dataclass(frozen=True)
class EvidenceCheck:
    has_evidence: bool
    restated: bool
    checked: bool
    restated_coverage: float  # coverage: the token share; enumerated: the share of labels found
    checked_coverage: float
    rule: str = "coverage"
    pieces: int = 0  # enumerated: the evidence's pieces
    first_reply_answer: bool = False  # the solution came in the very first reply

    @property
    def skipped(self) -> int:
        """Rules the trajectory skipped (0 when the task has no evidence). Enumerated rule: a
        solution in the very first reply needs only one of the two blocks."""
        if not self.has_evidence:
            return 0
        missing = int(not self.restated) + int(not self.checked)
        if self.rule == "enumerated" and self.first_reply_answer:
            return int(missing == 2)
        return missing

    @property
    def met(self) -> int:
        return int(self.restated) + int(self.checked) if self.has_evidence else 0
