"""`data build | inspect | stats`: make, look at and count token-level supervision data."""

from __future__ import annotations

import argparse
import textwrap
from collections import Counter

from ..analysis.evaluation.config import EvalConfig
from ..analysis.studies.own_summaries import generate_own_summaries, own_summary_records
from ..config_fields import add_config_args, config_args, field_infos
from ..data import halueval
from ..data.encode import encode_record
from ..data.records import Record, merge_jsonl, read_jsonl, write_jsonl
from ..data.sources import SOURCES, SourceOptions, read_source
from ..data.split import split_records
from ..data.variants import label_settings_table
from ..models import DEVICES, ModelSpec, load_model
from ..presets import DEFAULT_MODEL
from ..progress import Bar
from . import COMMANDS
from .common import add_model_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help=COMMANDS["data"].help)
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    b = dsub.add_parser(
        "build",
        help="build a records JSONL from a source",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="sources:\n" + "\n".join(_wrapped(f"{s.name}: {s.help}") for s in SOURCES.values()),
    )
    b.add_argument(
        "--source", choices=list(SOURCES), default="halueval-perturbed", help="where the records come from (below)"
    )
    readers = {name: [s.name for s in SOURCES.values() if name in s.options] for name in field_infos(SourceOptions)}
    # --input, --limit, …: each says which sources read it
    add_config_args(b, SourceOptions, SourceOptions(), notes={n: f"({', '.join(r)})" for n, r in readers.items()})
    b.add_argument("--out", required=True, help="output JSONL")
    b.add_argument("--model", default=DEFAULT_MODEL, help="own-summaries: the model that writes the summaries")
    b.add_argument("--device", default="cpu", choices=DEVICES, help="own-summaries: where it generates")
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


def build(args: argparse.Namespace) -> None:
    source = SOURCES[args.source]
    options = SourceOptions(**config_args(args, SourceOptions))
    if source.generated:  # own-summaries, the one generated source (data/sources.py says why it has no loader)
        records = _own_summaries(args)
    else:
        with Bar(f"building {source.name}") as bar:
            loaded = read_source(source, options, bar)
        if loaded.report:
            print(loaded.report)
        records = loaded.records
    write_jsonl(records, args.out)
    print(f"wrote {len(records)} records to {args.out}")


def _wrapped(text: str) -> str:
    return textwrap.fill(text, 100, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)


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
