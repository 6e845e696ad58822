"""`python -m topl_core <command>`: one module per command group, each with `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import WorkbenchError

# Command modules, in --help order. Each defines register(subparsers) and sets a `func` default on its parsers.
COMMAND_MODULES = ("data", "train", "generate", "score_tokens", "probe", "steer", "evaluate", "sweep", "label_sensitivity", "bench", "merge_check")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m topl_core", description="TOPL Workbench command line.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except WorkbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
