"""The GPU acceptance check: every computing command, and every page, on one device, as a user runs them.

    .venv/bin/python scripts/gpu_check.py                       # cuda: tiny-llama, then SmolLM2
    .venv/bin/python scripts/gpu_check.py --device cpu --models tiny-llama   # the same steps on the CPU (the test)

For each model: train a TOPL run (20 steps) and an SFT run (2 steps), probe, steer in each mode (on every position
and on generated tokens only), score-tokens, evaluate 2 documents (base, merged, steered), a 2-window layer sweep,
merge-check, and a kill and resume (a TOPL run with LoRA dropout killed by SIGKILL after a checkpoint and resumed:
its adapter and head tensors must equal, bit for bit, those of the same run never killed; dropout masks are drawn on
the device, so this holds only when the checkpoint carries the device's random state) — each command in the
precision "auto" gives on that device (bf16 on a GPU with bf16), and printed with its exit status and seconds.
Then, with --pages, the app is started on the device and every page is visited in headless Chromium
(../shared/tools/visit_pages.py), which fails on an exception or an error box; --pages apptest runs every page's
script in-process with Streamlit's AppTest instead (scripts/apptest_pages.py: no browser, no screenshots; the GPU
machines lent here have no browser). Exit status 0 when every step passed. tests/test_gpu.py runs it where CUDA is
visible and skips with the reason elsewhere; `--steps resume` alone is the kill-and-resume measurement.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from topl_core.runtime.modes import MODES, POSITIONS  # noqa: E402  (light: no torch)

VISIT_PAGES = REPO.parent / "shared" / "tools" / "visit_pages.py"
DOC = (
    "The council of Leeds approved the new budget on Monday after a long debate. Police arrested two men in London "
    "and released a third. The company said profits increased by 12 percent in 2023."
)


def step(name: str, args: list[str], env: dict, log: list[tuple[str, int, float]]) -> bool:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    log.append((name, out.returncode, seconds))
    said = [line for line in out.stderr.splitlines() if line.startswith("precision: ")]
    print(f"{'ok  ' if out.returncode == 0 else 'FAIL'} {name:38s} {seconds:6.1f} s  {said[0] if said else ''}")
    if out.returncode != 0:
        print("     " + "\n     ".join((out.stdout + out.stderr).strip().splitlines()[-15:]))
    return out.returncode == 0


def model_steps(
    model: str, device: str, work: Path, data: str, modes=tuple(MODES), positions=POSITIONS
) -> list[tuple[str, str, list[str]]]:
    """(kind, name, command-line arguments) of every step of one model, in the order they run."""
    topl = ["-m", "topl_core"]
    run, sft = work / f"{model}-topl", work / f"{model}-sft"
    last = "2" if model.startswith("tiny") else "20"  # the head layer: SmolLM2's default m is 20 of 30
    common = ["--model", model, "--device", device, "--data", data, "--max-val-examples", "8", "--eval-every", "10"]
    lora = ["--lora-layer-start", "0", "--lora-layer-end", last]
    train = [*topl, "train", *common, *lora]
    steps = [
        ("train", f"{model}: train TOPL 20 steps", [*train, "--steps", "20", "--out", str(run)]),
        ("train", f"{model}: train SFT 2 steps", [*train, "--method", "sft", "--steps", "2", "--out", str(sft)]),
        ("probe", f"{model}: probe", [*topl, "probe", "--run", str(run), "--compare", str(sft), "--limit", "24"]),
    ]
    steps += [
        ("steer", f"{model}: steer {mode} ({where})",
         [*topl, "steer", "--run", str(run), "--document", DOC, "--mode", mode, "--positions", where,
          "--lambdas", "-2", "0", "2", "--max-new-tokens", "24", "--limit", "24", "--no-base"])
        for mode in modes
        for where in positions
    ]  # fmt: skip
    steps += [
        ("score-tokens", f"{model}: score-tokens",
         [*topl, "score-tokens", "--run", str(run), "--data", data, "--limit", "8"]),
        ("evaluate", f"{model}: evaluate 2 documents",
         [*topl, "evaluate", "--run", str(run), "--n-id", "2", "--n-ood", "0", "--steer", "2", "--max-new-tokens", "24",
          "--device", device, "--data", data]),
        ("sweep", f"{model}: layer sweep, 2 windows",
         [*topl, "sweep", "--out", str(work / f"{model}-sweep"), "--model", model, "--device", device,
          "--data", data, "--windows", "0:2", "2:2", "--steps", "4"]),
        ("merge-check", f"{model}: merge-check", [*topl, "merge-check", "--run", str(run), "--n", "4"]),
        ("resume", f"{model}: killed and resumed = straight",
         [*train, "--steps", str(RESUME_STEPS), "--checkpoint-every", "4", "--out", str(work / f"{model}-resumed")]),
    ]  # fmt: skip
    return steps


STEP_KINDS = ("train", "probe", "steer", "score-tokens", "evaluate", "sweep", "merge-check", "resume")
RESUME_STEPS, KILL_AFTER = 24, 6  # killed once 6 steps are logged: after the step-4 checkpoint, before the end


def kill_and_resume(name: str, args: list[str], env: dict, log: list[tuple[str, int, float]]) -> bool:
    """`args` trains a run into its --out (the last two arguments): trained once straight (into <out>-straight), once
    killed by SIGKILL after KILL_AFTER logged steps and resumed with --resume; passes when the two runs' adapter and
    head tensors are the same bits (else it prints how far each tensor is off, and trains straight once more to say
    whether the device repeats a run bit for bit at all)."""
    t = time.perf_counter()
    out = Path(args[-1])
    straight = out.with_name(out.name + "-straight")
    problem = _run_quietly([*args[:-1], str(straight)], env)
    if problem is None:
        killed = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
        metrics = out / "metrics.jsonl"
        while killed.poll() is None and (not metrics.exists() or len(metrics.read_text().splitlines()) < KILL_AFTER):
            time.sleep(0.002)
        if killed.poll() is not None:
            problem = f"the run ended (exit {killed.returncode}) before it could be killed; raise RESUME_STEPS"
        else:
            killed.kill()
            killed.wait()
            steps = len(metrics.read_text().splitlines())
            print(f"     killed after {steps} logged steps; resuming from the last checkpoint")
            problem = _run_quietly([*args[:2], "train", "--resume", str(out)], env)
    if problem is None:
        problem = _same_weights(out, straight)
    if problem is not None and problem.startswith(DIFFER):  # the resume's fault, or the device's own repeatability?
        again = straight.with_name(straight.name + "-again")
        repeated = _run_quietly([*args[:-1], str(again)], env) or _same_weights(again, straight)
        problem += "\n" + (
            "a straight run trained again equals the first bit for bit: the resume loses some state"
            if repeated is None
            else "a straight run trained again differs from the first too: training here is not repeatable bit for "
            "bit, so neither is a resume (" + repeated.splitlines()[-1].strip() + ")"
        )
    seconds = time.perf_counter() - t
    log.append((name, 0 if problem is None else 1, seconds))
    print(f"{'ok  ' if problem is None else 'FAIL'} {name:38s} {seconds:6.1f} s")
    if problem is not None:
        lines = problem.strip().splitlines()
        if len(lines) > 16:  # the first tensors off, how many more, and the verdict
            lines = [*lines[:12], f"... {len(lines) - 14} more tensors", *lines[-2:]]
        print("     " + "\n     ".join(lines))
    return problem is None


DIFFER = "the weights differ"


def _run_quietly(args: list[str], env: dict) -> str | None:
    out = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True)
    return None if out.returncode == 0 else f"exit {out.returncode}: {out.stdout}{out.stderr}"


def _same_weights(a: Path, b: Path) -> str | None:
    """None when both runs' adapter and head tensors are the same bits (the files' metadata is compared as a dict: the
    order safetensors writes its keys in changes from one process to the next); else how far each tensor is off."""
    import torch
    from safetensors import safe_open

    lines = []
    for f in ("adapter_model.safetensors", "head.safetensors"):
        with safe_open(a / f, "pt") as x, safe_open(b / f, "pt") as y:
            if x.metadata() != y.metadata() or set(x.keys()) != set(y.keys()):
                lines.append(f"{f}: metadata or tensor names differ")
                continue
            for k in x.keys():
                u, v = x.get_tensor(k), y.get_tensor(k)
                if not u.view(-1).view(torch.uint8).equal(v.view(-1).view(torch.uint8)):
                    lines.append(f"{f} {k}: max |Δ| {(u.float() - v.float()).abs().max().item():.3g}")
    return DIFFER + ":\n" + "\n".join(lines) if lines else None


def check_model(
    model: str, device: str, work: Path, data: str, env: dict, log: list, modes=tuple(MODES), positions=POSITIONS,
    kinds=STEP_KINDS,
) -> None:  # fmt: skip
    for kind, name, args in model_steps(model, device, work, data, modes, positions):
        if kind == "resume" and kind in kinds:
            kill_and_resume(name, args, env, log)
        elif kind in kinds:
            step(name, args, env, log)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_pages(model: str, device: str, work: Path, env: dict, log: list, how: str = "chromium") -> None:
    app_env = {**env, "TOPL_DEFAULT_MODEL": f"{model}|auto|{device}", "TOPL_RUNS_DIR": str(work)}
    if how == "apptest":
        step(f"{model}: every page's script (AppTest)", ["scripts/apptest_pages.py"], app_env, log)
        return
    port = free_port()
    app = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port), "--server.headless", "true"],
        cwd=REPO,
        env=app_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(8)
        shots = work / "screenshots"
        step(f"{model}: every page in Chromium", [str(VISIT_PAGES), f"http://127.0.0.1:{port}", str(shots), "300"],
             app_env, log)  # fmt: skip
        print(f"     screenshots: {shots}")
    finally:
        app.terminate()
        app.wait(timeout=30)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--models", nargs="+", default=["tiny-llama", "smollm2-135m"])
    p.add_argument("--data", default="cache/data/halueval-perturbed.jsonl", help="token-labelled records")
    p.add_argument("--modes", nargs="+", choices=tuple(MODES), default=list(MODES), help="steering modes to run")
    p.add_argument("--positions", nargs="+", choices=POSITIONS, default=list(POSITIONS), help="steered positions")
    p.add_argument("--steps", nargs="+", choices=STEP_KINDS, default=list(STEP_KINDS), help="the kinds of step to run")
    p.add_argument(
        "--pages",
        nargs="?",
        const="chromium",
        choices=("chromium", "apptest"),
        help="also visit every page: in headless Chromium (needs chromium), or with Streamlit's AppTest (no browser)",
    )
    p.add_argument("--work", help="keep runs and screenshots here (default: a temp folder)")
    args = p.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device is visible: nothing to check here (use --device cpu to run the steps on the CPU)")
            return 2
        print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  CUDA {torch.version.cuda}")
    work = Path(args.work or tempfile.mkdtemp(prefix="topl-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TOPL_CACHE_DIR": str(work / "cache"), "PYTHONUNBUFFERED": "1"}
    env.pop("TOPL_PRECISION", None)  # "auto", as a user gets it on this device
    (work / "cache").mkdir(exist_ok=True)
    for shared in ("models", "data", "machine"):  # the converted models and data sets, not the analysis results
        if (REPO / "cache" / shared).exists() and not (work / "cache" / shared).exists():
            (work / "cache" / shared).symlink_to(REPO / "cache" / shared)
    log: list[tuple[str, int, float]] = []
    for model in args.models:
        check_model(
            model, args.device, work, str(Path(args.data).resolve()), env, log, args.modes, args.positions, args.steps
        )
        if args.pages:
            check_pages(model, args.device, work, env, log, args.pages)
    failed = [name for name, rc, _ in log if rc != 0]
    print(f"{len(log) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
