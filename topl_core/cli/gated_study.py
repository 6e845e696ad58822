"""`gated-study`: detect-then-steer held out, in the adapter's domain and out of it — the merged model, always-on and
gated steering at the adapter's recommended τ and λ (`recommend` first) on the same documents, paired per document,
with a verdict per claim (analysis/studies/gated_study.py). Rerun the same command to resume: generations are cached
in chunks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..analysis.evaluation.config import EvalConfig
from ..analysis.studies.gated_study import GatedDomains, markdown, run_study
from ..foundations.io import atomic_open, write_json
from ..foundations.progress import Bar
from . import COMMANDS
from .common import ADAPTER_HELP, add_precision_arg, announce_precision, open_adapter_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gated-study", help=COMMANDS["gated-study"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    defaults = GatedDomains("")
    p.add_argument("--run", required=True, metavar="ADAPTER", help=ADAPTER_HELP)
    p.add_argument("--out", required=True, help="folder for report.json and report.md")
    p.add_argument("--n-id", type=int, default=defaults.n_id, help="held-out documents in the adapter's domain")
    p.add_argument("--n-ood", type=int, default=defaults.n_ood, help="held-out documents of CLIFF's test cut")
    p.add_argument("--chunk", type=int, default=defaults.chunk, help="documents per cached generation")
    p.add_argument("--max-new-tokens", type=int, default=EvalConfig().max_new_tokens, help="summary length")
    add_precision_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    adapter = open_adapter_arg(args)
    announce_precision(args.precision, adapter.device)
    study = GatedDomains(str(adapter.path), args.n_id, args.n_ood, args.chunk)
    cfg = EvalConfig(max_new_tokens=args.max_new_tokens, precision=args.precision, device=adapter.device)
    with Bar("gated study") as bar:
        report = run_study(study, cfg, progress=bar.stage)
    out = Path(args.out)
    write_json(out / "report.json", json.loads(json.dumps(report, default=float)))
    with atomic_open(out / "report.md") as f:
        f.write(markdown(report))
    for v in report["verdicts"]:
        print(f"{v['domain']}: {v['claim']}: {v['verdict']} — {v['why']}")
    print(f"report: {out / 'report.md'}")
    return 0
