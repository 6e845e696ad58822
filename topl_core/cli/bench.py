"""`bench`: speed and memory against the measured machine limit and the naive way (ratios, one run)."""

from __future__ import annotations

import argparse

from ..bench import main
from ..paths import DEFAULT_DATA
from ..presets import DEFAULT_MODEL
from . import COMMANDS
from .common import add_precision_arg, announce_precision


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help=COMMANDS["bench"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer steps and repeats (under 3 minutes on 2 cores)")
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--json", help="write the results here")
    p.add_argument(
        "--executors",
        action="store_true",
        help="only time a 4-window sweep run serially here vs as Ray tasks (one CPU each)",
    )
    add_precision_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    main(args.quick, args.data, args.json, args.model, args.executors, announce_precision(args.precision))
