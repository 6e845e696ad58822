"""The steering-mode registry: how λ steers, and steering a model with it. Pages, the CLI and the λ study read every
mode from here; a mode is one MODE_TABLE entry — an action of actions.py, its direction (directions.py) and its judge
(gate.py) — and its test.

    MODE_TABLE                 every SteeringMode, in the order the UI lists them
    MODES                      {name: SteeringMode}, the same keyed by name
    SteerConfig(mode, positions, units, tau, keep)    how one generation is steered (validated against MODES)
    MODE_SETTINGS              the SteerConfig fields some mode reads as its own (gated: tau, keep)
    with steer(model, vectors, lam, how=SteerConfig(), lora=None) as switch: ...   the public form (below)
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import torch

from ..foundations.config_fields import config_field
from ..foundations.presets import FLAG_THRESHOLD
from .actions import AblateDirection, AddDirection, ScaleUpdate, SteeringMode
from .directions import diff_mean_direction, lora_b_direction, random_direction
from .gate import HeadGate
from .hooks import SteeringSwitch, edit_outputs
from .sites import LoraWeights, Site
from .vectors import UNITS, UNITS_DOC, SteeringVectors

POSITIONS: tuple[str, ...] = ("all", "generated")
_ADD, _SCALE, _ABLATE = AddDirection(), ScaleUpdate(), AblateDirection()
MODE_TABLE: tuple[SteeringMode, ...] = (
    SteeringMode(
        name="vector",
        label="LoRA-B vector (paper)",
        help="λ · scaling · B(μ+ − μ−) added at the top-k sites, the same at every position (the paper's formula).",
        colour="#2563eb",
        action=_ADD,
        direction=lora_b_direction,
        exportable=True,
    ),
    SteeringMode(
        name="conditional",
        label="Scale the adapter's update",
        help="every LoRA site adds λ · scaling · B(A h) — the update gated per token by A — so λ = 0 is the base "
        "model, 1 the merged model, > 1 amplifies and < 0 reverses it.",
        colour="#16a34a",
        action=_SCALE,
    ),
    SteeringMode(
        name="diff-mean",
        label="Control: diff-mean",
        help="control: the mean output of good minus bad tokens at the same sites, with the LoRA-B vector's length.",
        colour="#d97706",
        action=_ADD,
        direction=diff_mean_direction,
        exportable=True,
    ),
    SteeringMode(
        name="random",
        label="Control: random direction",
        help="control: a seeded random direction at the same sites with the LoRA-B vector's length — if it moves "
        "the text as much, the LoRA-B direction carries nothing special.",
        colour="#6b7280",
        action=_ADD,
        direction=random_direction,
    ),
    SteeringMode(
        name="ablate",
        label="Ablate the LoRA-B direction",
        help="removes λ × the component of each steered site's output along the LoRA-B vector's direction: λ = 0 is "
        "the merged model, 1 projects the direction out (does the text still change without it?), < 0 amplifies it.",
        colour="#9333ea",
        action=_ABLATE,
        direction=lora_b_direction,
    ),
    SteeringMode(
        name="gated",
        label="Detect, then steer (gated LoRA-B vector)",
        help="the LoRA-B vector at λ only where the adapter's own head flags a token while generating: a token with "
        "p(good) < τ is taken back and written again with the vector on, which then stays on for the next k tokens "
        "(τ = 0: the merged model; τ = 1, large k: the vector on every generated token).",
        colour="#dc2626",
        action=_ADD,
        direction=lora_b_direction,
        judge=HeadGate(),
    ),
)
MODES: dict[str, SteeringMode] = {m.name: m for m in MODE_TABLE}
MODE_SETTINGS: tuple[str, ...] = tuple(dict.fromkeys(s for m in MODE_TABLE for s in m.settings))
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
    help = "how λ steers: a mode of the steering registry (runtime/modes.py)."
    return config_field("vector", label="Steering mode", help=help, choices=MODES)


def positions_field() -> Any:
    help = "steer every position, or only the generated ones (the prompt left untouched)"
    return config_field("all", label="Positions", help=help, choices=POSITIONS)


def units_field() -> Any:
    return config_field("normalised", label="λ units", help=UNITS_DOC, choices=UNITS)


def tau_field() -> Any:
    return config_field(
        FLAG_THRESHOLD,
        label="τ: the gate's threshold",
        help="gated modes: a generated token whose p(good) under the adapter's head is below τ is taken back and "
        "written again with steering on (0: never, the merged model; 1: every token chosen without steering)",
        min=0.0,
        max=1.0,
        step=0.05,
    )


def keep_field() -> Any:
    return config_field(
        0,
        label="k: tokens steered after a take-back",
        help="gated modes: steering stays on for the next k tokens after a token is taken back",
        min=0,
        max=4096,
    )


@dataclass(frozen=True)
class SteerConfig:
    """How λ is applied in one generation. mode: a key of MODES; positions: "all" or "generated" (the prompt is left
    untouched); units (modes whose action adds a direction): "normalised" (module docstring) or "raw"; tau and keep
    (gated modes, gate.py): the head's threshold and how many tokens steering stays on after a take-back.

    Example: ``session.generate_steered(document, 1.5, how=SteerConfig("conditional", positions="generated"))``"""

    mode: str = mode_field()
    positions: str = positions_field()
    units: str = units_field()
    tau: float = tau_field()
    keep: int = keep_field()

    def __post_init__(self) -> None:
        for name, value, choices in (
            ("mode", self.mode, tuple(MODES)),
            ("positions", self.positions, POSITIONS),
            ("units", self.units, UNITS),
        ):
            if value not in choices:
                raise ValueError(f"SteerConfig.{name}={value!r}: choose one of {choices}.")
        if not 0.0 <= self.tau <= 1.0:
            raise ValueError(f"SteerConfig.tau={self.tau}: a threshold on p(good), between 0 and 1.")
        if int(self.keep) != self.keep or self.keep < 0:
            raise ValueError(f"SteerConfig.keep={self.keep}: a number of tokens, 0 or more.")

    @property
    def spec(self) -> SteeringMode:
        return MODES[self.mode]

    @property
    def caption(self) -> str:
        """What λ means in this mode and unit."""
        return self.spec.caption(self.units)

    @property
    def neutral(self) -> float:
        """The λ that leaves the merged model unchanged."""
        return self.spec.neutral

    @property
    def steers_prompt(self) -> bool:
        """Whether the prompt's forward is steered (else every λ decodes from one unsteered prompt)."""
        return self.positions == "all" and self.spec.steers_positions

    def settings(self) -> dict[str, float]:
        """The mode's own settings (its judge's) and their values."""
        return {name: getattr(self, name) for name in self.spec.settings}

    def key(self) -> dict:
        """What a cache key holds of this config: every setting the mode reads."""
        return {"mode": self.mode, "positions": self.positions, "units": self.units, **self.settings()}

    def label(self) -> str:
        spec = self.spec
        parts = [f"{self.positions} positions"] if spec.steers_positions else []
        parts += [self.units] if spec.action.units_apply else []
        parts += [f"{name} {value:g}" for name, value in self.settings().items()]
        return f"{self.mode} ({', '.join(parts)})"


