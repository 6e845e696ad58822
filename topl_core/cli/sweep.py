"""`sweep`: sliding-window layer sweep — TOPL trained per window (LoRA on layers [s, s+k), head after the window's
last layer) and scored by head token AUROC on the validation split (optionally by generation factuality).
Resumable (finished windows are kept), runnable in the background, with frozen-prefix reuse (on by default)."""

from __future__ import annotations

import argparse
import sys

from ..analysis.studies.sweep_results import compare_reuse, heatmap_table, read_sweep
from ..analysis.studies.sweeps import SweepConfig, resume_sweep, run_sweep
from ..foundations.config_fields import add_config_args, config_args
from ..foundations.errors import ConfigError
from ..foundations.progress import Bar
from ..foundations.status import request_stop
from ..jobs.background import read_job
from ..jobs.launchers import launch_sweep, resume_sweep_job
from . import COMMANDS
from .common import (
    ExamplesFormatter,
    add_executor_args,
    add_study_folder_args,
    add_study_train_args,
    announce_precision,
    executor_from_args,
    study_train_from_args,
)

SWEEP = SweepConfig()  # the flags' defaults; its `train` is every window's template
# a sweep's own training flags, beside every study's (the LoRA layers are each window's)
LENGTH_FLAGS = ("max_doc_tokens", "max_response_tokens")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help=COMMANDS["sweep"].help,
        formatter_class=ExamplesFormatter,
        description="Train TOPL on a grid of layer windows and score each. Examples:\n"
        "  python -m topl_core sweep --out runs/sweep-smollm2 --sizes 3 6 12 --stride 6 --steps 15 --background\n"
        "  python -m topl_core sweep --resume runs/sweep-smollm2      # continue; finished windows are kept\n"
        "  python -m topl_core sweep --show runs/sweep-smollm2        # print the results table and heatmap",
    )
    add_study_folder_args(
        p, "sweep", "sweep.json, status.json, results.jsonl, windows/<run dirs>", "a sweep's results (heatmap table)",
        "step"
    )  # fmt: skip
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("REUSE_DIR", "PLAIN_DIR"),
        help="compare two sweeps of the same grid run with and without prefix reuse (time, AUROC)",
    )
    g = p.add_argument_group("grid")
    g.add_argument("--windows", nargs="+", metavar="START:SIZE", help="explicit windows instead of sizes/stride")
    add_config_args(g, SweepConfig, SWEEP, skip={"train", "windows"})
    add_study_train_args(p.add_argument_group("training (per window)"), SWEEP.train, LENGTH_FLAGS)
    add_executor_args(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    windows = ()
    if args.windows:
        try:
            windows = tuple(tuple(int(x) for x in w.split(":")) for w in args.windows)
        except ValueError as e:
            raise ConfigError(f"--windows {args.windows}: write each as START:SIZE, e.g. 0:3 6:6") from e
    train = study_train_from_args(args, SWEEP.train, LENGTH_FLAGS)
    return SweepConfig(train=train, windows=windows, **config_args(args, SweepConfig, skip={"train", "windows"}))


def _print_results(df) -> None:
    if df.empty:
        print("no finished windows yet")
        return
    cols = [
        c
        for c in (
            "window",
            "start",
            "size",
            "val_token_auroc",
            "val_tokens",
            "loss",
            "train_s",
            "gen_factuality",
            "gen_sentences",
        )
        if c in df.columns
    ]
    print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("\nhead token AUROC (val) by window start (rows) × size (columns):")
    print(heatmap_table(df).to_string(float_format=lambda x: f"{x:.3f}"))


def run(args: argparse.Namespace) -> int:
    if args.show:
        job = read_job(args.show)
        print(
            f"status: {job.state if job else 'no sweep here'}"
            + (f", {job.step}/{job.steps} windows done" if job else "")
            + (f", training {job.current}" if job and job.current else "")
            + (f" ({job.error})" if job and job.error else "")
        )
        _print_results(read_sweep(args.show))
        return 0
    if args.stop:
        request_stop(args.stop)
        print(f"asked {args.stop} to stop after its current step")
        return 0
    if args.compare:
        table = compare_reuse(read_sweep(args.compare[0]), read_sweep(args.compare[1]))
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        tr, tp = table["train_s_reuse"].sum(), table["train_s_plain"].sum()
        print(
            f"\ntotal: {tr:.0f} s with reuse vs {tp:.0f} s without over {len(table)} windows "
            f"(saving {100 * (1 - tr / tp):.0f}%)"
            if tp
            else ""
        )
        return 0

    bar = Bar("sweep windows")

    def report(ev: dict) -> None:
        if ev["event"] == "plan":
            bar.total = ev["todo"]
            bar.note(f"{ev['todo']} windows to train, {ev['executor']}")
        elif ev["event"] == "window":
            bar.note(f"== window {ev['window']} (layers {ev['start']}..{ev['start'] + ev['size'] - 1})")
        elif ev["event"] == "step" and (ev["step"] == ev["steps"] or ev["step"] % 5 == 0):
            bar.note(f"   step {ev['step']}/{ev['steps']} loss {ev['loss']:.4f}")
        elif ev["event"] == "done":
            bar.note(f"   val AUROC {ev['val_token_auroc']:.3f}  ({ev['train_s']:.1f} s)")
            bar.update()

    executor = executor_from_args(args)
    if args.resume:
        if args.background:
            print(f"sweep continues in the background: {resume_sweep_job(args.resume, executor)} (job.log there)")
            return 0
        df = resume_sweep(args.resume, report, executor)
        out = args.resume
    else:
        if not args.out:
            print("error: give --out SWEEP_DIR (or --resume / --show)", file=sys.stderr)
            return 2
        cfg = config_from_args(args)
        announce_precision(args.precision, args.device)
        if args.background:
            print(
                f"sweep started in the background: {launch_sweep(cfg, args.out, executor)}\n"
                f"follow it with: python -m topl_core sweep --show {args.out}"
            )
            return 0
        df = run_sweep(cfg, args.out, report, executor=executor)
        out = args.out
    bar.close()  # end the bar's line before the tables
    print(f"\nstatus: {read_job(out).state}")
    _print_results(df)
    return 0
