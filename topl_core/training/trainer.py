"""The one training loop. Every method is a Method of the registry (training/methods/); this loop owns data order, the
optimizer, precision, validation, checkpoints/resume, progress reporting and the run directory; its inputs (the
checked data, the base model, the batches) are made by run_inputs.py.

Resume is exact: data order is a pure function of (seed, step), and the checkpoint holds the adapter, head,
optimizer, scheduler and RNG state of the last completed step.
"""

from __future__ import annotations

import math
import shutil
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..data.records import Record
from ..foundations.errors import RunError
from ..foundations.io import give_umask_permissions, save_tensors
from ..foundations.status import WriterLock, clear_stop, stop_requested
from ..hardware.precision import autocast
from ..models.architecture import compile_layers
from ..models.loading import LoadedModel, hub_id, layer_count
from .batching import batch_for
from .card import write_card
from .checkpoint import (
    Trainable,
    checkpoint_state,
    device_rng_state,
    load_checkpoint,
    lora_state,
    write_checkpoint,
)
from .clock import TrainingClock
from .config import TrainConfig
from .lora import apply_lora, cast_lora_inputs
from .memory import check_fits, longest_micro_batch
from .methods import METHODS, Method
from .run_dirs import RunDir
from .run_inputs import RunBatches, prepare_inputs, run_meta
from .steps import StepContext, combine_micro_batches, read_back
from .tracking import Trackers, check_trackers, open_trackers
from .world import World


@dataclass(frozen=True)
class Progress:
    step: int
    steps: int
    loss: float
    elapsed_s: float
    eta_s: float
    tokens_per_s: float
    val: dict | None = None


ProgressCallback = Callable[[Progress], "bool | None"]  # return False to cancel (a checkpoint is kept)


class Cancelled(Exception):
    pass


def train(
    cfg: TrainConfig,
    out_dir: str | Path,
    progress: ProgressCallback | None = None,
    records: Sequence[Record] | None = None,
    base: LoadedModel | None = None,
    tracking_group: str | None = None,
) -> RunDir:
    """Train (or resume) a run into out_dir and return its RunDir. `base` is consumed (LoRA is injected into it).
    Stops with a checkpoint and state "cancelled" when `progress` returns False or a STOP file appears in out_dir.
    One writer per run directory: a second train into the same out_dir while this one runs is refused.
    `tracking_group` groups runs in the experiment trackers of cfg.report_to (a sweep's windows: its folder name).

    Example: ``run = train(TrainConfig(steps=20), "runs/topl-demo", progress=lambda p: print(p.step, p.loss))``"""
    run, world = RunDir(out_dir), World.current()
    if cfg.lora.layer_end is None:  # the range left to the model: from its depth, recorded as numbers
        cfg = cfg.for_depth(base.num_layers if base is not None else layer_count(cfg.model))
    check_trackers(cfg)  # a tracker asked for but not installed fails before any work
    with WriterLock(run.path) if world.is_main else nullcontext():  # rank 0 writes; the other ranks only compute
        return _train(cfg, run, progress, records, base, world, tracking_group)


