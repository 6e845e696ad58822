"""Steering actions and the mode type built on them: what λ does to a site's output while generating.

An action owns its λ axis (neutral value, slider span, study grid, what one unit means), what it prepares from the
steering vectors and the adapter, and the edits its hooks apply (hooks.edit_outputs). A mode is an action with a name,
a colour, a direction per site (for actions that act along one: directions.py) and, for a mode that decides token by
token when its action acts, a judge (gate.HeadGate). modes.steer, the session, evaluation, decks, the CLI and the pages
call these objects and never branch on which action or judge a mode has, so a new action is one class here and its
modes in modes.MODE_TABLE (and its test).

    AddDirection       output += λ · delta           delta: the mode's direction, in normalised or raw units
    ScaleUpdate        output += (λ − 1) · s·B(A x)  at every LoRA site of the merged model: λ scales the update
    AblateDirection    output −= λ · (output·d̂) d̂   the component along the mode's direction, λ = 1 removes it
    SteeringMode       an action, its direction, its judge; how a generation under it goes (batched rows or not,
                       which positions, which settings) follows from those
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar, Mapping

import numpy as np
import torch

from ..foundations.errors import ModelError
from .directions import Direction
from .gate import HeadGate
from .hooks import SiteEdit
from .sites import LoraWeights, Site, site_module, sort_sites
from .vectors import UNIT_FRACTION, SteeringVectors


def _check_width(site: Site, module: torch.nn.Module, width: int) -> None:
    out_features = getattr(module, "out_features", None)
    if out_features is not None and out_features != width:
        raise ModelError(
            f"{site.key}: steering vector has {width} dims but {site.path} outputs {out_features}; "
            "these vectors belong to another model."
        )


def _hash_arrays(arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode() + np.asarray(arrays[k], np.float32).tobytes())
    return h.hexdigest()[:16]


class SteeringAction:
    """What λ does at a site. Subclasses set the λ axis (class attributes) and implement `edits`.

    neutral: the λ that reproduces the merged model exactly. lambda_range / lambda_step: the slider's default span;
    range_choices: the ± bounds a user may widen it to (empty: fixed). lambda_grid: the λ study's default grid.
    family: modes of one action share a λ axis (one slider state, one plot). needs_direction: its modes give a
    direction per site; needs_lora: it reads the adapter's A and B; units_apply: λ is in the normalised/raw units of
    SteerConfig.units (otherwise the units setting is ignored)."""

    family: ClassVar[str]
    neutral: ClassVar[float] = 0.0
    lambda_range: ClassVar[tuple[float, float]]
    lambda_step: ClassVar[float]
    lambda_grid: ClassVar[tuple[float, ...]]
    range_choices: ClassVar[tuple[float, ...]] = ()
    axis_title: ClassVar[str]
    lambda_help: ClassVar[str]  # what λ means, for the slider's help
    needs_direction: ClassVar[bool] = True
    needs_lora: ClassVar[bool] = False
    units_apply: ClassVar[bool] = False

    def edits(
        self,
        model: torch.nn.Module,
        vectors: SteeringVectors,
        mode: "SteeringMode",
        units: str,
        lams: torch.Tensor,
        lora: Mapping[Site, LoraWeights] | None,
    ) -> dict[Site, SiteEdit]:
        """Per steered site of `model`, the edit of its output at λ = `lams` (a float64 scalar, or (rows, 1, 1): one λ
        per batch row). Raises ModelError when the vectors or the LoRA do not fit the model."""
        raise NotImplementedError

    def caption(self, mode: "SteeringMode", units: str) -> str:
        """What λ means in this mode and unit (under a deck's slider, in the app and in the export)."""
        return self.lambda_help

    def unit_note(
        self, vectors: SteeringVectors, mode: "SteeringMode", units: str, lam: float | None = None
    ) -> str | None:
        """One unit of λ in the paper's raw terms for these vectors (the CLI prints it, the page captions it); None
        where the action has no such conversion."""
        return None

    def fingerprint(self, vectors: SteeringVectors, mode: "SteeringMode", units: str) -> str:
        """What the action applies at λ = 1, hashed (a cache key part beside the adapter's fingerprint)."""
        return _hash_arrays(mode.directions(vectors))

    def decode_shifts(
        self, vectors: SteeringVectors, mode: "SteeringMode", units: str, lam: float
    ) -> dict[Site, torch.Tensor] | None:
        """Where the edit at λ adds a constant vector to each site's output: those float32 vectors (what a compiled
        decoder adds at every decode step: inference/compiled_decode.py); None where the edit depends on the output."""
        return None


class AddDirection(SteeringAction):
    """Adds λ · delta at the steered sites, delta the mode's direction in normalised (UNIT_FRACTION of the site's mean
    output norm per unit) or raw units (the paper's formula)."""

    # the steering study (docs/evaluation.md §3): on the demo TOPL adapter, normalised λ = 1–2 raises full-summary
    # factuality with the text intact and λ ≥ 3 breaks it, so the default span keeps the whole faithful side usable
    family = "constant"
    lambda_range = (-2.0, 2.0)
    lambda_step = 0.25
    lambda_grid = (-2.0, -1.0, 0.0, 1.0, 2.0)
    range_choices = (1.0, 2.0, 4.0, 8.0, 16.0, 64.0)
    axis_title = "λ (normalised)"
    lambda_help = (
        f"Normalised: λ = 1 adds, at each steered site, {UNIT_FRACTION:g} × that site's mean output norm along the "
        "mode's direction (every mode the same length; only the direction differs). 0 reproduces the merged model."
    )
    units_apply = True

    def edits(self, model, vectors, mode, units, lams, lora):
        deltas = mode.deltas(vectors, units)
        out: dict[Site, SiteEdit] = {}
        for s in vectors.sites:
            m = site_module(model, s)
            v = torch.from_numpy(deltas[s.key])
            _check_width(s, m, v.shape[0])
            device = next(m.parameters()).device
            add = lams.float().to(device) * v.to(device)  # float32

            def edit(_x, output, add=add):
                return output + add.to(output.dtype)

            out[s] = edit
        return out

    def decode_shifts(self, vectors, mode, units, lam):
        deltas = mode.deltas(vectors, units)
        lam32 = torch.as_tensor(lam, dtype=torch.float64).float()  # as edits() rounds λ
        return {s: lam32 * torch.from_numpy(deltas[s.key]) for s in vectors.sites}

    def caption(self, mode, units):
        if units == "raw":
            return f"λ in raw units (the paper's formula), {mode.name} mode; 0 = the merged model."
        return (
            f"λ in normalised units, {mode.name} mode: λ = 1 adds {UNIT_FRACTION:g} × each steered site's mean "
            "output norm; 0 = the merged model."
        )

    def unit_note(self, vectors, mode, units, lam=None):
        if units != "normalised":
            return None
        factor = vectors.unit_factor(mode.directions(vectors))
        lo, hi = min(factor.values()), max(factor.values())
        note = (
            f"One unit of λ = {UNIT_FRACTION:.0%} of each steered site's mean output norm = raw λ {lo:.3g}–{hi:.3g} "
            f"in the paper's formula (per site), {mode.name} mode"
        )
        return note + (f"; at λ = {lam:+.2f}: raw {lam * lo:+.3g} … {lam * hi:+.3g}." if lam is not None else ".")

    def fingerprint(self, vectors, mode, units):
        return _hash_arrays(mode.deltas(vectors, units))


class ScaleUpdate(SteeringAction):
    """Scales the adapter's own update at every LoRA site of the MERGED model (the conditional reading of LoRA:
    h' = W h + λ · s · B(A h)): adds (λ − 1) · s · B(A x), so λ = 0 is the base model and 1 the merged model."""

    family = "conditional"
    neutral = 1.0
    lambda_range = (-1.0, 3.0)
    lambda_step = 0.25
    lambda_grid = (-1.0, 0.0, 1.0, 2.0, 3.0)
    axis_title = "λ (scale of the adapter's update)"
    lambda_help = (
        "λ scales the adapter's update: 0 = base model, 1 = merged model, 2 = twice the update, −1 = reversed."
    )
    needs_direction = False
    needs_lora = True

    def edits(self, model, vectors, mode, units, lams, lora):
        assert lora is not None, "ScaleUpdate reads the adapter's LoRA (modes.steer passes it)"
        out: dict[Site, SiteEdit] = {}
        for s in sort_sites(lora):
            m, w = site_module(model, s), lora[s]
            if (
                getattr(m, "in_features", w.A.shape[1]) != w.A.shape[1]
                or getattr(m, "out_features", w.B.shape[0]) != w.B.shape[0]
            ):
                raise ModelError(
                    f"{s.key}: the adapter's LoRA is {w.B.shape[0]}×{w.A.shape[1]} but {s.path} is "
                    f"{m.out_features}×{m.in_features}; this adapter belongs to another model."
                )
            device = next(m.parameters()).device
            factors = ((lams - 1.0) * w.scaling).float().to(device)
            if not factors.any():  # every row at λ = 1: the merged model, untouched
                continue
            A, B = w.A.to(device), w.B.to(device)

            def edit(x, output, factors=factors, A=A, B=B):
                # a row at λ = 1 adds 0 · (finite) = 0: exactly the merged model's output
                return output + (factors * ((x.float() @ A.T) @ B.T)).to(output.dtype)

            out[s] = edit
        return out

    def fingerprint(self, vectors, mode, units):
        return mode.name  # the update is the adapter's own, whose fingerprint is already in every key


class AblateDirection(SteeringAction):
    """Removes the component of each steered site's output along the mode's direction d (as steering-vectors'
    ablation operator): output − λ · (output · d̂) d̂. λ = 0 is the merged model, 1 projects the direction out, 2
    reflects the output across the plane orthogonal to d, and λ < 0 amplifies the component."""

    family = "ablation"
    lambda_range = (-1.0, 2.0)
    lambda_step = 0.25
    lambda_grid = (-1.0, 0.0, 0.5, 1.0, 2.0)
    axis_title = "λ (share of the direction's component removed)"
    lambda_help = (
        "λ scales how much of the output's component along the mode's direction is removed: 0 = merged model, "
        "1 = the direction projected out, 2 = reflected, < 0 = amplified."
    )

    def edits(self, model, vectors, mode, units, lams, lora):
        directions = mode.directions(vectors)
        out: dict[Site, SiteEdit] = {}
        for s in vectors.sites:
            m = site_module(model, s)
            d = np.asarray(directions[s.key], np.float64)
            _check_width(s, m, d.shape[0])
            device = next(m.parameters()).device
            unit = torch.from_numpy((d / max(float(np.linalg.norm(d)), 1e-30)).astype(np.float32)).to(device)
            factors = lams.float().to(device)

            def edit(_x, output, unit=unit, factors=factors):
                component = (output.float() @ unit).unsqueeze(-1) * unit
                return output - (factors * component).to(output.dtype)

            out[s] = edit
        return out if lams.any() else {}  # λ = 0 in every row: the merged model, untouched

    def caption(self, mode, units):
        return (
            f"λ = the share of each steered site's output component along the {mode.name} direction removed: "
            "0 = the merged model, 1 = projected out."
        )


@dataclass(frozen=True)
class SteeringMode:
    """One way of steering: an action, with a direction per site where the action acts along one, and a judge where
    the mode decides token by token when the action acts (gate.HeadGate). `exportable`: a fixed direction that a
    llama.cpp control vector can carry. The λ axis is the action's."""

    name: str
    label: str
    help: str
    colour: str
    action: SteeringAction
    direction: Direction | None = None
    judge: HeadGate | None = None
    exportable: bool = False

    def __post_init__(self) -> None:
        if self.action.needs_direction != (self.direction is not None):
            need = "needs a direction" if self.action.needs_direction else "takes no direction"
            raise ValueError(f"SteeringMode {self.name!r}: its action {type(self.action).__name__} {need}.")

    def directions(self, vectors: SteeringVectors) -> Mapping[str, np.ndarray]:
        if self.direction is None:
            raise ValueError(f"mode={self.name!r} scales the adapter's update: it acts along no direction.")
        return self.direction(vectors)

    def deltas(self, vectors: SteeringVectors, units: str = "normalised") -> dict[str, np.ndarray]:
        """Per site, what λ = 1 adds to the site's output along this mode's direction in `units` (float32)."""
        return vectors.in_units(self.directions(vectors), units)

    # what a judge changes: the gate decides which forwards are steered (never the prompt), reads the adapter's head,
    # and crops each row's cache at its own positions (one λ at a time)
    @property
    def settings(self) -> tuple[str, ...]:
        """The SteerConfig fields of this mode's own (a form or a command line shows them only for it)."""
        return self.judge.settings if self.judge is not None else ()

    @property
    def needs_head(self) -> bool:
        """Whether its generation reads the adapter's token-level head."""
        return self.judge is not None

    @property
    def steers_positions(self) -> bool:
        """Whether SteerConfig.positions says which positions are steered (else the judge decides)."""
        return self.judge is None

    @property
    def batches_rows(self) -> bool:
        """Whether a λ grid's positions can share one batch, a λ per row."""
        return self.judge is None

    def caption(self, units: str) -> str:
        """What λ means in this mode and unit (under a deck's slider, in the app and in the export)."""
        return self.action.caption(self, units) + (self.judge.caption if self.judge is not None else "")

    # the λ axis, the action's
    family = property(lambda self: self.action.family)
    neutral = property(lambda self: self.action.neutral)
    lambda_range = property(lambda self: self.action.lambda_range)
    lambda_step = property(lambda self: self.action.lambda_step)
    lambda_grid = property(lambda self: self.action.lambda_grid)
    range_choices = property(lambda self: self.action.range_choices)
    axis_title = property(lambda self: self.action.axis_title)
    lambda_help = property(lambda self: self.action.lambda_help)

    @property
    def lambda_bounds(self) -> tuple[float, float]:
        """The λ a request may ask for: the widest span the slider can be widened to (range_choices), else its span."""
        if self.range_choices:
            return -max(self.range_choices), max(self.range_choices)
        return self.lambda_range

    def slider(self, bound: float | None = None) -> tuple[float, float, float]:
        """(lo, hi, step) of the λ slider; `bound` widens an adjustable range to ±bound (8 steps a side)."""
        if bound is None or not self.range_choices:
            return (*self.lambda_range, self.lambda_step)
        return -bound, bound, bound / 8

    def slider_positions(self, bound: float | None = None) -> list[float]:
        """Every position of the λ slider (17 by default), the grid the Steering page generates as one batch."""
        lo, hi, step = self.slider(bound)
        return [round(lo + i * step, 6) for i in range(int(round((hi - lo) / step)) + 1)]
