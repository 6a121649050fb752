"""CISPO math: a hand-computed batch checked against the plain-Python reference (always runs) and
against the torch implementation and the miles entry point (run where torch is installed).

The batch (eps_low 0.2, eps_high 0.28):
  sample A: 3 tokens, mask [1, 0, 1], advantage 2
     t0: log_prob -1.0, old -1.0            -> ratio 1.0 -> weight 1.0  -> term -1*2*-1.0  = 2.0
     t1: masked out
     t2: log_prob -0.5, old -0.5 - ln 1.5   -> ratio 1.5 -> weight 1.28 -> term -1.28*2*-0.5 = 1.28
     sample mean over 2 active tokens: (2.0 + 1.28) / 2 = 1.64
  sample B: 1 token, advantage -1
     t0: log_prob -3.0, old -3.0 + ln 2     -> ratio 0.5 -> weight 0.8  -> term -0.8*-1*-3 = -2.4
  loss (sum of sample means) = 1.64 - 2.4 = -0.76
  d loss / d log_prob = -w*A*mask/denominator: A = [-1.0, 0, -1.28], B = [0.8]
Per-token reduction (miles --calculate-per-token-loss): loss 0.88, grads A = [-2, 0, -2.56], B = [0.8].
Token A.t2 is the CISPO point: PPO's clipped surrogate would give it zero gradient (ratio above
1 + eps_high with positive advantage); CISPO keeps it, with the weight capped at 1.28.
"""

from __future__ import annotations

import math
import sys
import textwrap
from types import SimpleNamespace

import pytest

from t2sql.errors import CispoConfigError
from t2sql.miles.cispo import cispo_eps, cispo_reference, clipped_weight

EPS_LOW, EPS_HIGH = 0.2, 0.28
LOG_PROBS = [[-1.0, -2.0, -0.5], [-3.0]]
OLD_LOG_PROBS = [[-1.0, -2.7, -0.5 - math.log(1.5)], [-3.0 + math.log(2.0)]]
ADVANTAGES = [[2.0, 2.0, 2.0], [-1.0]]
MASKS = [[1.0, 0.0, 1.0], [1.0]]

EXPECTED_LOSS = -0.76
EXPECTED_GRADS = [[-1.0, 0.0, -1.28], [0.8]]
EXPECTED_LOSS_PER_TOKEN = 0.88
EXPECTED_GRADS_PER_TOKEN = [[-2.0, 0.0, -2.56], [0.8]]


def _flat(rows):
    return [x for row in rows for x in row]


# ------------------------------------------------------------------ plain Python (always runs)


def test_clipped_weight_clips_both_sides_and_passes_the_middle():
    assert clipped_weight(0.0, math.log(2.0), EPS_LOW, EPS_HIGH) == pytest.approx(0.8)
    assert clipped_weight(math.log(1.5), 0.0, EPS_LOW, EPS_HIGH) == pytest.approx(1.28)
    assert clipped_weight(math.log(1.1), 0.0, EPS_LOW, EPS_HIGH) == pytest.approx(1.1)
    # A huge log-ratio is clamped before exp (no overflow) and then clipped.
    assert clipped_weight(1e6, 0.0, EPS_LOW, EPS_HIGH) == pytest.approx(1.28)


def test_reference_value_and_gradient_match_hand_computation():
    loss, grads = cispo_reference(
        LOG_PROBS, OLD_LOG_PROBS, ADVANTAGES, MASKS, eps_low=EPS_LOW, eps_high=EPS_HIGH
    )
    assert loss == pytest.approx(EXPECTED_LOSS)
    assert _flat(grads) == pytest.approx(_flat(EXPECTED_GRADS))


def test_reference_per_token_reduction():
    loss, grads = cispo_reference(
        LOG_PROBS, OLD_LOG_PROBS, ADVANTAGES, MASKS, eps_low=EPS_LOW, eps_high=EPS_HIGH, per_token=True
    )
    assert loss == pytest.approx(EXPECTED_LOSS_PER_TOKEN)
    assert _flat(grads) == pytest.approx(_flat(EXPECTED_GRADS_PER_TOKEN))


