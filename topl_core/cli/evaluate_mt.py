"""`evaluate-mt`: the translation task's table — base and merged models translate MLQE-PE test sentences (ID, the
post-edits as references) and FLORES+ or any parallel files (OOD), scored with chrF offline or COMET by id."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..analysis.evaluation.config import Variant
from ..analysis.evaluation.translation import (
    TranslationConfig,
    evaluate_translation,
    flores_pairs,
    mlqe_pairs,
    parallel_pairs,
    scorer_agreement,
    translation_table,
)
from ..foundations.config_fields import add_config_args, config_args
from ..foundations.errors import ConfigError
from ..foundations.io import atomic_open, write_json
from ..foundations.presets import DEFAULT_MODEL
from ..training.adapters import open_adapter
from . import COMMANDS
from .common import add_precision_arg, announce_precision


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate-mt",
        help=COMMANDS["evaluate-mt"].help,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="example (with the WMT20 task 2 release and FLORES+ on disk):\n"
        "  python -m topl_core evaluate-mt --run runs/topl-mt --lang-pair en-de --mlqe wmt20/en-de/test "
        "--flores flores_plus --n-id 300 --n-ood 300",
    )
    p.add_argument("--run", action="append", default=[], help="an adapter to evaluate merged (repeatable)")
    p.add_argument("--no-base", action="store_true", help="leave out the base model row")
    p.add_argument("--model", help=f"base model when no --run is given (default {DEFAULT_MODEL})")
    p.add_argument("--mlqe", help="ID: an MLQE-PE split folder with test.src and test.pe (the post-edits)")
    p.add_argument("--split", default="test", help="the MLQE-PE split in --mlqe")
    p.add_argument("--flores", help="OOD: a FLORES folder (devtest/<code>.devtest) or a hub dataset id")
    p.add_argument("--ood-src", help="OOD from two parallel files instead: the source sentences")
    p.add_argument("--ood-ref", help="... and their reference translations, line by line")
    p.add_argument("--n-id", type=int, default=16, help="ID sentences")
    p.add_argument("--n-ood", type=int, default=16, help="OOD sentences")
    add_config_args(p, TranslationConfig, TranslationConfig(), skip={"model", "precision"})
    add_precision_arg(p)
    p.add_argument("--no-cache", action="store_true", help="translate again instead of reading cached translations")
    p.add_argument("--csv", help="write the per-sentence rows here")
    p.add_argument("--json", help="write the table and settings here")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> TranslationConfig:
    """The TranslationConfig a command line asks for (its precision resolved and announced)."""
    return TranslationConfig(
        **config_args(args, TranslationConfig, skip={"model", "precision"}),
        model=args.model or DEFAULT_MODEL,
        precision=announce_precision(args.precision, args.device),
    )


def run(args: argparse.Namespace) -> int:
    if args.flores and (args.ood_src or args.ood_ref):
        raise ConfigError("--flores with --ood-src/--ood-ref: give one OOD set.")
    if bool(args.ood_src) != bool(args.ood_ref):
        raise ConfigError("--ood-src and --ood-ref go together (source sentences and their references).")
    if args.model and args.run:
        raise ConfigError("--model with --run: an adapter is evaluated on the base model it was trained on.")
    cfg = config_from_args(args)
    id_pairs = mlqe_pairs(args.mlqe, args.split, args.n_id) if args.mlqe else []
    if args.flores:
        ood_pairs = flores_pairs(args.flores, args.lang_pair, args.n_ood)
    elif args.ood_src:
        ood_pairs = parallel_pairs(args.ood_src, args.ood_ref, args.n_ood)
    else:
        ood_pairs = []
    base = args.model or (open_adapter(args.run[0]).base_model if args.run else DEFAULT_MODEL)
    variants = [] if args.no_base else [Variant.base(base)]
    variants += [Variant.merged(r) for r in args.run]
    if not variants:
        raise ConfigError("nothing to evaluate: give --run, or drop --no-base.")
    per_sentence = evaluate_translation(variants, id_pairs, ood_pairs, cfg, use_cache=not args.no_cache)
    table = translation_table(per_sentence)
    scorer = per_sentence["scorer"].iloc[0]
    print(f"translation {args.lang_pair} ({scorer}; ID = MLQE-PE {args.split}, OOD = {args.flores or args.ood_src}):")
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    agreement = None
    if args.mlqe and (Path(args.mlqe) / f"{args.split}.hter").is_file():  # the scorer's measured quality, as for
        agreement = scorer_agreement(args.mlqe, args.split, args.scorer)  # the summarization scorer's AUROC
        print(
            f"scorer {agreement['scorer']}: Spearman ρ with MLQE-PE's 1 − HTER {agreement['spearman']:.3f} over "
            f"{agreement['n']} machine translations of {args.split}"
        )
    if args.csv:
        with atomic_open(args.csv) as f:
            per_sentence.to_csv(f, index=False)
    if args.json:
        write_json(
            args.json,
            {
                "task": "translation",
                "config": cfg.__dict__,
                "scorer": scorer,
                "scorer_agreement": agreement,
                "table": table.reset_index().to_dict("records"),
            },
        )
    return 0
