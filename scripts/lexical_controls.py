"""The model-free controls of token-level detection (topl_core/analysis/lexical.py) on the held-out token sets of
`transfer --stage heldout`, without any adapter: the test split of a perturbation data file (split by document with
seed 0) and CLIFF's test cut, each set's first N records, tokenized by the base model's tokenizer as the scorer does.
The tokens are those the detection tables score, so these rows stand beside the head's there.

    PYTHONPATH=$PWD python scripts/lexical_controls.py --data cache/data/halueval-perturbed.jsonl --records 128
"""

from __future__ import annotations

import argparse
import json

from topl_core.analysis.lexical import CONTROLS
from topl_core.analysis.studies.detection_stats import bootstrap_auroc, control_arrays
from topl_core.analysis.studies.transfer import load_cliff, stage_sets
from topl_core.data.records import read_jsonl
from topl_core.foundations.presets import DEFAULT_MODEL
from topl_core.models.loading import ModelSpec, load_model
from topl_core.training.config import TrainConfig


def controls_of(tokenizer, records, max_doc_tokens: int, max_response_tokens: int, bootstrap: int, seed: int) -> dict:
    t = control_arrays(tokenizer, records, max_doc_tokens, max_response_tokens)
    cis = bootstrap_auroc(t["bad"], {c: t[c] for c in CONTROLS}, t["record"], bootstrap, seed)
    return {
        "records": len(records),
        "tokens": int(len(t["bad"])),
        "pct_bad": float(100 * t["bad"].mean()),
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
    labelled = [r for r in read_jsonl(args.data) if r.token_labels_known]
    cliff, notes = load_cliff(args.cliff)
    sets = stage_sets(cfg.split_seed, "heldout", labelled, cliff, args.records)  # transfer --stage heldout's sets
    rows = {
        name: controls_of(tokenizer, recs, cfg.max_doc_tokens, cfg.max_response_tokens, args.bootstrap, args.seed)
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