def test_reference_gradient_is_the_stop_gradient_surrogate():
    # With the weight frozen, the loss is linear in each log-prob: a finite difference taken with the
    # weights held fixed reproduces the analytic gradient.
    _, grads = cispo_reference(LOG_PROBS, OLD_LOG_PROBS, ADVANTAGES, MASKS, eps_low=EPS_LOW, eps_high=EPS_HIGH)
    h = 1e-6
    weights = [[clipped_weight(lp, o, EPS_LOW, EPS_HIGH) for lp, o in zip(r, ro)]
               for r, ro in zip(LOG_PROBS, OLD_LOG_PROBS)]

    def frozen_loss(lps):
        total = 0.0
        for lp, w, a, m in zip(lps, weights, ADVANTAGES, MASKS):
            total += sum(-wi * ai * li * mi for li, wi, ai, mi in zip(lp, w, a, m)) / max(sum(m), 1.0)
        return total

    for s, row in enumerate(LOG_PROBS):
        for t in range(len(row)):
            bumped = [list(r) for r in LOG_PROBS]
            bumped[s][t] += h
            numeric = (frozen_loss(bumped) - frozen_loss(LOG_PROBS)) / h
            assert numeric == pytest.approx(grads[s][t], abs=1e-5)


def test_fully_masked_sample_contributes_nothing():
    loss, grads = cispo_reference([[-1.0, -2.0]], [[-1.5, -2.0]], [[3.0, 3.0]], [[0.0, 0.0]],
                                  eps_low=0.2, eps_high=0.28)
    assert loss == 0.0 and grads == [[0.0, 0.0]]


def test_bad_eps_and_ragged_input_are_rejected():
    with pytest.raises(CispoConfigError, match="eps_low"):
        cispo_reference([[0.0]], [[0.0]], [[1.0]], [[1.0]], eps_low=1.5, eps_high=0.2)
    with pytest.raises(CispoConfigError, match="eps_high"):
        cispo_reference([[0.0]], [[0.0]], [[1.0]], [[1.0]], eps_low=0.2, eps_high=-0.1)
    with pytest.raises(ValueError, match="same length"):
        cispo_reference([[0.0, 1.0]], [[0.0]], [[1.0]], [[1.0]], eps_low=0.2, eps_high=0.2)


def test_eps_come_from_cispo_flags_then_from_miles_clip_flags():
    assert cispo_eps(SimpleNamespace(eps_clip=0.2, eps_clip_high=0.28)) == (0.2, 0.28)
    assert cispo_eps(SimpleNamespace(eps_clip=0.2, eps_clip_high=None)) == (0.2, 0.2)
    assert cispo_eps(SimpleNamespace(eps_clip=0.2, eps_clip_high=0.28, cispo_eps_low=1.0, cispo_eps_high=4.0)) == (
        1.0,
        4.0,
    )


def test_import_does_not_load_torch():
    import subprocess

    code = "import sys, t2sql.miles.cispo; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ torch (skipped without torch)


def _torch():
    return pytest.importorskip(
        "torch", reason="torch is not installed (PyPI only ships CUDA builds, too big for CI); "
        "the plain-Python reference tests above cover the formula"
    )


def test_torch_objective_value_and_gradient_match_reference():
    torch = _torch()
    from t2sql.miles.cispo import cispo_objective, sample_mean_reducer

    lengths = [len(r) for r in LOG_PROBS]
    masks = [torch.tensor(m) for m in MASKS]
    for per_token, want_loss, want_grads in [
        (False, EXPECTED_LOSS, EXPECTED_GRADS),
        (True, EXPECTED_LOSS_PER_TOKEN, EXPECTED_GRADS_PER_TOKEN),
    ]:
        log_probs = torch.tensor(_flat(LOG_PROBS), dtype=torch.float64, requires_grad=True)
        loss, metrics = cispo_objective(
            log_probs,
            torch.tensor(_flat(OLD_LOG_PROBS), dtype=torch.float64),
            torch.tensor(_flat(ADVANTAGES), dtype=torch.float64),
            torch.tensor(_flat(MASKS)),
            eps_low=EPS_LOW,
            eps_high=EPS_HIGH,
            reduce=sample_mean_reducer(lengths, masks, per_token=per_token),
        )
        loss.backward()
        assert loss.item() == pytest.approx(want_loss)
        assert log_probs.grad.tolist() == pytest.approx(_flat(want_grads))
    # Per-token reduction (the last loop): two active tokens were clipped, A.t2 (1.5 -> 1.28) and
    # B.t0 (0.5 -> 0.8), so the masked sum of the clip indicator is 2.
    assert metrics["pg_clipfrac"].item() == pytest.approx(2.0)


