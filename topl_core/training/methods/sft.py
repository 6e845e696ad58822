"""SFT: next-token cross-entropy on the faithful responses only (records with sequence_label 1, plus the
faithful_response of pairs whose faithful record is absent), on the response tokens and the end-of-turn token."""

from __future__ import annotations

import torch

from ...data.encode import Batch
from ...foundations.presets import MethodHyper
from ..batching import encode_faithful
from ..steps import StepContext, mean_loss_validator, target_logprobs
from .base import Method


def nll_loss(token_logp: torch.Tensor) -> torch.Tensor:
    """SFT: mean of −log p(target) over the targets."""
    if token_logp.numel() == 0:
        return token_logp.sum() * 0.0
    return -token_logp.mean()


def sft_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    lp = target_logprobs(ctx.model, batch)
    return nll_loss(lp.token_logp), {"supervised_tokens": batch.n_lm_targets}


METHOD = Method(
    name="sft",
    label="SFT",
    description="Supervised fine-tuning: next-token cross-entropy on faithful responses (response + end-of-turn "
    "tokens).",
    requires="faithful",
    loss=sft_loss_step,
    prepare=encode_faithful,
    validate=mean_loss_validator(sft_loss_step, ()),
    paper={
        "qwen3-8b": MethodHyper(1e-4, 4, 4),
        "llama3.1-8b": MethodHyper(1e-4, 4, 4),
        "gemma3-4b": MethodHyper(5e-5, 4, 4),
    },
    packable=True,
)
