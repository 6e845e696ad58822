"""What the studies of trained TOPL runs — a layer sweep's windows, a label study's settings — share: the settings
every study has (StudyConfig) and what every task of one study needs (Study), handed to
topl_core.foundations.executor (and sent to Ray's object store once)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Generic, TypeVar

from ...foundations.config_fields import config_field
from ...foundations.errors import ConfigError
from ...models.loading import LoadedModel
from ...training.config import TrainConfig
from ..evaluation.scorers import DEFAULT_SCORER, SCORER_HELP


def _study_template() -> TrainConfig:
    return TrainConfig(steps=20, eval_every=20, checkpoint_every=10, max_val_examples=32)


@dataclass(frozen=True)
class StudyConfig:
    """The settings every study of TOPL runs has: `train`, the template of each run it trains, and how the merged
    model's generations are scored (n_generate test documents per run; 0: no generation). A study's own config
    adds its grid (SweepConfig's windows, LabelStudyConfig's settings)."""

    train: TrainConfig = field(default_factory=_study_template)
    n_generate: int = config_field(
        0,
        label="Also score generations on … test docs",
        help="also generate on this many test documents per run and score their factuality",
        min=0,
        max=1000,
    )
    max_new_tokens: int = config_field(
        64, label="Max new tokens (generations)", help="the longest generation, in tokens", min=8, max=1024
    )
    scorer: str = config_field(DEFAULT_SCORER, label="Scorer (generations)", help=SCORER_HELP)

    what_it_trains: ClassVar[str] = "a study trains TOPL runs"  # the method error's words

    def __post_init__(self) -> None:
        if isinstance(self.train, dict):
            object.__setattr__(self, "train", TrainConfig.from_json(self.train))
        if self.train.method != "topl":
            raise ConfigError(f"train.method={self.train.method!r}: {self.what_it_trains}; use method='topl'.")
        if self.n_generate < 0:
            raise ConfigError(
                f"n_generate={self.n_generate!r}: use 0 (no generation) or a positive number of documents."
            )


C = TypeVar("C")


@dataclass(frozen=True)
class Study(Generic[C]):
    """A study's config, its folder (each task writes only its own run folder below it), its training records, how
    a worker gets the base model (None: load it from the config's model spec), and the progress callback (only when
    the tasks run in this process; a Ray worker has none)."""

    cfg: C
    folder: Path
    records: list
    base_loader: Callable[[], LoadedModel] | None
    progress: Callable | None
