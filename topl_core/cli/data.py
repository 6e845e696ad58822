"""`data build | inspect | stats`: make, look at and count token-level supervision data."""

from __future__ import annotations

import argparse
from collections import Counter

from ..analysis.evaluation.config import EvalConfig
from ..analysis.studies.own_summaries import generate_own_summaries, own_summary_records
from ..data import cliff, fava, halueval, mlqe
from ..data.encode import encode_record
from ..data.perturb import RECIPES
from ..data.records import Record, merge_jsonl, read_jsonl, write_jsonl
from ..data.split import split_records
from ..data.variants import label_settings_table
from ..errors import DataError
from ..models import ModelSpec, load_model
from ..presets import DEFAULT_MODEL
from ..progress import Bar
from . import COMMANDS
from .common import add_model_args

SOURCES = ("halueval-perturbed", "halueval-pairs", "fava", "cliff", "aggrefact", "mlqe", "jsonl")
# Sources that generate with a model (minutes to hours): the Data page builds them as background jobs.
GENERATED_SOURCES = ("own-summaries",)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help=COMMANDS["data"].help)
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    b = dsub.add_parser("build", help="build a records JSONL from a source")
    b.add_argument(
        "--source",
        choices=SOURCES + GENERATED_SOURCES,
        default="halueval-perturbed",
        help="halueval-perturbed: seeded edits of HaluEval's faithful summaries (token labels); "
        "halueval-pairs: HaluEval right/hallucinated (sequence labels); fava: JSONL rows of FAVA tagged "
        "text; cliff/aggrefact: CSV; mlqe: directory with SPLIT.src/.mt/.tags; jsonl: validate and copy; "
        "own-summaries: --model's own summaries of the HaluEval documents, labelled by a lexical rule "
        "(analysis/studies/own_summaries.py; generation is cached, a stopped build resumes)",
    )
    b.add_argument("--input", help="input path (default: the embedded HaluEval file for halueval-*)")
    b.add_argument("--fava-form", choices=["raw", "completion"], default="raw")
    b.add_argument("--mlqe-split", default="train")
    b.add_argument("--limit", type=int, default=600, help="documents to read (HaluEval has 10,000)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default="v1",
        help="halueval-perturbed edit recipe: v1 = entity, number, date, negation, relation, invented; v2 adds "
        "attribution, swap, extrinsic, modal, copied and lower-cases 15%% of documents (docs/evaluation.md §6)",
    )
    b.add_argument("--out", required=True, help="output JSONL")
    b.add_argument("--model", default=DEFAULT_MODEL, help="own-summaries: the model that writes the summaries")
    b.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="own-summaries: where it generates")
    b.add_argument(
        "--max-new-tokens",
        type=int,
        default=EvalConfig.max_new_tokens,
        help="own-summaries: the longest summary, in tokens (the evaluation's default)",
    )
    b.set_defaults(func=build)

    m = dsub.add_parser("merge", help="join records JSONL files into one (e.g. perturbations + own summaries)")
    m.add_argument("inputs", nargs="+", help="records JSONL files, in order")
    m.add_argument("--out", required=True, help="output JSONL")
    m.set_defaults(func=merge)

    i = dsub.add_parser("inspect", help="print records with bad spans marked [[like this]]")
    i.add_argument("path")
    i.add_argument("-n", type=int, default=3)
    i.add_argument("--source", default=None, help="only records of this source")
    i.set_defaults(func=inspect)

    s = dsub.add_parser("stats", help="counts per source/split, and token label stats per label setting")
    s.add_argument("path")
    s.add_argument("--split", default="train", choices=["train", "val", "test"])
    add_model_args(s)
    s.set_defaults(func=stats)


def load_source(
    source: str,
    input_path: str | None,
    limit: int | None,
    seed: int,
    fava_form: str = "raw",
    mlqe_split: str = "train",
    progress=None,
    recipe: str = "v1",
) -> list[Record]:
    """Records from any supported source (shared by the CLI and the Data page)."""
    if source.startswith("halueval"):
        rows = halueval.load_halueval_rows(input_path, limit=limit)
        if source == "halueval-pairs":
            return halueval.halueval_pair_records(rows)
        return halueval.halueval_perturbation_records(rows, seed=seed, progress=progress, recipe=recipe)
    if input_path is None:
        raise DataError(f"source {source!r} needs an input path (--input PATH).")
    if source == "fava":
        return fava.load_fava_jsonl(input_path, fava_form)
    if source in ("cliff", "aggrefact"):
        report = cliff.load_factuality_csv(input_path)
        print(report)
        return list(report.records)
    if source == "mlqe":
        return mlqe.load_mlqe_dir(input_path, split=mlqe_split)
    return read_jsonl(input_path)


def build(args: argparse.Namespace) -> None:
    if args.source == "own-summaries":
        records = _own_summaries(args)
    else:
        with Bar(f"building {args.source}") as bar:
            records = load_source(
                args.source, args.input, args.limit, args.seed, args.fava_form, args.mlqe_split, bar, args.recipe
            )
        if args.limit and not args.source.startswith("halueval"):
            records = records[: args.limit]
    write_jsonl(records, args.out)
    print(f"wrote {len(records)} records to {args.out}")


def _own_summaries(args: argparse.Namespace) -> list[Record]:
    rows = halueval.load_halueval_rows(args.input, limit=args.limit)
    with Bar(f"{args.model} summarising", total=len(rows)) as bar:
        summaries = generate_own_summaries(
            args.model, rows, device=args.device, progress=bar, max_new_tokens=args.max_new_tokens
        )
    records, report = own_summary_records(rows, summaries, args.model)
    print(report)
    return records


def merge(args: argparse.Namespace) -> None:
    records = merge_jsonl(args.inputs)
    write_jsonl(records, args.out)
    print(f"wrote {len(records)} records from {len(args.inputs)} files to {args.out}")


def mark_spans(r: Record) -> str:
    """The response with each bad span marked [[like this]]<kind> (a record's spans never overlap: it merges them)."""
    out, pos = [], 0
    for s in sorted(r.bad_spans, key=lambda s: s.start):
        out += [r.response[pos : s.start], "[[", r.response[s.start : s.end], f"]]<{s.kind}>"]
        pos = s.end
    return "".join(out + [r.response[pos:]])


def inspect(args: argparse.Namespace) -> None:
    records = [r for r in read_jsonl(args.path) if args.source in (None, r.source)]
    for r in records[: args.n]:
        print(f"== {r.id}  source={r.source} seq_label={r.sequence_label} token_labels={r.token_labels_known}")
        print(f"document: {r.document[:300]}{'…' if len(r.document) > 300 else ''}")
        print(f"response: {mark_spans(r)}\n")


def stats(args: argparse.Namespace) -> None:
    records = read_jsonl(args.path)
    print(f"{len(records)} records, {len({r.doc_id for r in records})} documents")
    print("by source:", dict(Counter(r.source for r in records)))
    print("by sequence label:", dict(Counter(r.sequence_label for r in records)))
    print("by split:", {k: len(v) for k, v in split_records(records).items()})
    chosen = [r for r in split_records(records)[args.split] if r.token_labels_known]
    if not chosen:
        print("no token-labelled records in this split")
        return
    tok = load_model(ModelSpec(args.model, args.dtype, args.device)).tokenizer
    labels = []
    with Bar("tokenizing", total=len(chosen)) as bar:
        for r in chosen:
            labels.append(encode_record(tok, r).response_labels)
            bar.update()
    print(f"\ntoken labels per label setting ({args.split} split, {args.model} tokenizer):")
    print(label_settings_table(labels, seed=0).to_string(index=False))
