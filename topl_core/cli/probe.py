"""`probe`: LoRA-A separability of one or more adapters on a labelled token set — per-site AUROC heatmap
(layer × module), mean ± std with a bootstrap CI, the random-init-A control, and the comparison table.
Results are cached under cache/analysis/ (keyed by settings, token set, adapter and base fingerprints)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..analysis.evaluation.config import EvalConfig
from ..analysis.evaluation.indicator import MIN_ADAPTERS_FOR_RHO, factuality_by_adapter, indicator_table
from ..analysis.evaluation.scorers import DEFAULT_SCORER
from ..analysis.lora_a.probe import ProbeSettings, labelled_records, probe_run
from ..analysis.lora_a.separability import METHOD, comparison_table, format_heatmap
from ..data.cliff import load_factuality_csv
from ..foundations.config_fields import add_config_args, config_args
from ..foundations.errors import ConfigError
from ..foundations.io import write_json
from ..foundations.progress import Bar
from . import COMMANDS
from .common import (
    add_adapter_args,
    add_data_args,
    add_precision_arg,
    announce_precision,
    data_or_adapter_default,
    load_split,
    open_adapter_arg,
)

PROBE_FLAGS = ("random_control", "batch_size", "folds", "seed", "n_boot")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help=COMMANDS["probe"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_adapter_args(p)
    p.add_argument(
        "--compare", nargs="*", default=[], metavar="ADAPTER", help="more adapters, probed on the same tokens"
    )
    add_data_args(p)
    p.add_argument(
        "--cliff", help="token set from a CLIFF span CSV (e.g. ../shared/data/CLIFF_error_types.csv) instead of --data"
    )
    p.add_argument("--column", choices=["cv_auroc", "component_auroc"], default="cv_auroc", help="heatmap value")
    # the random-A control (a second capture of every site) only when asked for: --random-control
    add_config_args(p, ProbeSettings, ProbeSettings(random_control=False), only=PROBE_FLAGS)
    add_precision_arg(p)
    p.add_argument(
        "--ood-score",
        nargs="*",
        default=[],
        metavar="RUN=SCORE",
        help="OOD factuality score per run (run directory name) for the comparison table",
    )
    p.add_argument(
        "--evaluate",
        action="store_true",
        help="the paper's indicator table: also generate with every adapter's merged model and add its ID and OOD "
        "factuality and sentence count, with Spearman ρ between LoRA-A AUROC and factuality (cached)",
    )
    p.add_argument("--n-id", type=int, default=16, help="with --evaluate: ID documents (the data's test split)")
    p.add_argument("--n-ood", type=int, default=16, help="with --evaluate: OOD documents (CLIFF)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="with --evaluate: summary length")
    p.add_argument("--scorer", default=DEFAULT_SCORER, help="with --evaluate: factuality scorer (see evaluate --help)")
    p.add_argument("--no-cache", action="store_true", help="recompute instead of reading cache/analysis/")
    p.add_argument("--json", help="write the full report here")
    p.set_defaults(func=run)


def _token_set(args: argparse.Namespace, adapter) -> tuple[str, list]:
    if args.cliff:
        report = load_factuality_csv(args.cliff)
        records = list(report.records)[: args.limit] if args.limit else list(report.records)
        return f"CLIFF {Path(args.cliff).name} ({len(report.skipped)} rows skipped)", labelled_records(records)
    data_or_adapter_default(args, adapter)
    return f"{args.data} [{args.split}]", labelled_records(load_split(args))


def run(args: argparse.Namespace) -> None:
    if args.evaluate and args.ood_score:
        raise ConfigError("--ood-score with --evaluate: --evaluate measures the OOD factuality itself; drop one.")
    runs = [open_adapter_arg(args, ref) for ref in [args.run, *args.compare]]
    token_set, records = _token_set(args, runs[0])
    if not records:
        raise SystemExit("error: the token set holds no records with token labels; pick another --split or data file.")
    announce_precision(args.precision, runs[0].device)
    settings = ProbeSettings(**config_args(args, ProbeSettings, only=PROBE_FLAGS), precision=args.precision)
    ood = {}
    for item in args.ood_score:
        name, _, value = item.partition("=")
        ood[name] = float(value)
    print(f"token set: {token_set}: {len(records)} records")
    print(f"method: {METHOD}")
    results, separabilities, names = [], {}, []
    for rd in runs:
        with Bar(f"capturing {rd.name}") as bar:
            res = probe_run(rd, records, settings, token_set=token_set, use_cache=not args.no_cache, progress=bar)
        name = f"{rd.method or 'adapter'} ({rd.name})"
        while name in separabilities:
            name += "'"
        names.append(name)
        separabilities[name] = res.lora
        results.append(res)
        s = res.lora
        print(f"\n== {name}: {len(s.scores)} sites, {s.n_tokens} tokens ({s.n_bad} bad)")
        print(
            f"LoRA-A AUROC mean ± std: {s.mean:.3f} ± {s.std:.3f}  (95% CI of mean {s.ci_low:.3f}–{s.ci_high:.3f}; "
            f"best-component {s.component_mean:.3f} ± {s.component_std:.3f})"
        )
        if res.control is not None:
            c = res.control
            print(
                f"random-init A (control) mean ± std: {c.mean:.3f} ± {c.std:.3f}  (95% CI "
                f"{c.ci_low:.3f}–{c.ci_high:.3f})"
            )
        print(format_heatmap(s.heatmap(args.column)))
    control, rho = results[0].control, {}
    if args.evaluate:
        cfg = EvalConfig(
            data=args.data or EvalConfig.data,
            n_id=args.n_id,
            n_ood=args.n_ood,
            max_new_tokens=args.max_new_tokens,
            scorer=args.scorer,
            device=runs[0].device,
        )
        with Bar("evaluating merged models", total=len(runs)) as bar:
            factuality = factuality_by_adapter(
                {n: r.path for n, r in zip(names, runs)}, cfg, bar.stage, use_cache=not args.no_cache
            )
        table, rho = indicator_table(separabilities, factuality, control)
    else:
        ood_by_name = {n: ood[r.path.name] for n, r in zip(names, runs) if r.path.name in ood}
        table = comparison_table(separabilities, ood_by_name, control)
    print(
        "\n"
        + table.drop(columns=["mean", "std"]).to_string(
            index=False, float_format=lambda v: "nan" if math.isnan(v) else f"{v:.3f}"
        )
    )
    if rho:
        print(
            f"Spearman ρ of LoRA-A mean AUROC with OOD factuality {rho['ood_factuality']:.3f}, with ID factuality "
            f"{rho['id_factuality']:.3f} over {len(runs)} adapters (factuality: {args.scorer}, sentence protocol; "
            f"NaN below {MIN_ADAPTERS_FOR_RHO} adapters)"
        )
    if args.json:
        write_json(
            args.json,
            {
                "token_set": token_set,
                "records": len(records),
                "method": METHOD,
                "results": [
                    r.to_json() | {"name": n, "heatmap": r.lora.heatmap(args.column).to_dict(orient="index")}
                    for n, r in zip(names, results)
                ],
                "comparison": table.to_dict(orient="records"),
                "spearman": rho,
            },
        )
        print(f"\nwrote {args.json}")
