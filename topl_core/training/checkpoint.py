"""A training run's checkpoint: what is trained (Trainable), its state written whole (so a run resumes on any world
size, with or without FSDP) into run/checkpoint/ atomically with per-file checksums, and read back — a checkpoint
whose files changed since it was written is refused, never resumed from.

The random state is every rank's, of every device it draws on (the CPU's generator and each CUDA device's: LoRA
dropout draws its masks on the device the activations are on), in rng.safetensors as `rank<r>.cpu`,
`rank<r>.cuda<i>`; each rank resumes with its own, so a resumed run draws the masks the uninterrupted one drew."""

from __future__ import annotations

import json
import os
import shutil
import warnings
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
    # this rank's random state after its last completed step (device_rng_state), what a checkpoint records: one taken
    # after a step was cut short (SIGTERM mid-step) must not hold the draws of the step it did not finish
    rng: dict[str, torch.Tensor] | None = None


ADAPTER = "default"  # the PEFT adapter name of a training run


def lora_state(t: Trainable, world: World) -> dict[str, torch.Tensor]:
    """The LoRA tensors whole, keyed as the model names them (all-gathered under FSDP: every rank calls this)."""
    return {n: world.full(p.detach()) for n, p in t.model.named_parameters() if "lora_" in n}


def device_rng_state() -> dict[str, torch.Tensor]:
    """This process's random state on every device: the CPU generator's, and each CUDA device's once CUDA is in use
    (before that, nothing has been drawn there)."""
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states |= {f"cuda{i}": torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())}
    return states


def restore_device_rng_state(states: dict[str, torch.Tensor]) -> None:
    """Set the generators device_rng_state read (a CUDA device this machine lacks is skipped: a run resumed on
    another machine cannot draw on it anyway)."""
    torch.set_rng_state(states["cpu"])
    for name, state in states.items():
        if name.startswith("cuda") and torch.cuda.is_available() and int(name[4:]) < torch.cuda.device_count():
            torch.cuda.set_rng_state(state, int(name[4:]))


def rng_entries(t: Trainable, world: World, all_ranks: bool = True) -> dict[str, torch.Tensor]:
    """Every rank's random state as rng.safetensors holds it (`rank<r>.<device>`). A collective when `all_ranks`
    (every rank must call it); without (a rank that stops on its own error: its peers are not here to gather),
    only this rank's."""
    mine = t.rng if t.rng is not None else device_rng_state()
    ranks = enumerate(world.gather([mine])) if all_ranks else [(world.rank, mine)]
    return {f"rank{r}.{device}": state for r, states in ranks for device, state in states.items()}


def restore_rng(saved: dict[str, torch.Tensor], rank: int) -> None:
    """This rank's random state from rng.safetensors (one written before ranks were recorded holds the CPU state
    alone, under "torch")."""
    if "torch" in saved:
        torch.set_rng_state(saved["torch"])
        return
    prefix = f"rank{rank}."
    mine = {name.removeprefix(prefix): state for name, state in saved.items() if name.startswith(prefix)}
    if not mine:  # written by rank 0 alone (an error on one rank), or by a smaller world
        warnings.warn(
            f"the checkpoint holds no random state of rank {rank} (written by ranks "
            f"{sorted({n.split('.')[0] for n in saved})}): its dropout masks from here differ from the uninterrupted "
            "run's.",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    restore_device_rng_state(mine)


def checkpoint_state(t: Trainable, world: World, all_ranks: bool = True) -> dict | None:
    """What a checkpoint holds, whole (so it resumes on any world size, with or without FSDP); None on ranks other
    than 0, after taking part in the all-gathers. `all_ranks`: every rank takes the checkpoint together (the
    random states are gathered); False for a rank leaving on an error of its own (rank 0's state alone)."""
    from peft import get_peft_model_state_dict

    # PEFT's default ("auto") asks the hub whether the base model's embeddings were resized; LoRA here never
    # touches them, so the answer is known: no lookup, no warning, no time-out on a network that drops packets
    adapter = get_peft_model_state_dict(t.model, state_dict=lora_state(t, world), save_embedding_layers=False)
    optimizer = t.optimizer.state_dict()  # its per-parameter dicts are the optimizer's own: copied, not changed
    optimizer["state"] = {  # in parameter order: the same on every rank
        index: {k: world.full(v) if isinstance(v, torch.Tensor) else v for k, v in param_state.items()}
        for index, param_state in optimizer["state"].items()
    }
    rng = rng_entries(t, world, all_ranks)
    if not world.is_main:
        return None
    return {
        "rng": rng,
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
    save_tensors(tmp / "rng.safetensors", ckpt["rng"])
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
        restore_rng(load_file(ck / "rng.safetensors"), world.rank)
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
