"""Where a training step's time goes on the device: a preset at its published shape (random weights) trained a few
steps through the workbench's trainer, torch.profiler over two steps after the warm-up ones, the kernel time per step
by kind (matmul, attention, dropout, casts, …) and the top kernels. docs/scale.md, "The benchmark on one H200".

    python scripts/gpu_profile_step.py --data cache/data/halueval-perturbed.jsonl --micro-batch-size 16 \
        --compile-backend inductor                       # Qwen3-8B TOPL on a GPU
    python scripts/gpu_profile_step.py --model tiny-llama --device cpu --data …   # the script itself, on a CPU
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from topl_core.bench.scale import model_name, train_config
from topl_core.data.records import read_jsonl
from topl_core.models.loading import ModelSpec, load_model
from topl_core.training.trainer import train

WARM, ACTIVE = 2, 2  # steps before the profiled ones (the first compiles), steps profiled
KINDS = (  # a kernel's kind: the first fragment its name holds
    (("gemm", "nvjet", "cutlass", "xmma"), "matmul"),
    (("fmha", "flash", "sdpa", "attention"), "attention"),
    (("where",), "dropout (where)"),
    (("to_copy",), "dtype casts"),
    (("random", "philox"), "random numbers"),
    (("triton",), "other fused (triton)"),
    (("adam",), "optimizer"),
    (("copy",), "copies"),
    (("elementwise",), "other elementwise"),
    (("reduce",), "reductions"),
)

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaGraphLaunch")  # the host's launch calls


def kind(kernel: str) -> str:
    name = kernel.lower()
    return next((label for keys, label in KINDS if any(k in name for k in keys)), "other")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--model", default="qwen3-8b", help="a preset (built with random weights) or any model name")
    p.add_argument("--method", default="topl")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--micro-batch-size", type=int, default=16)
    p.add_argument("--compile-backend", default="inductor")
    args = p.parse_args()
    cfg = train_config(
        args.model, args.method, args.device, model=model_name(args.model, hub=False), steps=WARM + ACTIVE,
        micro_batch_size=args.micro_batch_size, compile_backend=args.compile_backend, eval_every=10_000,
        checkpoint_every=10_000, max_val_examples=8,
    )  # fmt: skip
    base = load_model(ModelSpec.computing(cfg.model, cfg.precision, args.device))
    prof = profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=WARM - 1, warmup=1, active=ACTIVE, repeat=1),
    )

    def step_done(_progress) -> bool:
        if args.device == "cuda":
            torch.cuda.synchronize()
        prof.step()
        return True

    with prof, tempfile.TemporaryDirectory() as work:
        t = time.perf_counter()
        run = train(cfg, Path(work) / args.method, progress=step_done, records=read_jsonl(args.data)[:400], base=base)
        metrics = [r for r in run.read_metrics() if "step_s" in r]
    wall = time.perf_counter() - t
    print(f"{cfg.model} {args.method}, micro-batch {args.micro_batch_size}, {cfg.precision}, {wall:.0f} s in all")
    print("step s", [round(r["step_s"], 3) for r in metrics], "tokens", [r["step_tokens"] for r in metrics])
    by_kind, total = collections.Counter(), 0.0
    for e in prof.events():  # the device's kernels, not the step annotations
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("ProfilerStep"):
            by_kind[kind(e.name)] += e.time_range.elapsed_us()
            total += e.time_range.elapsed_us()
    step_ms = metrics[-1]["step_s"] * 1e3
    host = collections.Counter(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU)
    launches = sum(n for name, n in host.items() if name in LAUNCHES)
    operators = sum(n for name, n in host.items() if name.startswith("aten::"))
    print(
        f"host per profiled step: {launches / ACTIVE:.0f} kernel launches, {operators / ACTIVE:.0f} aten operator "
        f"calls (nested ones counted), {host['aten::random_'] / ACTIVE:.0f} random draws"
    )
    print(f"kernel time per profiled step: {total / ACTIVE / 1e3:.1f} ms; the last step's wall {step_ms:.0f} ms")
    for label, us in by_kind.most_common():
        print(f"  {label:22s} {us / ACTIVE / 1e3:8.1f} ms a step  {us / max(total, 1):6.1%}")
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
