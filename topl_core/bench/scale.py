"""`python -m topl_core bench --scale`: the paper's presets at their published shape on one device, every part of the
workbench that scale makes slow, measured in one run per model (docs/bench/ holds the JSON of past runs).

Per model (a preset builds its published architecture with random weights, "<preset>@random", unless --hub; any other
model name loads as usual, e.g. tiny-llama for the CPU test):
- train_{topl,sft}: the paper preset's method settings (the TOPL layer range, all layers for SFT), a few steps
  through the workbench's trainer: median tokens/s and step seconds over the steps after the first, the padding
  share of the positions computed, peak device memory (CUDA: max_memory_allocated; None on a CPU), and mfu = the
  step's FLOPs (training.flops.topl_flops_per_token / sft_flops_per_token at the data's mean length) × tokens/s over the
  matmul peak measured in the same run; on a GPU also the largest micro-batch whose step fits, measured
  (largest_micro_batch). topl_vs_sft_step: TOPL's seconds per token over SFT's.
- capture: LoRA-A capture of every site of the SFT adapter (LoRA on every layer: layers × 7 sites) on 48 records.
- steering: one steered generation of `new_tokens` tokens per λ (the vector mode's 17 slider positions, −2..2 by
  0.25) run one λ at a time, the same grid as one batched generation (SteeringSession.generate_grid), and one λ at a
  time streamed through the compiled decode step (SteeringSession.compile_decode; CUDA graphs on a GPU): the compile
  (its first stream) and the streams after it timed apart, and how many of its texts are the eager ones.
- sweep: two adjacent 3-layer windows (fewer layers on a small model) trained with and without frozen-prefix
  reuse (bench.benchmark_prefix_reuse).
ScaleSettings.skip (--skip) leaves out fit (the largest-micro-batch probe), capture, steering or sweep.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..analysis.lora_a.capture import collect_projections
from ..analysis.lora_a.probe import ProbeSettings
from ..analysis.steering.extract import build_steering_vectors
from ..analysis.studies.sweeps import SweepConfig
from ..data.encode import collate, encode_record
from ..data.records import Record, read_jsonl
from ..data.split import split_records
from ..foundations.config_fields import config_field
from ..foundations.presets import PRESETS
from ..hardware.precision import autocast, resolve_precision
from ..inference.generate import GenerationConfig, load_merged
from ..models.loading import RANDOM_WEIGHTS, LoadedModel, ModelSpec, layer_count, load_model
from ..runtime.modes import MODES
from ..runtime.session import SteeringSession
from ..training.batching import EncodeSettings
from ..training.config import LoraSettings, TrainConfig, preset_config
from ..training.flops import sft_flops_per_token, topl_flops_per_token
from ..training.methods import METHODS
from ..training.steps import StepContext
from ..training.trainer import train
from .timing import matmul_peak_tflops, timed
from .workbench import benchmark_prefix_reuse

CAPTURE_RECORDS = 48
OPTIONAL_PARTS = ("fit", "capture", "steering", "sweep")  # ScaleSettings.skip: all but the training steps
MATMUL_MAX_N = {"cuda": 8192, "cpu": 1024}  # the largest matmul of the peak measurement (timing.matmul_peak_tflops)


def _peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def _reset_peak(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def model_name(name: str, hub: bool) -> str:
    """What the benchmark loads for a name: a preset's random-weight build unless the hub is to be used."""
    return f"{name}{RANDOM_WEIGHTS}" if name in PRESETS and not hub else name


def train_config(name: str, method: str, device: str, **overrides) -> TrainConfig:
    """The paper preset's settings for a preset; for any other model the same shape of run: TOPL on the first two
    thirds of the layers, SFT on all, batches of 16."""
    model = overrides.pop("model")
    if name in PRESETS:
        return preset_config(name, method, device=device, model=model, **overrides)
    layers = layer_count(model)
    end = round(layers * 2 / 3) if method == "topl" else layers - 1
    lora = LoraSettings(layer_start=0, layer_end=end)
    return TrainConfig(method=method, model=model, device=device, batch_size=16, lora=lora).with_overrides(**overrides)


