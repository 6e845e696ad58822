"""`reproduce`: the paper's tables in one command — every training method trained on the same data and split with the
paper's relative settings, measured on the same held-out tokens and documents (LoRA-A separability, factuality ID and
OOD, λ curves, label sensitivity, token-level detection), and a report (report.md, one self-contained report.html)
that sets this run's figures beside the paper's with a verdict per claim. Resumable: finished tasks are kept."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

from ..analysis.studies.reproduce import read_tasks, resume_reproduce, run_reproduce
from ..analysis.studies.reproduce_config import ReproduceConfig
from ..analysis.studies.reproduce_rejudge import rejudge_report
from ..analysis.studies.reproduce_report import read_report
from ..foundations.config_fields import add_config_args, config_args
from ..foundations.progress import Bar, format_seconds
from ..foundations.status import request_stop
from ..jobs.background import read_job
from ..jobs.launchers import launch_reproduce, resume_reproduce_job
from . import CANCELLED, COMMANDS
from .common import add_executor_args, add_study_folder_args, announce_precision, executor_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        help=COMMANDS["reproduce"].help,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the config flags say their defaults
        description="Train every method, measure them on the same held-out data and write the report. Examples:\n"
        "  python -m topl_core reproduce --out runs/paper                  # SmolLM2, the paper's settings scaled\n"
        "  python -m topl_core reproduce --out runs/paper-quick --quick    # the structure end to end, minutes\n"
        "  python -m topl_core reproduce --out runs/paper-qwen --preset qwen3-8b --device cuda\n"
        "  python -m topl_core reproduce --resume runs/paper               # continue; finished tasks are kept\n"
        "  python -m topl_core reproduce --show runs/paper                 # its tasks, and the verdicts\n"
        "  python -m topl_core reproduce --rejudge docs/results/reproduce-smollm2   # a saved report, judged again",
    )
    add_study_folder_args(
        p, "study", "reproduce.json, methods/, tasks/, report.md, report.html", "the study's tasks and, once finished, "
        "its verdicts", "step or task"
    )  # fmt: skip
    p.add_argument(
        "--quick",
        action="store_true",
        help="a tiny random model, a few steps and documents: every table and verdict end to end in minutes (the "
        "suite's, on a small data file: under a minute; its numbers mean nothing); the flags below override it",
    )
    g = p.add_argument_group("what the study trains and measures (--preset alone: the preset's own model)")
    add_config_args(g, ReproduceConfig)  # no defaults here: what is not given comes from the config (or --quick)
    add_executor_args(p)
    p.add_argument(
        "--rejudge",
        metavar="FOLDER",
        help="rewrite the report in FOLDER with the current claims' verdicts and the detection table's model-free "
        "controls, from its saved tables alone (no study folder, no training: reproduce_rejudge.py)",
    )
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> ReproduceConfig:
    given = config_args(args, ReproduceConfig)
    if "preset" in given and "model" not in given:
        given["model"] = given["preset"]  # the paper's model itself, its settings unscaled
    return ReproduceConfig.quick(**given) if args.quick else ReproduceConfig(**given)


def _show(folder: str) -> None:
    job = read_job(folder)
    tasks = read_tasks(folder)
    eta = f", about {format_seconds(job.eta_s)} left" if job and job.eta_s else ""
    done = int((tasks["state"] == "done").sum())
    print(f"status: {job.state if job else 'not started'}, {done}/{len(tasks)} tasks{eta}")
    print(tasks.to_string(index=False, float_format=lambda x: f"{x:.0f}"))
    if (Path(folder) / "report.json").exists():
        print("\nverdicts:")
        for v in read_report(folder)["verdicts"]:
            print(f"- {v['verdict']}: {v['claim']} ({v['this_run']})")
        print(f"\nreport: {Path(folder) / 'report.md'}, {Path(folder) / 'report.html'}")


def run(args: argparse.Namespace) -> int:
    if args.rejudge:
        today = datetime.now(timezone.utc).date().isoformat()
        note = (
            f"Re-judged on {today} from this report's saved tables (`python -m topl_core reproduce --rejudge "
            f"{args.rejudge}`): the verdicts by the current claims (reproduced / unsettled / not reproduced, with "
            "the power estimates), the detection table's model-free controls recomputed on the same tokens; "
            "every other table as the study wrote it."
        )
        print(rejudge_report(args.rejudge, note))
        for v in read_report(args.rejudge)["verdicts"]:
            print(f"- {v['verdict']}: {v['claim']}")
        return 0
    if args.show:
        _show(args.show)
        return 0
    if args.stop:
        request_stop(args.stop)
        print(f"asked {args.stop} to stop after its current training step or task")
        return 0
    executor = executor_from_args(args)
    if args.resume:
        folder = args.resume
        if args.background:
            print(f"the study continues in the background: {resume_reproduce_job(folder, executor)} (job.log there)")
            return 0
        with Bar("tasks") as bar:
            report = resume_reproduce(folder, bar.stage, executor)
    else:
        if not args.out:
            print("error: give --out DIR (or --resume / --show / --stop DIR)", file=sys.stderr)
            return 2
        cfg, folder = config_from_args(args), args.out
        announce_precision(config_args(args, ReproduceConfig).get("precision", "auto"), cfg.device)  # as asked
        if args.background:
            print(
                f"the study started in the background: {launch_reproduce(cfg, folder, executor)}\n"
                f"follow it with: python -m topl_core reproduce --show {folder}"
            )
            return 0
        with Bar("tasks") as bar:
            report = run_reproduce(cfg, folder, bar.stage, executor)
    _show(folder)
    return 0 if report is not None else CANCELLED  # stopped before the end: the job reads as cancelled
