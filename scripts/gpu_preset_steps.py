"""A few training steps of each paper preset on a GPU, through the workbench's own trainer: loss, tokens/s, step time
and peak GPU memory per (preset, method).

    python scripts/gpu_preset_steps.py --data cache/data/halueval-perturbed.jsonl \
        --tokenizer cache/models/smollm2-135m --steps 4 --json gpu-presets.json

On a machine without the hub (where this was run) the presets' weights cannot be downloaded: each model is then
built with the published architecture of its preset (Preset.architecture: hidden size, layers, heads, vocabulary) and
random bf16 weights on the GPU, and the text is tokenized with the given tokenizer (its ids lie inside every preset's
vocabulary). Speed and memory are those of the real shapes; the losses are those of an untrained model (TOPL starts at
log 2 from its zero head, SFT near log |vocab|) and say only that the step runs. With a hub, --hub loads the real
models and tokenizers instead.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from topl_core.data.records import read_jsonl  # noqa: E402
from topl_core.models import LoadedModel, ModelSpec, load_model  # noqa: E402
from topl_core.presets import PRESETS  # noqa: E402
from topl_core.training.config import preset_config  # noqa: E402
from topl_core.training.memory import preset_model_config  # noqa: E402
from topl_core.training.trainer import train  # noqa: E402


def random_preset_model(preset: str, tokenizer_dir: str) -> LoadedModel:
    """The preset's architecture with random bf16 weights, built on the GPU, and the given tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = preset_model_config(preset)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return LoadedModel(model.eval(), tok, ModelSpec(preset, "bfloat16", "cuda"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="records JSONL")
    p.add_argument("--tokenizer", help="tokenizer folder for the random-weight models (without --hub)")
    p.add_argument("--hub", action="store_true", help="load the presets' real weights and tokenizers from the hub")
    p.add_argument("--presets", nargs="+", default=list(PRESETS))
    p.add_argument("--methods", nargs="+", default=["topl", "sft"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    records = read_jsonl(args.data)
    rows = []
    for preset in args.presets:
        for method in args.methods:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            if args.hub:
                base = load_model(ModelSpec(preset, "bfloat16", "cuda"))
            else:
                base = random_preset_model(preset, args.tokenizer)
            n_params = sum(p.numel() for p in base.model.parameters())
            load_s = time.perf_counter() - t0
            cfg = preset_config(
                preset,
                method,
                steps=args.steps,
                micro_batch_size=args.micro_batch_size,
                eval_every=10_000,
                checkpoint_every=10_000,
                max_val_examples=8,
                data=args.data,
            )
            with tempfile.TemporaryDirectory() as out:
                run = train(cfg, Path(out) / "run", records=records, base=base)
                metrics = [r for r in run.read_metrics() if "step_s" in r]
                precision = run.read_config()[0].precision
            timed = metrics[1:] or metrics  # the first step warms the kernels up
            rows.append(
                {
                    "preset": preset,
                    "method": method,
                    "weights": "hub" if args.hub else "random (published shape)",
                    "params_b": n_params / 1e9,
                    "lora_layers": f"{cfg.lora.layer_start}-{cfg.lora.layer_end}",
                    "batch": f"{cfg.batch_size}x{cfg.grad_accum}",
                    "precision": precision,
                    "losses": [round(r["loss"], 4) for r in metrics],
                    "step_s": statistics.median(r["step_s"] for r in timed),
                    "tokens_per_s": statistics.median(r["step_tokens"] / r["step_s"] for r in timed),
                    "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                    "load_s": load_s,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            del base, run
            gc.collect()
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