def bench_training(
    cfg: TrainConfig, records: Sequence[Record], work: Path, peak_tflops: float
) -> tuple[dict, LoadedModel]:
    """Train `cfg` from a fresh base; its row and the trained model (the PEFT model is left in base.model)."""
    _reset_peak(cfg.device)
    base = load_model(ModelSpec.computing(cfg.model, cfg.precision, cfg.device))
    run = train(cfg, work / cfg.method, records=records, base=base)
    rows = [r for r in run.read_metrics() if "step_s" in r]
    timed = rows[1:] or rows  # the first step warms the kernels up
    tokens_per_s = statistics.median(r["step_tokens"] / r["step_s"] for r in timed)
    enc = [encode_record(base.tokenizer, r, cfg.max_doc_tokens, cfg.max_response_tokens) for r in records[:64]]
    seq_len = float(np.mean([len(e) for e in enc]))
    config = base.model.config
    if cfg.method == "topl":
        flops = topl_flops_per_token(config, cfg.lora.layer_end + 1, seq_len)
    else:
        predicted = sum(e.response_end - e.response_start + 1 for e in enc) / sum(len(e) for e in enc)
        flops = sft_flops_per_token(config, seq_len, predicted)
    row = {
        "lora_layers": f"{cfg.lora.layer_start}-{cfg.lora.layer_end}",
        "batch": f"{cfg.batch_size}x{cfg.grad_accum}",
        "micro_batch_size": cfg.micro_batch_size,
        "packing": cfg.packing,
        "compile_backend": cfg.compile_backend,
        "precision": cfg.precision,
        "losses": [round(r["loss"], 4) for r in rows],
        "step_s": statistics.median(r["step_s"] for r in timed),
        "tokens_per_s": tokens_per_s,
        "padding_share": float(np.mean([r["padding_share"] for r in rows])),
        "mean_tokens": seq_len,
        "attention": base.model.config._attn_implementation,  # sdpa: flash or memory-efficient kernels on a GPU
        "mfu": flops * tokens_per_s / (peak_tflops * 1e12),
        "peak_gib": _peak_gib(cfg.device),
    }
    return row, base


FIT_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)


def largest_micro_batch(cfg: TrainConfig, lm: LoadedModel, records: Sequence[Record]) -> tuple[int, int] | None:
    """The largest micro-batch (of FIT_CANDIDATES) whose forward and backward fit the GPU, measured: the method's
    loss step on that many of the data's longest examples, until the device runs out of memory; with the number of
    times that step made the host wait for the GPU (torch's sync debug mode). None on a CPU."""
    if cfg.device != "cuda":
        return None
    method = METHODS[cfg.method]
    examples = sorted(
        method.prepare(lm.tokenizer, records, EncodeSettings(cfg.max_doc_tokens, cfg.max_response_tokens)), key=len
    )
    head = torch.nn.Linear(lm.model.config.hidden_size, 1, device="cuda") if method.uses_head else None
    ctx = StepContext(lm.model, head, method.head_layer(cfg.lora.layer_end, lm.num_layers), cfg.beta, cfg.tdpo_alpha)
    lm.model.train()
    fits = None
    for size in FIT_CANDIDATES:
        batch = collate((examples * size)[-size:], lm.tokenizer.pad_token_id).to("cuda")  # the longest, repeated
        try:
            with autocast(cfg.precision, "cuda"), warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")  # each op that makes the host wait for the GPU warns
                try:
                    loss, _ = method.loss(ctx, batch)
                    loss.backward()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = sum("synchroniz" in str(w.message) for w in seen)
            torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            break
        finally:
            lm.model.zero_grad(set_to_none=True)
            loss = batch = None
            torch.cuda.empty_cache()
        fits = (size, syncs)
    return fits


def bench_capture(lm: LoadedModel, records: Sequence[Record], cfg: TrainConfig) -> dict:
    """LoRA-A capture of every site of a trained model on CAPTURE_RECORDS records."""
    proj, seconds = timed(
        cfg.device,
        lambda: collect_projections(
            lm.model, lm.tokenizer, records[:CAPTURE_RECORDS], precision=cfg.precision, batch_size=cfg.micro_batch_size
        ),
    )
    return {
        "sites": len(proj.sites),
        "records": min(CAPTURE_RECORDS, len(records)),
        "tokens": proj.n_tokens,
        "seconds": seconds,
    }


