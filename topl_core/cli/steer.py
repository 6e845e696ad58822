"""`steer`: LoRA-B steering vectors v = scaling·B(μ+ − μ−) at the top-k residual-writing sites (o_proj, down_proj)
by LoRA-A AUROC, and the merged model's summary of a document for each λ (λ·v added at those sites), next to the
base model's. Vectors come from a labelled token set (default: the run's data, val split) or from --vectors DIR
(an earlier --export). Without --tau / --lambdas, a mode the adapter's recommendation covers (`recommend`: gated τ and
λ, the vector mode's λ) runs at the recommended values — the merged model's λ beside them — and says so."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path

from ..analysis.evaluation.recommend import opening
from ..analysis.steering.llama_cpp import export_for_llama_cpp
from ..analysis.studies.deck import DeckConfig, create_deck, read_deck
from ..analysis.studies.deck_html import write_deck_html, write_frames
from ..analysis.studies.deck_prepare import prepare_deck
from ..data.records import read_jsonl, read_utf8
from ..data.split import split_records
from ..foundations.config_fields import DECLARED, add_config_args, config_args, field_infos
from ..foundations.io import write_json
from ..foundations.progress import Bar
from ..inference.generate import GenerationConfig, generate
from ..models.loading import ModelSpec, load_model
from ..runtime.modes import SteerConfig, modes_help
from ..runtime.session import SteeringSession
from ..training.adapters import open_adapter
from . import CANCELLED, COMMANDS
from .common import (
    ADAPTER_HELP,
    add_adapter_args,
    add_precision_arg,
    announce_precision,
    data_or_adapter_default,
    open_adapter_arg,
)
from .vectors_args import add_vectors_args, vectors_from_args

GENERATION_FLAGS = ("max_new_tokens", "seed")  # GenerationConfig's mode is --decoding here


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("steer", help=COMMANDS["steer"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_adapter_args(p, ADAPTER_HELP + " (its LoRA is merged; its B gives the vectors)")
    p.add_argument("--document", help="document text to summarise")
    p.add_argument("--document-file", help="read the document from this file instead")
    p.add_argument(
        "--lambdas",
        nargs="+",
        type=float,
        help="λ grid — not given: the merged model's λ and the adapter's recommended one where `recommend` set one "
        "for the mode, else the mode's grid",
    )
    recommended_tau = "— not given: the adapter's recommended τ (python -m topl_core recommend), else 0.5"
    # and a mode's own settings: gated τ, k; τ not given: the recommended one (steer_config)
    add_config_args(p, SteerConfig, SteerConfig(), notes={"mode": modes_help(), "tau": recommended_tau})
    p.set_defaults(tau=None)
    add_vectors_args(p)
    p.add_argument("--export", help="export the steering vectors (safetensors + JSON) to this directory")
    p.add_argument(
        "--export-gguf",
        metavar="FILE",
        help="also write the --mode (vector or diff-mean) vectors at λ = 1 in --units as a llama.cpp control vector, "
        "and the adapter's LoRA beside it as FILE's stem + .lora.gguf (llama.cpp's --lora); prints the llama.cpp line",
    )
    add_config_args(p, GenerationConfig, GenerationConfig(), only=GENERATION_FLAGS)
    decoding = field_infos(GenerationConfig)["mode"]  # --mode is the steering mode's
    p.add_argument("--decoding", choices=decoding.choices, default=decoding.default, help=decoding.help)
    p.add_argument("--no-base", action="store_true", help="skip the base model's summary")
    p.add_argument("--json", help="write vectors' metadata and the generations here")
    deck = p.add_argument_group("deck (talk mode; analysis/studies/deck.py)")
    deck.add_argument(
        "--deck",
        metavar="DIR",
        help="prepare a deck in DIR: base, merged and every --lambdas position of each document, with the head's "
        "verdict (resumes a deck already there, with its own settings)",
    )
    deck.add_argument(
        "--deck-documents",
        type=int,
        default=3,
        metavar="N",
        help="without --document: the first N documents of --data's test split",
    )
    add_config_args(deck, DeckConfig, DECLARED, only=("head",))
    deck.add_argument("--export-html", metavar="FILE", help="write the deck as one self-contained HTML file")
    deck.add_argument("--frames", metavar="DIR", help="write PNG frames of the exported HTML (needs --export-html)")
    deck.add_argument(
        "--frame-lambdas", nargs="+", type=float, help="the λ positions of the frames (default: every position)"
    )
    add_precision_arg(p)
    p.set_defaults(func=run)


def run_deck(args: argparse.Namespace) -> int:
    """--deck: create (or resume) the deck, prepare it, export it."""
    folder = Path(args.deck)
    if read_deck(folder) is None:
        rd = open_adapter_arg(args)
        if args.document_file:
            args.document = read_utf8(args.document_file)
        if args.document:
            documents = (args.document,)
        else:
            data_or_adapter_default(args, rd)
            test = split_records(read_jsonl(args.data), seed=args.split_seed)["test"]
            documents = tuple(dict.fromkeys(r.document for r in test))[: args.deck_documents]
        how, _ = steer_config(args, rd, grid=True)  # a deck's λ positions are a grid: its slider moves along them
        cfg = DeckConfig(
            str(rd.path),
            documents,
            tuple(args.lambdas or how.spec.lambda_grid),
            **asdict(how),  # mode, positions, units and a mode's own settings: fields of both configs
            **config_args(args, DeckConfig, only=("top_k", "head")),
            max_new_tokens=args.max_new_tokens,
            data=args.data,
            precision=args.precision,
        )
        create_deck(folder, cfg)
    else:
        print(f"resuming the deck in {folder} with its own settings", file=sys.stderr)
    cfg = read_deck(folder).config
    announce_precision(cfg.precision, open_adapter(cfg.adapter).device)
    with Bar("preparing the deck") as bar:
        stats = prepare_deck(folder, progress=bar)
    for note in stats.redone:
        print(note)
    print(f"deck {folder}: {stats.generated} summaries generated, {stats.skipped} already there ({stats.state})")
    if stats.state == "cancelled":
        return CANCELLED
    deck = read_deck(folder)
    if args.export_html:
        write_deck_html(deck, args.export_html)
        print(f"wrote {args.export_html}")
    if args.frames:
        if not args.export_html:
            raise SystemExit("error: --frames renders the exported page: give --export-html FILE too")
        frames = write_frames(args.export_html, args.frames, args.frame_lambdas or deck.config.lambdas)
        print(f"wrote {len(frames)} frames to {args.frames}")
    return 0


def steer_config(args: argparse.Namespace, adapter, grid: bool = False) -> tuple[SteerConfig, list[float]]:
    """The steering the command line asks for (the mode, its positions and units, its own settings) and its λ
    positions; τ and λ not given come from the adapter's recommendation where it covers the mode (λ in normalised
    units only; with `grid`, the positions stay the mode's grid), with the line saying where they came from."""
    how = SteerConfig(**config_args(args, SteerConfig))
    lambdas = list(args.lambdas or how.spec.lambda_grid)
    open_lambda = not (args.lambdas or grid)
    asked = (["τ"] if "tau" in how.spec.settings and args.tau is None else []) + (["λ"] if open_lambda else [])
    if not asked:
        return how, lambdas
    opens = opening(adapter, how.mode)
    if args.tau is None and opens.tau is not None:
        how = replace(how, tau=opens.tau)
    if open_lambda and opens.lam is not None and how.units == "normalised":
        lambdas = [how.neutral, opens.lam]
    print(f"{opens.source} ({' and '.join(asked)} not given; {how.label()})")
    return how, lambdas


