"""The outcome table, the shaping terms, the floor, the evidence token rule and the presets."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from t2sql.episode import evidence, presets
from t2sql.episode.evidence import content_tokens, coverage
from t2sql.episode.presets import OUTCOMES, PRESETS, RESERVED_SWITCHES, Preset, get_preset
from t2sql.episode.reward import RewardTerm, Trajectory
from t2sql.episode.terms import register_term, registered_terms, score, unregister_term
from t2sql.errors import PresetError

RECIPE = get_preset("qwen3.6-35b-a3b")
BARE = get_preset("bare")
COVERAGE = RECIPE.replace(reward={"evidence_rule": "coverage"})
EVIDENCE = ("female superheroes refers to gender = 'Female'; "
            "published by Dark Horse Comics refers to publisher_name = 'Dark Horse Comics'")
RESTATING = "The evidence says female means gender = 'Female' and the publisher_name is 'Dark Horse Comics'."


def traj(outcome: str, *, prose=("",), invalid=0, evidence="", answer_turn=None) -> Trajectory:
    prose = tuple(prose)
    return Trajectory(
        outcome=outcome,
        evidence=evidence,
        visible=prose,
        prose=prose,
        answer_turn=answer_turn,
        invalid_tool_calls=invalid,
    )


def total(t: Trajectory, preset: Preset = RECIPE) -> float:
    return asyncio.run(score(t, preset)).total


# -- the outcome table, one row at a time (no evidence, no invalid calls: terms are zero)

@pytest.mark.parametrize(
    "outcome, expected",
    [
        ("correct", 1.0),
        ("incorrect", 0.0),
        ("pred_error", 0.0),
        ("pred_timeout", 0.0),
        ("no_solution", -1.0),
        ("turn_cut", -1.0),
        ("context_cut", -1.0),
        ("unsafe", -1.0),
        ("gold_error", 0.0),
    ],
)
@pytest.mark.parametrize("preset", [RECIPE, BARE], ids=["recipe", "bare"])
def test_outcome_table(outcome, expected, preset):
    assert total(traj(outcome, answer_turn=0), preset) == expected


def test_every_outcome_has_a_row_and_unknown_outcomes_are_errors():
    assert {o for o, _ in presets.outcome_table(RECIPE)} == set(OUTCOMES)
    with pytest.raises(PresetError, match="unknown outcome 'wrong'"):
        RECIPE.outcome_reward("wrong")


def test_gold_error_is_never_rewarded_as_correct_and_gets_no_terms():
    b = asyncio.run(score(traj("gold_error", invalid=4, evidence=EVIDENCE), RECIPE))
    assert b.total == 0.0 and b.total < RECIPE.reward.correct
    assert b.terms == {}
    with pytest.raises(PresetError, match="reward.gold_error"):
        RECIPE.replace(reward={"gold_error": 1.0})


# -- invalid tool calls: 0.05 each, capped at 0.2

@pytest.mark.parametrize("invalid, expected", [(0, 1.0), (1, 0.95), (3, 0.85), (4, 0.8), (9, 0.8)])
def test_invalid_tool_penalty_and_cap(invalid, expected):
    assert total(traj("correct", invalid=invalid, answer_turn=0)) == pytest.approx(expected)


def test_bare_has_no_shaping():
    t = traj("correct", invalid=3, evidence=EVIDENCE, answer_turn=0)
    b = asyncio.run(score(t, BARE))
    assert b.total == 1.0 and b.terms == {}


# -- evidence rules: the coverage rule (an option; the recipe's is enumerated, below)

def test_evidence_both_rules_met():
    check = "Check: my query keeps gender = 'Female' and publisher_name = 'Dark Horse Comics', as the evidence says."
    t = traj("correct", prose=(RESTATING, check), evidence=EVIDENCE, answer_turn=1)
    b = asyncio.run(score(t, COVERAGE))
    assert b.evidence.restated and b.evidence.checked
    assert b.total == 1.0


def test_evidence_restated_only():
    t = traj("correct", prose=(RESTATING, "done"), evidence=EVIDENCE, answer_turn=1)
    b = asyncio.run(score(t, COVERAGE))
    assert b.evidence.restated and not b.evidence.checked
    assert b.total == pytest.approx(0.9)


def test_evidence_both_skipped_on_incorrect_goes_negative_but_not_below_floor():
    t = traj("incorrect", prose=("hmm", "answer"), invalid=4, evidence=EVIDENCE, answer_turn=1)
    assert total(t) == pytest.approx(0.0 - 0.2 - 0.2)


def test_restating_in_turn_three_is_too_late():
    t = traj("correct", prose=("", "", RESTATING), evidence=EVIDENCE, answer_turn=2)
    b = asyncio.run(score(t, COVERAGE))
    assert not b.evidence.restated and b.evidence.checked  # the answer turn still checks it


def test_restating_may_be_spread_over_turns_one_and_two():
    half = len(RESTATING) // 2
    cut = RESTATING.rfind(" ", 0, half)
    t = traj("correct", prose=(RESTATING[:cut], RESTATING[cut:], ""), evidence=EVIDENCE, answer_turn=2)
    assert asyncio.run(score(t, COVERAGE)).evidence.restated


def test_no_evidence_means_no_evidence_rules():
    for ev in ("", "   ", "refers to the"):  # empty, blank, stop words only
        b = asyncio.run(score(traj("correct", evidence=ev, answer_turn=0), COVERAGE))
        assert not b.evidence.has_evidence and b.total == 1.0


def test_checked_needs_an_answer_turn():
    t = traj("no_solution", prose=(RESTATING,), evidence=EVIDENCE, answer_turn=None)
    assert not asyncio.run(score(t, COVERAGE)).evidence.checked


def test_verbatim_quote_always_counts_as_checked():
    ev = "cost > 50 and cost < 100 where type is 'Pizza'"
    strict = COVERAGE.replace(reward={"evidence_share": 1.0})
    t = traj("correct", prose=("", "as required: " + ev.upper()), evidence=ev, answer_turn=1)
    assert asyncio.run(score(t, strict)).evidence.checked
    t = traj("correct", prose=("", "as required: cost > 50 and type is 'Pizza'"), evidence=ev, answer_turn=1)
    assert not asyncio.run(score(t, strict)).evidence.checked  # "100" is missing


# -- the token rule and its edges

def test_content_tokens_rule():
    assert content_tokens("Refers to MAX(COUNT(bond_type)); T1.name = 'Dark Horse' and 2.5%") == {
        "max", "count", "bond_type", "t1", "name", "dark", "horse", "2.5"
    }
    # punctuation-only literals carry no token; case does not matter
    assert content_tokens("bond_type = '-'") == {"bond_type"}
    assert content_tokens("GENDER") == content_tokens("gender")


def test_identifier_is_one_token_so_spaced_words_do_not_cover_it():
    assert coverage("bond_type", "the bond type") == 0.0
    assert coverage("bond_type", "column bond_type") == 1.0


def test_share_threshold_is_inclusive():
    ev = "alpha beta gamma delta epsilon"  # 5 tokens, 60% = 3
    assert coverage(ev, "alpha beta gamma") == pytest.approx(0.6)
    t3 = traj("correct", prose=("alpha beta gamma",), evidence=ev, answer_turn=0)
    t2 = traj("correct", prose=("alpha beta",), evidence=ev, answer_turn=0)
    assert asyncio.run(score(t3, COVERAGE)).evidence.restated
    assert not asyncio.run(score(t2, COVERAGE)).evidence.restated


def test_sql_in_tool_calls_counts_only_when_the_preset_says_so():
    t = Trajectory(
        outcome="correct",
        evidence=EVIDENCE,
        visible=("SELECT * FROM x WHERE gender = 'Female' AND publisher_name = 'Dark Horse Comics' "
                 "-- superheroes published",),
        prose=("let me look",),
        answer_turn=0,
        invalid_tool_calls=0,
    )
    assert not t.check_evidence(COVERAGE).restated
    assert t.check_evidence(COVERAGE.replace(reward={"evidence_counts_sql": True})).restated


# -- evidence rules: the recipe's enumerated protocol, row by row

PIECES = EVIDENCE.split(";")  # two pieces


def labels(kind: str, numbers=(1, 2)) -> str:
    return "\n".join(f"{kind} of external knowledge {i} ({PIECES[i - 1].strip()}): noted." for i in numbers)


def enumerated(prose: tuple[str, ...], answer_turn: int | None, outcome: str = "correct", evidence: str = EVIDENCE):
    t = traj(outcome, prose=prose, evidence=evidence, answer_turn=answer_turn)
    return asyncio.run(score(t, RECIPE))


def test_enumerated_both_blocks_in_their_turns():
    b = enumerated((labels("Requirement"), "more looking", labels("Verification") + "\n<solution>x</solution>"), 2)
    assert b.evidence.rule == "enumerated" and b.evidence.pieces == 2
    assert b.evidence.restated and b.evidence.checked and b.total == 1.0


def test_enumerated_requirement_lines_may_come_in_the_second_reply():
    b = enumerated(("let me look first", labels("Requirement"), labels("Verification")), 2)
    assert b.evidence.restated and b.total == 1.0
    late = enumerated(("", "", labels("Requirement"), labels("Verification")), 3)
    assert not late.evidence.restated and late.total == pytest.approx(0.9)


def test_enumerated_labels_missing_cost_a_tenth_each():
    assert enumerated(("no labels", "answer"), 1).total == pytest.approx(0.8)
    assert enumerated((labels("Requirement"), "answer"), 1).total == pytest.approx(0.9)
    assert enumerated(("looked", labels("Verification")), 1).total == pytest.approx(0.9)


def test_enumerated_fewer_labels_than_pieces_is_not_enough():
    b = enumerated((labels("Requirement", (1,)), labels("Verification", (2,))), 1)
    assert not b.evidence.restated and not b.evidence.checked
    assert b.evidence.restated_coverage == 0.5 and b.evidence.checked_coverage == 0.5
    assert b.total == pytest.approx(0.8)


def test_enumerated_solution_in_the_first_reply_needs_one_block():
    assert enumerated((labels("Requirement") + "\n<solution>x</solution>",), 0).total == 1.0
    assert enumerated((labels("Verification") + "\n<solution>x</solution>",), 0).total == 1.0
    assert enumerated(("<solution>x</solution>",), 0).total == pytest.approx(0.9)  # both missing: one penalty


def test_enumerated_no_evidence_no_penalty():
    for ev in ("", "  ", " ; ;"):  # a trailing ';' leaves a blank piece that does not count
        b = enumerated(("<solution>x</solution>",), 0, evidence=ev)
        assert not b.evidence.has_evidence and b.total == 1.0
    assert evidence.evidence_pieces("a refers to b; c refers to d;") == ["a refers to b", "c refers to d"]


def test_enumerated_labels_tolerate_case_and_spacing_and_not_other_words():
    text = "REQUIREMENT  of external   knowledge 1(x): .\nrequirement of External Knowledge  2 ( y): ."
    assert evidence.evidence_labels(text, "requirement", 2) == 2
    assert evidence.evidence_labels("Requirement of external knowledge 3 (z)", "requirement", 2) == 0  # no piece 3
    assert evidence.evidence_labels("Requirement of knowledge 1 (x)", "requirement", 1) == 0
    assert evidence.evidence_labels(labels("Requirement"), "verification", 2) == 0
    # Each number counts once: one label written three times is one label.
    assert evidence.evidence_labels(labels("Verification", (2, 2, 2)), "verification", 2) == 1


def test_enumerated_labels_inside_think_do_not_count():
    t = Trajectory(outcome="correct", evidence=EVIDENCE,
                   visible=("", "answer"), prose=("", "answer"), answer_turn=1, invalid_tool_calls=0,
                   texts=(f"<think>{labels('Requirement')}</think>", f"<think>{labels('Verification')}</think>answer"))
    check = t.check_evidence(RECIPE)
    assert not check.restated and not check.checked


# -- the floor

def test_penalties_never_push_below_minus_one_unless_the_preset_says_so():
    t = traj("unsafe", prose=("",), invalid=4, evidence=EVIDENCE)
    assert total(t, RECIPE) == -1.0
    assert total(t, RECIPE.replace(reward={"penalties_below_floor": True})) == pytest.approx(-1.0 - 0.2 - 0.2)
    below = RECIPE.replace(reward={"penalties_below_floor": True})
    assert total(traj("turn_cut", invalid=2), below) == pytest.approx(-1.1)


# -- terms hook for the recipe extras

def test_registered_term_is_applied_only_when_its_switch_is_on():
    async def equivalence(t, preset):
        await asyncio.sleep(0)  # terms may be async (they may run SQL)
        return -preset.reward.equivalence_penalty if t.outcome == "correct" else 0.0

    # t2sql.episode.equivalence_term registers the real term under this name: set it aside, restore it after.
    saved = registered_terms()
    register_term(RewardTerm("equivalence", equivalence, switch="equivalence_penalty"))
    try:
        b = asyncio.run(score(traj("correct", answer_turn=0), RECIPE))
        assert b.total == pytest.approx(0.8) and b.unapplied == ()
        assert asyncio.run(score(traj("correct", answer_turn=0), BARE)).total == 1.0
        unregister_term("equivalence")
        b = asyncio.run(score(traj("correct", answer_turn=0), RECIPE))
        assert b.unapplied == ("equivalence_penalty",) and b.total == 1.0
    finally:
        for term in saved:
            register_term(term)
    assert [t.name for t in registered_terms()] == [t.name for t in saved]


def test_register_term_rejects_unknown_switch():
    with pytest.raises(PresetError, match="not a field of a preset's reward part"):
        register_term(RewardTerm("x", lambda t, p: 0.0, switch="no_such_field"))


# -- presets

def test_presets_are_complete_frozen_data():
    assert set(PRESETS) == {"qwen3.6-35b-a3b", "bare"}
    assert get_preset() is RECIPE
    d = RECIPE.to_dict()
    assert d["budgets"]["max_tool_calls"] == 5 and d["budgets"]["max_turn_tokens"] == 3072
    parts = {f.name: type(getattr(RECIPE, f.name)) for f in dataclasses.fields(Preset)}
    rebuilt = {k: parts[k](**v) if isinstance(v, dict) else v for k, v in d.items()}
    assert Preset(**rebuilt) == RECIPE  # to_dict holds every field, part by part
    with pytest.raises(dataclasses.FrozenInstanceError):
        RECIPE.budgets.max_tool_calls = 6  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        RECIPE.budgets = RECIPE.budgets  # type: ignore[misc]
    for s in RESERVED_SWITCHES:
        assert getattr(BARE.reward, s) == 0
    assert RECIPE.reward.equivalence_penalty == 0.2


def test_a_presets_method_has_one_name():
    assert RECIPE.replace(grading={"method": "ordered"}).grading.method == "ordered"
    with pytest.raises(PresetError, match="method must be one of multiset, ordered, set, auto"):
        RECIPE.replace(grading={"method": "subset,=,3"})  # a preset-wide method has no count
    with pytest.raises(PresetError, match="unknown preset field.*semantics"):  # the pre-release name is gone
        RECIPE.replace(semantics="ordered")
    assert not hasattr(RECIPE, "semantics")


def test_preset_errors_say_what_to_do():
    with pytest.raises(PresetError, match="choose one of: bare, qwen3.6-35b-a3b"):
        get_preset("qwen3")
    with pytest.raises(PresetError, match="unknown preset field.*max_tool_call\\b"):
        RECIPE.replace(max_tool_call=3)
    with pytest.raises(PresetError, match="evidence_share"):
        RECIPE.replace(reward={"evidence_share": 1.5})
    with pytest.raises(PresetError, match="invalid_tool_penalty is an amount taken off"):
        RECIPE.replace(reward={"invalid_tool_penalty": -0.05})
