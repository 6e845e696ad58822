"""What an evaluation evaluates and how: model variants (base, merged, steered) and the evaluation's settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...foundations.config_fields import config_field
from ...foundations.paths import DEFAULT_DATA
from ...foundations.presets import DEFAULT_MODEL
from ...hardware.precision import (
    DECODE_PRECISION_HELP,
    PRECISION_HELP,
    Precision,
    resolve_phases,
)
from ...inference.generate import GenerationConfig
from ...models.loading import Device
from ...runtime.modes import SteerConfig
from .scorers import DEFAULT_SCORER, SCORER_HELP

ProgressFn = Callable[[str], None]


@dataclass(frozen=True)
class Variant:
    """A model to evaluate: the base model (`run` None; `model` names it), a run's merged adapter (`lam` None), or
    the merged adapter steered with λ in mode `how` (topl_core.runtime.modes.SteerConfig).

    Example: ``[Variant.base(), Variant.merged(path), Variant.steered(path, 2.0, how=SteerConfig("conditional"))]``"""

    name: str
    run: str | None = None
    lam: float | None = None
    model: str | None = None  # base model spec for run=None (default: the config's / first run's base)
    how: SteerConfig = SteerConfig()

    @classmethod
    def base(cls, model: str | None = None, name: str = "base") -> "Variant":
        return cls(name, None, None, model)

    @classmethod
    def merged(cls, run, name: str | None = None) -> "Variant":
        return cls(name or f"merged ({Path(run).name})", str(run))

    @classmethod
    def steered(cls, run, lam: float, name: str | None = None, how: SteerConfig = SteerConfig()) -> "Variant":
        mode = "" if how == SteerConfig() else f" {how.mode}" + (" gen-only" if how.positions == "generated" else "")
        mode += "".join(f" {name}={value:g}" for name, value in how.settings().items())  # gated: τ and k
        return cls(name or f"steered{mode} λ={lam:g} ({Path(run).name})", str(run), float(lam), how=how)

    @property
    def kind(self) -> str:
        return "base" if self.run is None else "merged" if self.lam is None else "steered"

    @property
    def generates_like_merged(self) -> bool:
        """Steered at the mode's neutral λ (the one that changes nothing): the merged model's texts."""
        return self.kind == "merged" or (self.kind == "steered" and self.lam == self.how.neutral)


OOD_MEAN = "OOD mean of datasets"  # the column of the paper's OOD figure: each dataset weighs the same


@dataclass(frozen=True)
class EvalConfig:
    """What an evaluation reads and how it generates: ID and OOD documents, summary length, scorer, device, precision.

    Example: ``evaluate(variants, EvalConfig(n_id=16, n_ood=16, scorer="grounding", max_new_tokens=64))``"""

    data: str = config_field(DEFAULT_DATA, label="ID data", help="ID data (its held-out test split is used)")
    split_seed: int = config_field(0, label="Split seed", help="seed of the data's document-level split", min=0)
    n_id: int = config_field(16, label="ID documents", help="ID documents", min=0)
    n_ood: int = config_field(
        16,
        label="OOD documents",
        help="OOD documents (CLIFF: in all, alternating its sources; per dataset with --ood-data)",
        min=0,
    )
    cliff_csv: str | None = config_field(
        None,
        label="CLIFF CSV",
        help="CLIFF CSV for OOD documents (default: the shipped CLIFF_error_types.csv)",
        flag="--cliff",
    )
    # the paper's OOD: LLM-AggreFact's 11 datasets, up to 300 documents each
    ood_data: str | None = config_field(
        None,
        label="OOD benchmark instead of CLIFF",
        help="OOD over a benchmark instead of CLIFF: an AggreFact / LLM-AggreFact CSV or parquet (doc and dataset "
        "columns) or a hub dataset id; --n-ood documents per dataset; per-dataset columns and their mean",
    )
    max_new_tokens: int = config_field(
        96, label="Max new tokens", help="the longest summary, in tokens", min=8, max=1024
    )
    max_doc_tokens: int = config_field(
        512, label="Max document tokens", help="documents cut to this many tokens", min=16, max=32_768
    )
    batch_size: int = config_field(4, label="Batch size", help="documents generated together", min=1, max=256)
    scorer: str = config_field(DEFAULT_SCORER, label="Scorer", help=SCORER_HELP)
    top_k: int = config_field(4, label="Steered sites", help="steered sites (the top k by LoRA-A AUROC)", min=1)
    model: str = config_field(DEFAULT_MODEL, label="Base model", help="the base model when no adapter names one")
    device: Device = config_field("cpu", label="Device", help="where the variants generate")
    # resolved for `device` when built (topl_core.hardware.precision)
    precision: Precision = config_field("auto", label="Precision", help="of the generations: " + PRECISION_HELP)
    # of their one-token decode steps (GenerationConfig.decode_precision), resolved with precision when built
    decode_precision: Precision = config_field(
        "auto",
        label="Decode precision",
        help=DECODE_PRECISION_HELP,
    )

    def __post_init__(self) -> None:
        if self.n_id < 0 or self.n_ood < 0 or self.n_id + self.n_ood == 0:
            raise ValueError(f"n_id={self.n_id}, n_ood={self.n_ood}: evaluate at least one document (both >= 0).")
        prompt, decode = resolve_phases(self.precision, self.decode_precision, self.device)
        object.__setattr__(self, "precision", prompt)
        object.__setattr__(self, "decode_precision", decode)

    @property
    def generation(self) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            max_doc_tokens=self.max_doc_tokens,
            batch_size=self.batch_size,
            precision=self.precision,
            decode_precision=self.decode_precision,
        )


EVAL_SETS: tuple[str, ...] = ("ID", "OOD")


@dataclass(frozen=True)
class LambdaStudy:
    """A λ study (lambda_study.lambda_sweep): every run steered in each mode over its grid — adding modes over
    `lambdas`, modes that scale the update over `scaled_lambdas` (default `lambdas`); `settings`: the modes' own
    SteerConfig settings as (name, value) pairs (a gated mode's tau and keep; modes.MODE_SETTINGS)."""

    lambdas: tuple[float, ...]
    modes: tuple[str, ...] = ("vector",)
    positions: str = "all"
    sets: tuple[str, ...] = ("ID",)
    scaled_lambdas: tuple[float, ...] = ()
    settings: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not self.lambdas or not self.modes:
            raise ValueError("LambdaStudy: a λ study needs some λ values and at least one mode.")
        for mode in self.modes:
            SteerConfig(mode, self.positions, **dict(self.settings))  # names the bad mode, positions or setting
        if not self.sets or not set(self.sets) <= set(EVAL_SETS):
            raise ValueError(f"LambdaStudy.sets={self.sets}: choose among {EVAL_SETS}.")


@dataclass(frozen=True)
class EvalJob:
    """An evaluation to run in the background (jobs/launchers.py: launch_evaluation): the results table of the base
    model (include_base), each run merged and steered at each λ of `steer` — or, with `study`, a λ study of the runs."""

    cfg: EvalConfig
    runs: tuple[str, ...] = ()
    include_base: bool = True
    steer: tuple[float, ...] = ()
    study: LambdaStudy | None = None

    def __post_init__(self) -> None:
        if self.study is not None and not self.runs:
            raise ValueError("EvalJob: a λ study needs an adapter (runs).")
        if self.study is None and not self.runs and not self.include_base:
            raise ValueError("EvalJob: nothing to evaluate — pick an adapter or keep the base model row.")