def bench_steering(run: Path, spec: ModelSpec, records: Sequence[Record], precision: str, new_tokens: int) -> dict:
    """Seconds of one steered generation per λ of the vector mode's slider grid, one at a time and as one batch; then
    one at a time streamed through the compiled decode step (SteeringSession.compile_decode: CUDA graphs on a GPU),
    its first stream (the compile) timed apart."""
    grid = MODES["vector"].slider_positions()
    base, merged = load_model(spec), load_merged(spec, run)
    vectors = build_steering_vectors(
        run,
        records,
        ProbeSettings(random_control=False, precision=precision),
        4,
        base=base,
        merged=merged,
        use_cache=False,
    )
    del base
    session = SteeringSession(merged, vectors)
    gen = GenerationConfig.chosen(precision, max_new_tokens=new_tokens)
    document = records[0].document
    session.generate_steered(document, grid[0], gen)  # warm-up
    serial, serial_s = timed(spec.device, lambda: [session.generate_steered(document, lam, gen) for lam in grid])
    batched, batched_s = timed(spec.device, lambda: session.generate_grid(document, grid, gen))
    session.compile_decode()
    streamed = lambda lam: [*session.stream_steered(document, lam, gen)][-1]  # noqa: E731
    _, compile_s = timed(spec.device, lambda: streamed(grid[0]))
    compiled, compiled_s = timed(spec.device, lambda: [streamed(lam) for lam in grid])
    return {
        "lambdas": len(grid),
        "new_tokens": new_tokens,
        "per_lambda_s": serial_s / len(grid),
        "grid_serial_s": serial_s,
        "grid_batched_s": batched_s,
        "batched_vs_serial": batched_s / serial_s,
        "same_texts": serial == batched,
        "compiles": session.compiles_decode(gen),
        "compile_s": compile_s,
        "per_lambda_compiled_s": compiled_s / len(grid),
        "compiled_vs_serial": compiled_s / serial_s,
        "compiled_same_texts": sum(a == b for a, b in zip(serial, compiled)),  # of `lambdas`: near-ties part in bf16
    }


