"""`evaluate`: factuality of generated summaries for base / merged / steered models on ID (held-out test split of
the training data) and OOD (CLIFF documents), scored with a pluggable scorer under the sentence and full-summary
protocols, with average sentence counts — the paper's results table. With --lambdas: the λ sweep of one run
(factuality and length vs λ, with every generated text). With --scorer-quality: the offline scorer's measured AUROC."""

from __future__ import annotations

import argparse
import sys

from ..analysis.evaluation.config import EvalConfig, Variant
from ..analysis.evaluation.evaluate import evaluate, protocol_agreement, results_table
from ..analysis.evaluation.lambda_study import CURVE_KEYS, lambda_curve, lambda_sweep
from ..analysis.evaluation.quality import scorer_quality
from ..analysis.evaluation.scorers import PROTOCOLS, make_scorer
from ..foundations.config_fields import add_config_args, config_args
from ..foundations.errors import ConfigError
from ..foundations.executor import ExecutorConfig
from ..foundations.io import atomic_open, write_json
from ..foundations.presets import DEFAULT_MODEL
from ..foundations.progress import Bar
from ..runtime.modes import MODE_SETTINGS, MODES, UNITS_DOC, SteerConfig, lambda_grids, modes_help
from ..training.adapters import open_adapter
from . import COMMANDS
from .common import ExamplesFormatter, add_executor_args, add_precision_arg, announce_precision, executor_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help=COMMANDS["evaluate"].help,
        formatter_class=ExamplesFormatter,
        description="Examples:\n"
        "  python -m topl_core evaluate --run runs/topl --steer 2 --n-id 16 --n-ood 16\n"
        "  python -m topl_core evaluate --run runs/topl --lambdas -4 -2 -1 0 1 2 4 --n-id 12\n"
        "  python -m topl_core evaluate --scorer-quality",
    )
    p.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="ADAPTER",
        help="adapter to evaluate merged (repeatable): a run directory, a PEFT folder or a hub id",
    )
    p.add_argument("--no-base", action="store_true", help="leave out the base model row")
    p.add_argument(
        "--steer",
        nargs="+",
        type=float,
        default=[],
        metavar="LAMBDA",
        help="also evaluate each run steered with these λ values (LoRA-B steering)",
    )
    p.add_argument(
        "--lambdas",
        nargs="+",
        type=float,
        metavar="LAMBDA",
        help="λ sweep: factuality and fluency vs λ for every --run, in each of --modes",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        choices=tuple(MODES),
        default=["vector"],
        help="λ sweep: how λ steers. " + modes_help() + " Adding modes in normalised units (" + UNITS_DOC + ")",
    )
    p.add_argument(
        "--scaled-lambdas",
        "--conditional-lambdas",
        nargs="+",
        type=float,
        metavar="LAMBDA",
        help="λ grid of the modes whose λ is not in normalised units (scaling the update, ...; default: --lambdas)",
    )
    # λ sweep: the positions, and a mode's own settings (gated τ, k)
    add_config_args(p, SteerConfig, SteerConfig(), only=("positions", *MODE_SETTINGS))
    p.add_argument("--sets", nargs="+", choices=["ID", "OOD"], default=["ID"], help="document sets of the λ sweep")
    p.add_argument(
        "--scorer-quality", action="store_true", help="print the scorer's measured AUROC on CLIFF / HaluEval"
    )
    p.add_argument("--model", help=f"base model when no --run is given (default {DEFAULT_MODEL})")
    add_config_args(p, EvalConfig, EvalConfig(), skip={"model", "precision"})
    add_precision_arg(p)
    p.add_argument("--no-cache", action="store_true", help="regenerate instead of reading cached generations")
    p.add_argument("--csv", help="write the per-document rows (with texts) here")
    p.add_argument("--json", help="write tables and settings here")
    add_executor_args(p)
    p.set_defaults(func=run)


def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """The EvalConfig a command line asks for (its precision resolved and announced)."""
    return EvalConfig(
        **config_args(args, EvalConfig, skip={"model", "precision", "decode_precision"}),
        model=args.model or DEFAULT_MODEL,
        precision=announce_precision(args.precision, args.device),
        # --decode-precision when named; else an explicit --precision decodes in it too
        decode_precision=args.precision if args.decode_precision == "auto" else args.decode_precision,
    )


