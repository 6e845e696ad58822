"""`export`: a finished run folder made ready to share (adapter, head, card, config, metrics; no checkpoints, caches
or locks), and with --push-to-hub uploaded to a hub repository."""

from __future__ import annotations

import argparse

from ..training.sharing import export_run, push_to_hub
from . import COMMANDS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help=COMMANDS["export"].help)
    p.add_argument("run", metavar="RUN", help="a finished run directory")
    p.add_argument("dest", metavar="DIR", help="the folder to export into (new or empty)")
    p.add_argument("--push-to-hub", metavar="ID", help="also upload the export to this hub repository (user/name)")
    p.add_argument("--private", action="store_true", help="create the hub repository private (with --push-to-hub)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    out = export_run(args.run, args.dest)
    print(f"exported {args.run} -> {out.path}: {', '.join(sorted(p.name for p in out.path.iterdir()))}")
    if args.push_to_hub:
        print(f"pushed to {push_to_hub(out.path, args.push_to_hub, private=args.private)}")
