"""The steering-mode registry: how λ steers. Pages, the CLI and the λ study read every mode from here, so a new mode
is one `SteeringMode` entry in `MODES` (and its test).

A mode either ADDS a constant vector per site (λ · delta at the steered sites' outputs, delta from `direction`), or
SCALES the adapter's own update at every LoRA site of the merged model (the conditional reading of LoRA:
h' = W h + λ · s · B (A h); λ = 0 is the base model, 1 the merged model).

    MODES                      {name: SteeringMode}, in the order the UI lists them
    SteerConfig(mode, positions, units)    how one generation is steered (validated against MODES)
    UNIT_FRACTION, UNITS_DOC   normalised λ: |λ| = 1 adds UNIT_FRACTION × the site's mean output norm
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Protocol, Sequence

import numpy as np

POSITIONS: tuple[str, ...] = ("all", "generated")
UNITS: tuple[str, ...] = ("normalised", "raw")
# Normalised λ: |λ| = 1 adds, at each steered site, a vector whose norm is UNIT_FRACTION × that site's mean output
# norm on the token set (the same norm for every adding mode: only the direction differs between them).
UNIT_FRACTION = 0.1
UNITS_DOC = (
    f"normalised: lambda = 1 adds {UNIT_FRACTION:g} x the site's mean output norm (output_norm) along the mode's "
    "direction; raw: lambda multiplies the stored vector (the paper's formula)"
)
RANDOM_SEED = 0  # the random control's directions are seeded per site from this and the site key


class HasDirections(Protocol):
    """What a direction reads of vectors.SteeringVectors (which imports this module, so it is not imported here)."""

    sites: tuple
    vectors: dict[str, np.ndarray]
    diff_mean: dict[str, np.ndarray]

    def require_outputs(self) -> "HasDirections": ...


Direction = Callable[[HasDirections], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class SteeringMode:
    """One way of steering. `acts`: "add" (λ · direction at the steered sites) or "scale" (λ scales the adapter's
    update at every LoRA site). `neutral`: the λ that reproduces the merged model. `lambda_range` / `lambda_step`:
    the slider's default span; `range_choices`: the ± bounds a user may widen it to (empty: fixed). `lambda_grid`:
    the λ study's default grid. `family`: modes of one family share a λ axis (and a plot). `exportable`: a fixed
    direction that a llama.cpp control vector can carry."""

    name: str
    label: str
    help: str
    acts: Literal["add", "scale"]
    family: str
    colour: str
    neutral: float
    lambda_range: tuple[float, float]
    lambda_step: float
    lambda_grid: tuple[float, ...]
    lambda_help: str
    axis_title: str
    range_choices: tuple[float, ...] = ()
    direction: Direction | None = None
    exportable: bool = False

    def __post_init__(self) -> None:
        if (self.acts == "add") != (self.direction is not None):
            raise ValueError(f"SteeringMode {self.name!r}: an adding mode needs a direction, a scaling mode none.")
        lo, hi = self.lambda_range
        if not lo <= self.neutral <= hi:
            raise ValueError(f"SteeringMode {self.name!r}: neutral λ {self.neutral} outside {self.lambda_range}.")

    def slider(self, bound: float | None = None) -> tuple[float, float, float]:
        """(lo, hi, step) of the λ slider; `bound` widens an adjustable range to ±bound (8 steps a side)."""
        if bound is None or not self.range_choices:
            return (*self.lambda_range, self.lambda_step)
        return -bound, bound, bound / 8

    def slider_positions(self, bound: float | None = None) -> list[float]:
        """Every position of the λ slider (17 by default), the grid the Steering page generates as one batch."""
        lo, hi, step = self.slider(bound)
        return [round(lo + i * step, 6) for i in range(int(round((hi - lo) / step)) + 1)]


def _lora_b(vectors: HasDirections) -> Mapping[str, np.ndarray]:
    return vectors.vectors


def _diff_mean(vectors: HasDirections) -> Mapping[str, np.ndarray]:
    vectors.require_outputs()
    return vectors.diff_mean


def _random(vectors: HasDirections) -> Mapping[str, np.ndarray]:
    """A seeded random direction per site with the LoRA-B vector's norm."""
    out = {}
    for s in vectors.sites:
        v = vectors.vectors[s.key]
        seed = int.from_bytes(hashlib.sha256(f"{RANDOM_SEED}|{s.key}".encode()).digest()[:4], "little")
        r = np.random.default_rng(seed).standard_normal(v.shape)
        out[s.key] = (r * (np.linalg.norm(v) / np.linalg.norm(r))).astype(np.float32)
    return out


