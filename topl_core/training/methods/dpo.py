"""DPO (Rafailov et al. 2023): chosen = the faithful_response, rejected = the perturbed/hallucinated response of the
same prompt; −log σ(β[(log π_θ − log π_ref)(y_w) − (log π_θ − log π_ref)(y_l)]), log-probs summed over the response
and its end-of-turn token. The reference policy is the same PEFT model with its adapter disabled."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...data.encode import Batch
from ...foundations.presets import MethodHyper
from ..batching import encode_pairs, make_pair_batches
from ..steps import StepContext, mean_loss_validator, pair_halves, pair_info, reference_policy, target_logprobs
from .base import Method


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """DPO (Rafailov et al. 2023): mean of −log σ(β[(π_c − ref_c) − (π_r − ref_r)]) over pairs; inputs are
    per-sequence summed log-probs (B,)."""
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()


def dpo_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    B = pair_halves(batch)
    pol = target_logprobs(ctx.model, batch)
    with reference_policy(ctx.model) as ref_model:
        ref = target_logprobs(ref_model, batch)
    pol_seq, ref_seq = pol.per_sequence(pol.token_logp), ref.per_sequence(ref.token_logp)
    loss = dpo_loss(pol_seq[:B], pol_seq[B:], ref_seq[:B], ref_seq[B:], ctx.beta)
    ratio = pol_seq - ref_seq
    return loss, pair_info(ctx, ratio[:B], ratio[B:])


METHOD = Method(
    name="dpo",
    label="DPO",
    description="DPO: chosen = faithful response, rejected = perturbed response; reference = the model with its "
    "adapter disabled.",
    requires="pairs",
    loss=dpo_loss_step,
    prepare=encode_pairs,
    validate=mean_loss_validator(dpo_loss_step, ("reward_accuracy", "reward_margin")),
    paper={
        "qwen3-8b": MethodHyper(1e-5, 1, 8),
        "llama3.1-8b": MethodHyper(2e-5, 1, 8),
        "gemma3-4b": MethodHyper(5e-6, 1, 8),
    },
    batches=make_pair_batches,
    validation_metric="val_reward_accuracy",
    units_key="pairs",
)