def bench_sweep(cfg: TrainConfig, records: Sequence[Record], work: Path, layers: int) -> dict:
    """Two adjacent windows of 3 layers (fewer on a small model) in the middle of the model, with and without
    frozen-prefix reuse."""
    size = max(1, min(3, layers // 4))
    windows = [(layers // 2 - size, size), (layers // 2, size)]
    sweep = SweepConfig(train=replace(cfg, steps=3), windows=tuple(windows))
    table = benchmark_prefix_reuse(sweep, work, windows, records=records)  # the base: sweep_inputs loads it
    wall = table.groupby("mode")["wall_s"].sum()
    return {"windows": windows, "reuse_s": float(wall["reuse"]), "plain_s": float(wall["plain"])}


@dataclass(frozen=True)
class ScaleSettings:
    """What every model of one benchmark run gets: training steps per method (the first is warm-up), micro-batch
    size, packing and the compile backend of the training runs (TrainConfig), the real weights from the hub instead
    of a preset's random-weight build, tokens per steered generation, and how many records of the data are read."""

    device: str = config_field("cuda", label="Device", help="where every model is benchmarked")
    steps: int = config_field(
        4, label="Steps", help="training steps per method (the first is warm-up)", min=2, max=1000
    )
    micro_batch_size: int = config_field(4, label="Micro-batch size", help="TrainConfig.micro_batch_size", min=1)
    packing: bool = config_field(False, label="Packing", help="train on packed batches (TrainConfig.packing)")
    compile_backend: str = config_field(
        "", label="Compile backend", help="compile the decoder layers (TrainConfig.compile_backend)"
    )
    hub: bool = config_field(
        False, label="Hub weights", help="load the presets' real weights from the hub instead of random ones"
    )
    new_tokens: int = config_field(64, label="New tokens", help="tokens per steered generation", min=1)
    max_records: int = config_field(400, label="Records", help="records of the data read", min=1)
    skip: tuple[str, ...] = config_field(
        (), label="Skip", help="parts left out (a shorter run): " + ", ".join(OPTIONAL_PARTS), choices=OPTIONAL_PARTS
    )

    def phases(self) -> int:
        """The log lines (progress stages) of one model: TOPL, SFT, and each part not skipped but fit's."""
        return 2 + len(set(OPTIONAL_PARTS) - {"fit"} - set(self.skip))


def bench_model(
    name: str, settings: ScaleSettings, records: Sequence[Record], work: Path, peak_tflops: float, log: Callable
) -> dict:
    device, model = settings.device, model_name(name, settings.hub)
    common = dict(
        model=model,
        steps=settings.steps,
        micro_batch_size=settings.micro_batch_size,
        compile_backend=settings.compile_backend,
        eval_every=10_000,
        checkpoint_every=10_000,
        max_val_examples=8,
    )
    weights = "hub" if settings.hub or name not in PRESETS else "random (published shape)"
    row: dict = {"model": name, "weights": weights}
    test = [r for r in split_records(records)["test"] if r.token_labels_known]
    for method in ("topl", "sft"):
        log(f"{name}: {method} training, {settings.steps} steps")
        cfg = train_config(name, method, device, packing=settings.packing, **common)
        row[f"train_{method}"], trained = bench_training(cfg, records, work / name, peak_tflops)
        row.setdefault("params_b", sum(p.numel() for p in trained.model.parameters() if not p.requires_grad) / 1e9)
        if "fit" not in settings.skip:
            fits, waits = largest_micro_batch(cfg, trained, records) or (None, None)
            row[f"train_{method}"] |= {"largest_micro_batch": fits, "host_waits_per_micro_batch": waits}
        if method == "sft" and "capture" not in settings.skip:
            log(f"{name}: LoRA-A capture of every site")
            row["capture"] = bench_capture(trained, test, cfg)
        del trained
        _reset_peak(device)
    row["topl_vs_sft_step"] = row["train_sft"]["tokens_per_s"] / row["train_topl"]["tokens_per_s"]
    precision = row["train_topl"]["precision"]
    if "steering" not in settings.skip:
        log(f"{name}: steering, one λ at a time, the grid as one batch, and compiled")
        spec = ModelSpec.computing(model, precision, device)
        row["steering"] = bench_steering(work / name / "topl", spec, test, precision, settings.new_tokens)
        _reset_peak(device)
    if "sweep" not in settings.skip:
        log(f"{name}: layer-sweep windows with and without frozen-prefix reuse")
        topl = train_config(name, "topl", device, **common)
        row["sweep"] = bench_sweep(topl, records, work / name / "sweep", layer_count(model))
        _reset_peak(device)
    return row


def run_scale_bench(
    models: Sequence[str], data: str, settings: ScaleSettings = ScaleSettings(), log: Callable[[str], None] = print
) -> dict:
    precision = resolve_precision("auto", settings.device)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    res: dict = {
        "device": torch.cuda.get_device_name() if settings.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "precision": precision,
        "matmul_peak_tflops": matmul_peak_tflops(dtype, settings.device, MATMUL_MAX_N[settings.device]),
        "settings": asdict(settings),
        "rows": [],
    }
    records = read_jsonl(data)[: settings.max_records]
    with tempfile.TemporaryDirectory(prefix="topl-scale-") as work:
        for name in models:
            res["rows"].append(bench_model(name, settings, records, Path(work), res["matmul_peak_tflops"], log))
    return res


def format_scale(res: dict) -> str:
    """The benchmark as a table, one line per model and method."""
    lines = [
        f"{res['device']}, {res['precision']}, matmul peak {res['matmul_peak_tflops']:.1f} TFLOP/s",
        f"{'model':14s} {'method':6s} {'tok/s':>9s} {'MFU':>6s} {'peak GiB':>9s} {'padding':>8s}",
    ]
    for row in res["rows"]:
        for method in ("topl", "sft"):
            t = row[f"train_{method}"]
            peak = "-" if t["peak_gib"] is None else f"{t['peak_gib']:.1f}"
            lines.append(
                f"{row['model']:14s} {method:6s} {t['tokens_per_s']:9.0f} {t['mfu']:6.1%} {peak:>9s} "
                f"{t['padding_share']:8.1%}"
            )
        parts = [f"TOPL/SFT step {row['topl_vs_sft_step']:.2f}"]
        if cap := row.get("capture"):
            parts.append(f"capture {cap['sites']} sites × {cap['records']} records {cap['seconds']:.1f} s")
        if st := row.get("steering"):
            parts.append(
                f"steering {st['per_lambda_s']:.2f} s per λ, {st['lambdas']} λ batched {st['grid_batched_s']:.2f} s "
                f"({st['batched_vs_serial']:.2f} of one at a time), compiled {st['per_lambda_compiled_s']:.2f} s per "
                f"λ after {st['compile_s']:.1f} s ({st['compiled_same_texts']}/{st['lambdas']} texts as eager)"
            )
        if sw := row.get("sweep"):
            parts.append(f"sweep windows reuse {sw['reuse_s']:.1f} s / plain {sw['plain_s']:.1f} s")
        lines.append("  " + "; ".join(parts))
    return "\n".join(lines)
