"""`label-sensitivity`: TOPL trained on each label setting (original, random, balanced, bad_skewed, good_skewed,
good_only, dense_balanced; see topl_core.data.variants) and the scores per setting next to the label stats
(#tokens, % good, % bad). Resumable: finished settings are kept."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..analysis.studies.label_sensitivity import LabelStudyConfig, label_stats_for, read_label_study, run_label_study
from ..data.variants import LABEL_SETTINGS
from ..executor import ExecutorConfig
from ..io import write_json
from ..models import DEVICES
from ..paths import DEFAULT_DATA
from ..presets import DEFAULT_MODEL
from ..progress import Bar
from ..runs import RunDir
from ..training.config import LoraSettings, TrainConfig
from . import COMMANDS
from .common import (
    ExamplesFormatter,
    add_executor_args,
    add_precision_arg,
    add_tracking_args,
    announce_precision,
    executor_from_args,
    tracking_from_args,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "label-sensitivity",
        help=COMMANDS["label-sensitivity"].help,
        formatter_class=ExamplesFormatter,
        description="Examples:\n"
        "  python -m topl_core label-sensitivity --out runs/labels --stats-only\n"
        "  python -m topl_core label-sensitivity --out runs/labels --steps 20 --n-cliff 100",
    )
    p.add_argument("--out", required=True, help="study directory (one run directory per setting)")
    p.add_argument("--settings", nargs="+", choices=LABEL_SETTINGS, default=list(LABEL_SETTINGS))
    p.add_argument("--stats-only", action="store_true", help="print the label stats table without training")
    p.add_argument("--show", action="store_true", help="print the table of what has finished so far and exit")
    p.add_argument("--n-cliff", type=int, default=0, help="also head token AUROC on this many CLIFF span records")
    p.add_argument("--cliff", help="CLIFF CSV (default ../shared/data/CLIFF_error_types.csv)")
    p.add_argument("--n-generate", type=int, default=0, help="also generation factuality on this many test documents")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lora-layer-start", type=int, default=0)
    p.add_argument("--lora-layer-end", type=int, default=20)
    add_precision_arg(p)
    p.add_argument("--max-val-examples", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=DEVICES, default="cpu")
    add_tracking_args(p)
    p.add_argument("--json", help="write the table here")
    add_executor_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    announce_precision(args.precision, args.device)
    train = TrainConfig(
        model=args.model,
        data=args.data,
        steps=args.steps,
        lr=args.lr,
        batch_size=args.batch_size,
        lora=LoraSettings(layer_start=args.lora_layer_start, layer_end=args.lora_layer_end),
        precision=args.precision,
        max_val_examples=args.max_val_examples,
        seed=args.seed,
        device=args.device,
        eval_every=args.steps,
        checkpoint_every=max(1, min(10, args.steps)),
        **tracking_from_args(args),
    )
    cfg = LabelStudyConfig(
        train=train,
        settings=tuple(args.settings),
        n_cliff=args.n_cliff,
        cliff_csv=args.cliff,
        n_generate=args.n_generate,
    )
    if args.stats_only:
        df = label_stats_for(cfg)
    elif args.show:
        df = read_label_study(args.out)
    else:
        todo = sum(not RunDir(Path(args.out) / s).is_complete for s in cfg.settings)
        with Bar("label settings", total=todo) as bar:  # each "training setting …" message starts a stage
            df = run_label_study(
                cfg,
                args.out,
                progress=lambda m: bar.stage(m) if m.startswith("training setting") else bar.note(m),
                executor=executor_from_args(args) or ExecutorConfig(),
            )
    cols = [c for c in df.columns if c != "run"]
    print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if args.json:
        write_json(args.json, df.to_dict("records"))
    return 0