def run(args: argparse.Namespace) -> int | None:
    if args.deck:
        return run_deck(args)
    if args.document_file:
        args.document = read_utf8(args.document_file)  # not UTF-8 or unreadable: a DataError naming the fix
    if not args.document:
        raise SystemExit("error: give --document TEXT or --document-file PATH")
    rd = open_adapter_arg(args)
    precision = announce_precision(args.precision, rd.device)
    vectors = vectors_from_args(args, rd, precision)
    norms = vectors.norms()
    print(f"steered sites ({vectors.n_good} good / {vectors.n_bad} bad tokens; v = scaling·B(μ+ − μ−)):")
    for s in vectors.sites:
        print(f"  {s.key:14s} AUROC {vectors.auroc[s.key]:.3f}  ‖v‖ {norms[s.key]:.4g}")
    how, lambdas = steer_config(args, rd)
    unit_note = how.spec.action.unit_note(vectors, how.spec, how.units)
    if unit_note:
        print(unit_note)
    if args.export:
        vectors.save(args.export)
        print(f"exported to {args.export}")
    session = SteeringSession.from_run(rd, vectors, rd.base_model)
    if args.export_gguf:
        exported = export_for_llama_cpp(vectors, args.export_gguf, how.mode, how.units, session.lm.model.config)
        print(f"llama.cpp control vector ({how.mode}, λ = 1 in {how.units} units): {exported.vector}")
        print(f"llama.cpp LoRA adapter (the vectors were computed on base + this LoRA): {exported.lora}")
        if exported.left_out:
            print(f"  left out (llama.cpp has no direction for layer 0): {', '.join(exported.left_out)}")
        print(f"  in llama.cpp (steers every position, as --positions all): {exported.command(lambdas[-1])}")

    given = config_args(args, GenerationConfig, only=GENERATION_FLAGS)
    gen = GenerationConfig.chosen(args.precision, **given, mode=args.decoding)
    rows = []
    if not args.no_base:
        base_text = generate(
            load_model(ModelSpec.computing(rd.base_model, args.precision, rd.device)), [args.document], gen
        )[0]
        rows.append({"model": "base", "lambda": None, "text": base_text})
        print(f"\n== base model\n{base_text}")
    print(f"\ngenerating {len(lambdas)} λ positions …", flush=True)
    for lam, g in zip(lambdas, session.grid_generations(args.document, lambdas, gen, how=how)):
        rows.append({"model": "merged" if lam == how.neutral else "steered", "lambda": lam, **g.to_json()})
        print(f"\n== merged, λ = {lam:g} ({how.label()})\n{g.text}")
        if g.note():  # a gated mode: how many tokens the head took back and what replaced them
            print(f"-- {g.note()}: " + ", ".join(f"{r.original!r} → {r.replacement!r}" for r in g.replacements))
    if args.json:
        write_json(
            args.json,
            {
                "run": str(rd.path),
                "vectors": vectors.metadata(),
                "steering": how.key(),
                "precision": precision,
                "decode_precision": gen.decode_on(rd.device),
                "document": args.document,
                "generations": rows,
            },
        )
        print(f"\nwrote {args.json}")
