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


def test_the_check_passes_on_the_cpu_with_a_tiny_model(tmp_path, tiny_records):
    """Every step but six of the eight steering runs (each a process start, ~8 s on a slow CPU; the modes and
    positions themselves are tested in-process in test_steering.py and test_bf16.py)."""
    out = run_check(
        tmp_path, tiny_records, "--device", "cpu", "--models", "tiny-llama", "--modes", "vector", "conditional",
        "--positions", "generated",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    # train ×2, probe, 2 modes × 1 position, score-tokens, evaluate, sweep, merge-check
    assert "9 passed, 0 failed" in out.stdout, out.stdout[-4000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_gpu_acceptance(tmp_path, tiny_records):
    out = run_check(tmp_path, tiny_records, "--device", "cuda", "--models", "tiny-llama", "smollm2-135m")
    assert out.returncode == 0, out.stdout[-4000:]
