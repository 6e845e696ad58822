"""TOPL (docs/design.md §2): a linear head h on FinalNorm(f_{0:m}(x)), m = the last LoRA layer, trained with binary
cross-entropy against the token labels of the response (1 good, 0 bad; prompt and document unsupervised). The
forward stops after layer m. Side probes at layers below m learn in the same forward without teaching the model."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...data.encode import IGNORE, Batch
from ...foundations.presets import MethodHyper
from ..batching import encode_token_labelled
from ..steps import StepContext, head_and_probe_logits, validate_head
from .base import Method


def token_bce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of per-token head logits against labels 1 (good) / 0 (bad); -1 ignored (0 when no
    token is labelled): every token's BCE, the unlabelled ones weighted 0, over the labelled count — a masked sum,
    not an index of the labelled tokens, which on a GPU makes the host wait while the device counts them."""
    mask = labels != IGNORE
    per_token = F.binary_cross_entropy_with_logits(logits.float(), labels.clamp(min=0).float(), reduction="none")
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def topl_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    logits, probes = head_and_probe_logits(ctx, batch)
    loss = token_bce_loss(logits, batch.labels)
    info: dict = {"supervised_tokens": batch.n_labelled}
    if probes:
        side = {k: token_bce_loss(p, batch.labels) for k, p in probes.items()}
        info |= {f"probe_loss_L{k}": v.detach() for k, v in side.items()}
        total = sum(side.values())
        loss = loss + (total - total.detach())  # the value stays the head's loss; the gradient trains the probes too
    return loss, info


METHOD = Method(
    name="topl",
    label="TOPL",
    description="Token-level off-policy labeling: BCE of a linear head on FinalNorm(layer m) over response tokens.",
    requires="token_labels",
    loss=topl_loss_step,
    prepare=encode_token_labelled,
    validate=validate_head,
    # the paper's TOPL puts LoRA on a layer range (presets.Preset.topl_layers), its head after the last of them
    paper={
        "qwen3-8b": MethodHyper(5e-5, 16, all_layers=False),
        "llama3.1-8b": MethodHyper(1e-4, 16, all_layers=False),
        "gemma3-4b": MethodHyper(1e-4, 16, all_layers=False),
    },
    head_position="lora_end",
    packable=True,
    probed=True,
    validation_metric="val_token_auroc",
)