def _train(cfg: TrainConfig, run: RunDir, progress, records, base, world: World, tracking_group: str | None) -> RunDir:
    method: Method = METHODS[cfg.method]
    resuming = _check_resumable(run, cfg)
    world.barrier()  # every rank has looked at the directory before rank 0 writes to it
    if resuming and run.is_complete:
        return run
    if world.is_main:
        clear_stop(run.path)  # a stop request belongs to the start it was made for
    base, batches = prepare_inputs(cfg, method, records, base)
    if cfg.device == "cuda" and not world.fsdp:
        _check_gpu_memory(cfg, base, batches)
    meta = run_meta(cfg, method, base, batches)
    if world.size > 1:
        meta |= {"world_size": world.size, **({"fsdp": True} if world.fsdp else {})}
    torch.manual_seed(cfg.seed)  # after loading: LoRA/head init depends on cfg.seed alone, however the base was built
    t = _trainable(cfg, method, base, meta["head_layer"], world)
    start = _open_run(run, cfg, meta, t, resuming, world)

    clock = TrainingClock()
    last_ckpt = completed = start
    trackers = Trackers()
    try:
        if world.is_main:  # rank 0 alone logs; a tracker that fails to open fails the run like any error
            with clock.overhead():  # not training time (MLflow's first open of a store migrates its schema)
                trackers = open_trackers(cfg, run, start, tracking_group)
        for step in range(start + 1, cfg.steps + 1):
            loss, info, tokens = _train_step(cfg, method, t, batches.train, step, world)
            completed, t.rng = step, device_rng_state()  # what a checkpoint of this step holds (validation draws none)
            row = {"step": step, "loss": loss, "lr": t.scheduler.get_last_lr()[0], **clock.step(tokens), **info}
            with clock.overhead():  # validation and checkpoints are not training time
                val = _validate(cfg, method, t, batches, step, world)
                ckpt = checkpoint_state(t, world) if step % cfg.checkpoint_every == 0 else None
            stop = world.is_main and _record_step(run, cfg, row, val, ckpt, clock, start, progress, trackers)
            if step % cfg.checkpoint_every == 0:
                last_ckpt = step
            if world.any(stop):
                raise Cancelled()
    except BaseException as e:
        state = "cancelled" if isinstance(e, (Cancelled, KeyboardInterrupt)) else "failed"
        # keep every completed step: checkpoint before leaving, so `train` here resumes (under FSDP only when all
        # ranks stop together: gathering the shards needs every rank)
        if completed > last_ckpt and (not world.fsdp or isinstance(e, Cancelled)):
            ckpt = checkpoint_state(t, world, all_ranks=isinstance(e, Cancelled))  # else its peers may not be here
            if world.is_main:
                write_checkpoint(run, ckpt, completed)
                last_ckpt = completed
        if world.is_main:
            run.write_status(state, max(completed, last_ckpt), cfg.steps, error=f"{type(e).__name__}: {e}")
        trackers.close(state)
        if isinstance(e, Cancelled):
            return run
        raise
    finally:
        if cfg.compile_backend:  # what the caller does next with the model (capture, steering) runs uncompiled
            compile_layers(t.model, "")
        cast_lora_inputs(t.model, True)  # and may run it outside autocast
    adapter = lora_state(t, world)  # whole tensors on every rank (all-gathered under FSDP)
    if world.is_main:
        _save_final(run, cfg, t, meta, adapter)
        run.write_status("finished", cfg.steps, cfg.steps, elapsed_s=clock.wall())
        write_card(run)  # over the empty template PEFT's save_pretrained wrote
        trackers.close("finished")
    world.barrier()  # the run is whole on disk before any rank returns it
    return run


def _validate(
    cfg: TrainConfig, method: Method, t: Trainable, batches: RunBatches, step: int, world: World
) -> dict | None:
    """The validation metrics when due (rank 0; every rank under FSDP, whose layers all-gather together)."""
    due = bool(batches.val) and (step % cfg.eval_every == 0 or step == cfg.steps)
    if not due or not (world.is_main or world.fsdp):
        return None
    return method.validate(t.ctx, batches.val, cfg.precision, cfg.device)


def _record_step(
    run: RunDir,
    cfg: TrainConfig,
    row: dict,
    val: dict | None,
    ckpt: dict | None,
    clock: TrainingClock,
    start: int,
    progress: ProgressCallback | None,
    trackers: Trackers,
) -> bool:
    """Rank 0's bookkeeping after a step: the metrics row (with validation when it ran; the experiment trackers
    get it too), the checkpoint when one was gathered, the status, and the progress report. True when the run is to
    stop (the callback said so, or a STOP request)."""
    step = row["step"]
    with clock.overhead():
        row.update(val or {})
        run.append_metrics(row)
        trackers.log(row)
        if ckpt is not None:
            write_checkpoint(run, ckpt, step)
        run.write_status("running", step, cfg.steps, loss=row["loss"])
    eta = clock.eta(step - start, cfg.steps - step)
    report = Progress(step, cfg.steps, row["loss"], row["elapsed_s"], eta, row["tokens_per_s"], val)
    return (progress is not None and progress(report) is False) or stop_requested(run.path)


