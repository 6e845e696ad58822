"""`merge-check`: max |merged − unmerged| logit difference of a run's adapter, with float32 and bfloat16 weights,
the forwards in the --precision asked for (bf16 = autocast over float32 weights)."""

from __future__ import annotations

import argparse

import torch

from ..data.encode import collate, encode_record
from ..data.records import read_jsonl
from ..data.split import split_records
from ..hardware.precision import autocast
from ..models.loading import ModelSpec, load_model
from ..training.adapters import load_adapter
from . import COMMANDS
from .common import add_adapter_args, add_precision_arg, announce_precision, open_adapter_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "merge-check", help=COMMANDS["merge-check"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_adapter_args(p)
    p.add_argument("--n", type=int, default=8, help="test-split records of the run's (or default) data to compare on")
    add_precision_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    run_dir = open_adapter_arg(args)
    cfg = run_dir.settings
    precision = announce_precision(args.precision, cfg.device)
    records = split_records(read_jsonl(cfg.data), seed=cfg.split_seed)["test"][: args.n]
    for dtype in ("fp32", "bf16"):
        spec = ModelSpec(run_dir.base_model, dtype=dtype, device=cfg.device)
        unmerged = load_adapter(load_model(spec), run_dir)
        merged_lm = load_model(spec)
        merged = load_adapter(merged_lm, run_dir, merge=True)
        tok = merged_lm.tokenizer
        b = collate([encode_record(tok, r) for r in records], tok.pad_token_id).to(spec.device)
        with torch.no_grad(), autocast(precision, spec.device):
            x = unmerged(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
            y = merged(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
        m = b.attention_mask.bool()
        diff = (x - y).abs()[m]
        agree = (x.argmax(-1) == y.argmax(-1))[m].float().mean().item()
        print(
            f"{dtype} weights: max |Δlogit| {diff.max().item():.3g}  mean {diff.mean().item():.3g}  "
            f"logit std {x[m].std().item():.3g}  argmax agreement {agree:.4f}  ({int(m.sum())} positions)"
        )
