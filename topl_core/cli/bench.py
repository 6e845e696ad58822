"""`bench`: speed and memory against the measured machine limit and the naive way (ratios, one run); `bench --scale`:
the paper's presets at their published shape on one device (topl_core.bench.scale); `bench --memory`: what fits on a
GPU per paper preset, computed on the meta device (no GPU needed); `bench --slider`: a new λ position of the Steering
page against plain generate (topl_core.bench.slider); `bench --gated`: gated steering against always-on steering and
the merged model's plain generation (topl_core.bench.workbench.gated)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from ..analysis.evaluation.config import EvalConfig
from ..analysis.evaluation.evaluate import steering_vectors_for
from ..bench.gated import format_gated, gated_bench
from ..bench.scale import ScaleSettings, format_scale, run_scale_bench
from ..bench.serve import format_serve, serve_bench, served
from ..bench.slider import format_slider, slider_bench
from ..bench.workbench import main
from ..data.records import read_jsonl
from ..data.split import split_records
from ..foundations.config_fields import add_config_args, config_args
from ..foundations.io import write_json
from ..foundations.paths import DEFAULT_DATA, examples_dir, project_path
from ..foundations.presets import DEFAULT_MODEL, PRESETS
from ..foundations.progress import Bar
from ..hardware.machine import machine_description
from ..models.loading import DEVICES
from ..runtime.modes import MODE_SETTINGS, SteerConfig
from ..runtime.session import SteeringSession
from ..training.adapters import Adapter, open_adapter
from ..training.memory import GIB, what_fits
from . import COMMANDS
from .common import add_precision_arg, announce_precision

SCALE = ScaleSettings()  # the scale flags' defaults (but --device's, which picks the scale benchmark when cuda)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help=COMMANDS["bench"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer steps and repeats (under 3 minutes on 2 cores)")
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--json", help="write the results here")
    p.add_argument(
        "--executors",
        action="store_true",
        help="only time a 4-window sweep run serially here vs as Ray tasks (one CPU each)",
    )
    p.add_argument(
        "--memory",
        action="store_true",
        help="only compute the largest micro-batch of each paper preset and method that fits --budget-gib, with and "
        "without gradient checkpointing (meta-device accounting: no GPU, no weights)",
    )
    p.add_argument(
        "--slider",
        action="store_true",
        help="only time a new λ position of the Steering page's slider (streamed, the prompt reused) against plain "
        "generate of the same text, on --run",
    )
    p.add_argument(
        "--gated",
        action="store_true",
        help="only time gated steering (mode gated at --lam, --tau, --keep) against always-on steering and the merged "
        "model's plain generate, on --run; with its forwards per token",
    )
    p.add_argument(
        "--run",
        default=None,
        help="--slider, --gated and the full benchmark's slider figures: the adapter to steer (default: the demo TOPL "
        "adapter, examples/adapters)",
    )
    p.add_argument("--lam", type=float, default=2.0, help="--gated: λ, in normalised units")
    p.add_argument(
        "--serve",
        action="store_true",
        help="only time the OpenAI-compatible service (serve --run): --clients streaming steered summaries at once "
        "against the same requests one after another, through the openai client (topl_core.bench.serve)",
    )
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8], help="--serve: the concurrencies to time")
    p.add_argument(
        "--slots",
        type=int,
        default=16,
        help="--serve: the server's --slots, rows decoded as one batch (a steered request takes two, so 2 × the most "
        "clients decode every client at once; what the slots cannot hold waits in its queue of 32, more is refused)",
    )
    add_config_args(p, SteerConfig, SteerConfig(), only=MODE_SETTINGS)
    notes = {"new_tokens": "(--slider, --gated, the scale benchmark)"}
    add_config_args(p, ScaleSettings, SCALE, only=("new_tokens",), notes=notes)
    p.add_argument("--budget-gib", type=float, default=78.0, help="GPU memory for --memory (an 80 GB H100: 79.2 GiB)")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[512, 2048], help="sequence lengths for --memory")
    add_precision_arg(p)
    scale = p.add_argument_group("--device cuda (or --scale): the presets at their published shape on one device")
    scale.add_argument(
        "--scale",
        action="store_true",
        help="train TOPL and SFT (tokens/s, MFU, peak memory, padding), capture every site, steer a 17-λ grid "
        "(one at a time and batched) and train two sweep windows (with and without prefix reuse), per model; "
        "implied by --device cuda",
    )
    scale.add_argument(
        "--models",
        nargs="+",
        default=list(PRESETS),
        help="presets (built with random weights at their published shape unless --hub) or any model name",
    )
    scale.add_argument("--device", choices=DEVICES, default="cpu", help="cuda: the scale benchmark on the GPU")
    add_config_args(scale, ScaleSettings, SCALE, skip=("device", "new_tokens", "max_records"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.serve or args.slider or args.gated:
        adapter, document = bench_inputs(args)
        announce_precision(args.precision, adapter.device)  # where the run is served or steered: it loads there
    if args.serve:
        with served(str(adapter.path), args.precision, args.slots) as url:
            res = serve_bench(url, adapter.name, document, args.clients, args.new_tokens)
        res["machine"] = machine_description(adapter.device)  # the server loads the run where it trained
        print(format_serve(res))
        if args.json:
            write_json(args.json, res)
        return
    if args.slider or args.gated:
        return steering_bench(args, adapter, document)  # as asked: "auto" lets the decode steps take their own
    if args.memory:
        return memory_table(args.budget_gib, tuple(args.seq_lens), args.json)
    if args.scale or args.device == "cuda":
        given = config_args(args, ScaleSettings, skip=("device", "max_records"))
        settings = ScaleSettings(device=args.device, **given)
        with Bar("scale bench", total=settings.phases() * len(args.models)) as bar:  # a phase's log line: a stage
            res = run_scale_bench(args.models, args.data, settings, log=bar.stage)
        print(format_scale(res))
        if args.json:
            write_json(args.json, res)
        return
    precision = announce_precision(args.precision)

    def slider() -> dict:  # the slider's figures join the full table, measured on --run as bench --slider measures them
        adapter, document = bench_inputs(args)
        return slider_bench(slider_session(adapter, args.precision), document, args.new_tokens, args.precision)

    main(args.quick, args.data, args.json, args.model, args.executors, precision, slider=slider)


def memory_table(budget_gib: float, seq_lens: tuple[int, ...], json_path: str | None) -> None:
    """Print (and write as JSON) the largest micro-batch that fits per preset × method × length × checkpointing."""
    rows = what_fits(int(budget_gib * GIB), seq_lens, tuple(PRESETS), ("topl", "sft"))
    print(f"largest micro-batch within {budget_gib:g} GiB (computed on the meta device; estimate at that size)")
    print("| preset | method | tokens | micro-batch | GiB | micro-batch, checkpointing | GiB |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for plain, checkpointed in zip(rows[::2], rows[1::2]):
        print(
            f"| {plain.preset} | {plain.method} | {plain.seq_len} | {plain.micro_batch_size} | {plain.total_gib:.1f} "
            f"| {checkpointed.micro_batch_size} | {checkpointed.total_gib:.1f} |",
            flush=True,
        )
    if json_path:
        write_json(json_path, {"budget_gib": budget_gib, "rows": [asdict(r) for r in rows]})


def bench_inputs(args: argparse.Namespace) -> tuple[Adapter, str]:
    """--run (default: the demo TOPL adapter) and the first document of its data's test split."""
    adapter = open_adapter(args.run or str((examples_dir() or project_path("examples/adapters")) / "topl-smollm2"))
    records = read_jsonl(project_path(adapter.settings.data))
    return adapter, split_records(records, seed=adapter.settings.split_seed)["test"][0].document


def slider_session(adapter: Adapter, precision: str) -> SteeringSession:
    """A session on `adapter` and its vectors from its data's validation split."""
    vectors = steering_vectors_for(adapter, EvalConfig(precision=precision))
    return SteeringSession.from_run(adapter, vectors)


def steering_bench(args: argparse.Namespace, adapter: Adapter, document: str) -> None:
    """bench --slider or --gated on `adapter` (bench_inputs) and `document`."""
    precision = args.precision
    session = slider_session(adapter, precision)
    if args.gated:
        how = SteerConfig("gated", **config_args(args, SteerConfig, only=MODE_SETTINGS))
        with Bar("gated bench") as bar:
            res = gated_bench(session, document, how, args.lam, args.new_tokens, precision, log=bar.stage)
        print(format_gated(res))
    else:
        res = slider_bench(session, document, args.new_tokens, precision)
        print(format_slider(res))
    res["machine"] = machine_description(session.lm.model.device.type)
    if args.json:
        write_json(args.json, res)
