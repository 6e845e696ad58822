"""`python -m topl_core bench`: the workbench against the machine's measured limit and the naive way, in one run.

Every speed figure is a ratio of two things measured side by side in this process (absolute times are noisy on
shared machines). Definitions:

- matmul_peak_tflops_{fp32,bf16}: best of several large square matmuls (2·n³ FLOPs each); n grows from 256 to
  2048 while one matmul stays under a second (on a CPU that emulates bf16, a 2048² bf16 matmul takes a minute).
- precision: the compute precision the benchmark resolved (--precision, "auto" by default:
  topl_core.hardware.precision) and runs every phase in.
- train_mfu: TOPL training FLOPs per second over the peak of that precision. FLOPs counted for the layers that actually
  run (0..m, no LM head): forward 2·N_run + attention 2·L·T·d (causal half of 4·L·T·d) per token; backward the same
  again (gradients w.r.t. activations only — the base weights are frozen, so no weight gradients; LoRA's own
  FLOPs are < 1% and ignored).
- topl_vs_sft_step: TOPL step time / SFT step time per token, same data, same LoRA (layers 0..m, m = 20 of 30),
  same batch size, the resolved precision. TOPL stops after layer m; SFT runs every layer and the LM head.
- steered_vs_plain_generate: merged-model generation with LoRA-B steering hooks (λ = 2, top-4 sites) / without,
  the same number of new tokens (min = max), greedy, KV cache on.
- capture_vs_plain_forward: LoRA-A capture of every site of an all-layer adapter (30 × 7 = 210 sites) / a plain
  no-grad forward of the same model on the same batch.
- sweep_cached_vs_naive: a sliding-window sweep grid with frozen-prefix reuse / the same grid without it.
- heatmap_reload_s: seconds to reopen a cached LoRA-A separability result (probe_run on a warm cache).
- peak_rss_gib: peak resident memory of the training subprocess (TOPL run), GiB.
- generate_tokens_per_s, train_tokens_per_s: for the record.
- topl_vs_sft_flops, sweep_cached_vs_naive_flops: the same two ratios in FLOPs, the floor that cutting work
  can reach (a measured ratio below it would mean the faster side is also more efficient per FLOP).
- phase_s: wall seconds of each phase of the benchmark.

`bench --executors` measures instead where a study's tasks run (benchmark_executors): ray_vs_local = the wall time
of a sweep grid run as Ray tasks / the same grid run serially in this process, both from scratch.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd
import torch

from ..analysis.lora_a.capture import capture_lora
from ..analysis.lora_a.probe import ProbeSettings, probe_run
from ..analysis.steering.extract import build_steering_vectors
from ..analysis.studies.sweeps import SweepConfig, Window, fresh_copy, plan_windows, run_sweep, sweep_inputs
from ..data.encode import build_prompt, collate, encode_record
from ..data.records import read_jsonl
from ..data.split import split_records
from ..foundations.executor import ExecutorConfig
from ..foundations.io import write_json
from ..foundations.paths import PROJECT_ROOT, cache_dir
from ..foundations.presets import DEFAULT_MODEL
from ..foundations.progress import Bar
from ..hardware.precision import autocast, resolve_precision
from ..models.loading import LoadedModel, load_model
from ..runtime.modes import steer
from ..training.adapters import load_adapter
from ..training.config import LoraSettings, TrainConfig
from ..training.flops import sft_flops_per_token, sweep_flops_ratio, topl_flops_per_token
from ..training.lora import apply_lora
from ..training.prefix_cache import PrefixStore, install_prefix_cache
from ..training.run_dirs import RunDir
from ..training.trainer import train
from .slider import GOALS as SLIDER_GOALS
from .timing import best_times, matmul_peak_tflops

GOALS = {
    "train_mfu": (">=", 0.20),
    "topl_vs_sft_step": ("<=", 0.5),
    "steered_vs_plain_generate": ("<=", 1.05),
    "capture_vs_plain_forward": ("<=", 1.3),
    "sweep_cached_vs_naive": ("<=", 0.5),
    "heatmap_reload_s": ("<=", 0.5),
    "peak_rss_gib": ("<=", 4.0),
    **SLIDER_GOALS,
}
# what the full benchmark keeps of bench --slider's figures (topl_core/bench/slider.py)
SLIDER_FIGURES = ("slider_vs_naive", "first_token_vs_naive", "slider_compiled_vs_naive", "decode_ms_per_token")


def _train_subprocess(args: list[str], env: dict) -> tuple[Path, float]:
    """Run `python -m topl_core train ...` in a child; return its run dir and the child's peak RSS (GiB)."""
    out = Path(args[args.index("--out") + 1])
    proc = subprocess.run(
        [sys.executable, "-m", "topl_core", "train", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"bench training run failed:\n{proc.stderr[-3000:]}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # max over finished children so far
    return out, peak_kib / 2**20


def _step_seconds_per_token(run_dir: Path) -> float:
    """Seconds per token over the logged steps after the first (warm-up) step."""
    timed = RunDir(run_dir).step_times()[1:]
    return sum(s for s, _ in timed) / sum(tok for _, tok in timed)


N_PHASES = 7  # the phase(...) calls in run_bench: peaks, TOPL, SFT, capture, generation, heatmap, sweep


def run_bench(
    quick: bool, data: str, model: str = DEFAULT_MODEL, log: Callable[[str], None] = print, precision: str = "auto"
) -> dict:
    res: dict = {"quick": quick, "model": model, "threads": torch.get_num_threads()}
    work = Path(tempfile.mkdtemp(prefix="topl-bench-"))
    env = {**os.environ, "TOPL_CACHE_DIR": str(work / "cache"), "PYTHONPATH": str(PROJECT_ROOT)}
    # the converted model lives in the normal cache: point the child at it instead of converting again

    (work / "cache").mkdir()
    if (cache_dir() / "models").exists():
        (work / "cache" / "models").symlink_to(cache_dir() / "models")
    os.environ["TOPL_CACHE_DIR"] = env["TOPL_CACHE_DIR"]

    phases: dict[str, float] = {}
    current = ["", time.perf_counter()]

    def phase(name: str) -> None:
        """Start timing a phase (and end the previous one); an empty name only ends it."""
        now = time.perf_counter()
        if current[0]:
            phases[current[0]] = now - current[1]
        current[:] = [name, now]
        if name:
            log(f"{name} …")

    phase("matmul peaks")
    res["matmul_peak_tflops_fp32"] = matmul_peak_tflops(torch.float32)
    res["matmul_peak_tflops_bf16"] = matmul_peak_tflops(torch.bfloat16)
    res["precision"] = precision = resolve_precision(precision)

    lm = load_model(model)
    head_layer = round(lm.num_layers * 2 / 3)  # m = 20 of SmolLM2's 30 layers
    res["head_layer"] = head_layer
    steps = 3 if quick else 8  # the first step is warm-up; the rest are timed
    common = [
        "--model",
        model,
        "--data",
        data,
        "--steps",
        str(steps),
        "--batch-size",
        "8",
        "--lora-layer-end",
        str(head_layer),
        "--max-val-examples",
        "8",
        "--eval-every",
        "1000",
        "--checkpoint-every",
        "1000",
        "--precision",
        precision,
    ]
    phase(f"TOPL training ({steps} steps)")
    topl_dir, res["peak_rss_gib"] = _train_subprocess([*common, "--method", "topl", "--out", str(work / "topl")], env)
    phase(f"SFT training ({steps} steps)")
    sft_dir, _ = _train_subprocess([*common, "--method", "sft", "--out", str(work / "sft")], env)
    topl_spt, sft_spt = _step_seconds_per_token(topl_dir), _step_seconds_per_token(sft_dir)
    res["topl_vs_sft_step"] = topl_spt / sft_spt
    res["train_tokens_per_s"] = 1 / topl_spt

    records = read_jsonl(data)
    test = [r for r in split_records(records)["test"] if r.token_labels_known][: 8 if quick else 24]
    enc = [encode_record(lm.tokenizer, r, 320, 128) for r in test[:8]]
    seq_len = sum(len(e) for e in enc) / len(enc)
    predicted = sum(e.response_end - e.response_start + 1 for e in enc) / sum(len(e) for e in enc)  # + end of turn
    config = lm.model.config
    res["train_mfu"] = (
        topl_flops_per_token(config, head_layer + 1, seq_len)
        * res["train_tokens_per_s"]
        / (res[f"matmul_peak_tflops_{precision}"] * 1e12)
    )
    res["topl_vs_sft_flops"] = topl_flops_per_token(config, head_layer + 1, seq_len) / sft_flops_per_token(
        config, seq_len, predicted
    )

    phase("capture vs plain forward")
    peft = apply_lora(
        load_model(model).model, TrainConfig(model=model, lora=LoraSettings(layer_start=0, layer_end=lm.num_layers - 1))
    ).eval()
    b = collate(enc[:4], lm.tokenizer.pad_token_id)
    select = b.labels != -1

    @torch.no_grad()
    def plain() -> None:
        with autocast(precision, "cpu"):
            peft(input_ids=b.input_ids, attention_mask=b.attention_mask)

    @torch.no_grad()
    def captured() -> None:
        with capture_lora(peft) as cap, autocast(precision, "cpu"):
            cap.run(b.input_ids, b.attention_mask, select)

    with capture_lora(peft) as cap:
        res["capture_sites"] = len(cap.sites)
    reps = 2 if quick else 4
    t = best_times({"plain": plain, "captured": captured}, reps)
    res["capture_vs_plain_forward"] = t["captured"] / t["plain"]
    peft = None  # free the all-layer copy before generation (a `del` would leave the closures above unbound)

    phase("steered vs plain generation")
    vectors = build_steering_vectors(topl_dir, test, ProbeSettings(random_control=False, precision=precision), top_k=4)
    merged = load_adapter(load_model(model), topl_dir, merge=True)
    prompt = build_prompt(lm.tokenizer, test[0].document[:1500])
    ids = lm.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    n_new = 32 if quick else 64

    @torch.no_grad()
    def gen() -> None:
        with autocast(precision, "cpu"):
            merged.generate(
                **ids,
                max_new_tokens=n_new,
                min_new_tokens=n_new,
                do_sample=False,
                pad_token_id=lm.tokenizer.pad_token_id,
            )

    def gen_steered() -> None:
        with steer(merged, vectors, 2.0):
            gen()

    t = best_times({"plain": gen, "steered": gen_steered}, reps)
    t_plain = t["plain"]
    res["steered_vs_plain_generate"] = t["steered"] / t_plain
    res["generate_tokens_per_s"] = n_new / t_plain

    phase("heatmap (compute, then reload)")
    settings = ProbeSettings(random_control=False, precision=precision)
    probe_run(topl_dir, test, settings)  # compute and cache
    t = time.perf_counter()
    probe_run(topl_dir, test, settings)
    res["heatmap_reload_s"] = time.perf_counter() - t

    phase("sweep with and without frozen-prefix reuse")
    # the standard grid (sizes 3, 6, 12, stride 3: 26 windows on SmolLM2); --quick thins it to 6 windows
    sizes = [k for k in ((3, 6) if quick else (3, 6, 12)) if k <= lm.num_layers]
    windows = tuple((w.start, w.size) for w in plan_windows(lm.num_layers, sizes, 12 if quick else 3))
    sweep_train = TrainConfig(
        model=model,
        data=data,
        steps=2,
        batch_size=8,
        eval_every=1000,
        checkpoint_every=1000,
        max_val_examples=8,
        precision=precision,
    )
    sweep_records = records[:160]
    timings = {}
    for reuse in (True, False):
        t = time.perf_counter()
        run_sweep(
            SweepConfig(train=sweep_train, windows=windows, reuse_prefix=reuse),
            work / f"sweep-{reuse}",
            records=sweep_records,
        )
        timings[reuse] = time.perf_counter() - t
    res["sweep_windows"] = len(windows)
    res["sweep_cached_vs_naive_flops"] = sweep_flops_ratio(list(windows))
    res["sweep_cached_vs_naive"] = timings[True] / timings[False]
    phase("")
    res["phase_s"] = phases
    return res


def benchmark_prefix_reuse(
    cfg: SweepConfig,
    work_dir: str | Path,
    windows: Sequence[tuple[int, int]] | None = None,
    progress: Callable[[str], None] | None = None,
    records=None,
    base_loader: Callable[[], LoadedModel] | None = None,
):
    """Time the same windows trained with and without frozen-prefix reuse, interleaved window by window (the
    order of the two alternates), so that load from other processes hits both alike. Rows: window, start, size,
    mode ("reuse" / "plain"), wall_s, cpu_s (this process's CPU time), val_token_auroc, prefix layer passes.
    Runs go to work_dir/{reuse,plain}/<window>; existing finished runs are retrained (the directory is cleared)."""
    work_dir = Path(work_dir)
    base, records = sweep_inputs(cfg, base_loader, records)
    ws = sorted({Window(s, k) for s, k in windows}) if windows else cfg.window_list(base.num_layers)
    store = PrefixStore()
    rows = []
    for i, w in enumerate(ws):
        for mode in ("reuse", "plain") if i % 2 == 0 else ("plain", "reuse"):
            out = work_dir / mode / w.name
            shutil.rmtree(out, ignore_errors=True)
            before = replace(store.stats)
            t0, c0 = time.perf_counter(), time.process_time()
            lm = fresh_copy(base)
            if mode == "reuse":
                install_prefix_cache(lm, store, w.start)
            run = train(cfg.window_config(w), out, records=records, base=lm)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            val = next((r for r in reversed(run.read_metrics()) if "val_token_auroc" in r), {})
            passes = store.stats.layer_passes - before.layer_passes if mode == "reuse" else 0
            rows.append(
                {
                    "window": w.name,
                    "start": w.start,
                    "size": w.size,
                    "mode": mode,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "val_token_auroc": val.get("val_token_auroc", float("nan")),
                    "prefix_layer_passes": passes,
                }
            )
            if progress:
                progress(
                    f"{w.name} {mode}: {wall:.1f} s wall, {cpu:.1f} s CPU, val AUROC {rows[-1]['val_token_auroc']:.3f}"
                )
    return pd.DataFrame(rows)


def benchmark_executors(
    model: str = DEFAULT_MODEL, data: str = "", steps: int = 10, windows=((0, 3), (8, 3), (16, 3), (24, 3))
) -> dict:
    """One sweep grid run twice, each from scratch: serially in this process (torch on every core) and as Ray tasks
    on a Ray instance started for it (one CPU per task, as many tasks at once as the machine has cores; its start
    and the workers' imports and model loads are counted). Wall seconds of both, their ratio, and the largest
    difference between the two runs' window AUROCs (the results must agree)."""

    train = TrainConfig(model=model, data=data, steps=steps, batch_size=8, eval_every=steps, checkpoint_every=steps)
    cfg = SweepConfig(train=train, windows=tuple(windows))
    res: dict = {"sweep_windows": len(windows), "steps_per_window": steps, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as work:
        tables = {}
        for kind in ("local", "ray"):
            t = time.perf_counter()
            tables[kind] = run_sweep(cfg, Path(work) / kind, executor=ExecutorConfig(kind=kind)).set_index("window")
            res[f"{kind}_s"] = time.perf_counter() - t
    res["ray_vs_local"] = res["ray_s"] / res["local_s"]
    diff = (tables["ray"]["val_token_auroc"] - tables["local"]["val_token_auroc"]).abs()
    res["max_auroc_difference"] = float(diff.max())
    return res


def format_table(res: dict) -> str:
    lines = [f"{'metric':28s} {'value':>10s}  goal"]
    for k, v in res.items():
        if isinstance(v, dict):
            lines += [f"{k}:"] + [f"  {name:26s} {x:10.1f}" for name, x in v.items()]
            continue
        goal = GOALS.get(k)
        g = f"{goal[0]} {goal[1]}" if goal else ""
        ok = "" if not goal else ("  met" if (v >= goal[1] if goal[0] == ">=" else v <= goal[1]) else "  MISSED")
        val = f"{v:10.3f}" if isinstance(v, float) else f"{v!s:>10s}"
        lines.append(f"{k:28s} {val}  {g}{ok}")
    return "\n".join(lines)


def main(
    quick: bool,
    data: str,
    json_path: str | None,
    model: str,
    executors: bool = False,
    precision: str = "auto",
    slider: Callable[[], dict] | None = None,
) -> dict:
    """The benchmark (or, with `executors`, the executors' comparison); slider(): bench --slider's figures, of which
    SLIDER_FIGURES join the table."""
    t = time.perf_counter()
    if executors:
        res = benchmark_executors(model, data)
    else:
        with Bar("bench phases", total=N_PHASES) as bar:  # each phase's log line starts a stage
            res = run_bench(quick, data, model, log=bar.stage, precision=precision)
        if slider is not None:
            figures = slider()
            res.update({k: figures[k] for k in SLIDER_FIGURES if k in figures})
    res["bench_wall_s"] = time.perf_counter() - t
    print(format_table(res))
    if json_path:
        write_json(json_path, res)
    return res
