"""The service's batched decode step alone: the demo TOPL adapter's Batcher (serve/batch.py) with `--clients` steered
generations joined (each a 554-token prompt and its twin), then 30 steps of every row at once, timed — eagerly
(TOPL_COMPILED_DECODE=0) or through the compiled package (inference/batch_step.py; built first where none is on disk).
What docs/performance.md's table "The service's compiled step" comes from:

    .venv/bin/python scripts/batch_step_bench.py eager --clients 1
    .venv/bin/python scripts/batch_step_bench.py compiled --clients 1 [--precision bf16]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from topl_core.analysis.evaluation.config import EvalConfig
from topl_core.analysis.evaluation.evaluate import steering_vectors_for
from topl_core.foundations.paths import PROJECT_ROOT
from topl_core.hardware.machine import machine_description
from topl_core.runtime.modes import SteerConfig
from topl_core.runtime.session import SteeringSession
from topl_core.serve.batch import Batcher
from topl_core.serve.row_steering import MERGED, Steering
from topl_core.training.adapters import open_adapter

STEPS = 30
PROMPT = 554  # the demo's first test document's summary prompt, in tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("decode", choices=["eager", "compiled"])
    p.add_argument("--clients", type=int, default=1, help="steered generations, each decoding with its twin")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="what the steps decode in (bf16: autocast's step over the weights' kept bf16 copies)",
    )
    args = p.parse_args()
    os.environ["TOPL_COMPILED_DECODE"] = "0" if args.decode == "eager" else "auto"  # read when the Batcher is made

    adapter = open_adapter(PROJECT_ROOT / "examples" / "adapters" / "topl-smollm2")
    vectors = steering_vectors_for(adapter, EvalConfig(precision="bf16"))
    session = SteeringSession.from_run(adapter, vectors, adapter.base_model)
    precisions = (args.precision, args.precision)
    batcher = Batcher(session.lm, vectors, session.lora, session.head(), precisions, slots=16)
    if args.decode == "compiled" and not batcher.warm(PROMPT + STEPS + 8, wait=True):
        raise SystemExit(f"no compiled step here: {batcher.compiled and batcher.compiled.failed}")
    steering = Steering(SteerConfig("vector"), 1.0)
    joined = [
        batcher.join(torch.randint(100, 1000, (1, PROMPT)), steering, twin=True).result() for _ in range(args.clients)
    ]

    def step() -> None:
        futures = []
        for j in joined:
            futures += [batcher.submit(j.slot, 42, steering), batcher.submit(j.twin, 42, MERGED)]
        for f in futures:
            f.result()

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(STEPS):
        step()
    ms = (time.perf_counter() - start) / STEPS * 1000
    rows = 2 * args.clients
    what = f"{args.decode} {args.precision}, {rows} rows"
    print(f"{machine_description()}: {what}: {ms:.1f} ms a step; {dict(batcher.forwards)}")
    batcher.close()


if __name__ == "__main__":
    main()