def _check_gpu_memory(cfg: TrainConfig, base: LoadedModel, batches: RunBatches) -> None:
    """Before LoRA goes in: a clear error, instead of an out-of-memory crash mid-run, when the step on the longest
    micro-batch needs more than the GPU has free beside the loaded weights (training.memory; its accounting is that
    of bf16 weights, the validated case, so other weights are not checked)."""
    if base.model.dtype == torch.bfloat16:
        check_fits(cfg, base.model.config, longest_micro_batch(batches.train), torch.cuda.mem_get_info()[0])


def _trainable(
    cfg: TrainConfig, method: Method, base: LoadedModel, head_layer: int | None, world: World = World()
) -> Trainable:
    """LoRA injected into the base model (its layers sharded under FSDP), a zero-initialised head for head
    methods, AdamW (the head at lr × head_lr_multiplier) and a linear warm-up."""
    model = apply_lora(base.model, cfg)
    if cfg.gradient_checkpointing:  # the decoder layers recompute their activations in backward (training mode only)
        model.base_model.model.activation_checkpointing_enable({"use_reentrant": False})
    compile_layers(model, cfg.compile_backend)
    world.shard(model)  # before the optimizer: sharding replaces the parameters
    hidden = base.model.config.hidden_size
    head = _zero_linear(hidden, cfg.device) if method.uses_head else None
    with torch.random.fork_rng(devices=[]):  # probes draw no random numbers: a run's dropout masks stay its own
        probes = torch.nn.ModuleDict({str(k): _zero_linear(hidden, cfg.device) for k in cfg.probe_layers})
    lora_params = [p for p in model.parameters() if p.requires_grad]
    head_params = list(head.parameters()) if head else []
    probe_params = list(probes.parameters())
    groups = [{"params": lora_params}]
    if head_params:
        groups.append({"params": head_params + probe_params, "lr": cfg.lr * cfg.head_lr_multiplier})
    # fused: one kernel updates every parameter instead of a loop over them (on a GPU, one launch instead of several
    # per LoRA matrix; tested to step as the plain one)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=not world.fsdp)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)))
    ctx = StepContext(model, head, head_layer, cfg.beta, cfg.tdpo_alpha, probes if cfg.probe_layers else None)
    return Trainable(model, head, lora_params + head_params, optimizer, scheduler, ctx, probe_params)


def _zero_linear(hidden: int, device: str) -> torch.nn.Linear:
    """A head or probe at p = σ(0) = ½: uninformed, loss ≈ log 2, no wild first steps."""
    linear = torch.nn.Linear(hidden, 1).to(device)
    torch.nn.init.zeros_(linear.weight)
    torch.nn.init.zeros_(linear.bias)
    return linear


def _open_run(run: RunDir, cfg: TrainConfig, meta: dict, t: Trainable, resuming: bool, world: World) -> int:
    """Write the run's config and status (rank 0); on resume every rank loads the checkpoint. Returns the last
    completed step."""
    start = 0
    if resuming and run.checkpoint_dir.exists():
        start = load_checkpoint(run, t, world)
        world.barrier()  # all have read it before rank 0 may write a new one
        if world.is_main:
            run.truncate_metrics(start)
    elif world.is_main:
        run.path.mkdir(parents=True, exist_ok=True)
        run.metrics_path.unlink(missing_ok=True)
    if world.is_main:
        run.write_config(cfg, meta)
        run.write_status("running", start, cfg.steps)
    return start


