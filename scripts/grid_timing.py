"""Time a λ grid generated as one batch against the same grid one λ at a time (SteeringSession.generate_grid vs
generate_steered), and against the batch with its rows' prompts run whole (how a grid ran before its rows took one
row's layers below the first steered one: inference/prompt_layers.py): SmolLM2-135M with the demo TOPL adapter, the
Steering page's 17 slider positions of each mode family (vector: ±2 normalised; conditional: −1 … 3), every position
steered, greedy, 64 new tokens, the first validation document, in --precision (default fp32). Prints each side's
seconds (the two batches alternated --repeat times: their medians), their ratios and how many texts equal the
one-at-a-time texts; --json writes them.

    PYTHONPATH=$PWD .venv/bin/python scripts/grid_timing.py [--precision auto] [--repeat 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager

import torch

from topl_core.analysis.lora_a.probe import ProbeSettings, labelled_records
from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.data.records import read_jsonl
from topl_core.data.split import split_records
from topl_core.hardware.machine import machine_description
from topl_core.inference import generate, prompt_layers
from topl_core.inference.generate import GenerationConfig
from topl_core.runtime.modes import SteerConfig
from topl_core.runtime.session import SteeringSession
from topl_core.training.adapters import open_adapter

ADAPTER = "examples/adapters/topl-smollm2"
DATA = "cache/data/halueval-perturbed.jsonl"


@contextmanager
def rows_prompts_whole():
    """generate_grid as before the rows shared one row's layers below: prompt_forward's resumed_prompt never given the
    first row to run (rows of one prompt then run whole)."""
    resumed = generate.resumed_prompt

    @contextmanager
    def whole_rows(model, ids, precision, cache, through=None, first_row=None):
        with resumed(model, ids, precision, cache, through) as done:
            yield done

    generate.resumed_prompt = whole_rows
    try:
        yield
    finally:
        generate.resumed_prompt = resumed


def timed(work) -> tuple[list[str], float]:
    prompt_layers._KEPT._entries.clear()  # every side starts from a document never asked about
    t = time.perf_counter()
    out = work()
    return out, time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precision", default="fp32", help="fp32, bf16 or auto (GenerationConfig.chosen)")
    p.add_argument("--repeat", type=int, default=1, help="times the two batches are timed, alternated")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    adapter = open_adapter(ADAPTER)
    val = split_records(read_jsonl(DATA), seed=adapter.settings.split_seed)["val"]
    settings = ProbeSettings(random_control=False, precision="fp32")
    session = SteeringSession.from_run(
        adapter, build_steering_vectors(adapter, labelled_records(val)[:16], settings, 4)
    )
    document, tok = val[0].document, session.lm.tokenizer
    gen = GenerationConfig.chosen(args.precision, max_new_tokens=64)
    out = {"machine": machine_description(), "threads": torch.get_num_threads(), "precision": args.precision,
           "prompt_tokens": len(tok(document)["input_ids"]), "new_tokens": 64, "repeat": args.repeat,
           "modes": {}}  # fmt: skip
    print(out, flush=True)
    session.generate_steered(document, 0.0, GenerationConfig.chosen(args.precision, max_new_tokens=4))  # warm-up
    for mode in ("vector", "conditional"):
        how = SteerConfig(mode, "all")
        grid = how.spec.slider_positions()
        alone, t_alone = timed(lambda: [session.generate_steered(document, lam, gen, how=how) for lam in grid])
        t_batch, t_whole = [], []
        for _ in range(args.repeat):
            batch, t = timed(lambda: session.generate_grid(document, grid, gen, how=how))
            t_batch.append(t)
            with rows_prompts_whole():
                whole, t = timed(lambda: session.generate_grid(document, grid, gen, how=how))
            t_whole.append(t)
        t_batch, t_whole = statistics.median(t_batch), statistics.median(t_whole)
        row = {
            "lambdas": len(grid),
            "one_at_a_time_s": round(t_alone, 2),
            "batch_s": round(t_batch, 2),
            "batch_prompts_whole_s": round(t_whole, 2),
            "batch_vs_one_at_a_time": round(t_batch / t_alone, 3),
            "batch_vs_prompts_whole": round(t_batch / t_whole, 3),
            "identical_to_one_at_a_time": sum(a == b for a, b in zip(alone, batch)),
            "prompts_whole_identical_to_one_at_a_time": sum(a == b for a, b in zip(alone, whole)),
            "batch_identical_to_prompts_whole": sum(a == b for a, b in zip(batch, whole)),
        }
        out["modes"][mode] = row
        print(mode, row, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
