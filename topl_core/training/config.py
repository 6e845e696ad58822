"""Training configuration: frozen, typed, validated; serialised as topl_config.json in every run directory."""

from __future__ import annotations

import json
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Literal

import torch

from ..data.label_settings import LABEL_SETTINGS
from ..foundations.config_fields import config_argv, config_field
from ..foundations.errors import ConfigError
from ..foundations.paths import DEFAULT_DATA
from ..foundations.presets import DEFAULT_MODEL, LORA_MODULES, PRESETS, default_lora_end
from ..hardware.precision import PRECISION_HELP, PRECISIONS, Precision, resolve_precision
from ..models.loading import layer_count
from .methods import METHODS

# experiment trackers a run can also log to, beside its metrics.jsonl (topl_core.training.tracking)
Tracker = Literal["tensorboard", "mlflow"]
TRACKERS: tuple[str, ...] = typing.get_args(Tracker)


def compile_backends() -> list[str]:
    """torch.compile's backends, the debugging ones (aot_eager: the compiled graph run eagerly) included."""
    return torch.compiler.list_backends(exclude_tags=())


def _fail(field_name: str, value, fix: str):
    raise ConfigError(f"{field_name}={value!r}: {fix}")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA on layers [layer_start, layer_end] (inclusive) and the listed modules. Paper: r=4, α=8, dropout 0.1.
    layer_end None (the default) is the model's own depth's: presets.default_lora_end (⌊2n/3⌋, every layer for a
    method defined on all layers), filled in by `for_depth` when the model is known — training records the number.

    Example: ``TrainConfig(lora=LoraSettings(r=8, alpha=16, layer_start=4, layer_end=20))``"""

    r: int = config_field(4, label="Rank r", help="LoRA rank (paper: 4)", min=1, max=256)
    alpha: float = config_field(
        8.0, label="α", help="LoRA scaling numerator: the update is α / r · B A (paper: 8)", min=0.1, max=1024.0
    )
    dropout: float = config_field(
        0.1, label="Dropout", help="dropout on the LoRA's input (paper: 0.1)", min=0.0, max=0.9
    )
    layer_start: int = config_field(0, label="First layer", help="first decoder layer with LoRA", min=0)
    layer_end: int | None = config_field(
        None,
        label="Last layer",
        help="last decoder layer with LoRA (inclusive); the TOPL head reads its output; none: two thirds of the "
        "model's depth (SmolLM2: 20 of 30, Gemma-3-270M: 12 of 18)",
        min=0,
    )
    modules: tuple[str, ...] = config_field(
        LORA_MODULES, label="Modules", help="the decoder layer's linear modules LoRA adapts", choices=LORA_MODULES
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "modules", tuple(self.modules))
        if self.r < 1:
            _fail("lora.r", self.r, "use a rank of at least 1 (paper: 4).")
        if not 0 <= self.dropout < 1:
            _fail("lora.dropout", self.dropout, "use a probability in [0, 1) (paper: 0.1).")
        if self.layer_start < 0 or (self.layer_end is not None and self.layer_end < self.layer_start):
            _fail("lora.layer_end", self.layer_end, f"needs 0 <= layer_start ({self.layer_start}) <= layer_end.")
        bad = [m for m in self.modules if m not in LORA_MODULES]
        if bad or not self.modules:
            _fail("lora.modules", self.modules, f"choose a non-empty subset of {LORA_MODULES}.")

    @property
    def layers(self) -> list[int]:
        if self.layer_end is None:
            raise ConfigError("lora.layer_end=None: the range follows the model's depth; call for_depth(num_layers).")
        return list(range(self.layer_start, self.layer_end + 1))

    def for_depth(self, num_layers: int, all_layers: bool = False) -> "LoraSettings":
        """These settings in a model of `num_layers` decoder layers: a layer_end not given becomes the last layer
        (`all_layers`: a method defined with LoRA on every layer) or presets.default_lora_end; a given one stays."""
        if self.layer_end is not None:
            return self
        return replace(self, layer_end=num_layers - 1 if all_layers else default_lora_end(num_layers))


@dataclass(frozen=True)
class TrainConfig:
    """A run's settings: method, model, data, LoRA, schedule, precision; frozen, each field checked and described once.

    Example: ``train(TrainConfig(method="sft", steps=60, lr=1e-4), "runs/sft-demo")``"""

    # choices: the registry itself, read when a parser or form is built, so a method added to it is a choice too
    method: str = config_field(
        "topl", label="Method", help="the training method (training/methods/: one module each)", choices=METHODS
    )
    model: str = config_field(
        DEFAULT_MODEL, label="Model", help="embedded model (smollm2-135m, gemma3-270m), preset, hub id or local path"
    )
    data: str = config_field(
        DEFAULT_DATA, label="Data set", help="records JSONL (build one with: python -m topl_core data build)"
    )
    lora: LoraSettings = field(default_factory=LoraSettings)
    lr: float = config_field(
        1e-4, label="Learning rate", help="AdamW's learning rate of the LoRA", min=1e-7, max=1.0, step=1e-5
    )
    # the head is a fresh, zero-initialised linear layer while the LoRA adapts pretrained weights: at the LoRA's lr it
    # needs far more steps than a CPU run has (docs/evaluation.md §6 compares head lr ×1, ×10 and ×100)
    head_lr_multiplier: float = config_field(
        10.0,
        label="Head lr × (of lr)",
        help="the head (TOPL, SOPL, TLDR) learns at lr × this, the LoRA at lr (paper presets: 1)",
        min=0.01,
        max=100_000.0,
    )
    batch_size: int = config_field(8, label="Batch size", help="examples per optimizer step", min=1, max=1024)
    grad_accum: int = config_field(
        1, label="Gradient accumulation", help="batches whose gradients add up to one step", min=1, max=1024
    )
    micro_batch_size: int = config_field(
        2,
        label="Micro-batch size",
        help="examples per forward/backward pass: a batch split into micro-batches keeps its gradient (summed with "
        "the loss's own token or sequence weights) and cuts peak memory",
        min=1,
        max=1024,
    )
    gradient_checkpointing: bool = config_field(
        False,
        label="Gradient checkpointing",
        help="recompute each decoder layer's activations in the backward pass: less memory, about a third more "
        "compute, the same gradients",
    )
    packing: bool = config_field(
        False,
        label="Packing",
        help="pack a batch's examples into rows (each attending to itself only): no compute on padding, the same "
        "loss and gradients; micro_batch_size then counts rows (validation stays padded)",
    )
    compile_backend: str = config_field(
        "",
        label="Compile backend",
        help="torch.compile each decoder layer with this backend ('inductor' on a GPU: fused elementwise work, fewer "
        "kernel launches; empty: eager); shapes compile dynamic",
    )
    steps: int = config_field(60, label="Steps", help="optimizer steps", min=1, max=1_000_000)
    weight_decay: float = config_field(0.0, label="Weight decay", help="AdamW's decoupled weight decay", min=0.0)
    max_grad_norm: float = config_field(1.0, label="Max gradient norm", help="gradients clipped to this norm", min=0.0)
    warmup_steps: int = config_field(0, label="Warm-up steps", help="steps of linear learning-rate warm-up", min=0)
    seed: int = config_field(
        0, label="Seed", help="seed of initialisation, dropout and batch order", min=0, max=1_000_000
    )
    # "auto" resolves when the config is built, so a run directory records the precision that actually ran
    precision: Precision = config_field("auto", label="Precision", help=PRECISION_HELP)
    device: Literal["cpu", "cuda"] = config_field("cpu", label="Device", help="where the run trains")
    max_doc_tokens: int = config_field(
        320, label="Max document tokens", help="documents cut to this many tokens", min=16, max=32_768
    )
    max_response_tokens: int = config_field(
        128, label="Max response tokens", help="responses cut to this many tokens", min=8, max=8192
    )
    eval_every: int = config_field(
        20, label="Validate every (steps)", help="steps between validations", min=1, max=100_000
    )
    checkpoint_every: int = config_field(
        10,
        label="Checkpoint every",
        help="steps between checkpoints (a stopped run resumes from the last)",
        min=1,
        max=100_000,
    )
    max_val_examples: int = config_field(
        64, label="Validation examples", help="validation examples scored at each validation", min=1, max=100_000
    )
    split_seed: int = config_field(0, label="Split seed", help="seed of the document-level train/val/test split", min=0)
    label_setting: str = config_field(
        "original",
        label="Label setting",
        help="how the token labels are rewritten before training (data/variants.py; token-level methods only)",
        choices=LABEL_SETTINGS,
    )
    probe_layers: tuple[int, ...] = config_field(
        (),
        label="Side probes at layers",
        help="TOPL/TLDR: a linear probe on FinalNorm(layer k) at each of these layers below the head's, trained in "
        "the same forward without changing the run; validation shows each one's token AUROC, to choose the head "
        "layer from data",
    )
    beta: float = config_field(0.1, label="β (DPO/TDPO)", help="DPO/TDPO temperature", min=0.0, max=10.0)
    tdpo_alpha: float = config_field(
        0.5, label="TDPO α", help="TDPO2's weight of the sequential-KL difference (Zeng et al. 2024: 0.5)", min=0.0
    )
    report_to: tuple[Tracker, ...] = config_field(
        (),
        label="Report to",
        help="experiment trackers that also get every logged metric and the config: TensorBoard event files in the "
        "run folder (tensorboard --logdir runs/), MLflow at the tracking URI (pip install -e '.[tracking]')",
    )
    mlflow_tracking_uri: str = config_field(
        "",
        label="MLflow tracking URI",
        help="MLflow's store; empty: the SQLite store mlflow.db in the runs folder (e.g. http://host:5000)",
    )

    def __post_init__(self) -> None:
        if isinstance(self.lora, dict):
            object.__setattr__(self, "lora", LoraSettings(**self.lora))
        if self.method not in METHODS:
            _fail("method", self.method, f"choose one of {sorted(METHODS)}.")
        for name in ("batch_size", "grad_accum", "micro_batch_size", "steps", "eval_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                _fail(name, getattr(self, name), "must be a positive integer.")
        if not self.lr > 0:
            _fail("lr", self.lr, "must be positive (paper: 5e-5 to 1e-4 for TOPL).")
        if not self.head_lr_multiplier > 0:
            _fail("head_lr_multiplier", self.head_lr_multiplier, "must be positive (1 = the head learns at lr).")
        if self.precision not in PRECISIONS:
            _fail("precision", self.precision, f"choose one of {PRECISIONS} ('auto' follows the hardware).")
        object.__setattr__(self, "precision", resolve_precision(self.precision, self.device))
        if not self.beta > 0:
            _fail("beta", self.beta, "must be positive (DPO/TDPO temperature; paper-style default 0.1).")
        if not self.tdpo_alpha >= 0:
            _fail("tdpo_alpha", self.tdpo_alpha, "must be non-negative (TDPO2 default 0.5).")
        if self.label_setting not in LABEL_SETTINGS:
            _fail("label_setting", self.label_setting, f"choose one of {LABEL_SETTINGS}.")
        object.__setattr__(self, "probe_layers", tuple(sorted({int(k) for k in self.probe_layers})))
        object.__setattr__(self, "report_to", tuple(dict.fromkeys(self.report_to)))  # in the order given, once each
        if any(t not in TRACKERS for t in self.report_to):
            _fail("report_to", self.report_to, f"choose trackers from {TRACKERS} (none: an empty list).")
        if self.mlflow_tracking_uri and "mlflow" not in self.report_to:
            _fail("mlflow_tracking_uri", self.mlflow_tracking_uri, "add 'mlflow' to report_to, or leave the URI empty.")
        if self.compile_backend and self.compile_backend not in compile_backends():
            _fail("compile_backend", self.compile_backend, f"choose '' (eager) or one of {compile_backends()}.")
        method = METHODS[self.method]
        if self.packing and not method.packable:
            packable = tuple(k for k, m in METHODS.items() if m.packable)
            _fail("packing", self.packing, f"packed rows hold no single example's sequence: use {packable}.")
        if self.probe_layers and not method.probed:
            probed = tuple(k for k, m in METHODS.items() if m.probed)
            _fail("probe_layers", self.probe_layers, f"side probes read a token head's labels: use {probed}.")
        # a head after the last LoRA layer bounds the probes; one on the model's last layer (TLDR) sits above them all
        # (a range left to the model's depth is checked when for_depth fills it in)
        below = self.lora.layer_end if method.head_position == "lora_end" else None
        if any(k < 0 or (below is not None and k >= below) for k in self.probe_layers):
            _fail("probe_layers", self.probe_layers, f"use layers from 0 up to below the head layer ({below}).")
        token_methods = sorted(k for k, m in METHODS.items() if m.requires == "token_labels")
        if self.label_setting != "original" and method.requires != "token_labels":
            _fail(
                "label_setting",
                self.label_setting,
                f"label settings rewrite token labels, which method {self.method!r} does not use; "
                f"use 'original', or one of the token-level methods {token_methods}.",
            )

    def for_depth(self, num_layers: int) -> "TrainConfig":
        """This config for a model of `num_layers` decoder layers: a LoRA range left to the model (layer_end None)
        filled in from its depth (LoraSettings.for_depth); what train() records."""
        lora = self.lora.for_depth(num_layers, METHODS[self.method].lora_all_layers)
        return self if lora is self.lora else replace(self, lora=lora)

    def to_json(self) -> dict:
        d = asdict(self)
        d["lora"]["modules"] = list(self.lora.modules)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s) {unknown}; known fields are {sorted(known)}.")
        return cls(**{**d, "lora": LoraSettings(**d.get("lora", {}))})

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True)

    def with_overrides(self, **kw) -> "TrainConfig":
        lora_kw = {k[5:]: v for k, v in kw.items() if k.startswith("lora_")}
        rest = {k: v for k, v in kw.items() if not k.startswith("lora_")}
        return replace(self, lora=replace(self.lora, **lora_kw), **rest)


ALWAYS_SPELLED = ("method", "model", "data", "precision")  # the command names these even at their defaults


def command_args(cfg: TrainConfig) -> list[str]:
    """`train` arguments that rebuild `cfg` (TrainConfig's defaults may change between versions, so every field
    that differs from them is spelled, and the ones that say what the run is, always)."""
    return config_argv(cfg, always=ALWAYS_SPELLED)


def study_schedule(cfg: TrainConfig) -> TrainConfig:
    """`cfg` as a study's task trains it (a sweep's window, a label setting): validated once, at its last step, and
    checkpointed at least every 10 steps."""
    return replace(cfg, eval_every=cfg.steps, checkpoint_every=max(1, min(10, cfg.steps)))


def preset_config(preset: str, method: str = "topl", num_layers: int | None = None, **overrides) -> TrainConfig:
    """The paper's hyperparameters for a model family and method (docs/design.md §2: each method's module holds its
    own, training/methods/), with any field overridden. On another model (overrides' `model`) the preset's LoRA range
    is carried to that model's depth at the same fraction (`num_layers`, else read from the model's config)."""
    if preset not in PRESETS:
        _fail("preset", preset, f"choose one of {sorted(PRESETS)}.")
    if method not in METHODS:
        _fail("method", method, f"choose one of {sorted(METHODS)}.")
    p = PRESETS[preset]
    h = METHODS[method].hyper(preset)
    model = overrides.get("model", preset)
    if num_layers is None and model != preset:
        num_layers = layer_count(model)
    layer_start, layer_end = p.lora_layers(h.all_layers, num_layers)
    base = TrainConfig(
        method=method,
        model=preset,
        lr=h.lr,
        batch_size=h.batch_size,
        grad_accum=h.grad_accum,
        head_lr_multiplier=h.head_lr_multiplier,
        lora=LoraSettings(layer_start=layer_start, layer_end=layer_end),
        # device and precision are given together: "auto" must resolve for the device the run will use
        device=overrides.pop("device", "cuda"),
        precision=overrides.pop("precision", "auto"),
    )
    return base.with_overrides(**overrides)


def tiny_topl_config(**overrides) -> TrainConfig:
    """A TOPL run on tiny-llama (models/tiny.py) that trains in seconds on a CPU: LoRA on layers 0–3, 3 steps of 4
    examples at lr 5e-3 in fp32, validated on 4 examples and checkpointed at its last step; `overrides` replace any
    field. What the steering, slider and service tests steer (tests/conftest.py), the probe tests analyse and
    scripts/ray_serve_check.py serves."""
    base = dict(
        model="tiny-llama",
        lora=LoraSettings(layer_start=0, layer_end=3),
        steps=3,
        precision="fp32",
        batch_size=4,
        lr=5e-3,
        max_val_examples=4,
        eval_every=3,
        checkpoint_every=3,
    )
    return TrainConfig(**{**base, **overrides})
