"""SOPL, the sequence-level twin of TOPL: one BCE label per response (faithful 1, perturbed 0) on the **mean of the
per-token head logits over the response tokens** (end-of-turn token excluded), the head after layer m."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ...data.encode import IGNORE, Batch
from ...foundations.metrics import auroc
from ...foundations.presets import PRESETS, MethodHyper
from ...hardware.precision import autocast, to_numpy
from ..batching import encode_all
from ..steps import StepContext, head_logits, validate_head
from .base import Method


def pooled_response_logits(logits: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """SOPL pooling: the mean of the per-token head logits (B, T) over each row's response tokens → (B,)."""
    m = response_mask.to(logits.dtype)
    return (logits * m).sum(-1) / m.sum(-1).clamp(min=1)


def sequence_bce_loss(logits: torch.Tensor, response_mask: torch.Tensor, sequence_labels: torch.Tensor) -> torch.Tensor:
    """SOPL: mean over rows of BCE(pooled_response_logits, sequence label 1 faithful / 0 unfaithful)."""
    pooled = pooled_response_logits(logits.float(), response_mask)
    return F.binary_cross_entropy_with_logits(pooled, sequence_labels.float())


def sopl_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    logits = head_logits(ctx, batch)
    loss = sequence_bce_loss(logits, batch.response_mask, batch.sequence_labels)
    return loss, {"supervised_sequences": int(batch.sequence_labels.numel())}


@torch.no_grad()
def validate_sopl(ctx: StepContext, batches, precision: str, device: str) -> dict:
    """Validation loss, sequence AUROC of the pooled head logit (faithful positive), and the token AUROC of the
    same head where token labels are known (does a sequence-level head localise errors?)."""
    ctx.model.eval()
    losses, pooled, seq = [], [], []
    for b in batches:
        b = b.to(device)
        with autocast(precision, device):
            logits = head_logits(ctx, b)
        losses.append(float(sequence_bce_loss(logits, b.response_mask, b.sequence_labels)) * len(b.sequence_labels))
        pooled.append(to_numpy(pooled_response_logits(logits, b.response_mask)))
        seq.append(to_numpy(b.sequence_labels))
    y = np.concatenate(seq)
    out = {"val_loss": sum(losses) / max(len(y), 1), "val_seq_auroc": auroc(y, np.concatenate(pooled))}
    if any(bool((b.labels != IGNORE).any()) for b in batches):  # token labels known for some validation records
        out.update(validate_head(ctx, batches, precision, device))
    return out


METHOD = Method(
    name="sopl",
    label="SOPL",
    description="Sequence-level labeling: BCE of the mean head logit over response tokens (head on "
    "FinalNorm(layer m)); faithful 1, perturbed 0.",
    requires="sequence_labels",
    loss=sopl_loss_step,
    prepare=encode_all,
    validate=validate_sopl,
    paper={preset: MethodHyper(1e-4, 8) for preset in PRESETS},  # one setting for every model family
    head_position="lora_end",
    validation_metric="val_seq_auroc",
    units_key="supervised_sequences",
)
