"""What every task of one study needs — a layer sweep's windows, a label study's settings — handed to
topl_core.foundations.executor (and sent to Ray's object store once)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, TypeVar

from ...models.loading import LoadedModel

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
