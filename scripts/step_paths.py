"""Would one code path keep the demo adapters' bits? The first N steps of the demo TOPL recipe (demo_adapters.py:
SmolLM2, fp32, the default data) trained as a CPU trains today (the head's BCE over the indexed labelled tokens, the
plain AdamW) and with a GPU's masked-sum BCE and/or the fused AdamW; prints each variant's losses (hex) and the largest
weight difference from today's; then times the two BCE forms and the two AdamWs alone on the recipe's shapes. The
figures: docs/training.md, "One code path for the head's loss and the optimizer".

    PYTHONPATH=$PWD .venv/bin/python scripts/step_paths.py --steps 3 --out /tmp/step-paths
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from topl_core.data.encode import IGNORE
from topl_core.foundations.paths import DEFAULT_DATA
from topl_core.training import trainer
from topl_core.training.config import TrainConfig
from topl_core.training.methods import topl
from topl_core.training.run_dirs import ADAPTER_WEIGHTS, HEAD_FILE

INDEXED, PLAIN_ADAMW = topl.token_bce_loss, torch.optim.AdamW
VARIANTS = {"today": (False, False), "masked": (True, False), "fused": (False, True), "both": (True, True)}


def fused_adamw(*args, fused=None, **kw) -> torch.optim.AdamW:
    return PLAIN_ADAMW(*args, fused=True, **kw)  # the trainer asks for fused=False on a CPU


def train_variant(name: str, steps: int, out: Path) -> dict[str, torch.Tensor]:
    masked, fused = VARIANTS[name]
    topl.token_bce_loss = topl.masked_token_bce_loss if masked else INDEXED
    torch.optim.AdamW = fused_adamw if fused else PLAIN_ADAMW
    try:
        cfg = TrainConfig(steps=steps, eval_every=10_000, checkpoint_every=10_000, precision="fp32", data=DEFAULT_DATA)
        run = trainer.train(cfg, out / name)
    finally:
        topl.token_bce_loss, torch.optim.AdamW = INDEXED, PLAIN_ADAMW
    rows = run.read_metrics()
    print(f"{name}: losses {[r['loss'].hex() for r in rows]}, step s {[round(r['step_s'], 1) for r in rows]}")
    head = {f"head.{k}": v for k, v in load_file(run.path / HEAD_FILE).items()}
    return {**load_file(run.path / ADAPTER_WEIGHTS), **head}


def best_us(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e6


def time_parts() -> None:
    """Best-of times: the BCE of one micro-batch (2 rows of 450 tokens, 120 labelled), forward and backward; one
    AdamW step over the recipe's 296 trainable tensors (LoRA r=4 on SmolLM2's 7 modules × 21 layers, the head)."""
    torch.manual_seed(0)
    labels = torch.full((2, 450), IGNORE)
    labels[:, 330:] = (torch.rand(2, 120) > 0.1).long()
    logits = torch.randn(2, 450, requires_grad=True)
    for name, loss in (("indexed", INDEXED), ("masked", topl.masked_token_bce_loss)):
        print(f"BCE {name}: {best_us(lambda: loss(logits, labels).backward(), 2000):.1f} µs")
    sizes = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
    shapes = [s for _ in range(21) for i, o in sizes for s in ((4, i), (o, 4))] + [(1, 576), (1,)]
    for fused in (False, True):
        params = [torch.nn.Parameter(torch.randn(s) * 0.01) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = PLAIN_ADAMW([{"params": params[:-2]}, {"params": params[-2:], "lr": 1e-3}], lr=1e-4, fused=fused)
        print(f"AdamW fused={fused}: {best_us(opt.step, 200) / 1000:.2f} ms a step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True, help="a folder for the runs (one per variant)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["today", "masked", "fused"])
    args = parser.parse_args()
    names = dict.fromkeys(["today", *args.variants])  # today's first: the others are compared with it
    weights = {name: train_variant(name, args.steps, Path(args.out)) for name in names}
    for name, w in weights.items():
        same = sum(torch.equal(w[k], weights["today"][k]) for k in w)
        diff = {k: (w[k] - weights["today"][k]).abs().max().item() for k in w}
        lora = max(v for k, v in diff.items() if not k.startswith("head."))
        head = max(v for k, v in diff.items() if k.startswith("head."))
        print(f"{name}: {same}/{len(w)} tensors bit-identical to today's; max |Δ| LoRA {lora:.3g}, head {head:.3g}")
    time_parts()


if __name__ == "__main__":
    main()
