"""A training run's checkpoint: what is trained (Trainable), its state written whole (so a run resumes on any world
size, with or without FSDP) into run/checkpoint/ atomically with per-file checksums, and read back — a checkpoint
whose files changed since it was written is refused, never resumed from."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..foundations.errors import RunError
from ..foundations.io import checksum_problem, save_tensors, sha256_file, write_json
from .run_dirs import HEAD_FILE, PROBES_FILE, RunDir
from .steps import StepContext
from .world import World


@dataclass
class Trainable:
    """The model with its LoRA, the head, and what updates them."""

    model: torch.nn.Module
    head: torch.nn.Linear | None
    params: list[torch.nn.Parameter]  # LoRA and head
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ctx: StepContext
    probe_params: list[torch.nn.Parameter] = field(default_factory=list)  # the side probes'


ADAPTER = "default"  # the PEFT adapter name of a training run


def lora_state(t: Trainable, world: World) -> dict[str, torch.Tensor]:
    """The LoRA tensors whole, keyed as the model names them (all-gathered under FSDP: every rank calls this)."""
    return {n: world.full(p.detach()) for n, p in t.model.named_parameters() if "lora_" in n}


def checkpoint_state(t: Trainable, world: World) -> dict | None:
    """What a checkpoint holds, whole (so it resumes on any world size, with or without FSDP); None on ranks other
    than 0, after taking part in the all-gathers."""
    from peft import get_peft_model_state_dict

    # PEFT's default ("auto") asks the hub whether the base model's embeddings were resized; LoRA here never
    # touches them, so the answer is known: no lookup, no warning, no time-out on a network that drops packets
    adapter = get_peft_model_state_dict(t.model, state_dict=lora_state(t, world), save_embedding_layers=False)
    optimizer = t.optimizer.state_dict()  # its per-parameter dicts are the optimizer's own: copied, not changed
    optimizer["state"] = {  # in parameter order: the same on every rank
        index: {k: world.full(v) if isinstance(v, torch.Tensor) else v for k, v in param_state.items()}
        for index, param_state in optimizer["state"].items()
    }
    if not world.is_main:
        return None
    return {
        "adapter": adapter,
        "head": t.head.state_dict() if t.head is not None else None,
        "probes": t.ctx.probes.state_dict() if t.ctx.probes else None,
        "optimizer": {"optimizer": optimizer, "scheduler": t.scheduler.state_dict()},
    }


def write_checkpoint(run: RunDir, ckpt: dict, step: int) -> None:
    tmp = run.path / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_tensors(tmp / "adapter.safetensors", ckpt["adapter"])
    for name, file in (("head", HEAD_FILE), ("probes", PROBES_FILE)):
        if ckpt[name] is not None:
            save_tensors(tmp / file, ckpt[name])
    save_tensors(tmp / "rng.safetensors", {"torch": torch.get_rng_state()})
    torch.save(ckpt["optimizer"], tmp / "optimizer.pt")
    checksums = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
    write_json(tmp / "state.json", {"step": step, "checksums": checksums})
    old = run.path / "checkpoint.old"
    shutil.rmtree(old, ignore_errors=True)
    if run.checkpoint_dir.exists():
        os.replace(run.checkpoint_dir, old)
    os.replace(tmp, run.checkpoint_dir)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(run: RunDir, t: Trainable, world: World) -> int:
    from safetensors.torch import load_file

    ck = run.checkpoint_dir
    try:
        state = json.loads((ck / "state.json").read_text())
        step = state["step"]
        verify_checkpoint(ck, state.get("checksums"))
        saved = load_file(ck / "adapter.safetensors")
        with torch.no_grad():  # into whole or sharded parameters alike (PEFT's keys lack the adapter name)
            for name, p in t.model.named_parameters():
                if "lora_" in name:
                    p.copy_(world.place(saved[name.replace(f".{ADAPTER}", "")], p))
        if t.head is not None:
            t.head.load_state_dict(load_file(ck / HEAD_FILE))
        if t.ctx.probes:
            t.ctx.probes.load_state_dict(load_file(ck / PROBES_FILE))
        opt = torch.load(ck / "optimizer.pt", weights_only=True)
        params = [p for group in t.optimizer.param_groups for p in group["params"]]
        for index, param_state in opt["optimizer"]["state"].items():
            for k, v in param_state.items():
                if isinstance(v, torch.Tensor) and v.shape == params[index].shape:  # not Adam's step count
                    param_state[k] = world.place(v, params[index])
        t.optimizer.load_state_dict(opt["optimizer"])
        t.scheduler.load_state_dict(opt["scheduler"])
        torch.set_rng_state(load_file(ck / "rng.safetensors")["torch"])
    except RunError:
        raise
    except Exception as e:
        raise RunError(
            f"{ck}: checkpoint is corrupt ({type(e).__name__}: {e}); delete {ck} to restart the run from step 0."
        ) from e
    return int(step)


def verify_checkpoint(ck: Path, checksums: dict | None) -> None:
    """Refuse a checkpoint whose files changed since it was written (a flipped byte can still parse, and would
    resume silently from wrong weights or optimizer state)."""
    if checksums is None:
        raise RunError(
            f"{ck}/state.json records no checksums (written by an older version or edited), so the checkpoint "
            f"cannot be verified; delete {ck} to restart the run from step 0."
        )
    if problem := checksum_problem(ck, checksums):
        path, what = problem
        raise RunError(
            f"{path}: {what} since the checkpoint was written (checksum in state.json) — the checkpoint is "
            f"corrupt. Delete {ck} to restart the run from step 0."
        )
