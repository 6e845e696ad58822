"""TLDR (a token-level reward model): TOPL's token-level BCE with the head on FinalNorm(the model's *last* layer)
and LoRA on every layer."""

from __future__ import annotations

from ...foundations.presets import PRESETS, MethodHyper
from ..batching import encode_token_labelled
from ..steps import validate_head
from .base import Method
from .topl import topl_loss_step

METHOD = Method(
    name="tldr",
    label="TLDR",
    description="TLDR token-level reward model: BCE of a linear head on FinalNorm(last layer) per response token, "
    "LoRA on all layers.",
    requires="token_labels",
    loss=topl_loss_step,
    prepare=encode_token_labelled,
    validate=validate_head,
    paper={preset: MethodHyper(1e-4, 16) for preset in PRESETS},  # one setting for every model family
    head_position="last",
    packable=True,
    probed=True,
    lora_all_layers=True,
    validation_metric="val_token_auroc",
)
