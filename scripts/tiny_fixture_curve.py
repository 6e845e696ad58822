"""Where the tests' tiny TOPL run converges (docs/reliability.md, "The tiny TOPL fixture"): for each LoRA lr, head
multiplier and step count, tiny-llama trained as tests/conftest.steerable_topl_config does (LoRA 0–2, 4 records a
step, the tests' 40 template pairs), then the largest batch loss, the head's mean BCE and AUROC on its own training
tokens (a fixed set: one batch's loss swings with its share of bad tokens), the same BCE of the base rate (what a
constant p gets), and whether the merged model writes any text for the first 3 documents.

    PYTHONPATH=$PWD .venv/bin/python scripts/tiny_fixture_curve.py 0.05,10,12 3e-3,5,40 3e-3,5,80
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import make_pairs, steerable_topl_config  # noqa: E402

from topl_core.data.perturb import build_perturbation_records  # noqa: E402
from topl_core.data.records import write_jsonl  # noqa: E402
from topl_core.data.split import split_records  # noqa: E402
from topl_core.inference.generate import GenerationConfig, generate, load_merged  # noqa: E402
from topl_core.inference.token_scores import TokenScorer, detection_auroc  # noqa: E402
from topl_core.models.loading import load_model  # noqa: E402
from topl_core.training.trainer import train  # noqa: E402


def main(settings: list[str]) -> None:
    torch.set_num_threads(1)
    records = build_perturbation_records(make_pairs(40), seed=0)
    folder = Path(tempfile.mkdtemp())
    data = write_jsonl(records, folder / "tiny.jsonl")
    documents = list(dict.fromkeys(r.document for r in records))[:3]
    training = split_records(records, seed=0)["train"]
    print("| LoRA lr | head × | steps | largest batch loss | train-token BCE (base rate) | AUROC | texts written |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for setting in settings:
        lr, multiplier, steps = setting.split(",")
        cfg = steerable_topl_config(data, lr=float(lr), head_lr_multiplier=float(multiplier), steps=int(steps))
        run = train(cfg, folder / setting, records=records)
        scores = TokenScorer(load_model("tiny-llama"), run.path, precision="fp32", max_doc_tokens=64).score(training)
        gold = np.concatenate([s.gold for s in scores])
        good = gold[gold >= 0] == 1
        p_good = np.clip(np.concatenate([s.p_good for s in scores])[gold >= 0].astype(np.float64), 1e-7, 1 - 1e-7)
        bce = -np.mean(np.log(np.where(good, p_good, 1 - p_good)))
        rate = good.mean()
        constant = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
        texts = generate(load_merged("tiny-llama", run.path), documents, GenerationConfig(8, precision="fp32"))
        worst = max(r["loss"] for r in run.read_metrics())
        auroc = detection_auroc(scores)["head_auroc"]
        written = sum(bool(t.strip()) for t in texts)
        print(f"| {lr} | {multiplier} | {steps} | {worst:.2f} | {bce:.3f} ({constant:.3f}) | {auroc:.3f} | ", end="")
        print(f"{written}/3 |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
