"""Time a λ grid generated as one batch against the same grid one λ at a time (SteeringSession.generate_grid vs
generate_steered): SmolLM2-135M with the demo TOPL adapter, fp32, the Steering page's 17 slider positions of each
mode family (vector: ±2 normalised; conditional: −1 … 3), greedy, 64 new tokens, the first validation document.
Prints each side's seconds, their ratio and how many of the batch's texts equal the one-at-a-time texts.

    TOPL_PRECISION=fp32 PYTHONPATH=$PWD .venv/bin/python scripts/grid_timing.py
"""

from __future__ import annotations

import time

import torch

from topl_core.analysis.lora_a.probe import ProbeSettings, labelled_records
from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.data.records import read_jsonl
from topl_core.data.split import split_records
from topl_core.inference.generate import GenerationConfig
from topl_core.runtime.modes import SteerConfig
from topl_core.runtime.session import SteeringSession
from topl_core.training.adapters import open_adapter

ADAPTER = "examples/adapters/topl-smollm2"
DATA = "cache/data/halueval-perturbed.jsonl"


def main() -> None:
    adapter = open_adapter(ADAPTER)
    val = split_records(read_jsonl(DATA), seed=adapter.settings.split_seed)["val"]
    settings = ProbeSettings(random_control=False, precision="fp32")
    session = SteeringSession.from_run(
        adapter, build_steering_vectors(adapter, labelled_records(val)[:16], settings, 4)
    )
    document, tok = val[0].document, session.lm.tokenizer
    gen = GenerationConfig(max_new_tokens=64, precision="fp32")
    print(f"threads {torch.get_num_threads()}, capability {torch.backends.cpu.get_cpu_capability()}, prompt tokens "
          f"{len(tok(document)['input_ids'])}", flush=True)  # fmt: skip
    session.generate_steered(document, 0.0, GenerationConfig(max_new_tokens=4, precision="fp32"))  # warm-up
    for mode in ("vector", "conditional"):
        how = SteerConfig(mode)
        grid = how.spec.slider_positions()
        t = time.perf_counter()
        alone = [session.generate_steered(document, lam, gen, how=how) for lam in grid]
        t_alone = time.perf_counter() - t
        t = time.perf_counter()
        batch = session.generate_grid(document, grid, gen, how=how)
        t_batch = time.perf_counter() - t
        same = sum(a == b for a, b in zip(alone, batch))
        print(f"{mode}: {len(grid)} λ, one at a time {t_alone:.1f} s, one batch {t_batch:.1f} s, batch / one at a "
              f"time {t_batch / t_alone:.3f}; identical texts {same}/{len(grid)}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
