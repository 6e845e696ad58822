"""Every training method on the same data and split with the paper's relative settings, and how each run trained.

A method's settings come from a model-family preset (presets.PRESETS; each method's module holds its learning
rate, batch and LoRA extent per preset: training/methods/), scaled to the model trained: the preset's TOPL layer
range is kept as a fraction of the depth, every other method adapts every layer; one factor scales every method's
learning rate and one every method's examples per step, so the methods keep the paper's ratios. On the preset's own
model, with both factors 1, the settings are the paper's.

    family_preset(model) -> str        the preset of the model's family (its model_type), else FALLBACK_PRESET
    MethodSettings(preset, lr_scale, batch_scale, head_lr_multiplier).config(method, template, num_layers)
    training_summary(run) -> dict      steps, wall time, tokens/s, losses and the method's validation metric
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from ...foundations.presets import PRESETS
from ...models.loading import decoder_config
from ...training.config import TrainConfig
from ...training.methods import METHODS
from ...training.run_dirs import RunDir

FALLBACK_PRESET = "qwen3-8b"  # the family of the paper's indicator table (paper_numbers.py)


def family_preset(model: str) -> str:
    """The preset whose published architecture is of the model's family (its config's model_type: SmolLM2 is a
    Llama, the tiny Gemma3 a Gemma 3), else FALLBACK_PRESET."""
    model_type = decoder_config(model).model_type
    return next((k for k, p in PRESETS.items() if p.architecture["model_type"] == model_type), FALLBACK_PRESET)


@dataclass(frozen=True)
class MethodSettings:
    """How the paper's per-method settings of `preset` become a run: lr × lr_scale, examples per step (the paper's
    batch × gradient accumulation) × batch_scale in one batch (micro-batches keep memory bounded), and the heads'
    learning-rate multiplier (the paper's is 1)."""

    preset: str
    lr_scale: float = 1.0
    batch_scale: float = 1.0
    head_lr_multiplier: float = 1.0

    def config(self, method: str, template: TrainConfig, num_layers: int) -> TrainConfig:
        """`template` (model, data, split, steps, precision, …) with `method`'s scaled paper settings."""
        hyper, preset = METHODS[method].hyper(self.preset), PRESETS[self.preset]
        first, last = preset.lora_layers(hyper.all_layers or METHODS[method].lora_all_layers, num_layers)
        return replace(
            template,
            method=method,
            lr=hyper.lr * self.lr_scale,
            batch_size=max(1, round(hyper.batch_size * hyper.grad_accum * self.batch_scale)),
            grad_accum=1,
            head_lr_multiplier=self.head_lr_multiplier,
            lora=replace(template.lora, layer_start=first, layer_end=last),
        )


def training_summary(run: RunDir) -> dict:
    """How a finished run trained: steps, examples per step, LoRA layers, head layer, the training loop's time (the
    sum of its logged steps' seconds, over every start of a resumed run; model loading and validation excluded),
    median seconds and tokens/s per step (robust to steps another job slowed down), first and final loss, and the
    method's validation metric."""
    rows = [r for r in run.read_metrics() if "loss" in r]
    cfg, meta = run.read_config()
    metric = meta.get("validation_metric", METHODS[cfg.method].validation_metric)
    val = next((r for r in reversed(run.read_metrics()) if metric in r), {})
    times = run.step_times()
    last = rows[-1] if rows else {}
    return {
        "method": cfg.method,
        "steps": last.get("step", 0),
        "examples_per_step": cfg.batch_size * cfg.grad_accum,
        "lr": cfg.lr,
        "lora_layers": f"{cfg.lora.layer_start}-{cfg.lora.layer_end}",
        "head_layer": meta.get("head_layer"),
        # elapsed_s restarts with each resume: a resumed run's last row holds only its last segment
        "train_wall_s": sum(s for s, _ in times) if times else None,
        "median_s_per_step": statistics.median(s for s, _ in times) if times else None,
        "median_tokens_per_s": statistics.median(t / s for s, t in times if s > 0) if times else None,
        "first_loss": rows[0]["loss"] if rows else None,
        "final_loss": last.get("loss"),
        "val_metric": metric,
        "val_value": val.get(metric),
        "precision": cfg.precision,
    }
