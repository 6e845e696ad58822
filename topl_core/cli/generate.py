"""`generate`: merge a run's LoRA (the head is dropped) and generate summaries for one or many documents."""

from __future__ import annotations

import argparse
import json

from ..foundations.config_fields import add_config_args, config_args
from ..foundations.io import atomic_open
from ..foundations.presets import DEFAULT_MODEL
from ..inference.generate import GenerationConfig, generate, load_merged
from ..models.loading import ModelSpec
from . import COMMANDS
from .common import (
    ADAPTER_HELP,
    add_data_args,
    add_model_args,
    add_precision_arg,
    announce_precision,
    load_split,
    open_adapter_arg,
)

GENERATION_FLAGS = ("max_new_tokens", "mode", "temperature", "seed")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate", help=COMMANDS["generate"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--run", metavar="ADAPTER", help=ADAPTER_HELP + " whose LoRA is merged (omit for the base model)")
    add_model_args(p)
    p.add_argument("--document", help="one document (else --data)")
    add_data_args(p)
    add_config_args(p, GenerationConfig, GenerationConfig(), only=GENERATION_FLAGS)
    p.add_argument("--out", help="write JSONL {id, document, generated} here")
    add_precision_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.document:
        items = [("input", args.document)]
    elif args.data:
        items = [(r.id, r.document) for r in load_split(args)]
        items = list(dict((doc, (rid, doc)) for rid, doc in items).values())  # one generation per document
    else:
        raise SystemExit("error: give --document TEXT or --data PATH")
    spec = ModelSpec(args.model, args.dtype, args.device)
    adapter = None
    if args.run:  # --model, when given, is the base model the adapter is loaded on
        adapter = open_adapter_arg(args, args.run)
        model = args.model if args.model != DEFAULT_MODEL else adapter.base_model
        spec = ModelSpec(model, args.dtype, args.device)
    lm = load_merged(spec, adapter)
    announce_precision(args.precision, args.device)
    cfg = GenerationConfig.chosen(args.precision, **config_args(args, GenerationConfig, only=GENERATION_FLAGS))
    texts = generate(lm, [d for _, d in items], cfg)
    rows = [{"id": rid, "document": doc, "generated": t} for (rid, doc), t in zip(items, texts)]
    if args.out:
        with atomic_open(args.out) as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    for r in rows:
        print(f"== {r['id']}\n{r['generated']}\n")
