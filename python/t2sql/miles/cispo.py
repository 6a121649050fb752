"""CISPO, the clipped-IS-weight policy loss, as a miles custom loss, in three layers each usable alone: the plain
Python spec the tests check (`cispo_reference`), the torch math (`cispo_token_loss`, `cispo_objective`; torch is
imported inside them only) and the miles entry point (`cispo_loss`). The loss, its reduction and clip bounds:
docs/recipe_extras.md, "CISPO loss"."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from t2sql.errors import CispoConfigError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

# Same guard as miles' policy loss: a log-ratio beyond +-20 is numerical noise, and exp() of it
# would overflow float32.
LOG_RATIO_CLAMP = 20.0


# ---------------------------------------------------------------- plain-Python reference


def clipped_weight(log_prob: float, old_log_prob: float, eps_low: float, eps_high: float) -> float:
    """The CISPO importance weight of one token: clip(exp(log_prob - old_log_prob), 1-eps_low, 1+eps_high)."""
    log_ratio = max(-LOG_RATIO_CLAMP, min(LOG_RATIO_CLAMP, log_prob - old_log_prob))
    return min(max(math.exp(log_ratio), 1.0 - eps_low), 1.0 + eps_high)


def cispo_reference(
    log_probs: Sequence[Sequence[float]],
    old_log_probs: Sequence[Sequence[float]],
    advantages: Sequence[Sequence[float]],
    loss_masks: Sequence[Sequence[float]],
    *,
    eps_low: float,
    eps_high: float,
    per_token: bool = False,
) -> tuple[float, list[list[float]]]:
    """Loss value and d loss / d log_prob for a batch given per sample (lists of per-token lists).

    Reduction as miles: each sample's masked sum divided by its mask sum (at least 1), summed over
    samples; with `per_token=True` (miles' --calculate-per-token-loss) the plain masked sum.
    """
    _check_eps(eps_low, eps_high)
    total = 0.0
    grads: list[list[float]] = []
    for lp, old, adv, mask in zip(log_probs, old_log_probs, advantages, loss_masks, strict=True):
        if not len(lp) == len(old) == len(adv) == len(mask):
            raise ValueError("every per-sample list must have the same length (one entry per response token)")
        denominator = 1.0 if per_token else max(float(sum(mask)), 1.0)
        sample_grads = []
        for lp_t, old_t, adv_t, mask_t in zip(lp, old, adv, mask):
            weight = clipped_weight(lp_t, old_t, eps_low, eps_high)
            total += -weight * adv_t * lp_t * mask_t / denominator
            sample_grads.append(-weight * adv_t * mask_t / denominator)
        grads.append(sample_grads)
    return total, grads


def _check_eps(eps_low: float, eps_high: float) -> None:
    if not (0.0 <= eps_low <= 1.0):
        raise CispoConfigError(f"eps_low must be in [0, 1] (the weight floor is 1 - eps_low), got {eps_low}")
    if eps_high < 0.0:
        raise CispoConfigError(f"eps_high must be >= 0 (the weight cap is 1 + eps_high), got {eps_high}")


# ---------------------------------------------------------------- torch math


def cispo_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token CISPO loss over flat tensors. Returns (loss, weight, clipped) per token.

    `weight` is detached (the stop-gradient); `clipped` is 1.0 where the clip changed the ratio.
    Only `log_probs` carries gradient; masking and reduction are the caller's (miles' reducer).
    """
    import torch

    _check_eps(eps_low, eps_high)
    log_ratio = (log_probs.detach() - old_log_probs.detach()).float()
    log_ratio = torch.nan_to_num(log_ratio, nan=0.0, posinf=LOG_RATIO_CLAMP, neginf=-LOG_RATIO_CLAMP)
    ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    clipped = (weight != ratio).float()
    loss = -(weight * advantages.detach()).to(log_probs.dtype) * log_probs
    return loss, weight, clipped


def sample_mean_reducer(
    response_lengths: Sequence[int], loss_masks: Sequence[torch.Tensor], *, per_token: bool = False
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A CPU stand-in for miles' `get_sum_of_sample_mean` without context parallelism (cp_size 1)."""
    import torch

    lengths = [int(n) for n in response_lengths]

    def reduce(x: torch.Tensor) -> torch.Tensor:
        parts = x.split(lengths, dim=0)
        if per_token:
            return sum((p * m).sum() for p, m in zip(parts, loss_masks, strict=True))
        return sum(
            (p * m).sum() / torch.clamp_min(m.sum(), 1) for p, m in zip(parts, loss_masks, strict=True)
        )

    return reduce


def cispo_objective(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    reduce: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Masked, reduced CISPO loss and its detached metrics, over flat (concatenated) token tensors.

    Inactive tokens (mask 0) get advantage 0 and NaN/inf advantages become 0, as in miles.
    """
    import torch

    active = loss_mask.bool()
    advantages = torch.where(active, torch.nan_to_num(advantages, nan=0.0, posinf=0.0, neginf=0.0), 0.0)
    token_loss, weight, clipped = cispo_token_loss(
        log_probs, old_log_probs, advantages, eps_low=eps_low, eps_high=eps_high
    )
    loss = reduce(token_loss)
    approx_kl = torch.where(active, (old_log_probs - log_probs).detach(), 0.0)
    metrics = {
        "pg_loss": loss.detach().clone(),
        "pg_clipfrac": reduce(clipped).detach(),
        "cispo_weight": reduce(weight).detach(),
        "ppo_kl": reduce(approx_kl).detach(),
    }
    return loss, metrics


# ---------------------------------------------------------------- miles entry point


def cispo_eps(args: Any) -> tuple[float, float]:
    """(eps_low, eps_high) from the miles args: cispo_eps_* if set, else --eps-clip/--eps-clip-high."""
    eps_low = getattr(args, "cispo_eps_low", None)
    eps_high = getattr(args, "cispo_eps_high", None)
    if eps_low is None:
        eps_low = getattr(args, "eps_clip", 0.2)
    if eps_high is None:
        eps_high = getattr(args, "eps_clip_high", None)
        if eps_high is None:
            eps_high = eps_low
    return float(eps_low), float(eps_high)


def cispo_loss(args: Any, batch: Any, logits: Any, sum_of_sample_mean: Callable) -> tuple[Any, dict[str, Any]]:
    """miles custom loss: `--loss-type custom_loss --custom-loss-function-path t2sql.cispo.cispo_loss`."""
    import torch
    from miles.backends.training_utils.cp_utils import get_local_response_loss_masks, get_sum_of_sample_mean
    from miles.backends.training_utils.loss_hub.logit_processors import get_log_probs_and_entropy

    if getattr(args, "advantage_estimator", "grpo") == "gspo" or getattr(args, "use_opsm", False):
        raise CispoConfigError(
            "CISPO is a token-level loss: drop --use-opsm and use --advantage-estimator grpo "
            "(or another token-level estimator), not gspo"
        )
    eps_low, eps_high = cispo_eps(args)

    advantages = torch.cat([a.detach() for a in batch["advantages"]], dim=0)
    rollout_log_probs = batch.get("rollout_log_probs")
    rollout_log_probs = [x.detach() for x in rollout_log_probs] if rollout_log_probs is not None else None
    response_lengths, total_lengths = batch["response_lengths"], batch["total_lengths"]
    max_seq_lens = batch.get("max_seq_lens", None)
    entropy_coef = getattr(args, "entropy_coef", 0.0)
    with_entropy = entropy_coef != 0 or getattr(args, "observe_training_entropy", False)

    scored = get_log_probs_and_entropy(
        logits,
        args=args,
        unconcat_tokens=batch["unconcat_tokens"],
        total_lengths=total_lengths,
        response_lengths=response_lengths,
        with_entropy=with_entropy,
        entropy_requires_grad=entropy_coef != 0,
        max_seq_lens=max_seq_lens,
    )
    log_probs_list = scored["log_probs"]
    if getattr(args, "skip_actor_forward_only", False):
        trainer_old = [x.detach() for x in log_probs_list]
    else:
        trainer_old = [x.detach() for x in batch["log_probs"]] if batch.get("log_probs") is not None else None
    if getattr(args, "use_rollout_logprobs", False):
        if rollout_log_probs is None:
            raise CispoConfigError("--use-rollout-logprobs is set but the batch has no rollout_log_probs")
        old_list = rollout_log_probs
    else:
        if trainer_old is None:
            raise CispoConfigError("CISPO needs old-policy log-probs: the batch has none (set --use-rollout-logprobs)")
        old_list = trainer_old

    log_probs = torch.cat(log_probs_list, dim=0)
    old_log_probs = torch.cat(old_list, dim=0)
    local_masks = get_local_response_loss_masks(
        total_lengths, response_lengths, batch["loss_masks"], getattr(args, "qkv_format", "thd"), max_seq_lens
    )
    loss_mask = torch.cat(local_masks, dim=0).to(device=log_probs.device)
    active = loss_mask.bool()
    advantages = torch.where(active, torch.nan_to_num(advantages, nan=0.0, posinf=0.0, neginf=0.0), 0.0)

    token_loss, weight, clipped = cispo_token_loss(
        log_probs, old_log_probs, advantages, eps_low=eps_low, eps_high=eps_high
    )
    metric_reduce = sum_of_sample_mean
    loss_reduce = sum_of_sample_mean
    extra_metrics: dict[str, Any] = {}
    if getattr(args, "use_tis", False) or getattr(args, "get_mismatch_metrics", False):
        # Train/rollout mismatch correction, applied on top of the CISPO weight like miles does for PPO.
        from miles.backends.training_utils.loss_hub.corrections import vanilla_tis_function
        from miles.backends.training_utils.parallel import get_parallel_state
        from miles.utils.misc import load_function

        if trainer_old is None or rollout_log_probs is None:
            raise CispoConfigError("--use-tis needs both trainer log_probs and rollout_log_probs in the batch")
        tis_path = getattr(args, "custom_tis_function_path", None)
        tis_func = load_function(tis_path) if tis_path else vanilla_tis_function
        token_loss, modified_masks, tis_metrics = tis_func(
            args=args,
            pg_loss=token_loss,
            train_log_probs=trainer_old,
            rollout_log_probs=rollout_log_probs,
            loss_masks=batch["loss_masks"],
            total_lengths=total_lengths,
            response_lengths=response_lengths,
            parallel_state=get_parallel_state(),
            max_seq_lens=max_seq_lens,
        )
        loss_reduce = get_sum_of_sample_mean(
            total_lengths,
            response_lengths,
            modified_masks,
            getattr(args, "calculate_per_token_loss", False),
            getattr(args, "qkv_format", "thd"),
            max_seq_lens,
            denominators=batch.get("rollout_mask_sums", None),
        )
        extra_metrics = {k: metric_reduce(v).detach() for k, v in tis_metrics.items()}

    pg_loss = loss_reduce(token_loss)
    loss = pg_loss
    metrics: dict[str, Any] = {}
    entropy_loss = pg_loss.new_zeros(())
    if with_entropy:
        entropy_loss = metric_reduce(torch.cat(scored["entropy"], dim=0))
        if entropy_coef != 0:
            loss = loss - entropy_coef * entropy_loss
        else:
            entropy_loss = entropy_loss.detach()
    if getattr(args, "use_kl_loss", False):
        from miles.backends.training_utils.loss_hub.math_utils import compute_approx_kl

        if batch.get("ref_log_probs") is None:
            raise CispoConfigError("--use-kl-loss needs ref_log_probs in the batch (a reference model)")
        ref = torch.cat([x.detach() for x in batch["ref_log_probs"]], dim=0)
        kl = compute_approx_kl(log_probs, ref, kl_loss_type=args.kl_loss_type)
        kl = torch.where(active, torch.nan_to_num(kl, nan=0.0, posinf=0.0, neginf=0.0), 0.0)
        kl_loss = metric_reduce(kl)
        if getattr(args, "kl_loss_coef", 0.0) != 0:
            loss = loss + args.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach().clone()
    if log_probs.numel() == 0:
        # Keep every rank's autograd graph connected (miles does the same), else backward hangs.
        loss = loss + 0 * logits.sum()

    approx_kl = torch.where(active, (old_log_probs - log_probs).detach(), 0.0)
    metrics.update(
        {
            "loss": loss.detach().clone(),
            "pg_loss": pg_loss.detach().clone(),
            "entropy_loss": entropy_loss.detach().clone(),
            "pg_clipfrac": metric_reduce(clipped).detach(),
            "cispo_weight": metric_reduce(weight).detach(),
            "ppo_kl": metric_reduce(approx_kl).detach(),
        }
    )
    metrics.update(extra_metrics)
    return loss, metrics
