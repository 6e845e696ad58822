"""TDPO2 of Zeng et al. 2024, "Token-level Direct Preference Optimization" (α = cfg.tdpo_alpha, paper default 0.5):
the DPO margin minus α·(β·SeqKL(y_l) − sg(β·SeqKL(y_w))), where SeqKL(y) = Σ_t KL(π_ref(·|x, y_<t) ‖ π_θ(·|x, y_<t))
over the response + end-of-turn positions. `tdpo_loss(..., variant="tdpo1")` gives TDPO1 (α = 1, no stop-gradient).
The reference policy is the same PEFT model with its adapter disabled."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from ...data.encode import Batch
from ...foundations.presets import PRESETS, MethodHyper
from ..batching import encode_pairs, make_pair_batches
from ..steps import StepContext, mean_loss_validator, pair_halves, pair_info, reference_policy, target_logprobs
from .base import Method


def sequential_kl(ref_logp: torch.Tensor, policy_logp: torch.Tensor) -> torch.Tensor:
    """Per-position KL(π_ref ‖ π_θ) = Σ_v p_ref(v)(log p_ref(v) − log p_θ(v)) from log-probabilities over the vocab
    (last dimension). Summing it over a response's positions gives TDPO's sequential KL D_SeqKL(x, y; π_ref ‖ π_θ)."""
    return (ref_logp.exp() * (ref_logp - policy_logp)).sum(-1)


def tdpo_loss(
    chosen_margin: torch.Tensor,
    rejected_margin: torch.Tensor,
    chosen_kl: torch.Tensor,
    rejected_kl: torch.Tensor,
    beta: float,
    alpha: float = 0.5,
    variant: Literal["tdpo1", "tdpo2"] = "tdpo2",
) -> torch.Tensor:
    """TDPO (Zeng et al. 2024, "Token-level Direct Preference Optimization"), mean over pairs of
        TDPO1: −log σ(β[(m_w − m_l) − (K_l − K_w)])
        TDPO2: −log σ(β[(m_w − m_l) − α(K_l − sg(K_w))])
    where m = Σ_t log π_θ(y_t) − log π_ref(y_t) (per-sequence log-ratio) and K = sequential KL(π_ref ‖ π_θ) of the
    chosen (w) / rejected (l) response; sg = stop-gradient. All inputs are (B,)."""
    if variant == "tdpo1":
        delta = rejected_kl - chosen_kl
    elif variant == "tdpo2":
        delta = alpha * (rejected_kl - chosen_kl.detach())
    else:
        raise ValueError(f"variant={variant!r}: choose 'tdpo1' or 'tdpo2'.")
    return -F.logsigmoid(beta * ((chosen_margin - rejected_margin) - delta)).mean()


def tdpo_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    B = pair_halves(batch)
    pol = target_logprobs(ctx.model, batch, vocab=True)
    with reference_policy(ctx.model) as ref_model:
        ref = target_logprobs(ref_model, batch, vocab=True)
    margin = pol.per_sequence(pol.token_logp - ref.token_logp)
    kl = pol.per_sequence(sequential_kl(ref.vocab_logp, pol.vocab_logp))
    loss = tdpo_loss(margin[:B], margin[B:], kl[:B], kl[B:], ctx.beta, ctx.tdpo_alpha, "tdpo2")
    return loss, {
        **pair_info(ctx, margin[:B], margin[B:]),
        "seq_kl_chosen": kl[:B].detach().mean(),
        "seq_kl_rejected": kl[B:].detach().mean(),
    }


METHOD = Method(
    name="tdpo",
    label="TDPO",
    description="TDPO2 (Zeng et al. 2024): DPO margin minus α·(β·SeqKL(rejected) − sg(β·SeqKL(chosen))), KL(π_ref "
    "‖ π_θ) per token; reference = adapter disabled.",
    requires="pairs",
    loss=tdpo_loss_step,
    prepare=encode_pairs,
    validate=mean_loss_validator(tdpo_loss_step, ("reward_accuracy", "reward_margin")),
    paper={preset: MethodHyper(5e-6, 4, 4) for preset in PRESETS},  # one setting for every model family
    batches=make_pair_batches,
    validation_metric="val_reward_accuracy",
    units_key="pairs",
)
