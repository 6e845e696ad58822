"""`python -m topl_core <command>`: one module per command, each with `register(subparsers)` setting a `func`.

Only the module of the command being run is imported. Each imports the core at its top (torch, transformers, PEFT:
seconds on a 2-core CPU, docs/performance.md, "Figures behind the code's choices"), which listing the commands or
rejecting a mistyped one does not need. This dispatch is the project's one deferred import of its own modules
(docs/architecture.md).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple

from ..foundations.errors import WorkbenchError
from ..foundations.status import stop_cleanly_on_sigterm


class Command(NamedTuple):
    module: str  # in this package
    help: str


COMMANDS: dict[str, Command] = {  # in --help order
    "data": Command("data", "build, inspect and count data sets"),
    "train": Command("train", "train TOPL or a baseline; resumes when --out holds the same run"),
    "generate": Command("generate", "generate with the base model or a merged adapter"),
    "score-tokens": Command("score_tokens", "token p(good) for a text, or head/surprisal AUROC on labelled data"),
    "transfer": Command(
        "transfer", "detection transfer: dev / held-out AUROC with CIs for head, frozen probe, surprisal"
    ),
    "probe": Command("probe", "LoRA-A AUROC per layer × module (heatmap, mean ± std, random-A control)"),
    "steer": Command("steer", "LoRA-B steering: generate a summary for each λ"),
    "recommend": Command("recommend", "τ, λ, sites and layer for an adapter, from its own dev documents (cached)"),
    "gated-study": Command(
        "gated_study", "detect-then-steer held out: merged, always-on and gated, in and out of domain, with verdicts"
    ),
    "serve": Command("serve", "the steered model as an OpenAI-compatible service: λ per request, p(good) per token"),
    "evaluate": Command("evaluate", "factuality evaluation (ID/OOD table), λ sweep (--lambdas), scorer quality"),
    "evaluate-mt": Command("evaluate_mt", "translation: ID (MLQE-PE) / OOD (FLORES+) quality table of base and merged"),
    "sweep": Command("sweep", "sliding-window layer sweep (heatmap of head AUROC by window start × size)"),
    "label-sensitivity": Command("label_sensitivity", "train TOPL per label setting; table of label stats and scores"),
    "reproduce": Command("reproduce", "the paper's tables in one study: every method trained, measured, judged"),
    "bench": Command("bench", "benchmark: MFU, TOPL/SFT step, steering, capture, sweep reuse, cache, memory"),
    "export": Command("export", "copy a finished run for sharing (adapter, head, card, config); --push-to-hub ID"),
    "merge-check": Command("merge_check", "compare merged and unmerged logits of an adapter (fp32 and bf16)"),
    "cache": Command("cache", "the cache's size by folder and what it holds; clear by kind or age; size caps"),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: with the full arguments of the command argv names (all commands when argv is None),
    else every command by name and help line only (`python -m topl_core COMMAND --help` shows its arguments)."""
    parser = argparse.ArgumentParser(prog="python -m topl_core", description="TOPL Workbench command line.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    for name, command in COMMANDS.items():
        if argv is None or name == chosen:
            importlib.import_module(f"{__name__}.{command.module}").register(sub)
        elif chosen not in COMMANDS:
            sub.add_parser(name, help=command.help)
    return parser


CANCELLED = 130  # the exit code of work stopped by Ctrl-C or SIGTERM (128 + SIGINT, as shells report it)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    stop_cleanly_on_sigterm()  # `kill`, a scheduler or a container stop: the same clean stop as Ctrl-C
    try:
        return int(args.func(args) or 0)
    except WorkbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # the work took its cancel path (training: checkpoint, state "cancelled")
        print(f"cancelled ({e or 'Ctrl-C'}); a run resumes from its last checkpoint with --resume", file=sys.stderr)
        return CANCELLED
