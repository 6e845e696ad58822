"""Arguments and loaders shared by several commands."""

from __future__ import annotations

import argparse
import sys

from ..data.records import Record, read_jsonl
from ..data.split import SPLITS, split_records
from ..foundations.config_fields import add_config_args, config_args
from ..foundations.errors import ConfigError
from ..foundations.executor import ExecutorConfig
from ..foundations.paths import project_path
from ..foundations.presets import DEFAULT_MODEL
from ..hardware.precision import PRECISION_HELP, PRECISIONS, ResolvedPrecision, describe_precision, resolve_precision
from ..models.loading import DEVICES
from ..training.adapters import Adapter, open_adapter
from ..training.config import TrainConfig, study_schedule


class ExamplesFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in every argument's help, and a description of example command lines kept as written."""


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="embedded model (smollm2-135m, gemma3-270m), preset, hub id or local path",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=PRECISIONS,
        help="the weights' precision: auto = fp32 on CPU, bf16 on a GPU with bf16 support",
    )
    p.add_argument("--device", default="cpu", choices=DEVICES)


ADAPTER_HELP = (
    "the adapter: a run directory, a PEFT adapter folder (adapter_config.json + adapter_model.safetensors, e.g. from "
    "TRL or peft) or a hub adapter id"
)


def add_adapter_args(p: argparse.ArgumentParser, help: str = ADAPTER_HELP) -> None:
    p.add_argument("--run", required=True, metavar="ADAPTER", help=help)
    p.add_argument(
        "--base-model",
        help="the base model to load the adapter on (default: the run's model, or the adapter's "
        "base_model_name_or_path, an embedded model when it names one)",
    )


def open_adapter_arg(args: argparse.Namespace, ref: str | None = None) -> Adapter:
    """The adapter named by --run (or `ref`), with --base-model applied; says what it opened on stderr."""
    adapter = open_adapter(ref or args.run, getattr(args, "base_model", None))
    print(
        f"adapter: {adapter.name} ({adapter.source}; method {adapter.method or 'unknown'}; base {adapter.base_model}; "
        f"{adapter.lora.describe()})",
        file=sys.stderr,
    )
    return adapter


def data_or_adapter_default(args: argparse.Namespace, adapter: Adapter) -> None:
    """--data defaults to the adapter's run's data (the workbench's default data set for an adapter from elsewhere)."""
    if not args.data:
        args.data = str(project_path(adapter.settings.data))


def add_data_args(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--data", required=required, help="records JSONL (build one with: python -m topl_core data build)")
    p.add_argument("--split", default="test", choices=[*SPLITS, "all"], help="document-level split to use")
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="use at most this many records")


def load_split(args: argparse.Namespace) -> list[Record]:
    records = read_jsonl(args.data)
    if args.split != "all":
        records = split_records(records, seed=args.split_seed)[args.split]
    return records[: args.limit] if args.limit else records


def add_precision_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help=PRECISION_HELP,
    )


def announce_precision(requested: str, device: str = "cpu") -> ResolvedPrecision:
    """Say which precision runs and why (stderr, so tables and JSON on stdout stay clean); returns it resolved."""
    print(f"precision: {describe_precision(requested, device)}", file=sys.stderr, flush=True)
    return resolve_precision(requested, device)


def add_study_folder_args(p: argparse.ArgumentParser, what: str, contents: str, shows: str, stops_after: str) -> None:
    """The flags of a resumable study kept in one folder: --out (a new one), --resume / --show / --stop DIR and
    --background. what: "sweep", "study"…; contents: what the folder holds; shows: what --show prints."""
    p.add_argument("--out", help=f"{what} folder ({contents})")
    p.add_argument("--resume", metavar="DIR", help=f"continue the {what} in DIR with its saved settings")
    p.add_argument("--show", metavar="DIR", help=f"print {shows} and exit")
    p.add_argument("--stop", metavar="DIR", help=f"ask the {what} in DIR to stop after its current {stops_after}")
    p.add_argument("--background", action="store_true", help="run in a detached process (job.log in the folder)")


def add_executor_args(p: argparse.ArgumentParser) -> None:
    """Where a study's independent tasks run (topl_core.foundations.executor)."""
    g = p.add_argument_group("where the tasks run")
    add_config_args(
        g, ExecutorConfig, ExecutorConfig(), notes={"kind": "(default: what the study last used, else local)"}
    )
    g.set_defaults(executor=None)  # no --executor: the study's saved executor (executor_from_args gives None)


def executor_from_args(args: argparse.Namespace) -> ExecutorConfig | None:
    """The executor the flags ask for; None when --executor is not given (the study's saved one, else local)."""
    if args.executor is None:
        if args.ray_address:
            raise ConfigError(f"--ray-address {args.ray_address!r} needs --executor ray.")
        return None
    executor = ExecutorConfig(**config_args(args, ExecutorConfig))
    executor.check_reachable()  # before the study loads anything
    return executor


# the training flags of every study (each run's other TrainConfig fields at the template's value; the validation
# schedule follows the steps): a study adds its own (a sweep's lengths, a label study's LoRA layers)
STUDY_TRAIN_FLAGS = ("model", "data", "steps", "lr", "batch_size", "max_val_examples", "seed", "device")
TRACKER_FLAGS = ("report_to", "mlflow_tracking_uri")


def add_study_train_args(
    p: argparse.ArgumentParser | argparse._ArgumentGroup, template: TrainConfig, more: tuple[str, ...]
) -> None:
    """A study's training flags (STUDY_TRAIN_FLAGS, `more`, the trackers'), defaulting to its template, and the
    precision's ("auto" by default: the template holds it resolved)."""
    add_config_args(p, TrainConfig, template, only=(*STUDY_TRAIN_FLAGS, *more, *TRACKER_FLAGS))
    add_precision_arg(p)


def study_train_from_args(args: argparse.Namespace, template: TrainConfig, more: tuple[str, ...]) -> TrainConfig:
    """The template of every run of a study, with the flags add_study_train_args added."""
    given = config_args(args, TrainConfig, only=(*STUDY_TRAIN_FLAGS, *more, *TRACKER_FLAGS))
    return study_schedule(template.with_overrides(**given, precision=args.precision))
