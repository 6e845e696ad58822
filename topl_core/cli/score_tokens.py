"""`score-tokens`: per-token p(good) from a run's head (or a probe head fitted on any adapter's hidden states), or
the detection AUROC report over a labelled set: the head against base-model surprisal and the model-free controls
(analysis/lexical.py: the lexical control, a new number or name, position), on the same tokens, each with its
record-bootstrap 95% CI."""

from __future__ import annotations

import argparse
import sys

from ..analysis.lora_a.probe_head import ProbeHeadSettings, fit_probe_head
from ..analysis.studies.detection_stats import detection_summary
from ..data.cliff import load_factuality_csv
from ..data.records import read_jsonl
from ..foundations.io import write_json
from ..foundations.progress import Bar
from ..inference.token_scores import TokenScorer
from ..models.loading import ModelSpec, load_model
from . import COMMANDS
from .common import (
    ADAPTER_HELP,
    add_adapter_args,
    add_data_args,
    add_precision_arg,
    announce_precision,
    load_split,
    open_adapter_arg,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score-tokens", help=COMMANDS["score-tokens"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_adapter_args(p, ADAPTER_HELP + "; with a head (topl, sopl, tldr), or see --probe-head")
    p.add_argument(
        "--probe-head",
        action="store_true",
        help="score with a linear probe head fitted on the adapter's hidden states (its last LoRA layer) from the "
        "labelled training split of --probe-data; also reports the same probe on the base model (the control)",
    )
    p.add_argument("--probe-data", help="records for the probe head (default: the run's data, or the default set)")
    p.add_argument("--document", help="document text (with --response)")
    p.add_argument("--response", help="response text to score")
    add_data_args(p)
    p.add_argument(
        "--cliff", help="also report on a CLIFF/AggreFact span CSV (e.g. ../shared/data/CLIFF_error_types.csv)"
    )
    add_precision_arg(p)
    p.add_argument("--bootstrap", type=int, default=1000, help="record resamples of each AUROC's 95%% CI (0: none)")
    p.add_argument("--json", help="write the report / token values here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    adapter = open_adapter_arg(args)
    announce_precision(args.precision, adapter.device)
    head = None
    if args.probe_head or not adapter.has_head:
        if not args.probe_head:
            print(
                f"{adapter.name} has no head: fitting a probe head on its hidden states (--probe-head)", file=sys.stderr
            )
        head = _probe_head(args, adapter)
    scorer = TokenScorer(
        load_model(ModelSpec.computing(adapter.base_model, args.precision, adapter.device)),
        adapter,
        precision=args.precision,
        head=head,
    )
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
                summary = detection_summary(recs, scorer.score(recs, progress=bar), args.bootstrap)
            aurocs = summary.pop("aurocs")
            result[name] = summary | {  # the head's and surprisal's AUROC as before, then every detector's with its CI
                "head_auroc": aurocs["head"].auroc,
                "surprisal_auroc": aurocs["surprisal"].auroc,
                "aurocs": {d: ci._asdict() for d, ci in aurocs.items()},
            }
        _print_table(result)
    if args.json:
        write_json(args.json, result)


def _print_table(result: dict) -> None:
    """One row per set: records, tokens, % bad, then per detector its AUROC [95% CI] (the head first, then surprisal
    and the controls: analysis/lexical.py)."""
    detectors = list(next(iter(result.values()))["aurocs"])
    width = 22
    print(f"{'set':44s} {'records':>8s} {'tokens':>8s} {'%bad':>6s} " + " ".join(f"{d:>{width}s}" for d in detectors))
    for name, r in result.items():
        cells = []
        for d in detectors:
            a = r["aurocs"][d]
            ci = f" [{a['ci_low']:.3f}, {a['ci_high']:.3f}]" if a["ci_low"] == a["ci_low"] else ""  # NaN: none
            cells.append(f"{a['auroc']:.3f}{ci}")
        print(
            f"{name:44s} {r['records']:8d} {r['tokens']:8d} {r['pct_bad']:6.1f} "
            + " ".join(f"{c:>{width}s}" for c in cells)
        )


def _probe_head(args: argparse.Namespace, adapter) -> tuple:
    """Fit (or read from the cache) the probe head and its base-model control; print both AUROCs."""
    records = read_jsonl(args.probe_data or adapter.settings.data)
    settings = ProbeHeadSettings(precision=args.precision)
    probe = fit_probe_head(adapter, records, settings)
    control = fit_probe_head(adapter, records, settings, adapter_enabled=False)
    print(
        f"probe head at layer {probe.layer}: validation token AUROC {probe.val_auroc:.3f} ({probe.n_val_tokens} tokens;"
        f" train {probe.train_auroc:.3f}); the same probe on the base model (control): {control.val_auroc:.3f}",
        file=sys.stderr,
    )
    return probe.layer, probe.linear()
