"""The demo adapters that ship in examples/adapters: their exact training commands, and a rebuild that checks them.

    .venv/bin/python scripts/demo_adapters.py               # retrain each demo into a temp dir, compare bit for bit
    .venv/bin/python scripts/demo_adapters.py --replace     # retrain into examples/adapters (after a recipe change)
    .venv/bin/python scripts/demo_adapters.py --only sft-smollm2 --out /tmp/demos

`make demo-adapters` runs the first form. Training is seeded and its data order is a pure function of the seed, so
the same command on the same precision and CPU kind gives the same weights: the check compares the sha256 of every
weight file with the committed one. The commands pin `--precision fp32` so that a machine with fast bf16 ("auto"
would pick bf16 there) rebuilds the same adapters. Each finished demo folder gets a command.txt with its command.
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "adapters"
DATA = "cache/data/halueval-perturbed.jsonl"  # built by scripts/setup.sh: 600 HaluEval documents, seed 0

# name → train flags (the rest are TrainConfig's defaults: SmolLM2, LoRA r=4 α=8 on layers 0–20, lr 1e-4, batch 8)
DEMOS: dict[str, list[str]] = {
    "topl-smollm2": ["--method", "topl", "--steps", "160", "--eval-every", "40", "--precision", "fp32"],
    "sft-smollm2": ["--method", "sft", "--steps", "60", "--eval-every", "30", "--precision", "fp32"],
}
WEIGHT_FILES = ("adapter_model.safetensors", "head.safetensors")


def command(name: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "topl_core", "train", "--data", DATA, *DEMOS[name], "--out", str(out)]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(name: str, out: Path) -> None:
    """Train one demo into `out` (a finished run there is kept as is), then drop what a demo need not carry."""
    cmd = command(name, out)
    print("$", shlex.join(["python", *cmd[1:]]), flush=True)
    subprocess.run(cmd, cwd=REPO, check=True)
    shutil.rmtree(out / "checkpoint", ignore_errors=True)  # only an unfinished run has one; never committed
    shown = shlex.join(["python", *cmd[1:-1], f"examples/adapters/{name}"])
    (out / "command.txt").write_text(f"# rebuilt bit for bit by: make demo-adapters (scripts/demo_adapters.py)\n{shown}\n")


def compare(name: str, built: Path) -> bool:
    same = True
    for f in WEIGHT_FILES:
        a, b = EXAMPLES / name / f, built / f
        if not a.exists() and not b.exists():
            continue
        ok = a.exists() and b.exists() and sha256(a) == sha256(b)
        same &= ok
        print(f"  {name}/{f}: {'identical' if ok else 'DIFFERS'}")
    return same


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=sorted(DEMOS), default=sorted(DEMOS))
    p.add_argument("--replace", action="store_true", help="train into examples/adapters, replacing what is there")
    p.add_argument("--out", help="train into this folder instead of a temp dir, then compare")
    args = p.parse_args()
    if not (REPO / DATA).exists():
        print(f"error: {DATA} is missing; run `make setup` (or scripts/setup.sh) first", file=sys.stderr)
        return 2
    if args.replace:
        for name in args.only:
            shutil.rmtree(EXAMPLES / name, ignore_errors=True)
            build(name, EXAMPLES / name)
        return 0
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="topl-demos-"))
    ok = True
    for name in args.only:
        build(name, root / name)
        ok &= compare(name, root / name)
    print("all demo adapters reproduced bit for bit" if ok else "some files differ (another CPU kind or library "
          "version computes fp32 sums in another order: compare the metrics instead)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
