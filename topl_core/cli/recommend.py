"""`recommend`: the settings recommended for one adapter from its own dev documents — the gated mode's τ (the share of
the model's own tokens it flags), λ of the always-on and gated modes (the dev search), the steered sites and layer m
(untested unless a study measured them) — each with its evidence; cached with the adapter's analysis. `--heldout`
measures them once on the test documents, and every such call is logged."""

from __future__ import annotations

import argparse
import json
import sys

from ..analysis.evaluation.config import EvalConfig
from ..analysis.evaluation.recommend import RecommendSettings, recommend
from ..foundations.config_fields import add_config_args, config_args
from ..foundations.io import write_json
from ..foundations.progress import Bar
from . import COMMANDS
from .common import ADAPTER_HELP, add_precision_arg, announce_precision, open_adapter_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "recommend", help=COMMANDS["recommend"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--run", required=True, metavar="ADAPTER", help=ADAPTER_HELP)
    add_config_args(p, RecommendSettings, RecommendSettings())
    p.add_argument("--max-new-tokens", type=int, default=EvalConfig().max_new_tokens, help="summary length")
    add_precision_arg(p)
    p.add_argument("--json", help="write the recommendation (values, sources, evidence) here")
    p.set_defaults(func=run)


# the held-out rows printed: each steered variant's factuality and its difference from the merged model's, what each
# costs in fluency (log-perplexity under the base model: an adverse row is shown as a favourable one is), and what the
# gate changed in the share of flagged tokens (an adapter without a head has no gated rows)
HELDOUT_SHOWN = {
    ("factuality", "gated"),
    ("factuality", "gated − merged"),
    ("factuality", "always-on"),
    ("factuality", "always-on − merged"),
    ("log_perplexity", "gated − merged"),
    ("log_perplexity", "always-on − merged"),
    ("flagged_share", "gated − merged"),
}


def run(args: argparse.Namespace) -> int:
    adapter = open_adapter_arg(args)
    announce_precision(args.precision, adapter.device)
    settings = RecommendSettings(**config_args(args, RecommendSettings))
    cfg = EvalConfig(max_new_tokens=args.max_new_tokens, precision=args.precision, device=adapter.device)
    with Bar("recommend") as bar:
        rec = recommend(adapter, settings, cfg, progress=bar.stage)
    print(rec.line())
    for r in rec.rows():
        value = "–" if r["value"] is None else f"{r['value']:g}"
        print(f"  {r['setting']:18s} {value:>6s}  {r['source']}")
    tau = next((r for r in rec.rows() if r["setting"] == "tau"), {})
    if "flagged_at_tau" in tau:
        print(
            f"  evidence: {tau['tokens']} tokens of {tau['summaries']} summaries; p(good) < τ flags "
            f"{100 * tau['flagged_at_tau']:.1f}% of them (< 0.5: {100 * tau['flagged_at_0.5']:.1f}%)"
        )
        by_set = tau.get("flagged_at_tau_by_set") or {}
        if len(by_set) > 1:  # τ read on one kind of text flags another kind at another rate
            shares = ", ".join(f"{k} {100 * v:.1f}%" for k, v in by_set.items())
            print(f"  τ flags, by kind of dev text: {shares} (held out, per domain: python -m topl_core gated-study)")
    if rec.heldout:
        print(f"held out ({rec.heldout['documents']} documents, logged):", file=sys.stderr)
        for row in rec.heldout["table"]:
            if (row["metric"], row["comparison"]) in HELDOUT_SHOWN:
                print(f"  {row['metric']} {row['comparison']}: {row['mean']:+.3f} [{row['lo']:+.3f}, {row['hi']:+.3f}]")
    if args.json:
        write_json(args.json, json.loads(json.dumps(rec.to_json(), default=float)))
    return 0