# the steering study (docs/evaluation.md §3): on the demo TOPL adapter, normalised λ = 1–2 raises full-summary
# factuality with the text intact and λ ≥ 3 breaks it, so the default span keeps the whole faithful side usable
_ADD = dict(
    acts="add",
    family="constant",
    neutral=0.0,
    lambda_range=(-2.0, 2.0),
    lambda_step=0.25,
    lambda_grid=(-2.0, -1.0, 0.0, 1.0, 2.0),
    range_choices=(1.0, 2.0, 4.0, 8.0, 16.0, 64.0),
    lambda_help=(
        f"Normalised: λ = 1 adds, at each steered site, {UNIT_FRACTION:g} × that site's mean output norm along the "
        "mode's direction (every mode the same length; only the direction differs). 0 reproduces the merged model."
    ),
    axis_title="λ (normalised)",
)
MODES: dict[str, SteeringMode] = {
    m.name: m
    for m in (
        SteeringMode(
            name="vector",
            label="LoRA-B vector (paper)",
            help="λ · scaling · B(μ+ − μ−) added at the top-k sites, the same at every position (the paper's formula).",
            colour="#2563eb",
            direction=_lora_b,
            exportable=True,
            **_ADD,
        ),
        SteeringMode(
            name="conditional",
            label="Scale the adapter's update",
            help="every LoRA site adds λ · scaling · B(A h) — the update gated per token by A — so λ = 0 is the base "
            "model, 1 the merged model, > 1 amplifies and < 0 reverses it.",
            acts="scale",
            family="conditional",
            colour="#16a34a",
            neutral=1.0,
            lambda_range=(-1.0, 3.0),
            lambda_step=0.25,
            lambda_grid=(-1.0, 0.0, 1.0, 2.0, 3.0),
            lambda_help="λ scales the adapter's update: 0 = base model, 1 = merged model, 2 = twice the update, "
            "−1 = reversed.",
            axis_title="λ (scale of the adapter's update)",
        ),
        SteeringMode(
            name="diff-mean",
            label="Control: diff-mean",
            help="control: the mean output of good minus bad tokens at the same sites, with the LoRA-B vector's "
            "length.",
            colour="#d97706",
            direction=_diff_mean,
            exportable=True,
            **_ADD,
        ),
        SteeringMode(
            name="random",
            label="Control: random direction",
            help="control: a seeded random direction at the same sites with the LoRA-B vector's length — if it moves "
            "the text as much, the LoRA-B direction carries nothing special.",
            colour="#6b7280",
            direction=_random,
            **_ADD,
        ),
    )
}


def steering_mode(name: str) -> SteeringMode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"steering mode {name!r}: choose one of {tuple(MODES)}.") from None


def lambda_grids(
    modes: Sequence[str],
    lambdas: Sequence[float] | None = None,
    grids: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, tuple[float, ...]]:
    """The λ study's grid of each mode: `grids[mode]` when given, else `lambdas`, else the mode's own grid."""
    grids = grids or {}
    out = {}
    for name in modes:
        grid = grids.get(name) or lambdas or steering_mode(name).lambda_grid
        out[name] = tuple(float(x) for x in grid)
    return out


def modes_help() -> str:
    """Every mode in one line each (the CLI's and the pages' help)."""
    return " ".join(f"{m.name}: {m.help}" for m in MODES.values())


@dataclass(frozen=True)
class SteerConfig:
    """How λ is applied in one generation. mode: a key of MODES; positions: "all" or "generated" (the prompt is left
    untouched); units (adding modes): "normalised" (module docstring) or "raw"."""

    mode: str = "vector"
    positions: str = "all"
    units: str = "normalised"

    def __post_init__(self) -> None:
        for name, value, choices in (
            ("mode", self.mode, tuple(MODES)),
            ("positions", self.positions, POSITIONS),
            ("units", self.units, UNITS),
        ):
            if value not in choices:
                raise ValueError(f"SteerConfig.{name}={value!r}: choose one of {choices}.")

    @property
    def spec(self) -> SteeringMode:
        return MODES[self.mode]

    @property
    def neutral(self) -> float:
        """The λ that leaves the merged model unchanged."""
        return self.spec.neutral

    def label(self) -> str:
        unit = f", {self.units}" if self.spec.acts == "add" else ""
        return f"{self.mode} ({self.positions} positions{unit})"
