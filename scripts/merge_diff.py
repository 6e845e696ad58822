"""Max |merged − unmerged| logit difference for a run, in float32 and bfloat16 (README figure).

    .venv/bin/python scripts/merge_diff.py runs/topl-smollm2 [--n 8]
"""

from __future__ import annotations

import argparse

import torch

from topl_core.data.encode import collate, encode_record
from topl_core.data.records import read_jsonl
from topl_core.data.split import split_records
from topl_core.models import ModelSpec, load_model
from topl_core.runs import RunDir, load_adapter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--n", type=int, default=8, help="test-split records to compare on")
    args = ap.parse_args()
    run = RunDir(args.run)
    cfg, _ = run.read_config()
    records = split_records(read_jsonl(cfg.data))["test"][: args.n]
    for dtype in ("float32", "bfloat16"):
        spec = ModelSpec(cfg.model, dtype=dtype)
        unmerged = load_adapter(load_model(spec), run)
        merged = load_adapter(load_model(spec), run, merge=True)
        tok = load_model(spec).tokenizer
        b = collate([encode_record(tok, r) for r in records], tok.pad_token_id)
        with torch.no_grad():
            x = unmerged(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
            y = merged(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
        m = b.attention_mask.bool()
        diff = (x - y).abs()[m]
        print(f"{dtype:9s} max |Δlogit| = {diff.max().item():.3g}   mean = {diff.mean().item():.3g}   "
              f"logit scale (std) = {x[m].std().item():.3g}   argmax agreement = "
              f"{(x.argmax(-1) == y.argmax(-1))[m].float().mean().item():.4f}   ({int(m.sum())} positions)")


if __name__ == "__main__":
    main()
