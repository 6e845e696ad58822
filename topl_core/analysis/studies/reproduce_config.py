"""What a reproduction of the paper's tables trains and measures (reproduce.py runs it): the model and the preset whose
per-method settings it scales, the methods, the training budget, and how many documents, tokens and λ values each
measure reads. Its defaults are the real run on the embedded SmolLM2; `ReproduceConfig.quick()` the suite's."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Literal

from ...data.label_settings import LABEL_SETTINGS
from ...foundations.config_fields import config_field
from ...foundations.errors import ConfigError
from ...foundations.paths import DEFAULT_DATA
from ...foundations.presets import DEFAULT_MODEL, PRESETS
from ...hardware.precision import (
    DECODE_PRECISION_HELP,
    PRECISION_HELP,
    PRECISIONS,
    Precision,
    resolve_phases,
)
from ...models.loading import layer_count
from ...runtime.modes import MODES
from ...training.config import TrainConfig, study_schedule
from ...training.methods import METHODS
from ..evaluation.config import EvalConfig
from ..evaluation.scorers import DEFAULT_SCORER, SCORER_HELP
from .method_runs import MethodSettings, family_preset

VECTOR_MODE, CONTROL_MODES = "vector", ("diff-mean", "random")  # the paper's LoRA-B vector and its two controls
LAMBDA_METHODS: tuple[str, ...] = ("topl", "sft", "dpo", "sopl")  # the λ curves the paper draws or could


@dataclass(frozen=True)
class ReproduceConfig:
    """A reproduction study. Example: ``run_reproduce(ReproduceConfig(steps=60), "runs/paper")``"""

    model: str = config_field(
        DEFAULT_MODEL, label="Model", help="the model every method trains (embedded, preset, hub id or local path)"
    )
    preset: str = config_field(
        "",
        label="Paper settings of",
        help="the model family whose per-method paper settings are scaled to the model (empty: the model's own "
        "family, else qwen3-8b)",
        choices=PRESETS,
    )
    data: str = config_field(DEFAULT_DATA, label="Data set", help="token-labelled records JSONL, split by document")
    split_seed: int = config_field(0, label="Split seed", help="seed of the document-level split", min=0)
    methods: tuple[str, ...] = config_field(
        tuple(METHODS), label="Methods", help="the training methods to compare", choices=METHODS
    )
    steps: int = config_field(60, label="Steps", help="optimizer steps of every method", min=1, max=1_000_000)
    batch_scale: float = config_field(
        0.5,
        label="Batch × (of the paper's)",
        help="every method's examples per step = the paper's batch × accumulation × this (the ratios stay)",
        min=0.01,
        max=16.0,
    )
    lr_scale: float = config_field(
        1.0, label="Learning rate × (of the paper's)", help="every method's lr = the paper's × this", min=1e-3, max=1e3
    )
    head_lr_multiplier: float = config_field(
        TrainConfig().head_lr_multiplier,
        label="Head lr × (of lr)",
        help="the heads (TOPL, SOPL, TLDR) learn at lr × this (the paper's: 1; the CPU default was chosen on dev "
        "sets, docs/evaluation.md §6)",
        min=0.01,
        max=100_000.0,
    )
    val_examples: int = config_field(64, label="Validation examples", help="scored at each run's end", min=1)
    seed: int = config_field(0, label="Seed", help="seed of every run's initialisation and batch order", min=0)
    device: Literal["cpu", "cuda"] = config_field("cpu", label="Device", help="where everything runs")
    precision: Precision = config_field("auto", label="Precision", help=PRECISION_HELP)
    # of the generations' one-token decode steps (GenerationConfig.decode_precision), resolved with precision when
    # built, so that the saved config says what the generations decoded in
    decode_precision: Precision = config_field("auto", label="Decode precision", help=DECODE_PRECISION_HELP)
    probe_records: int = config_field(
        64, label="LoRA-A token set (records)", help="labelled test-split records every adapter's LoRA-A is probed on"
    )
    n_id: int = config_field(24, label="ID documents", help="test-split documents every model summarises", min=0)
    n_ood: int = config_field(
        24, label="OOD documents", help="CLIFF documents (or per dataset of --ood-data) every model summarises", min=0
    )
    cliff_csv: str | None = config_field(
        None, label="CLIFF CSV", help="CLIFF CSV (default: the shipped CLIFF_error_types.csv)", flag="--cliff"
    )
    ood_data: str | None = config_field(
        None, label="OOD benchmark", help="an AggreFact-style CSV / parquet for OOD instead of CLIFF's documents"
    )
    max_new_tokens: int = config_field(64, label="Summary tokens", help="the longest summary", min=8, max=1024)
    scorer: str = config_field(DEFAULT_SCORER, label="Scorer", help=SCORER_HELP)
    lambdas: tuple[float, ...] = config_field(
        (-2.0, 0.0, 1.0, 2.0, 4.0), label="λ (LoRA-B vector)", help="the λ curve's grid (normalised units)"
    )
    control_lambdas: tuple[float, ...] = config_field(
        (2.0,), label="λ (controls)", help="the diff-mean and random controls' grid (their neutral λ is added)"
    )
    lambda_methods: tuple[str, ...] = config_field(
        LAMBDA_METHODS, label="λ curves of", help="methods whose LoRA-B vector is steered", choices=METHODS
    )
    label_steps: int = config_field(30, label="Label study steps", help="steps of each label setting's TOPL", min=1)
    label_settings: tuple[str, ...] = config_field(
        LABEL_SETTINGS, label="Label settings", help="the label settings TOPL trains on", choices=LABEL_SETTINGS
    )
    label_cliff_records: int = config_field(
        64, label="Label study CLIFF records", help="CLIFF records each label setting's head is scored on", min=0
    )
    detection_records: int = config_field(
        64, label="Detection records per set", help="held-out records per token set of the detection table", min=1
    )
    detection_probe_records: int = config_field(
        128, label="Frozen-probe records", help="training records the frozen probe is fitted on", min=1
    )

    def __post_init__(self) -> None:
        for name in ("methods", "lambdas", "control_lambdas", "lambda_methods", "label_settings"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        unknown = [m for m in (*self.methods, *self.lambda_methods) if m not in METHODS]
        if unknown or not self.methods:
            raise ConfigError(f"methods {unknown or '()'}: choose among {tuple(METHODS)}.")
        if self.preset and self.preset not in PRESETS:
            raise ConfigError(f"preset={self.preset!r}: choose one of {tuple(PRESETS)}, or leave it empty.")
        for name in ("precision", "decode_precision"):
            if getattr(self, name) not in PRECISIONS:
                raise ConfigError(f"{name}={getattr(self, name)!r}: choose one of {PRECISIONS}.")
        prompt, decode = resolve_phases(self.precision, self.decode_precision, self.device)
        object.__setattr__(self, "precision", prompt)
        object.__setattr__(self, "decode_precision", decode)
        if not self.lambdas or not set(self.label_settings) <= set(LABEL_SETTINGS):
            raise ConfigError("lambdas must not be empty, and label_settings must come from " + str(LABEL_SETTINGS))
        EvalConfig(n_id=self.n_id, n_ood=self.n_ood)  # says what is wrong with the document counts

    @classmethod
    def quick(cls, **overrides) -> "ReproduceConfig":
        """Everything on a tiny random model in a few steps, documents and tokens: the structure of a reproduction
        end to end in minutes (under one on the suite's small data file), not its numbers."""
        small = dict(
            model="tiny-gemma3",  # the tiny Gemma3 writes non-empty text (the tiny Llama's is often empty)
            steps=2,
            batch_scale=0.25,
            val_examples=4,
            precision="fp32",
            probe_records=6,
            n_id=2,
            n_ood=2,
            max_new_tokens=8,
            lambdas=(-4.0, 0.0, 4.0),
            control_lambdas=(4.0,),
            lambda_methods=("topl", "sft"),  # the two curves the paper's claims compare
            label_steps=1,
            label_settings=("original", "random"),  # the two settings the label claim compares
            label_cliff_records=4,
            detection_records=4,
            detection_probe_records=8,
        )
        return cls(**{**small, **overrides})

    # --- what the tasks run ---------------------------------------------------------------------------------------

    @property
    def settings(self) -> MethodSettings:
        return MethodSettings(
            self.preset or family_preset(self.model), self.lr_scale, self.batch_scale, self.head_lr_multiplier
        )

    def train_config(self, method: str, steps: int | None = None) -> TrainConfig:
        """`method`'s run: its scaled paper settings on this study's model, data, split and budget."""
        template = TrainConfig(
            model=self.model,
            data=self.data,
            split_seed=self.split_seed,
            steps=steps or self.steps,
            max_val_examples=self.val_examples,
            seed=self.seed,
            device=self.device,
            precision=self.precision,
        )
        return study_schedule(self.settings.config(method, template, layer_count(self.model)))

    def eval_config(self) -> EvalConfig:
        """The documents and generation settings every model is evaluated with (and steered on)."""
        return EvalConfig(
            data=self.data,
            split_seed=self.split_seed,
            n_id=self.n_id,
            n_ood=self.n_ood,
            cliff_csv=self.cliff_csv,
            ood_data=self.ood_data,
            max_new_tokens=self.max_new_tokens,
            scorer=self.scorer,
            model=self.model,
            device=self.device,
            precision=self.precision,
            decode_precision=self.decode_precision,
        )

    def lambda_grids(self) -> dict[str, tuple[float, ...]]:
        """Each steering mode's λ grid, its neutral λ included (the merged model: the curves' paired reference)."""
        grids = {VECTOR_MODE: self.lambdas, **dict.fromkeys(CONTROL_MODES, self.control_lambdas)}
        return {m: tuple(sorted({MODES[m].neutral, *grid})) for m, grid in grids.items()}

    # --- files ----------------------------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict) -> "ReproduceConfig":
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(d) - known):
            raise ConfigError(f"unknown reproduction setting(s) {unknown}; known: {sorted(known)}.")
        return cls(**d)

    def differences(self, other: "ReproduceConfig") -> list[str]:
        """The settings that differ from `other`'s, as "name: other → self"."""
        return [
            f"{f.name}: {json.dumps(getattr(other, f.name))} → {json.dumps(getattr(self, f.name))}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]
