"""The steering-mode registry: how λ steers. Pages, the CLI and the λ study read every mode from here; a mode and
the action it takes are declared in actions.py (a new action is one class and its modes there, and its test).

    MODES                      {name: SteeringMode}, in the order the UI lists them
    SteerConfig(mode, positions, units)    how one generation is steered (validated against MODES)
    UNIT_FRACTION, UNITS_DOC   normalised λ: |λ| = 1 adds UNIT_FRACTION × the site's mean output norm
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ...config_fields import config_field
from .actions import MODE_TABLE, UNIT_FRACTION, SteeringMode

POSITIONS: tuple[str, ...] = ("all", "generated")
UNITS: tuple[str, ...] = ("normalised", "raw")
UNITS_DOC = (
    f"normalised: lambda = 1 adds {UNIT_FRACTION:g} x the site's mean output norm (output_norm) along the mode's "
    "direction; raw: lambda multiplies the stored vector (the paper's formula); modes that do not add a direction "
    "ignore it"
)
MODES: dict[str, SteeringMode] = {m.name: m for m in MODE_TABLE}
# the λ study's and the Evaluation page's default: the paper's vector and the conditional reading of LoRA
STUDY_MODES: tuple[str, ...] = ("vector", "conditional")


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


# How λ is applied, described once: SteerConfig's fields, and those of a config that carries them (DeckConfig)
def mode_field() -> Any:
    help = "how λ steers: a mode of the steering registry (analysis/steering/modes.py)."
    return config_field("vector", label="Steering mode", help=help, choices=MODES)


def positions_field() -> Any:
    help = "steer every position, or only the generated ones (the prompt left untouched)"
    return config_field("all", label="Positions", help=help, choices=POSITIONS)


def units_field() -> Any:
    return config_field("normalised", label="λ units", help=UNITS_DOC, choices=UNITS)


@dataclass(frozen=True)
class SteerConfig:
    """How λ is applied in one generation. mode: a key of MODES; positions: "all" or "generated" (the prompt is left
    untouched); units (modes whose action adds a direction): "normalised" (module docstring) or "raw".

    Example: ``session.generate_steered(document, 1.5, how=SteerConfig("conditional", positions="generated"))``"""

    mode: str = mode_field()
    positions: str = positions_field()
    units: str = units_field()

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
    def caption(self) -> str:
        """What λ means in this mode and unit."""
        return self.spec.action.caption(self.spec, self.units)

    @property
    def neutral(self) -> float:
        """The λ that leaves the merged model unchanged."""
        return self.spec.neutral

    def label(self) -> str:
        unit = f", {self.units}" if self.spec.action.units_apply else ""
        return f"{self.mode} ({self.positions} positions{unit})"
