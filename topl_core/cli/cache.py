"""`cache`: the size of each folder of cache/ and what it holds; clearing by kind or by age; the size caps applied now
(foundations/cache_usage.py). Light: it imports no torch, so it answers at once."""

from __future__ import annotations

import argparse
import time

from ..foundations.cache_usage import CACHE_KINDS, cap_bytes, clear, enforce_cap, human_bytes, usage
from ..foundations.errors import ConfigError
from ..foundations.paths import cache_dir
from . import COMMANDS

DAY_S = 86400


def register(sub: argparse._SubParsersAction) -> None:
    clearable = [k.name for k in CACHE_KINDS.values() if k.clearable]
    capped = ", ".join(f"{k.name}: {k.cap_env}" for k in CACHE_KINDS.values() if k.cap_env)
    p = sub.add_parser(
        "cache",
        help=COMMANDS["cache"].help,
        description=f"Without options: each folder of the cache, its size, entries, cap and what it holds. Caps in MB "
        f"({capped}; 'none' for no cap): the least recently used entries go first, and an entry removed is computed "
        "or built again when next needed.",
    )
    p.add_argument("--clear", nargs="+", metavar="KIND", choices=[*clearable, "all"],
                   help=f"remove these kinds' entries ({', '.join(clearable)}, or all of them)")  # fmt: skip
    p.add_argument("--older-than", type=float, metavar="DAYS",
                   help="with --clear: only the entries not used for this many days")  # fmt: skip
    p.add_argument("--evict", action="store_true", help="remove least recently used entries down to each cap now")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.older_than is not None and not args.clear:
        raise ConfigError("--older-than DAYS goes with --clear KIND (which kinds to clear).")
    if args.clear:
        kinds = [k.name for k in CACHE_KINDS.values() if k.clearable] if "all" in args.clear else args.clear
        removed = clear(kinds, None if args.older_than is None else args.older_than * DAY_S)
        age = f" unused for {args.older_than:g} days" if args.older_than is not None else ""
        print(f"cleared {len(removed)} files of {', '.join(kinds)}{age}")
    if args.evict:
        for kind in CACHE_KINDS:
            if cap_bytes(kind) is not None:
                print(f"{kind}: {len(enforce_cap(kind))} files evicted to fit {human_bytes(cap_bytes(kind))}")
    show()


def show() -> None:
    rows = usage()
    print(f"{cache_dir()}: {human_bytes(sum(u.bytes for u in rows))}")
    print(f"{'folder':14s} {'size':>9s} {'entries':>7s} {'cap':>9s} {'last used':>10s}  holds")
    now = time.time()
    for u in rows:
        cap = human_bytes(u.cap) if u.cap is not None else "-"
        days = (now - u.last_used) / DAY_S if u.last_used else None
        used = "-" if days is None else "today" if days < 1 else f"{days:.0f} d ago"
        print(f"{u.name:14s} {human_bytes(u.bytes):>9s} {u.entries:7d} {cap:>9s} {used:>10s}  {u.holds}")
