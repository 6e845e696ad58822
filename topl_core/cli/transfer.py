"""`transfer`: detection transfer of one or more adapters — AUROC of flagging bad tokens with a record-bootstrap
95% CI for the head, the frozen probe (base model, same training records) and surprisal, on the dev sets (val split,
CLIFF cut val) or the held-out sets (test split, CLIFF cut test; every evaluation is logged)."""

from __future__ import annotations

import argparse
import sys

from ..analysis.studies.layer_scan import layer_scan
from ..analysis.studies.transfer import (
    STAGES,
    TransferSettings,
    format_markdown,
    heldout_count,
    transfer_table,
)
from ..data.records import read_jsonl
from ..foundations.config_fields import add_config_args, config_args, field_infos
from ..foundations.io import atomic_open, write_json
from ..foundations.progress import Bar
from . import COMMANDS
from .common import ADAPTER_HELP, add_precision_arg, announce_precision, open_adapter_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "transfer", help=COMMANDS["transfer"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--run", action="append", required=True, metavar="ADAPTER", help=ADAPTER_HELP + "; repeat for more")
    p.add_argument("--base-model", help="the base model to load every adapter on; without it, each adapter's own")
    # required, not defaulted: whether the held-out sets are read is always said on the command line
    p.add_argument("--stage", required=True, choices=STAGES, help=field_infos(TransferSettings)["stage"].help)
    p.add_argument(
        "--cliff", help="CLIFF span CSV; without it, ../shared/data/CLIFF_error_types.csv, skipped when absent"
    )
    p.add_argument("--data", help="records JSONL for every adapter; without it, each run's training data")
    add_config_args(p, TransferSettings, TransferSettings(), skip=("stage", "precision"))
    add_precision_arg(p)
    p.add_argument(
        "--layer-scan",
        action="store_true",
        help="instead: the frozen probe fitted at every layer (or --layers), AUROC per layer on the dev sets — to "
        "choose layer m from data (dev only)",
    )
    p.add_argument("--layers", type=int, nargs="+", help="layers of --layer-scan (default: all)")
    p.add_argument("--csv", help="write the table here as CSV")
    p.add_argument("--json", help="write the rows, the held-out counts and the notes here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    given = config_args(args, TransferSettings, skip=("stage", "precision"))
    settings = TransferSettings(stage=args.stage, precision=args.precision, **given)
    adapters = [open_adapter_arg(args, ref) for ref in args.run]
    announce_precision(args.precision, adapters[0].device)
    records = read_jsonl(args.data) if args.data else None
    if args.layer_scan:
        scan = layer_scan(adapters[0], settings, args.layers, args.cliff, records)
        table = scan.pivot(index="layer", columns="set", values="auroc")
        table["mean"] = table.mean(axis=1)
        print(table.round(3).to_string())
        print(f"best layer by mean dev AUROC: {int(table['mean'].idxmax())}")
        if args.csv:
            with atomic_open(args.csv) as f:
                scan.to_csv(f, index=False)
        return
    if args.stage == "heldout":
        for a in adapters:
            print(
                f"held-out: report these figures; do not use them to choose settings (layers, steps, thresholds, "
                f"detectors). {a.name}'s held-out sets were evaluated {heldout_count(a)} time(s) before.",
                file=sys.stderr,
            )
    with Bar("transfer") as bar:
        table = transfer_table(adapters, settings, args.cliff, records, progress=bar.stage)
    print(format_markdown(table))
    if args.csv:
        with atomic_open(args.csv) as f:
            table.to_csv(f, index=False)
    if args.json:
        write_json(args.json, {"rows": table.to_dict("records"), **table.attrs})