@contextmanager
def steer(
    model: torch.nn.Module,
    vectors: SteeringVectors,
    lam: float | Sequence[float],
    how: SteerConfig = SteerConfig(),
    lora: Mapping[Site, LoraWeights] | None = None,
) -> Iterator[SteeringSwitch]:
    """Steer forwards from this thread while active: the mode's action (actions.py) edits the outputs of its sites of
    the MERGED model `model` through hooks (hooks.edit_outputs) — adding λ·delta at the vectors' sites, scaling the
    adapter's update by λ at every site of `lora` (default: read from vectors.adapter_path when the action needs it),
    ... A sequence `lam` steers batch row r with lam[r] (every forward's batch must then have len(lam) rows); a row
    steered with λ gets exactly what a batch steered with λ alone gets. The mode's neutral λ reproduces the unsteered
    output exactly; positions="generated" leaves the prompt's forward untouched. Works with KV-cache generation (each
    cached step's new positions are steered just as a full recompute would steer them). Yields the hooks' switch
    (hooks.SteeringSwitch: the gated mode's judge turns the steering on for the forwards it asks for).

    Example: ``with steer(merged.model, vectors, 2.0): logits = merged.model(**inputs).logits``"""
    # one code path: λ per row as shape (rows, 1, 1) against outputs (rows, positions, features); a single λ is a
    # scalar that broadcasts to every row (and to any output shape)
    lams = torch.as_tensor(lam, dtype=torch.float64)
    if lams.ndim > 1 or lams.numel() == 0:
        raise ValueError(f"lam={lam!r}: give one λ or a non-empty sequence of λ, one per batch row.")
    rows = lams.numel()
    lams = lams.reshape(-1, 1, 1) if rows > 1 else lams.reshape(())
    action = how.spec.action
    if action.needs_lora and lora is None:
        lora = vectors.adapter_lora()
    edits = action.edits(model, vectors, how.spec, how.units, lams, lora)
    with edit_outputs(model, edits, rows, skip_prompt=how.positions == "generated") as switch:
        yield switch