def test_torch_gradient_does_not_flow_through_the_weight():
    torch = _torch()
    from t2sql.miles.cispo import cispo_token_loss

    # ratio 1.1 is inside the clip range, so the weight depends on log_prob; with the stop-gradient
    # the gradient is -w*A, not -(w + w*log_prob)*A as it would be without it.
    log_prob = torch.tensor([math.log(1.1) - 1.0], dtype=torch.float64, requires_grad=True)
    loss, weight, clipped = cispo_token_loss(
        log_prob, torch.tensor([-1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64),
        eps_low=0.2, eps_high=0.28,
    )
    loss.sum().backward()
    assert weight.item() == pytest.approx(1.1)
    assert clipped.item() == 0.0
    assert log_prob.grad.item() == pytest.approx(-1.1)


MILES_STANDIN = {
    # Small stand-ins shaped like the miles modules cispo_loss imports (miles is not installable);
    # they do what miles does for context-parallel size 1.
    "miles/__init__.py": "",
    "miles/backends/__init__.py": "",
    "miles/backends/training_utils/__init__.py": "",
    "miles/backends/training_utils/cp_utils.py": """
        import torch

        def get_local_response_loss_masks(total_lengths, response_lengths, loss_masks, qkv_format="thd",
                                          max_seq_lens=None):
            return loss_masks

        def get_sum_of_sample_mean(total_lengths, response_lengths, loss_masks, calculate_per_token_loss=False,
                                   qkv_format="thd", max_seq_lens=None, *, denominators=None):
            if denominators is None:
                denominators = [m.sum() for m in loss_masks]
            def sum_of_sample_mean(x):
                return sum((x_i * m).sum() / torch.clamp_min(d, 1)
                           for x_i, m, d in zip(x.split(response_lengths, dim=0), loss_masks, denominators))
            return sum_of_sample_mean
    """,
    "miles/backends/training_utils/loss_hub/__init__.py": "",
    "miles/backends/training_utils/parallel.py": """
        def get_parallel_state():
            return None
    """,
    "miles/utils/__init__.py": "",
    "miles/utils/misc.py": """
        import importlib

        def load_function(path):
            module, _, name = path.rpartition(".")
            return getattr(importlib.import_module(module), name)
    """,
    "miles/backends/training_utils/loss_hub/corrections.py": """
        import torch

        def vanilla_tis_function(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
            tis = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
            weights = torch.clamp(tis, min=args.tis_clip_low, max=args.tis_clip)
            return pg_loss * weights, loss_masks, {"tis": tis.detach()}
    """,
    "miles/backends/training_utils/loss_hub/logit_processors.py": """
        import torch

        def get_log_probs_and_entropy(logits, *, args, unconcat_tokens, total_lengths, response_lengths,
                                      with_entropy=False, entropy_requires_grad=True, non_loss_data=True,
                                      max_seq_lens=None):
            # logits [1, T, V]; the logit at position p predicts token p + 1.
            out, ent, start = [], [], 0
            for tokens, total, resp in zip(unconcat_tokens, total_lengths, response_lengths):
                seq_logits = logits[0, start:start + total]
                lp = torch.log_softmax(seq_logits[total - resp - 1: total - 1], dim=-1)
                out.append(lp.gather(-1, tokens[total - resp:].unsqueeze(-1)).squeeze(-1))
                ent.append(-(lp.exp() * lp).sum(-1))
                start += total
            result = {"log_probs": out}
            if with_entropy:
                result["entropy"] = ent
            return result
    """,
}


def test_miles_entry_point_matches_reference_through_logits(tmp_path, monkeypatch):
    torch = _torch()
    for rel, text in MILES_STANDIN.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "miles" or m.startswith("miles.")]:
        monkeypatch.delitem(sys.modules, name)
    from miles.backends.training_utils.cp_utils import get_sum_of_sample_mean

    from t2sql.miles.cispo import cispo_loss, cispo_reference

    torch.manual_seed(0)
    vocab = 7
    tokens = [torch.tensor([1, 4, 2, 5, 3]), torch.tensor([0, 6, 2, 1])]
    response_lengths, total_lengths = [3, 2], [5, 4]
    masks = [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0])]
    logits = torch.randn(1, sum(total_lengths), vocab, dtype=torch.float64, requires_grad=True)
    # Current log-probs, computed independently, set the old log-probs a known ratio away.
    with torch.no_grad():
        cur = []
        start = 0
        for tok, total, resp in zip(tokens, total_lengths, response_lengths):
            lp = torch.log_softmax(logits[0, start + total - resp - 1: start + total - 1], dim=-1)
            cur.append(lp.gather(-1, tok[total - resp:].unsqueeze(-1)).squeeze(-1))
            start += total
    shifts = [torch.tensor([math.log(1.5), 0.3, -math.log(0.5)]), torch.tensor([0.0, math.log(1.1)])]
    old = [c - s for c, s in zip(cur, shifts)]
    advantages = [torch.full((3,), 1.5, dtype=torch.float64), torch.full((2,), -0.5, dtype=torch.float64)]
    batch = {
        "advantages": advantages,
        "log_probs": old,
        "unconcat_tokens": tokens,
        "response_lengths": response_lengths,
        "total_lengths": total_lengths,
        "loss_masks": masks,
    }
    args = SimpleNamespace(eps_clip=0.2, eps_clip_high=0.28, entropy_coef=0.0, use_kl_loss=False, use_tis=False,
                           advantage_estimator="grpo", qkv_format="thd", calculate_per_token_loss=False)
    reducer = get_sum_of_sample_mean(total_lengths, response_lengths, masks)
    loss, metrics = cispo_loss(args, batch, logits, reducer)
    loss.backward()

    want, _ = cispo_reference(
        [c.tolist() for c in cur], [o.tolist() for o in old], [a.tolist() for a in advantages],
        [m.tolist() for m in masks], eps_low=0.2, eps_high=0.28,
    )
    assert loss.item() == pytest.approx(want)
    assert metrics["pg_loss"].item() == pytest.approx(want)
    assert set(metrics) >= {"loss", "pg_loss", "pg_clipfrac", "ppo_kl", "entropy_loss", "cispo_weight"}
    assert logits.grad is not None and logits.grad.abs().sum().item() > 0
    # Clipped active tokens: sample 0 t0 (1.5) and t2 (2.0) of 2 active -> 1.0; sample 1: none -> 0.
    assert metrics["pg_clipfrac"].item() == pytest.approx(1.0)

    # Truncated IS on top of the CISPO weight (--use-tis): each token's term is multiplied by
    # min(exp(trainer_old - rollout), tis_clip), as miles does for its PPO loss.
    rollout = [old[0] - torch.tensor([0.5, 0.0, -0.1], dtype=torch.float64),
               old[1] - torch.tensor([0.0, 1.0], dtype=torch.float64)]  # ratios e^0.5, 1, e^-0.1; 1, e^1 -> 2
    tis_args = SimpleNamespace(**{**vars(args), "use_tis": True, "tis_clip": 2.0, "tis_clip_low": 0.0})
    logits.grad = None
    tis_loss, tis_metrics = cispo_loss(tis_args, {**batch, "rollout_log_probs": rollout}, logits, reducer)
    want_tis = 0.0
    for c, o, r, a, m in zip(cur, old, rollout, advantages, masks):
        terms = [
            -min(math.exp(ot - rt), 2.0) * min(max(math.exp(ct - ot), 0.8), 1.28) * at * ct * mt
            for ct, ot, rt, at, mt in zip(c.tolist(), o.tolist(), r.tolist(), a.tolist(), m.tolist())
        ]
        want_tis += sum(terms) / max(sum(m.tolist()), 1.0)
    assert tis_loss.item() == pytest.approx(want_tis)
    assert tis_loss.item() != pytest.approx(want)  # the correction changed something
    assert "tis" in tis_metrics

    args.advantage_estimator = "gspo"
    with pytest.raises(CispoConfigError, match="gspo"):
        cispo_loss(args, batch, logits, reducer)
