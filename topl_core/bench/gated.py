"""`bench --gated`: what gated steering (runtime/gate.py) costs against always-on steering and the merged
model's plain generation, measured in one run on one document.

- merged: the merged model's plain generate() (no hook);
- always-on: the mode's inner vector at λ on every generated position (SteeringSession, mode "vector", positions
  "generated": the forwards the gate steers at τ = 1);
- gated: mode "gated" at λ, τ, k, from a fresh session each time (its prompt's forward included, as in the others).

Per path the median wall time over `repeats` generations, its tokens (counted, untimed, by the gate at τ = 0 and at
τ = 1 with k ≥ the length, which give the merged and the always-on tokens exactly: tests/test_gated.py) and for the
gated path its forwards: plain decoding of n tokens runs n − 1 forwards after the prompt's (which gives the first),
the gate one per token (it reads the last token's too, an end of turn aside) plus two per token taken back.

    gated_vs_merged, gated_vs_always_on      wall-time ratios of whole generations (the goal, GOALS: ≤ 1.3 × merged)
    gated_vs_merged_per_token, ...           the same per generated token (the texts may end at other lengths)
    extra_forwards_per_token                 (gated forwards − (tokens − 1)) / tokens: above plain decoding
    taken_back_per_token                     the share of generated tokens the head flagged and generated again
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Callable

from ..hardware.precision import resolve_precision
from ..inference.generate import GenerationConfig, generate
from ..runtime.modes import SteerConfig
from ..runtime.session import SteeringSession

GOALS = {"gated_vs_merged": ("<=", 1.3), "gated_vs_merged_per_token": ("<=", 1.3)}


def gated_bench(
    session: SteeringSession,
    document: str,
    how: SteerConfig,
    lam: float,
    new_tokens: int = 64,
    precision: str = "auto",
    repeats: int = 3,
    log: Callable[[str], None] = print,
) -> dict:
    """The module docstring's figures for `session` (a merged model, its vectors and head) on `document`; `how`: a
    gated SteerConfig (its τ and keep), `lam` its λ."""
    lm = session.lm
    device = lm.model.device.type
    gen = GenerationConfig.chosen(precision, max_new_tokens=new_tokens)  # every path decodes alike
    always_on = SteerConfig("vector", "generated", how.units)

    def fresh() -> SteeringSession:  # no prompt kept from an earlier generation
        return SteeringSession(lm, session.vectors, head=session.head())

    paths = {
        "merged": lambda: generate(lm, [document], gen)[0],
        "always_on": lambda: fresh().generate_steered(document, lam, gen, how=always_on),
        "gated": lambda: fresh().grid_generations(document, [lam], gen, how=how)[0],
    }
    for run in paths.values():  # warm-up: the first generation after loading is slow
        run()
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    gated = None
    for i in range(repeats):
        for name, run in paths.items():
            log(f"gated bench: {name}, repeat {i + 1}/{repeats}")
            t0 = time.perf_counter()
            out = run()
            seconds[name].append(time.perf_counter() - t0)
            gated = out if name == "gated" else gated
    med = {name: statistics.median(s) for name, s in seconds.items()}
    counts = gated.gate
    tokens = {
        "merged": len(
            fresh().grid_generations(document, [lam], gen, how=dataclasses.replace(how, tau=0.0))[0].token_ids
        ),
        "always_on": len(
            fresh()
            .grid_generations(document, [lam], gen, how=dataclasses.replace(how, tau=1.0, keep=new_tokens))[0]
            .token_ids
        ),
        "gated": counts.tokens,
    }
    per_token = {name: med[name] / tokens[name] for name in paths}
    return {
        "model": lm.spec.name,
        "adapter": Path(session.vectors.adapter_path or "").name,
        "device": device,
        "precision": {"prefill": resolve_precision(precision, device), "decode": gen.decode_on(device)},
        "steering": {**how.key(), "lambda": lam},
        "tokens": tokens,
        "repeats": repeats,
        "merged_s": med["merged"],
        "always_on_s": med["always_on"],
        "gated_s": med["gated"],
        "gated_vs_merged": med["gated"] / med["merged"],
        "gated_vs_always_on": med["gated"] / med["always_on"],
        "always_on_vs_merged": med["always_on"] / med["merged"],
        "gated_vs_merged_per_token": per_token["gated"] / per_token["merged"],
        "gated_vs_always_on_per_token": per_token["gated"] / per_token["always_on"],
        "ms_per_token": {name: 1000 * t for name, t in per_token.items()},
        "gated_forwards": counts.forwards,
        "gated_forwards_per_token": counts.forwards / counts.tokens,
        "extra_forwards_per_token": (counts.forwards - (counts.tokens - 1)) / counts.tokens,
        "taken_back": counts.taken_back,
        "replaced": len(gated.replacements),
        "taken_back_per_token": counts.taken_back / counts.tokens,
        "steered_forwards": counts.steered,
    }


def format_gated(res: dict) -> str:
    """The figures as a table, each goal of GOALS marked met or missed."""
    s = res["steering"]
    lines = [f"gated bench: {res['model']} + {res['adapter']} on {res['device']}, precision {res['precision']}"]
    lines.append(
        f"λ {s['lambda']:g} ({s['units']}), τ {s['tau']:g}, k {s['keep']}; tokens {res['tokens']}, median of "
        f"{res['repeats']}; {res['taken_back']} taken back, {res['replaced']} replaced; ms per token "
        + ", ".join(f"{k} {v:.1f}" for k, v in res["ms_per_token"].items())
    )
    for k, v in res.items():
        if not isinstance(v, float):
            continue
        goal = GOALS.get(k)
        mark = "" if goal is None else f"  (goal {goal[0]} {goal[1]}: {'met' if v <= goal[1] else 'MISSED'})"
        lines.append(f"{k:28s} {v:10.3f}{mark}")
    return "\n".join(lines)
