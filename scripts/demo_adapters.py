"""The demo adapters that ship in examples/adapters: their exact training commands, and a rebuild that checks them.

    .venv/bin/python scripts/demo_adapters.py               # retrain each demo into a temp dir, compare bit for bit
    .venv/bin/python scripts/demo_adapters.py --replace     # retrain into examples/adapters (after a recipe change)
    .venv/bin/python scripts/demo_adapters.py --only sft-smollm2 --out /tmp/demos
    .venv/bin/python scripts/demo_adapters.py --first-visit ship --precision fp32   # time each analysis page's
                                  # first visit on the demos (cold), ship its small results; then --precision bf16
    .venv/bin/python scripts/demo_adapters.py --first-visit shipped   # time them again, as a fresh clone sees them
    .venv/bin/python scripts/demo_adapters.py --first-visit ship --visit-only peft-sft-smollm2
    .venv/bin/python scripts/demo_adapters.py --cards       # rewrite each demo's model card (README.md) from its
                                  # topl_config.json and metrics (topl_core.training.card; the weights stay as they are)
                                        # the same with that demo alone in the examples (added to what is shipped)

`make demo-adapters` runs the first form. Training is seeded and its data order is a pure function of the seed, so
the same command on the same precision and CPU kind gives the same weights: the check compares the sha256 of every
weight file with the committed one. The commands pin `--precision fp32` so that a machine with fast bf16 ("auto"
would pick bf16 there) rebuilds the same adapters. Each finished demo folder gets a command.txt with its command
and a model card naming its folder as examples/adapters/<name>.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from topl_core.foundations.paths import DEFAULT_DATA  # noqa: E402
from topl_core.foundations.presets import DEFAULT_MODEL  # noqa: E402
from topl_core.training.card import write_card  # noqa: E402
from topl_core.training.run_dirs import (  # noqa: E402
    ADAPTER_WEIGHTS,
    HEAD_FILE,
    RunDir,  # noqa: E402
)

EXAMPLES = REPO / "examples" / "adapters"
SHIPPED_CACHE = REPO / "examples" / "analysis-cache"
FIRST_VISIT_PAGES = ("home", "lora_a", "steering", "token_overlay")  # home first: it loads the base model
SHIP_MAX_BYTES = 2_000_000  # JSON results only (separability, steering vectors, scorer quality); never projections
DATA = DEFAULT_DATA  # built by scripts/setup.sh: 600 HaluEval documents, seed 0

# name → train flags (the rest are TrainConfig's defaults: SmolLM2, LoRA r=4 α=8 on layers 0–20, lr 1e-4, batch 8)
DEMOS: dict[str, list[str]] = {
    "topl-smollm2": ["--method", "topl", "--steps", "160", "--eval-every", "40", "--precision", "fp32"],
    "sft-smollm2": ["--method", "sft", "--steps", "60", "--eval-every", "30", "--precision", "fp32"],
}
WEIGHT_FILES = (ADAPTER_WEIGHTS, HEAD_FILE)


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
    (out / "command.txt").write_text(
        f"# rebuilt bit for bit by: make demo-adapters (scripts/demo_adapters.py)\n{shown}\n"
    )
    if out.resolve() == (EXAMPLES / name).resolve():
        write_card(shipped_run(name))


def shipped_run(name: str) -> RunDir:
    """A demo as a run folder named by its path in the repository (what its card shows)."""
    return RunDir(EXAMPLES.relative_to(REPO) / name)


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


def first_visit(mode: str, only: str | None = None, precision: str = "auto") -> dict[str, float]:
    """Open each analysis page on the demo adapters (SmolLM2, the pages' defaults) through Streamlit's AppTest with
    an empty local analysis cache, and time it: what a newcomer waits on a first visit. "ship": with no shipped
    results either (cold), then the JSON results the visits computed are added to examples/analysis-cache, where the
    cache finds them read-only (same keys everywhere: the data set is seeded, keys hold the adapter and base
    fingerprints and the resolved precision). "shipped": with the shipped results, as a fresh clone opens them.
    `only`: that demo alone in the examples (so the pages open on it), its results added to those already shipped.
    On the Token overlay, an adapter without a head gets its probe head fitted (the page's button). `precision`:
    what the pages compute in (TOPL_PRECISION): ship once per precision, so that a fresh clone's first visit is fast
    on every kind of machine; results of the other precision are kept (every key holds the precision that computed
    it)."""
    import os
    import time

    from streamlit.testing.v1 import AppTest

    ship = mode == "ship"
    work = Path(tempfile.mkdtemp(prefix="topl-first-visit-"))
    (work / "cache").mkdir()
    examples = EXAMPLES
    if only or ship:  # the demos (or that one alone) in a folder of their own: with no shipped cache beside when
        # shipping (cold; results are added to those already shipped), beside the shipped cache otherwise
        examples = work / "examples" / "adapters"
        examples.mkdir(parents=True)
        for demo in [only] if only else [d.name for d in EXAMPLES.iterdir() if d.is_dir()]:
            (examples / demo).symlink_to(EXAMPLES / demo)
        if not ship:
            (examples.parent / "analysis-cache").symlink_to(SHIPPED_CACHE)
    for sub in ("models", "data"):  # the converted model and the data sets, not the analysis results
        if (REPO / "cache" / sub).exists():
            (work / "cache" / sub).symlink_to(REPO / "cache" / sub)
    os.environ.update(
        {
            "TOPL_CACHE_DIR": str(work / "cache"),
            "TOPL_RUNS_DIR": str(work / "runs"),
            "TOPL_EXAMPLES_DIR": str(examples),
            "TOPL_DEFAULT_MODEL": DEFAULT_MODEL,
            "TOPL_PRECISION": precision,
        }
    )
    seconds = {}
    for name in FIRST_VISIT_PAGES:
        t = time.perf_counter()
        at = AppTest.from_file(str(REPO / "app.py"), default_timeout=1800)
        at.run()
        if name != "home":
            at.switch_page(f"pages/{name}.py").run()
        if [b for b in at.button if b.key == "overlay.fit_probe"]:
            at.button(key="overlay.fit_probe").click().run()
        seconds[name] = time.perf_counter() - t
        problems = [e.value for e in at.exception] + [e.value for e in at.error]
        print(
            f"{name}: first visit {seconds[name]:.1f} s{'  PROBLEM: ' + str(problems) if problems else ''}", flush=True
        )
    if ship:
        results = [f for f in (work / "cache" / "analysis").rglob("*.json") if not f.name.endswith(".key.json")]
        for f in results:
            if f.stat().st_size <= SHIP_MAX_BYTES:  # the entry and the key file that documents it
                for src in (f, f.with_name(f.name.removesuffix(".json") + ".key.json")):
                    dest = SHIPPED_CACHE / src.relative_to(work / "cache" / "analysis")
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dest)
        print(f"shipped {sum(1 for _ in SHIPPED_CACHE.rglob('*.json'))} files in {SHIPPED_CACHE}")
    return seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=sorted(DEMOS), default=sorted(DEMOS))
    p.add_argument("--replace", action="store_true", help="train into examples/adapters, replacing what is there")
    p.add_argument("--out", help="train into this folder (relative to the repository) instead of a temp dir, compare")
    p.add_argument(
        "--first-visit",
        choices=["ship", "shipped"],
        help="ship: time each analysis page's first visit on the demos with no cache at all, then write "
        "the JSON results into examples/analysis-cache; shipped: time them with those results",
    )
    p.add_argument("--visit-only", help="with --first-visit: that folder of examples/adapters alone")
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="with --first-visit: the pages' compute precision (ship both: fp32, then bf16)",
    )
    p.add_argument("--cards", action="store_true", help="rewrite the demos' model cards (README.md), no training")
    args = p.parse_args()
    os.chdir(REPO)  # the cards name the demo folders relative to the repository
    if args.cards:
        for name in args.only:
            print(write_card(shipped_run(name)))
        return 0
    if args.first_visit:
        first_visit(args.first_visit, args.visit_only, args.precision)
        return 0
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
    print(
        "all demo adapters reproduced bit for bit"
        if ok
        else "some files differ (another CPU kind or library "
        "version computes fp32 sums in another order: compare the metrics instead)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
