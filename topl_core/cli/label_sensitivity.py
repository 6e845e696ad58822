"""`label-sensitivity`: TOPL trained on each label setting (original, random, balanced, bad_skewed, good_skewed,
good_only, dense_balanced; see topl_core.data.label_settings) and the scores per setting next to the label stats
(#tokens, % good, % bad). Resumable: finished settings are kept."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..analysis.studies.label_sensitivity import LabelStudyConfig, label_stats_for, read_label_study, run_label_study
from ..foundations.config_fields import add_config_args, config_args
from ..foundations.executor import ExecutorConfig
from ..foundations.io import write_json
from ..foundations.progress import Bar
from ..training.run_dirs import RunDir
from . import COMMANDS
from .common import (
    ExamplesFormatter,
    add_executor_args,
    add_study_train_args,
    announce_precision,
    executor_from_args,
    study_train_from_args,
)

STUDY = LabelStudyConfig()  # the flags' defaults; its `train` is every setting's template
LAYER_FLAGS = ("lora_layer_start", "lora_layer_end")  # a label study's own training flags, beside every study's


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
    p.add_argument("--stats-only", action="store_true", help="print the label stats table without training")
    p.add_argument("--show", action="store_true", help="print the table of what has finished so far and exit")
    add_config_args(p, LabelStudyConfig, STUDY, skip={"train"})
    add_study_train_args(p, STUDY.train, LAYER_FLAGS)
    p.add_argument("--json", help="write the table here")
    add_executor_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    announce_precision(args.precision, args.device)
    train = study_train_from_args(args, STUDY.train, LAYER_FLAGS)
    cfg = LabelStudyConfig(train=train, **config_args(args, LabelStudyConfig, skip={"train"}))
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
