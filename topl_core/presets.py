"""Defaults and the paper's training presets, as data (no project imports: every layer may read them).

DEFAULT_MODEL is the embedded model every command and page starts on; LORA_MODULES the linear modules LoRA may adapt;
PRESETS the paper's per-model-family LoRA layer range and per-method learning rate / batch (docs/design.md §2).
The method keys of every preset equal training.config.METHODS and the objective registry's keys (a test holds them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MODEL = "smollm2-135m"
# The decoder layer's linear modules LoRA may adapt, in site order (attention q, k, v, o, then the MLP's gate, up,
# down): the default LoRA target list and the column order of every layer × module heatmap.
LORA_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class MethodHyper:
    lr: float
    batch_size: int
    grad_accum: int = 1
    # the paper states one learning rate per method, so its heads learn at lr (TrainConfig's CPU default is higher)
    head_lr_multiplier: float = 1.0


@dataclass(frozen=True)
class Preset:
    """The paper's settings for a model family: LoRA layer range and per-method learning rate / batch.
    `num_layers` is the model's decoder depth (TLDR puts LoRA on all of them)."""

    hf_id: str
    layer_start: int
    layer_end: int
    methods: dict[str, MethodHyper] = field(default_factory=dict)
    num_layers: int = 0


def _paper_methods(topl_lr: float, sft_lr: float, dpo_lr: float) -> dict[str, MethodHyper]:
    return {
        "topl": MethodHyper(topl_lr, 16),
        "sft": MethodHyper(sft_lr, 4, 4),
        "dpo": MethodHyper(dpo_lr, 1, 8),
        "sopl": MethodHyper(1e-4, 8),
        "tldr": MethodHyper(1e-4, 16),
        "unlikelihood": MethodHyper(1e-4, 4, 2),
        "tdpo": MethodHyper(5e-6, 4, 4),
    }


PRESETS: dict[str, Preset] = {
    "qwen3-8b": Preset("Qwen/Qwen3-8B", 0, 29, _paper_methods(5e-5, 1e-4, 1e-5), num_layers=36),
    "llama3.1-8b": Preset("meta-llama/Llama-3.1-8B-Instruct", 0, 27, _paper_methods(1e-4, 1e-4, 2e-5), num_layers=32),
    "gemma3-4b": Preset("google/gemma-3-4b-it", 0, 27, _paper_methods(1e-4, 5e-5, 5e-6), num_layers=34),
}
