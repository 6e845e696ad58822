"""`score-tokens`: per-token p(good) from a run's head, or the detection AUROC report over a labelled set
(head vs base-model surprisal, on the same tokens)."""

from __future__ import annotations

import argparse

from ..data.cliff import load_factuality_csv
from ..io import write_json
from ..models import ModelSpec, load_model
from ..progress import Bar
from ..runs import RunDir
from ..scoring import TokenScorer, detection_auroc
from . import COMMANDS
from .common import add_data_args, add_precision_arg, announce_precision, load_split


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score-tokens", help=COMMANDS["score-tokens"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--run", required=True, help="run directory with a head (topl, sopl, tldr)")
    p.add_argument("--document", help="document text (with --response)")
    p.add_argument("--response", help="response text to score")
    add_data_args(p)
    p.add_argument(
        "--cliff", help="also report on a CLIFF/AggreFact span CSV (e.g. ../shared/data/CLIFF_error_types.csv)"
    )
    add_precision_arg(p)
    p.add_argument("--json", help="write the report / token values here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    run_dir = RunDir(args.run)
    cfg, _ = run_dir.read_config()
    announce_precision(args.precision, cfg.device)
    scorer = TokenScorer(load_model(ModelSpec(cfg.model, device=cfg.device)), run_dir, precision=args.precision)
    if args.document or args.response:
        if not (args.document and args.response):
            raise SystemExit("error: give both --document and --response")
        s = scorer.score_text(args.document, args.response)
        result = [
            {"token": t, "start": int(a), "end": int(b), "p_good": float(p)}
            for t, (a, b), p in zip(s.tokens, s.offsets, s.p_good)
        ]
        for r in result:
            print(f"{r['p_good']:.3f}  {r['token']!r}")
    else:
        sets = {}
        if args.data:
            sets[f"{args.data} [{args.split}]"] = load_split(args)
        if args.cliff:
            report = load_factuality_csv(args.cliff)
            for src in sorted(report.sources):
                sets[src] = [r for r in report.records if r.source == src]
        if not sets:
            raise SystemExit("error: give --document/--response, --data, or --cliff")
        result = {}
        for name, recs in sets.items():
            with Bar(f"scoring {name}") as bar:
                result[name] = detection_auroc(scorer.score(recs, progress=bar)) | {"records": len(recs)}
        print(f"{'set':44s} {'records':>8s} {'tokens':>8s} {'%bad':>6s} {'head AUROC':>11s} {'surprisal AUROC':>16s}")
        for name, r in result.items():
            print(
                f"{name:44s} {r['records']:8d} {r['tokens']:8d} {r['pct_bad']:6.1f} {r['head_auroc']:11.3f} "
                f"{r['surprisal_auroc']:16.3f}"
            )
    if args.json:
        write_json(args.json, result)
