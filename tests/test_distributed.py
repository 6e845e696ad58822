"""`train` under `accelerate launch --num_processes 2` on CPU (gloo), replicated and FSDP-sharded: the same steps
as one process with the same global batch, only rank 0 writing the run, and a resume of the two-process checkpoint
in one process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import free_port

from topl_core.data.records import write_jsonl
from topl_core.foundations.status import request_stop
from topl_core.training.run_dirs import RunDir
from topl_core.training.trainer import train

# One process's gradient is one sum; two ranks' are two partial sums added: equal up to float rounding.
RTOL, ATOL = 1e-4, 1e-6


def _weights(run: RunDir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run.adapter_path) | {f"head.{k}": v for k, v in run.load_head().state_dict().items()}


@pytest.mark.parametrize("sharding", ["replicated", "fsdp"])
def test_two_processes_take_one_process_steps_and_resume_in_one(tmp_path, tiny_records, sharding):
    """Replicated (DDP-like: every rank a whole model) and FSDP (accelerate's --use_fsdp: the decoder layers and
    their LoRA sharded across the ranks) alike."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = write_jsonl(tiny_records, tmp_path / "d.jsonl")
    flags = ["--model", "tiny-llama", "--data", str(data), "--steps", "20", "--batch-size", "4",
             "--micro-batch-size", "1", "--lora-dropout", "0", "--eval-every", "1000", "--checkpoint-every", "2",
             "--max-doc-tokens", "64", "--lora-layer-end", "2", "--report-to", "tensorboard"]  # fmt: skip
    # --multi_gpu / --use_fsdp start accelerate's torchrun launcher; without GPUs its processes join over gloo on CPU
    mode = "--use_fsdp" if sharding == "fsdp" else "--multi_gpu"
    launch = [sys.executable, "-m", "accelerate.commands.launch", mode, "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port()), "-m", "topl_core", "train"]  # fmt: skip
    two = RunDir(tmp_path / "two")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*launch, *flags, "--out", str(two.path)], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    while len(two.read_metrics()) < 3:  # stop both ranks part-way: rank 0 sees the request and tells rank 1
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.01)
    request_stop(two.path)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    status = two.read_status()
    assert status["state"] == "cancelled" and 3 <= status["step"] < 20
    stopped = status["step"]
    assert [r["step"] for r in two.read_metrics()] == list(range(1, stopped + 1))  # one writer: each step once
    cfg, meta = two.read_config()
    assert meta["world_size"] == 2 and meta.get("fsdp", False) == (sharding == "fsdp")
    assert len(list(two.path.glob("events.out.tfevents.*"))) == 1  # rank 0 alone logs to the trackers

    train(cfg, two.path)  # the two-process checkpoint, resumed in this one process
    one = train(cfg, tmp_path / "one")  # the same config, one process throughout
    assert two.read_status()["state"] == "finished"
    loss_two = [r["loss"] for r in two.read_metrics()]
    loss_one = [r["loss"] for r in one.read_metrics()]
    assert loss_two == pytest.approx(loss_one, rel=RTOL, abs=ATOL)
    events = EventAccumulator(str(two.path))  # both starts' event files: every step once
    events.Reload()
    logged = events.Scalars("loss")
    assert [e.step for e in logged] == list(range(1, 21))
    assert [e.value for e in logged] == pytest.approx(loss_two, rel=1e-6)  # float32 in the event file
    a, b = _weights(two), _weights(one)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=RTOL, atol=ATOL, msg=k)


def test_the_example_accelerate_configs_load_with_accelerate():
    """configs/accelerate/*.yaml as accelerate reads them: one GPU, four GPUs replicated, four GPUs FSDP, two nodes."""
    from pathlib import Path

    from accelerate.commands.config.config_args import ClusterConfig

    folder = Path(__file__).parent.parent / "configs" / "accelerate"
    got = {p.stem: ClusterConfig.from_yaml_file(p) for p in sorted(folder.glob("*.yaml"))}
    shape = {name: (c.distributed_type.value, c.num_processes, c.num_machines) for name, c in got.items()}
    assert shape == {
        "one-gpu": ("NO", 1, 1),
        "four-gpus": ("MULTI_GPU", 4, 1),
        "fsdp-four-gpus": ("FSDP", 4, 1),
        "two-nodes": ("MULTI_GPU", 8, 2),
    }
