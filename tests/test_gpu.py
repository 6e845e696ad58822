"""The GPU acceptance check (scripts/gpu_check.py): every computing command on CUDA where a GPU is visible — and its
steps on the CPU here, so that the check itself is known to work before a GPU ever runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
NO_GPU = "no CUDA device is visible (CI and the CPU machines have none): run scripts/gpu_check.py where one is"


def run_check(tmp_path: Path, records, *args: str) -> subprocess.CompletedProcess:
    from topl_core.data.records import write_jsonl

    data = write_jsonl(records, tmp_path / "data.jsonl")
    return subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--work", str(tmp_path / "work"), "--data", str(data), *args],
        cwd=REPO, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip


def test_every_step_of_the_check_is_a_command_the_cli_takes(tmp_path):
    """Every step the check runs on a GPU — each kind, mode and position, both models — parses with the CLI's own
    parser, so a renamed flag fails here and not on a borrowed GPU."""
    import importlib.util

    from test_docs import parse_error

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    steps = [s for m in ("tiny-llama", "smollm2-135m") for s in gpu_check.model_steps(m, "cuda", tmp_path, "d.jsonl")]
    assert {kind for kind, _, _ in steps} == set(gpu_check.STEP_KINDS)
    for _, name, args in steps:
        assert args[:2] == ["-m", "topl_core"]
        assert parse_error(args[2:]) is None, (name, parse_error(args[2:]))


def test_the_check_passes_on_the_cpu_with_a_tiny_model(tmp_path, tiny_records):
    """The check's own machinery (its processes, environment, log and verdict) end to end on the CPU, on the steps
    the others build on (the two trainings, one steering), the kill and resume (SIGKILL after a checkpoint, resumed:
    the tensors of the run never killed, bit for bit), and every page's script on the runs it trained (--pages
    apptest, what a GPU machine without a browser runs; its process must also exit cleanly with the Steering page's
    work ahead in flight); every other step's command line is checked above, and the commands themselves are tested
    in-process (test_cli.py, test_steering.py, test_evaluation.py, test_sweeps.py, test_bf16.py)."""
    out = run_check(
        tmp_path, tiny_records, "--device", "cpu", "--models", "tiny-llama", "--modes", "vector",
        "--positions", "generated", "--steps", "train", "steer", "resume", "--pages", "apptest",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "5 passed, 0 failed" in out.stdout, out.stdout[-4000:]  # train ×2, steer, resume, pages
    assert "killed after" in out.stdout and "killed and resumed = straight" in out.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_gpu_acceptance(tmp_path, tiny_records):
    out = run_check(tmp_path, tiny_records, "--device", "cuda", "--models", "tiny-llama", "smollm2-135m")
    assert out.returncode == 0, out.stdout[-4000:]
