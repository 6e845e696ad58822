"""The model-free controls of token-level detection (topl_core/analysis/lexical.py) on the held-out token sets of
`transfer --stage heldout`, without any adapter: the test split of a perturbation data file (split by document with
seed 0) and CLIFF's test cut, each set's first N records, tokenized by the base model's tokenizer as the scorer does.
The tokens are those the detection tables score, so these rows stand beside the head's there.

    PYTHONPATH=$PWD python scripts/lexical_controls.py --data cache/data/halueval-perturbed.jsonl --records 128
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from topl_core.analysis.lexical import labelled_controls
from topl_core.analysis.studies.transfer import bootstrap_auroc, load_cliff
from topl_core.data.encode import encode_record
from topl_core.data.records import read_jsonl
from topl_core.data.split import split_records
from topl_core.foundations.presets import DEFAULT_MODEL
from topl_core.models.loading import ModelSpec, load_model
from topl_core.training.config import TrainConfig


def controls_of(tokenizer, records, max_doc_tokens: int, max_response_tokens: int, bootstrap: int, seed: int) -> dict:
    encoded = [encode_record(tokenizer, r, max_doc_tokens, max_response_tokens) for r in records]
    gold = [e.response_labels for e in encoded]
    scores = labelled_controls(
        [r.document for r in records], [r.response for r in records], [e.response_offsets for e in encoded], gold
    )
    bad = np.concatenate([(g[g >= 0] == 0) for g in gold]).astype(int)
    groups = np.concatenate([np.full(int((g >= 0).sum()), i) for i, g in enumerate(gold)])
    cis = bootstrap_auroc(bad, scores, groups, bootstrap, seed)
    return {
        "records": len(records),
        "tokens": int(len(bad)),
        "pct_bad": float(100 * bad.mean()),
        **{k: v._asdict() for k, v in cis.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="the base model whose tokenizer splits the responses")
    p.add_argument("--data", required=True, help="token-labelled records JSONL (its test split is scored)")
    p.add_argument("--cliff", help="CLIFF's span CSV (default: the shared copy, skipped when absent)")
    p.add_argument("--records", type=int, default=128, help="the first N records of each set")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    tokenizer = load_model(ModelSpec(args.model)).tokenizer
    cfg = TrainConfig()
    sets = {"perturbations/test": split_records(read_jsonl(args.data), seed=cfg.split_seed)["test"]}
    cliff, notes = load_cliff(args.cliff)
    for source in sorted(cliff.sources) if cliff is not None else ():
        sets[f"{source}/test"] = [r for r in cliff.records if r.source == source and r.meta.get("cut") == "test"]
    rows = {
        name: controls_of(
            tokenizer, recs[: args.records], cfg.max_doc_tokens, cfg.max_response_tokens, args.bootstrap, args.seed
        )
        for name, recs in sets.items()
        if recs
    }
    for name, r in rows.items():
        cells = [
            f"{k} {v['auroc']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]" for k, v in r.items() if isinstance(v, dict)
        ]
        print(f"{name}: {r['records']} records, {r['tokens']} tokens, {r['pct_bad']:.1f}% bad; " + "; ".join(cells))
    for note in notes:
        print(note)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