def _train_step(
    cfg: TrainConfig, method: Method, t: Trainable, batches: list, step: int, world: World = World()
) -> tuple[float, dict, int]:
    """One optimizer step over grad_accum batches of micro-batches (this rank's share of them). Returns (loss, info,
    tokens seen) of the whole step."""
    t.model.train()
    done = []  # (micro-batch index, loss, info, tokens) of this rank's micro-batches
    micro = [b for k in range(cfg.grad_accum) for b in batch_for(batches, (step - 1) * cfg.grad_accum + k, cfg.seed)]
    mine = [i for i in range(len(micro)) if world.mine(i)]
    padding = world.passes(len(micro)) - len(mine)  # FSDP: passes of weight 0 keep every rank's all-gathers in step
    for index in mine + [-1] * padding:
        host = micro[max(index, 0)]
        batch = host.to(cfg.device)
        with autocast(cfg.precision, cfg.device):
            loss, info = method.loss(t.ctx, batch)
        # weight by what the loss averages over; the sum is divided by the step's total below
        (loss * (info[method.units_key] if index >= 0 else 0)).backward()
        if index >= 0:  # the loss and info stay on the device: one transfer for the whole step, after the last backward
            done.append((index, loss.detach(), info, host.real_tokens, host.input_ids.numel()))
    step_losses, step_infos = read_back([d[1] for d in done], [d[2] for d in done])
    done = [(d[0], x, info, *d[3:]) for d, x, info in zip(done, step_losses, step_infos)]
    world.sum_grads(t.params + t.probe_params)
    done = sorted(world.gather(done), key=lambda d: d[0])  # the whole step, in one process's order
    losses, infos, tokens = [d[1] for d in done], [d[2] for d in done], sum(d[3] for d in done)
    loss, info = combine_micro_batches(losses, infos, method.units_key, t.params + t.probe_params)
    info["padding_share"] = 1 - tokens / sum(d[4] for d in done)  # of the positions the step computed
    info["grad_norm"] = world.clip_grad_norm(t.params, cfg.max_grad_norm)
    if t.probe_params:  # clipped on their own: the run's own gradients are clipped as without probes
        world.clip_grad_norm(t.probe_params, cfg.max_grad_norm)
    t.optimizer.step()
    t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    if not math.isfinite(loss):
        raise FloatingPointError(f"loss became {loss} at step {step}; lower lr (now {cfg.lr}) or use precision=fp32.")
    return loss, info, tokens


def _save_final(run: RunDir, cfg: TrainConfig, t: Trainable, meta: dict, adapter: dict) -> None:
    """The finished adapter (PEFT save_pretrained of `adapter`, its LoRA tensors whole) and head; the checkpoint is
    no longer needed."""
    # name the base model as the workbench knows it (a hub id, an embedded name, a path the user gave) rather than
    # the local folder it was loaded from (e.g. the GGUF conversion under cache/models/), which no other machine has
    for peft_config in t.model.peft_config.values():
        peft_config.base_model_name_or_path = hub_id(cfg.model)
    # no hub lookup for resized embeddings (as in checkpoint_state)
    t.model.save_pretrained(run.path, state_dict=adapter, save_embedding_layers=False)
    give_umask_permissions(run.adapter_path)
    if t.head is not None:
        save_tensors(
            run.head_path,
            t.head.state_dict(),
            {"head_layer": str(meta["head_layer"]), "base_fingerprint": meta["base_fingerprint"]},
        )
    if t.ctx.probes:  # {"<layer>.weight", "<layer>.bias"}: the side probes, for a look at the layers below m
        save_tensors(run.probes_path, t.ctx.probes.state_dict())
    run.record_checksums()
    shutil.rmtree(run.checkpoint_dir, ignore_errors=True)


def _check_resumable(run: RunDir, cfg: TrainConfig) -> bool:
    """True when out_dir already holds this very run (same config); refuse to mix two configs in one directory."""
    if run.is_foreign:
        raise RunError(f"{run.path} exists and is not a run directory; choose an empty or new --out directory.")
    if not run.config_path.exists():
        return False
    old, _ = run.read_config()
    if old != cfg:
        diff = {k: (v, cfg.to_json()[k]) for k, v in old.to_json().items() if cfg.to_json()[k] != v}
        raise RunError(
            f"{run.path} holds a run with a different config (differs in {diff}); use another --out directory, "
            "or delete that run to start over."
        )
    return True
