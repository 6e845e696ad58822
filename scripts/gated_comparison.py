"""The gated mode's comparison table: gated steering against always-on steering and the merged model, τ, λ and k chosen
on dev documents only (the adapter's val split and CLIFF's val cut), then every metric on held-out documents (its test
split and CLIFF's test cut) with paired 95% intervals (topl_core/analysis/evaluation/gated_comparison.py). Prints the
dev table, the choice and the held-out table (all documents, then per set); --json writes them with every row.

    PYTHONPATH=$PWD .venv/bin/python scripts/gated_comparison.py --run examples/adapters/topl-smollm2 \\
        --n-dev 8 --n-test 40 --json docs/bench/gated-comparison.json
"""

from __future__ import annotations

import argparse
import json

from topl_core.analysis.evaluation.config import EvalConfig
from topl_core.analysis.evaluation.gated_comparison import GatedStudy, Scoring, choose, compare, paired_table
from topl_core.foundations.io import write_json
from topl_core.foundations.paths import examples_dir, project_path
from topl_core.foundations.progress import Bar
from topl_core.hardware.precision import PRECISIONS
from topl_core.runtime.modes import POSITIONS


def records(df) -> list[dict]:
    """A table's rows for JSON, an undefined value (NaN) as null."""
    return json.loads(df.to_json(orient="records", force_ascii=False))


def wide(tables: dict):
    """One row per metric and comparison, one column per set of documents (all, then each set)."""
    import pandas as pd

    long = pd.concat(tables.values())
    cells = long[["mean", "lo", "hi", "n"]].values
    long["cell"] = [f"{m:.3f} [{lo:.3f}, {hi:.3f}] ({int(n)})" for m, lo, hi, n in cells]
    out = long.pivot_table(index=["metric", "comparison"], columns="set", values="cell", aggfunc="first", sort=False)
    return out[["all", *[c for c in out.columns if c != "all"]]].reset_index()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo = (examples_dir() or project_path("examples/adapters")) / "topl-smollm2"
    p.add_argument("--run", default=str(demo), help="the adapter (default: the demo TOPL adapter)")
    p.add_argument("--lambdas", nargs="+", type=float, default=list(GatedStudy.lambdas), help="λ searched (normalised)")
    p.add_argument("--taus", nargs="+", type=float, default=list(GatedStudy.taus), help="τ searched")
    p.add_argument("--keeps", nargs="+", type=int, default=list(GatedStudy.keeps), help="k searched")
    p.add_argument("--n-dev", type=int, default=GatedStudy.n_split, help="dev documents per source (val, CLIFF val)")
    p.add_argument("--n-test", type=int, default=40, help="held-out documents per source (test split, CLIFF test)")
    p.add_argument("--positions", choices=POSITIONS, default=GatedStudy.positions, help="always-on steering's")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--precision", choices=PRECISIONS, default="auto")
    p.add_argument("--json", help="write the dev table, the choice, the held-out tables and every row here")
    args = p.parse_args(argv)

    cfg = EvalConfig(max_new_tokens=args.max_new_tokens, precision=args.precision)
    dev = GatedStudy(args.run, tuple(args.lambdas), tuple(args.taus), tuple(args.keeps), args.n_dev, args.n_dev,
                     args.positions)  # fmt: skip
    test = GatedStudy(dev.run, dev.lambdas, dev.taus, dev.keeps, args.n_test, args.n_test, args.positions)
    scoring = Scoring(dev, cfg)
    with Bar("dev: choosing λ, τ and k", total=len(dev.lambdas) * (1 + len(dev.taus) * len(dev.keeps))) as bar:
        choice = choose(dev, cfg, bar.stage, scoring)
    print(choice.dev.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"\nchosen on dev: always-on λ = {choice.always_on_lambda:g}; gated λ = {choice.gated_lambda:g}, "
          f"τ = {choice.tau:g}, k = {choice.keep}")  # fmt: skip
    with Bar("held out: merged, always-on, gated", total=3) as bar:
        rows = compare(test, cfg, choice, bar.stage, scoring)
    tables = {"all": paired_table(rows), "by_set": paired_table(rows, by_set=True)}
    print("\nheld out: mean [95% interval] (documents); a difference is paired over the same documents")
    print(wide(tables).to_markdown(index=False))
    if args.json:
        write_json(args.json, {
            "study": {**vars(args)},
            "choice": {"always_on_lambda": choice.always_on_lambda, "gated_lambda": choice.gated_lambda,
                       "tau": choice.tau, "keep": choice.keep},
            "dev": records(choice.dev),
            **{f"heldout_{k}": records(t) for k, t in tables.items()},
            "rows": records(rows),
        })  # fmt: skip
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
