"""The training methods (docs/design.md §2), one module each, registered here: `METHODS` maps a name to its `Method`
(base.py) — the data it needs, its head, packing and probes, its loss step and validator, the paper's hyperparameters.
The trainer, TrainConfig's validation, the presets (`preset_config`), `train --method` and the Train page read this
registry, so a method added here reaches all of them. Its order is the order pages list the methods in.

The reference policy of the preference methods (DPO, TDPO) is the same PEFT model with its adapter disabled
(`steps.reference_policy`): no second copy of the weights. At initialisation (LoRA B = 0) policy and reference
coincide exactly."""

from __future__ import annotations

from . import dpo, sft, sopl, tdpo, tldr, topl, unlikelihood
from .base import HeadPosition, Method, Requirement

__all__ = ["METHODS", "HeadPosition", "Method", "Requirement"]

METHODS: dict[str, Method] = {
    m.name: m for m in (topl.METHOD, tldr.METHOD, sopl.METHOD, sft.METHOD, unlikelihood.METHOD, dpo.METHOD, tdpo.METHOD)
}
