"""Each row of a batched forward steered its own way: a generation's Steering (its mode and λ), and the one place where
the steerings of a step's rows become what its forward applies — site edits for the eager forward, or per-row shift
inputs for the compiled step (inference/batch_step.py) where every row's mode adds a constant vector.

    rows = RowSteering(model, vectors, lora)
    rows.edits(n, {slot: steering, ...}) -> {site: edit}   for runtime.hooks.edit_outputs(model, edits, rows=n)
    rows.shifts(n, {slot: steering, ...}, paths) -> [n × width per path] or None (a row's edit depends on the output)

A slot absent from the mapping, or at its mode's neutral λ, is the merged model exactly (zero shift; the neutral λ in
its group's edit). Both are kept for the last combination asked: a step usually repeats the one before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from ..runtime.hooks import SiteEdit
from ..runtime.modes import SteerConfig
from ..runtime.sites import LoraWeights, Site
from ..runtime.vectors import SteeringVectors

SHIFTS_KEPT = 256  # the (mode, λ) whose site shifts are kept: clients may ask for any number of λ


@dataclass(frozen=True)
class Steering:
    """How one slot's forwards are steered: the mode (SteerConfig) and λ (its neutral: the merged model)."""

    how: SteerConfig
    lam: float

    @property
    def neutral(self) -> bool:
        return float(self.lam) == self.how.neutral


MERGED = Steering(SteerConfig(), 0.0)


class RowSteering:
    """Per-row steering of one model's batched forwards (the module docstring)."""

    def __init__(
        self, model: torch.nn.Module, vectors: SteeringVectors, lora: Callable[[], Mapping[Site, LoraWeights]]
    ):
        self._model, self._vectors, self._lora = model, vectors, lora
        self._edits: tuple[tuple, dict[Site, SiteEdit]] | None = None
        self._shifts: tuple[tuple, list[torch.Tensor] | None] | None = None
        self._site_shifts: dict[tuple[SteerConfig, float], dict[str, torch.Tensor] | None] = {}
        self._widths: dict[str, int] = {}  # each shifted module's output width

    @staticmethod
    def _key(rows: int, steering: Mapping[int, Steering]) -> tuple:
        steered = sorted((slot, s.how, float(s.lam)) for slot, s in steering.items() if not s.neutral)
        return rows, tuple(steered)

    def edits(self, rows: int, steering: Mapping[int, Steering]) -> dict[Site, SiteEdit]:
        """Per mode present, the action's edits with each slot's λ (the neutral λ for the other slots), chained per
        site: every SteerConfig setting honoured, as the mode's own action applies it."""
        key = self._key(rows, steering)
        if self._edits is not None and self._edits[0] == key:
            return self._edits[1]
        groups: dict[SteerConfig, dict[int, float]] = {}
        for slot, s in steering.items():
            if not s.neutral:
                groups.setdefault(s.how, {})[slot] = float(s.lam)
        chained: dict[Site, list[SiteEdit]] = {}
        for how, lams in groups.items():
            per_row = torch.full((rows, 1, 1), how.neutral, dtype=torch.float64)
            for slot, lam in lams.items():
                per_row[slot] = lam
            lora = self._lora() if how.spec.action.needs_lora else None
            edits = how.spec.action.edits(self._model, self._vectors, how.spec, how.units, per_row, lora)
            for site, edit in edits.items():
                chained.setdefault(site, []).append(edit)
        self._edits = key, {site: _chain(edits) for site, edits in chained.items()}
        return self._edits[1]

    def shifts(self, rows: int, steering: Mapping[int, Steering], paths: Sequence[str]) -> list[torch.Tensor] | None:
        """Per path, the rows' shifts (rows × width, float32: λ times the mode's vector at that site, as the action's
        decode_shifts gives it; zero for a merged row); None where a row's mode does not add a constant vector or
        steers a site outside `paths`."""
        key = self._key(rows, steering)
        if self._shifts is not None and self._shifts[0] == key:
            return self._shifts[1]
        out: dict[str, torch.Tensor] = {}
        shifts: list[torch.Tensor] | None = None
        for slot, how, lam in key[1]:
            at_sites = self._at_sites(how, lam)
            if at_sites is None or not set(at_sites) <= set(paths):
                break
            for path, shift in at_sites.items():
                out.setdefault(path, torch.zeros(rows, shift.shape[0]))[slot] = shift
        else:
            shifts = [out[p] if p in out else torch.zeros(rows, self._width(p)) for p in paths]
        self._shifts = key, shifts
        return shifts

    def _width(self, path: str) -> int:
        if path not in self._widths:
            self._widths[path] = self._model.get_submodule(path).weight.shape[0]
        return self._widths[path]

    def _at_sites(self, how: SteerConfig, lam: float) -> dict[str, torch.Tensor] | None:
        if (how, lam) not in self._site_shifts:
            if len(self._site_shifts) >= SHIFTS_KEPT:
                self._site_shifts.clear()
            shifts = how.spec.action.decode_shifts(self._vectors, how.spec, how.units, lam)
            self._site_shifts[how, lam] = None if shifts is None else {s.path: v for s, v in shifts.items()}
        return self._site_shifts[how, lam]


def _chain(edits: list[SiteEdit]) -> SiteEdit:
    if len(edits) == 1:
        return edits[0]

    def edit(x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        for e in edits:
            edited = e(x, output)
            output = output if edited is None else edited
        return output

    return edit
