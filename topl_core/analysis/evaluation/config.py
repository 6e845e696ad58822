"""What an evaluation evaluates and how: model variants (base, merged, steered) and the evaluation's settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...generate import GenerationConfig
from ...paths import DEFAULT_DATA
from ...precision import Precision, resolve_precision
from ...presets import DEFAULT_MODEL
from ..steering.modes import SteerConfig
from .scorers import DEFAULT_SCORER

ProgressFn = Callable[[str], None]


@dataclass(frozen=True)
class Variant:
    """A model to evaluate: the base model (`run` None; `model` names it), a run's merged adapter (`lam` None), or
    the merged adapter steered with λ in mode `how` (topl_core.analysis.steering.modes.SteerConfig)."""

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
    data: str = DEFAULT_DATA  # ID: the held-out test split of this training data
    split_seed: int = 0
    n_id: int = 16
    n_ood: int = 16  # CLIFF: documents in all, alternating its sources; with ood_data: documents per dataset
    cliff_csv: str | None = None  # OOD documents; default shared/data/CLIFF_error_types.csv
    # OOD over a benchmark of several datasets instead (the paper: LLM-AggreFact's 11, up to 300 documents each): a
    # CSV or parquet with doc and dataset columns (AggreFact, LLM-AggreFact) by path, or a hub dataset id
    ood_data: str | None = None
    max_new_tokens: int = 96
    max_doc_tokens: int = 512
    batch_size: int = 4
    scorer: str = DEFAULT_SCORER
    top_k: int = 4  # steered sites
    model: str = DEFAULT_MODEL  # base model when no run names one
    device: str = "cpu"
    precision: Precision = "auto"  # of the generations; resolved for `device` when built (topl_core.precision)

    def __post_init__(self) -> None:
        if self.n_id < 0 or self.n_ood < 0 or self.n_id + self.n_ood == 0:
            raise ValueError(f"n_id={self.n_id}, n_ood={self.n_ood}: evaluate at least one document (both >= 0).")
        object.__setattr__(self, "precision", resolve_precision(self.precision, self.device))

    @property
    def generation(self) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            max_doc_tokens=self.max_doc_tokens,
            batch_size=self.batch_size,
            precision=self.precision,
        )


EVAL_SETS: tuple[str, ...] = ("ID", "OOD")


@dataclass(frozen=True)
class LambdaStudy:
    """A λ study (lambda_study.lambda_sweep): every run steered in each mode over its grid — adding modes over
    `lambdas`, modes that scale the update over `scaled_lambdas` (default `lambdas`)."""

    lambdas: tuple[float, ...]
    modes: tuple[str, ...] = ("vector",)
    positions: str = "all"
    sets: tuple[str, ...] = ("ID",)
    scaled_lambdas: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.lambdas or not self.modes:
            raise ValueError("LambdaStudy: a λ study needs some λ values and at least one mode.")
        for mode in self.modes:
            SteerConfig(mode, self.positions)  # names the bad mode or positions and the choices
        if not self.sets or not set(self.sets) <= set(EVAL_SETS):
            raise ValueError(f"LambdaStudy.sets={self.sets}: choose among {EVAL_SETS}.")


@dataclass(frozen=True)
class EvalJob:
    """An evaluation to run in the background (topl_core.launchers.launch_evaluation): the results table of the base
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