def run(args: argparse.Namespace) -> int:
    if args.model and args.run:
        raise ConfigError(
            f"--model {args.model} with --run: an adapter is evaluated on the base model it was trained on, so "
            "--model would be ignored. Drop --model (it names the base model of an evaluation without --run)."
        )
    args.model = args.model or DEFAULT_MODEL
    executor = executor_from_args(args) or ExecutorConfig()
    if executor.kind != "local" and args.lambdas is not None:
        raise ConfigError(
            "--executor ray runs an evaluation's variants (base, merged, --steer) as tasks; the λ study "
            "(--lambdas) runs in this process. Drop --executor or --lambdas."
        )
    cfg = config_from_args(args)
    out: dict = {"config": cfg.__dict__}

    if args.scorer_quality:
        q = scorer_quality(make_scorer(args.scorer), args.cliff)
        print(f"scorer {q.scorer}: AUROC of faithful vs hallucinated summaries")
        print(q.table().to_string(index=False, float_format=_fmt))
        out["scorer_quality"] = q.to_json()
        if not args.run and not args.lambdas:
            if args.json:
                write_json(args.json, out)
            return 0

    if args.lambdas is not None:
        if not args.run:
            print("error: --lambdas needs --run RUN_DIR", file=sys.stderr)
            return 2
        own_axis = [m for m in args.modes if not MODES[m].action.units_apply]  # λ not in the direction's units
        grids = lambda_grids(args.modes, args.lambdas, dict.fromkeys(own_axis, args.scaled_lambdas or args.lambdas))
        total = len(args.run) * sum(len(g) for g in grids.values())
        with Bar("(run, mode, λ)", total=total) as bar:
            df = lambda_sweep(
                args.run,
                args.lambdas,
                cfg,
                sets=tuple(args.sets),
                progress=bar.stage,
                use_cache=not args.no_cache,
                modes=args.modes,
                positions=args.positions,
                grids=grids,
                settings=config_args(args, SteerConfig, only=MODE_SETTINGS),
            )
        curve = lambda_curve(df)
        print(f"λ sweep (steered sites {df.attrs.get('sites')}; scorer {cfg.scorer}, sentence protocol; 95% interval")
        print("= mean ± 1.96 s.e. over documents; *_fluent: the texts not marked degenerate)")
        shown = [c for c in curve.columns if not c.endswith(("_sem", "_n"))]
        print(curve[shown].to_string(index=False, float_format=_fmt))
        print("\nfull-summary protocol:")
        full = lambda_curve(df, "full")
        print(
            full[[*CURVE_KEYS, "factuality", "factuality_lo", "factuality_hi"]].to_string(
                index=False, float_format=_fmt
            )
        )
        out["lambda_curve"] = curve.to_dict("records")
        out["lambda_curve_full"] = full.to_dict("records")
        out["lambda_curve_by_set"] = lambda_curve(df, by_set=True).to_dict("records")
        out["sites"] = df.attrs.get("sites")
        out["steering"] = {
            "modes": args.modes,
            "positions": args.positions,
            "units": UNITS_DOC,
            **config_args(args, SteerConfig, only=MODE_SETTINGS),
        }
        per_doc = df
    else:
        variants = [] if args.no_base else [Variant.base(args.model if not args.run else None)]
        for r in args.run:
            variants.append(Variant.merged(r))
            variants += [Variant.steered(r, lam) for lam in args.steer]
        if not variants:
            print("error: nothing to evaluate (give --run, or drop --no-base)", file=sys.stderr)
            return 2
        if args.run and not args.no_base:
            variants[0] = Variant.base(open_adapter(args.run[0]).base_model)
        with Bar("variants", total=len(variants)) as bar:
            res = evaluate(variants, cfg, progress=bar.stage, use_cache=not args.no_cache, executor=executor)
        per_doc = res.per_doc
        ood = cfg.ood_data or "CLIFF"
        for protocol in PROTOCOLS:
            print(f"\nfactuality ({res.scorer}, {protocol} protocol; ID = test split of {cfg.data}, OOD = {ood}):")
            print(results_table(per_doc, protocol, by_source=True).to_string(float_format=_fmt))
            out[f"table_{protocol}"] = results_table(per_doc, protocol, by_source=True).reset_index().to_dict("records")
        agreement = protocol_agreement(per_doc)
        print(
            f"\nprotocols agree: Spearman ρ sentence-level vs full-summary {agreement['summaries']:.3f} over "
            f"{agreement['n_summaries']} summaries, {agreement['variants']:.3f} over the {agreement['n_variants']} "
            "variants' means (NaN below 3)"
        )
        out["protocol_agreement"] = agreement
        if res.quality is not None:
            print(f"\n{res.quality.summary()}")
            out["scorer_quality"] = res.quality.to_json()
    if args.csv:
        with atomic_open(args.csv) as f:  # a concurrent reader never sees half a table
            per_doc.to_csv(f, index=False)
        print(f"wrote {args.csv}")
    if args.json:
        out["rows"] = per_doc.to_dict("records")
        write_json(args.json, out)
        print(f"wrote {args.json}")
    return 0
