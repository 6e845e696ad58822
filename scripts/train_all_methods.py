"""Train every method on the same data with the CLI (one `python -m topl_core train` command per method, each in
its own process) and write a table of steps, wall time, tokens/s, final loss and validation metric.

    .venv/bin/python scripts/train_all_methods.py --steps 30 --out runs/baselines --table docs/baselines.md

Shared settings: same data, split, model, LoRA rank/alpha/dropout, precision, sequence caps and learning rate;
LoRA on layers 0-20 for every method except TLDR (all layers, head on the last one). Token and sequence methods
take `--batch-size` examples per step; DPO/TDPO take `--pair-batch-size` pairs (2 sequences each). A run
directory that already holds a finished run of the same config is reused, an interrupted one resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from topl_core.data.records import read_jsonl  # noqa: E402
from topl_core.foundations.paths import DEFAULT_DATA  # noqa: E402
from topl_core.foundations.presets import DEFAULT_MODEL  # noqa: E402
from topl_core.models.loading import EMBEDDED, load_model  # noqa: E402
from topl_core.training.config import TrainConfig  # noqa: E402
from topl_core.training.methods import METHODS  # noqa: E402
from topl_core.training.run_dirs import RunDir  # noqa: E402


def method_command(args: argparse.Namespace, method: str, num_layers: int) -> list[str]:
    pairs = METHODS[method].pairs
    layer_end = num_layers - 1 if METHODS[method].lora_all_layers else args.layer_end
    return [
        sys.executable,
        "-m",
        "topl_core",
        "train",
        "--method",
        method,
        "--model",
        args.model,
        "--data",
        args.data,
        "--out",
        str(Path(args.out) / method),
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.pair_batch_size if pairs else args.batch_size),
        "--lr",
        str(args.lr),
        *(["--head-lr-multiplier", str(args.head_lr_multiplier)] if METHODS[method].uses_head else []),
        "--lora-layer-start",
        "0",
        "--lora-layer-end",
        str(layer_end),
        "--eval-every",
        str(args.steps),
        "--precision",
        args.precision,
        "--seed",
        str(args.seed),
    ]


def run_one(cmd: list[str], log_path: Path) -> dict:
    """Run a command to completion; return its exit code, wall time and peak resident memory (from wait4)."""
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "process_wall_s": time.perf_counter() - t0, "peak_rss_gb": usage.ru_maxrss / 2**20}


def summarize(run_dir: Path, method: str) -> dict:
    run = RunDir(run_dir)
    rows = [r for r in run.read_metrics() if "loss" in r]
    status = run.read_status()
    cfg, meta = run.read_config()
    metric = meta.get("validation_metric", METHODS[method].validation_metric)
    val_rows = [r for r in rows if metric in r]
    last = rows[-1] if rows else {}
    tail = [r["loss"] for r in rows[-5:]]
    # medians shrug off the steps that another job on the machine slowed down
    step_times = run.step_times()
    step_s = [s for s, _ in step_times]
    step_tps = [tok / s for s, tok in step_times if s > 0]
    extra = {}
    if val_rows:
        v = val_rows[-1]
        extra = {
            k: v[k]
            for k in ("val_loss", "val_token_auroc", "val_seq_auroc", "val_reward_margin")
            if k in v and k != metric
        }
    return {
        "method": method,
        "state": status.get("state"),
        "steps": status.get("step"),
        "examples_per_step": cfg.batch_size * cfg.grad_accum,
        "lora_layers": f"{cfg.lora.layer_start}-{cfg.lora.layer_end}",
        "head_layer": meta.get("head_layer"),
        "train_wall_s": last.get("elapsed_s"),  # the loop's clock at the last step, before its validation
        "val_wall_s": (status["elapsed_s"] - last["elapsed_s"]) if "elapsed_s" in status and last else None,
        "s_per_step": (last.get("elapsed_s") or float("nan")) / max(1, len(rows)),
        "median_s_per_step": statistics.median(step_s) if step_s else None,
        "median_tokens_per_s": statistics.median(step_tps) if step_tps else None,
        "tokens_per_s": last.get("tokens_per_s"),
        "first_loss": rows[0]["loss"] if rows else None,
        "final_loss": last.get("loss"),
        "final_loss_mean5": sum(tail) / len(tail) if tail else None,
        "val_metric": metric,
        "val_value": val_rows[-1][metric] if val_rows else None,
        "val_extra": extra,
    }


def _f(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def write_table(
    path: Path, results: list[dict], command: str, per_method: dict[str, str], args, num_layers: int
) -> None:
    data = read_jsonl(args.data)
    n_docs, n_bad = len({r.doc_id for r in data}), sum(r.sequence_label == 0 for r in data)
    lines = [
        "# Baselines on the embedded SmolLM2 (same data, same harness)",
        "",
        "Produced by (from the repository root; `flock` keeps heavy jobs one at a time on a shared machine):",
        "",
        "```",
        command,
        "```",
        "",
        f"Data `{args.data}` ({len(data)} records of {n_docs} documents, {n_bad} of them perturbed with token labels "
        f"and paired with their faithful response; document-level 80/10/10 split, seed 0), model `{args.model}`, "
        f"LoRA r=4 α=8 dropout 0.1 on q,k,v,o,gate,up,down, lr {args.lr} for every method (the heads of TOPL, SOPL "
        f"and TLDR learn at lr × {args.head_lr_multiplier}), precision {args.precision}, documents capped at 320 "
        f"tokens and responses at 128, {args.steps} steps, "
        "validation on up to 64 validation records at the last step. CPU, 2 cores.",
        "",
        "| method | steps | examples/step | LoRA layers | head layer | train wall time (s) | median s/step "
        "| tokens/s (overall / median step) | loss step 1 | final loss (mean of last 5) | validation metric "
        "| other validation | final validation (s) | peak RSS (GB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['method']} | failed: {r['error']} |" + " |" * 12)
            continue
        extra = ", ".join(f"{k} {v:.3f}" for k, v in r["val_extra"].items())
        pairs = " pairs" if METHODS[r["method"]].pairs else ""
        head = r["head_layer"] if r["head_layer"] is not None else "–"
        cells = [
            r["method"], r["steps"], f"{r['examples_per_step']}{pairs}", r["lora_layers"], head,
            _f(r["train_wall_s"], ".0f"), _f(r.get("median_s_per_step"), ".1f"),
            f"{_f(r['tokens_per_s'], '.0f')} / {_f(r.get('median_tokens_per_s'), '.0f')}", _f(r["first_loss"], ".4f"),
            f"{_f(r['final_loss'], '.4f')} ({_f(r['final_loss_mean5'], '.4f')})",
            f"{r['val_metric']} {_f(r['val_value'], '.3f')}", extra, _f(r.get("val_wall_s"), ".0f"),
            _f(r.get("peak_rss_gb"), ".1f"),
        ]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += [
        "",
        "Validation metrics (each method's own):",
        "- `val_token_auroc` (topl, tldr): AUROC of the head's p(good) for good vs bad response tokens.",
        "- `val_seq_auroc` (sopl): AUROC of the pooled (mean over response tokens) head logit, faithful vs perturbed "
        "responses; `val_token_auroc` is the same head read per token.",
        "- `val_token_auroc_logp` (unlikelihood): AUROC of the policy's own log p(token) for good vs bad tokens.",
        "- `val_reward_accuracy` (dpo, tdpo): share of validation pairs whose implicit reward β·(log π_θ − log π_ref) "
        "is higher for the faithful response; `val_reward_margin` is its mean difference.",
        "- `val_loss` (sft): next-token cross-entropy on faithful validation responses (+ end-of-turn).",
        "",
        "train wall time is the training loop's clock at the last step (model loading and the final validation "
        "excluded); median s/step and the median step's tokens/s are robust to the steps that other jobs on the "
        "machine slowed down. Peak RSS is the "
        "training process's maximum resident memory (wait4).",
        "",
        "tokens/s counts the tokens of the training batches (for DPO/TDPO both responses of each pair; the reference "
        "forward pass is not counted again). Loss values are not comparable across methods (different objectives).",
        "",
        "How each baseline is defined here (docstrings of `topl_core/training/methods/`):",
        "- **SFT**: next-token cross-entropy on the faithful responses only (sequence_label 1), over the response "
        "tokens and the end-of-turn token.",
        "- **DPO**: chosen = the faithful response, rejected = the perturbed response to the same prompt; log-probs "
        "summed over response + end-of-turn tokens; β = 0.1. The reference policy is the same PEFT model with its "
        "adapter disabled (no second copy of the weights), so at step 1 the loss is exactly log 2.",
        f"- **SOPL**: one BCE label per response (faithful 1, perturbed 0) on the *mean of the per-token head logits "
        f"over the response tokens*; linear head on FinalNorm(layer {args.layer_end}), like TOPL.",
        f"- **TLDR**: TOPL's token-level BCE with the head on the last layer ({num_layers - 1}) and LoRA on all "
        f"{num_layers} layers.",
        "- **Unlikelihood**: −log p on good tokens and −log(1 − p) on bad tokens of the token-labelled responses "
        "(faithful and perturbed); log(1 − p) is computed exactly from the other tokens' probabilities.",
        "- **TDPO**: TDPO2 of Zeng et al. (2024), α = 0.5: the DPO margin minus α·(β·SeqKL(rejected) − "
        "sg(β·SeqKL(chosen))), SeqKL = Σ_t KL(π_ref ‖ π_θ) over response + end-of-turn positions, reference = "
        "adapter disabled.",
        "",
        "Per-method commands (what the script runs, one process each):",
        "",
        "```",
        *[per_method[m] for m in per_method],
        "```",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--out", default="runs/baselines")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=8, help="examples per step (token and sequence methods)")
    p.add_argument("--pair-batch-size", type=int, default=4, help="pairs per step (dpo, tdpo)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument(
        "--head-lr-multiplier",
        type=float,
        default=TrainConfig().head_lr_multiplier,
        help="the heads (topl, sopl, tldr) learn at lr × this",
    )
    p.add_argument("--layer-end", type=int, default=20, help="last LoRA layer (TLDR always uses all layers)")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--table", default="docs/baselines.md")
    p.add_argument(
        "--table-only", action="store_true", help="rewrite the table from the saved <out>/<method>.summary.json"
    )
    args = p.parse_args(argv)

    from transformers import AutoConfig

    num_layers = (
        AutoConfig.from_pretrained(REPO / "cache" / "models" / args.model).num_hidden_layers
        if args.model in EMBEDDED and (REPO / "cache" / "models" / args.model / "config.json").exists()
        else load_model(args.model).num_layers
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, per_method = [], {}
    for method in args.methods:
        cmd = method_command(args, method, num_layers)
        per_method[method] = shlex.join([".venv/bin/python", *cmd[1:]])
        if args.table_only:  # re-read the run directory; keep what only the training process could measure
            saved = json.loads((out / f"{method}.summary.json").read_text())
            results.append({**saved, **summarize(out / method, method)})
            continue
        print(f"[{time.strftime('%H:%M:%S')}] {method}: {per_method[method]}", flush=True)
        info = run_one(cmd, out / f"{method}.log")
        if info["rc"] != 0:
            tail = (out / f"{method}.log").read_text().strip().splitlines()[-1:]
            results.append({"method": method, "error": f"exit {info['rc']}: {tail[0] if tail else ''}"})
            print(f"  failed ({info['rc']}); see {out / f'{method}.log'}", flush=True)
            continue
        r = {**summarize(out / method, method), **info}
        results.append(r)
        (out / f"{method}.summary.json").write_text(json.dumps(r, indent=2))
        print(
            f"  {r['steps']} steps in {r['train_wall_s']:.0f}s, {r['tokens_per_s']:.0f} tok/s, "
            f"loss {r['final_loss']:.4f}, "
            f"{r['val_metric']} {_f(r['val_value'], '.3f')}, peak RSS {r['peak_rss_gb']:.1f} GB",
            flush=True,
        )
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--table-only"]
    command = "flock /tmp/topl-heavy.lock " + shlex.join([".venv/bin/python", "scripts/train_all_methods.py", *given])
    write_table(Path(args.table), results, command, per_method, args, num_layers)
    print(f"wrote {args.table}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
