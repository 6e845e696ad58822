"""`train`: train (or resume) any method into a run directory. Every TrainConfig field is a flag."""

from __future__ import annotations

import argparse
import sys

from ..foundations.config_fields import add_config_args, config_args, flat_fields
from ..foundations.errors import ConfigError
from ..foundations.paths import runs_dir
from ..foundations.presets import PRESETS
from ..training.config import TrainConfig, preset_config
from ..training.methods import METHODS
from ..training.run_dirs import RunDir
from ..training.trainer import Progress, train
from ..training.world import World
from . import COMMANDS
from .common import announce_precision


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help=COMMANDS["train"].help)
    p.add_argument(
        "--out", help="run directory (default <runs folder>/<method>-<model>; TOPL_RUNS_DIR sets the folder)"
    )
    p.add_argument("--preset", choices=sorted(PRESETS), help="the paper's hyperparameters for a model family")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run with its saved config")
    add_config_args(p, TrainConfig)  # no defaults: a flag not given keeps the config's (or the preset's) value
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    given = config_args(args, TrainConfig)
    method = given.pop("method", "topl")
    if args.preset:
        return preset_config(args.preset, method, **given)
    return TrainConfig(method=method).with_overrides(**given)


def run(args: argparse.Namespace) -> None:
    overrides = [s.flag for s in flat_fields(TrainConfig) if getattr(args, s.dest) is not None]
    overrides += [flag for flag in ("--out", "--preset") if getattr(args, flag[2:])]
    if args.resume and overrides:
        raise ConfigError(
            f"--resume with {' '.join(overrides)}: a resumed run continues with the config it saved, so these would "
            f"be ignored. Drop them, or start a new run (--out) with the settings you want."
        )
    if args.resume:
        run_dir = RunDir(args.resume)
        cfg, _ = run_dir.read_config()
        print(f"resuming {run_dir.path} at step {run_dir.read_status().get('step', 0)} of {cfg.steps}")
    else:
        cfg = config_from_args(args)
        run_dir = RunDir(args.out or runs_dir() / f"{cfg.method}-{cfg.model.replace('/', '_')}")
    requested = cfg.precision if args.resume else (args.precision or "auto")  # a resumed run keeps what it recorded
    announce_precision(requested, cfg.device)

    metric = METHODS[cfg.method].validation_metric  # the method's headline number (AUROC, loss, reward accuracy)

    def report(p: Progress) -> None:
        val = f"  {metric} {p.val[metric]:.3f}" if p.val and metric in p.val else ""
        print(
            f"step {p.step}/{p.steps}  loss {p.loss:.4f}  {p.tokens_per_s:.0f} tok/s  eta {p.eta_s:.0f}s{val}",
            flush=True,
        )

    run = train(cfg, run_dir.path, progress=report)
    if not World.current().is_main:  # under accelerate / torchrun: rank 0 speaks for the run
        return
    print(
        f"{run.read_status()['state']}: {run.path}",
        file=sys.stderr if run.read_status()["state"] != "finished" else sys.stdout,
    )
