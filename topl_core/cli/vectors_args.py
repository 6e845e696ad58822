"""Where a steering command's vectors come from (`steer`, `serve`): --vectors DIR, or a labelled token set."""

from __future__ import annotations

import argparse

from ..analysis.lora_a.probe import ProbeSettings, labelled_records, labelled_split
from ..analysis.steering.extract import build_steering_vectors
from ..analysis.studies.deck import DeckConfig
from ..foundations.config_fields import DECLARED, add_config_args
from ..foundations.progress import Bar
from ..hardware.precision import ResolvedPrecision
from ..runtime.vectors import SteeringVectors
from ..training.adapters import Adapter
from .common import add_data_args, data_or_adapter_default, load_split


def add_vectors_args(p: argparse.ArgumentParser) -> None:
    """Where a command's steering vectors come from: --vectors DIR, or a labelled token set (--data, its val split by
    default) and the top --top-k sites (vectors_from_args)."""
    p.add_argument("--vectors", help="import steering vectors from this directory instead of computing them")
    add_config_args(p, DeckConfig, DECLARED, only=("top_k",))
    add_data_args(p)
    p.set_defaults(split="val")
    p.add_argument(
        "--no-cache", action="store_true", help="recompute the projections instead of reading cache/analysis/"
    )


def vectors_from_args(args: argparse.Namespace, adapter: Adapter, precision: ResolvedPrecision) -> SteeringVectors:
    """The steering vectors add_vectors_args asks for: loaded, or computed (cached) from the token set."""
    if args.vectors:
        print(f"steering vectors from {args.vectors}")
        return SteeringVectors.load(args.vectors)
    if args.data:
        records = labelled_records(load_split(args))
    else:  # the adapter's own data split as it was trained: the evaluation's token set (its cached vectors)
        records = labelled_split(adapter, args.split, args.limit)
        data_or_adapter_default(args, adapter)
    if not records:
        raise SystemExit(f"error: {args.data} [{args.split}] holds no records with token labels.")
    print(f"steering vectors from {args.data} [{args.split}]: {len(records)} labelled records")
    with Bar("capturing LoRA-A projections") as bar:
        return build_steering_vectors(
            adapter,
            records,
            ProbeSettings(random_control=False, precision=precision),
            args.top_k,
            use_cache=not args.no_cache,
            progress=bar,
        )
