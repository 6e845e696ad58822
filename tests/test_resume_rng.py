"""Exact resume across devices and ranks (training/checkpoint.py): a checkpoint carries every rank's random state on
every device it draws on (the CPU's and each CUDA device's), and each rank resumes with its own. On a GPU the LoRA
dropout masks are drawn on the device, so the CPU state alone resumed another run; with two ranks, rank 1 resumed
with rank 0's state. scripts/gpu_check.py's "resume" step is the same check on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import free_port
from safetensors.torch import load_file

from topl_core.data.records import write_jsonl
from topl_core.foundations.io import save_tensors
from topl_core.foundations.status import request_stop
from topl_core.training.checkpoint import device_rng_state, restore_rng, rng_entries
from topl_core.training.run_dirs import RunDir
from topl_core.training.world import World


@pytest.fixture
def two_cuda_devices(monkeypatch):
    """torch.cuda as two initialised devices whose generators hold the states in the returned dict (a CPU machine
    stands in for a GPU one: what is saved and what is set are the functions' arguments either way)."""
    states = {i: torch.randint(0, 256, (16,), dtype=torch.uint8) for i in range(2)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=0: states[device].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device=0: states.__setitem__(device, state.clone()))
    return states


class TwoRanks(World):
    """Rank 0 of two, the other rank's states given: gather as torch.distributed's all_gather_object answers."""

    def __init__(self, other: dict):
        super().__init__(rank=0, size=2)
        object.__setattr__(self, "other", other)

    def gather(self, items: list) -> list:
        return items + [self.other]


def test_every_rank_and_device_random_state_round_trips_through_the_checkpoint_file(two_cuda_devices, tmp_path):
    cpu = torch.get_rng_state()
    rank1 = {"cpu": torch.Generator().manual_seed(1).get_state(), "cuda0": torch.full((16,), 7, dtype=torch.uint8),
             "cuda1": torch.full((16,), 9, dtype=torch.uint8)}  # fmt: skip
    mine = device_rng_state()
    entries = rng_entries(SimpleNamespace(rng=None), TwoRanks(rank1))
    assert sorted(entries) == [f"rank{r}.{d}" for r in (0, 1) for d in ("cpu", "cuda0", "cuda1")]
    save_tensors(tmp_path / "rng.safetensors", entries)  # the project's no-pickle format
    saved = load_file(tmp_path / "rng.safetensors")

    torch.manual_seed(123)  # every generator moved on
    two_cuda_devices.update({0: torch.zeros(16, dtype=torch.uint8), 1: torch.zeros(16, dtype=torch.uint8)})
    restore_rng(saved, rank=1)  # rank 1 takes its own states, not rank 0's
    assert torch.equal(torch.get_rng_state(), rank1["cpu"])
    assert torch.equal(two_cuda_devices[0], rank1["cuda0"]) and torch.equal(two_cuda_devices[1], rank1["cuda1"])
    restore_rng(saved, rank=0)
    assert torch.equal(torch.get_rng_state(), cpu) and torch.equal(two_cuda_devices[1], mine["cuda1"])
    with pytest.warns(RuntimeWarning, match="no random state of rank 2"):  # a larger world than wrote it
        restore_rng(saved, rank=2)


def _weights(run: RunDir) -> dict[str, object]:
    """Every tensor of the adapter and the head, as bytes, and the files' metadata: a safetensors header's metadata
    comes in another key order from each process, so the files' own bytes may differ where nothing else does."""
    from safetensors import safe_open

    out: dict[str, object] = {}
    for name, path in (("adapter", run.adapter_path), ("head", run.head_path)):
        with safe_open(str(path), "pt") as f:
            out[name] = {k: f.get_tensor(k).numpy().tobytes() for k in f.keys()}
            out[f"{name} metadata"] = f.metadata()
    return out


def test_two_ranks_stopped_and_resumed_equal_the_uninterrupted_two_ranks_bit_for_bit(tmp_path, tiny_records):
    """Two processes (accelerate, gloo on CPU) with LoRA dropout on: each rank draws its own masks, rank 0 for two
    micro-batches of a step of three, rank 1 for one, so their random states part. Stopped part-way and resumed in
    two processes, the adapter and head files equal those of a two-process run never stopped, byte for byte (rank 1
    resumed with rank 0's random state draws other masks, and ends elsewhere)."""
    data = write_jsonl(tiny_records, tmp_path / "d.jsonl")
    flags = ["--model", "tiny-llama", "--data", str(data), "--steps", "10", "--batch-size", "3",
             "--micro-batch-size", "1", "--lora-dropout", "0.3", "--eval-every", "1000", "--checkpoint-every", "2",
             "--max-doc-tokens", "64", "--lora-layer-end", "2"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def two_processes(*args: str) -> subprocess.Popen:
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                  "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                  "--main_process_port", str(free_port()), "-m", "topl_core", "train", *args]  # fmt: skip
        return subprocess.Popen(launch, stderr=subprocess.PIPE, text=True, env=env)

    straight = RunDir(tmp_path / "straight")
    proc = two_processes(*flags, "--out", str(straight.path))
    assert proc.wait(timeout=300) == 0, proc.stderr.read()

    stopped = RunDir(tmp_path / "stopped")
    proc = two_processes(*flags, "--out", str(stopped.path))
    deadline = time.monotonic() + 240
    while len(stopped.read_metrics()) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.01)
    request_stop(stopped.path)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    assert stopped.read_status()["state"] == "cancelled" and 3 <= stopped.read_status()["step"] < 10
    saved = load_file(stopped.checkpoint_dir / "rng.safetensors")
    assert {"rank0.cpu", "rank1.cpu"} <= set(saved) and not torch.equal(saved["rank0.cpu"], saved["rank1.cpu"])

    proc = two_processes("--resume", str(stopped.path))
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    assert stopped.read_status()["state"] == "finished"
    assert [r["loss"] for r in stopped.read_metrics()] == [r["loss"] for r in straight.read_metrics()]
    assert _weights(stopped) == _weights(straight)
