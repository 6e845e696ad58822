"""Training configuration: frozen, typed, validated; serialised as topl_config.json in every run directory."""

from __future__ import annotations

import json
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Literal

import torch

from ..data.variants import LABEL_SETTINGS
from ..errors import ConfigError
from ..paths import DEFAULT_DATA
from ..precision import PRECISIONS, Precision, resolve_precision
from ..presets import DEFAULT_MODEL, LORA_MODULES, PRESETS
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
    """LoRA on layers [layer_start, layer_end] (inclusive) and the listed modules. Paper: r=4, α=8, dropout 0.1."""

    r: int = 4
    alpha: float = 8.0
    dropout: float = 0.1
    layer_start: int = 0
    layer_end: int = 20
    modules: tuple[str, ...] = LORA_MODULES

    def __post_init__(self) -> None:
        object.__setattr__(self, "modules", tuple(self.modules))
        if self.r < 1:
            _fail("lora.r", self.r, "use a rank of at least 1 (paper: 4).")
        if not 0 <= self.dropout < 1:
            _fail("lora.dropout", self.dropout, "use a probability in [0, 1) (paper: 0.1).")
        if self.layer_start < 0 or self.layer_end < self.layer_start:
            _fail("lora.layer_end", self.layer_end, f"needs 0 <= layer_start ({self.layer_start}) <= layer_end.")
        bad = [m for m in self.modules if m not in LORA_MODULES]
        if bad or not self.modules:
            _fail("lora.modules", self.modules, f"choose a non-empty subset of {LORA_MODULES}.")

    @property
    def layers(self) -> list[int]:
        return list(range(self.layer_start, self.layer_end + 1))


@dataclass(frozen=True)
class TrainConfig:
    method: str = "topl"  # a key of training.methods.METHODS
    model: str = DEFAULT_MODEL
    data: str = DEFAULT_DATA
    lora: LoraSettings = field(default_factory=LoraSettings)
    lr: float = 1e-4
    # the head's learning rate is lr × this: the head is a fresh linear layer (zero-initialised) while the LoRA
    # adapts pretrained weights, and at the LoRA's lr it needs far more steps than a CPU run has. Measured on
    # SmolLM2, 60 TOPL steps (README): ×1 → held-out token AUROC 0.71, ×10 → 0.90, ×100 → 0.94 but worse on CLIFF
    # (0.76 vs 0.83 CNN/DM), i.e. ×100 overfits the synthetic edits. Paper presets use 1 (models.MethodHyper).
    head_lr_multiplier: float = 10.0
    batch_size: int = 8
    grad_accum: int = 1
    # examples per forward/backward: each batch is split into micro-batches of this size and their gradients are
    # summed with the loss's own weights (tokens or sequences), so the step equals the whole batch's, in less memory
    micro_batch_size: int = 2
    # recompute each decoder layer's activations in the backward pass instead of keeping them: less memory for long
    # inputs or large models, about a third more compute; the same gradients
    gradient_checkpointing: bool = False
    # pack the training examples of a batch into rows (several short examples a row, each attending to itself only,
    # training.batching.make_packed_batches): no compute on padding, the same loss and gradients as padded batches;
    # micro_batch_size then counts rows. Validation batches stay padded.
    packing: bool = False
    # compile each decoder layer's forward with torch.compile and this backend ("inductor" on a GPU: fused
    # elementwise work, fewer kernel launches; "" = eager). Shapes are compiled dynamic (batches vary in length).
    compile_backend: str = ""
    steps: int = 60
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    seed: int = 0
    # "auto" resolves when the config is built (bf16 autocast only where the device computes bf16 natively and
    # fast, topl_core.precision), so a run directory records the precision that actually ran
    precision: Precision = "auto"
    device: Literal["cpu", "cuda"] = "cpu"
    max_doc_tokens: int = 320
    max_response_tokens: int = 128
    eval_every: int = 20
    checkpoint_every: int = 10
    max_val_examples: int = 64
    split_seed: int = 0
    label_setting: str = "original"
    # token-head methods (TOPL, TLDR): also a linear probe at each of these layers below the head's, trained in the
    # same forward on FinalNorm(layer k) detached (the LoRA and head learn exactly as without them); validation
    # reports each probe's token AUROC beside the head's, so the head layer m can be chosen from data
    probe_layers: tuple[int, ...] = ()
    beta: float = 0.1  # DPO/TDPO temperature
    tdpo_alpha: float = 0.5  # TDPO2 weight of the sequential-KL difference (Zeng et al. 2024 default)
    # experiment trackers that receive every metrics.jsonl row and this config (as TRL's report_to): TensorBoard
    # event files in the run folder, MLflow at mlflow_tracking_uri ("" = the SQLite store mlflow.db in the runs
    # folder, topl_core.training.tracking)
    report_to: tuple[Tracker, ...] = ()
    mlflow_tracking_uri: str = ""

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


class ConfigFlag(typing.NamedTuple):
    """A TrainConfig field as `python -m topl_core train` spells it (LoRA fields as --lora-*)."""

    flag: str  # --lora-layer-end
    dest: str  # lora_layer_end: the with_overrides keyword
    type: object  # the field's type hint
    default: object


def config_flags(cls=None, prefix: str = "") -> list[ConfigFlag]:
    """Every field of TrainConfig as a command-line flag: the train CLI's parser and a run's reproducing command
    (command_args) are both built from this list."""
    cls = cls or TrainConfig
    out = []
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.name == "lora":
            out += config_flags(LoraSettings, "lora_")
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        name = prefix + f.name
        out.append(ConfigFlag(f"--{name.replace('_', '-')}", name, hints[f.name], default))
    return out


ALWAYS_SPELLED = ("method", "model", "data", "precision")  # the command names these even at their defaults


def command_args(cfg: TrainConfig) -> list[str]:
    """`train` arguments that rebuild `cfg` (TrainConfig's defaults may change between versions, so every field
    that differs from them is spelled, and the ones that say what the run is, always)."""
    args: list[str] = []
    for flag, dest, typ, default in config_flags():
        value = getattr(cfg.lora, dest.removeprefix("lora_")) if dest.startswith("lora_") else getattr(cfg, dest)
        if value == default and dest not in ALWAYS_SPELLED:
            continue
        if typ is bool:
            args.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, tuple):  # nargs="+" (an empty tuple is the default of every such field)
            args += [flag, *map(str, value)]
        else:
            args += [flag, repr(value) if isinstance(value, float) else str(value)]
    return args


def preset_config(preset: str, method: str = "topl", **overrides) -> TrainConfig:
    """The paper's hyperparameters for a model family and method (docs/design.md §2: each method's module holds its
    own, training/methods/), with any field overridden."""
    if preset not in PRESETS:
        _fail("preset", preset, f"choose one of {sorted(PRESETS)}.")
    if method not in METHODS:
        _fail("method", method, f"choose one of {sorted(METHODS)}.")
    p = PRESETS[preset]
    h = METHODS[method].hyper(preset)
    layer_start, layer_end = p.lora_layers(h.all_layers)
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
