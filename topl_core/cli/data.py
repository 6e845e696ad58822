"""`data build | inspect | stats`: make, look at and count token-level supervision data."""

from __future__ import annotations

import argparse
import textwrap
from collections import Counter
from typing import Collection

from ..analysis.studies.data_sources import SOURCES
from ..data.overview import label_settings, token_labelled
from ..data.records import Record, merge_jsonl, read_jsonl, write_jsonl
from ..data.sources import DataSource, SourceOptions, build_source
from ..data.split import split_records
from ..foundations.config_fields import add_config_args, config_args, field_infos
from ..foundations.progress import Bar
from ..models.loading import ModelSpec, load_model
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
    add_option_args(b, list(SOURCES.values()))
    b.add_argument("--out", required=True, help="output JSONL")
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


def add_option_args(parser: argparse.ArgumentParser, sources: Collection[DataSource]) -> None:
    """A flag per option any of `sources` reads (--input, --limit, --model, …), added once, each saying which sources
    read it (with a source's own default where it differs). No flag has a default: an option not given takes the
    chosen source's (`options_of`)."""
    added: set[str] = set()
    for cls in dict.fromkeys(s.options_type for s in sources):
        fields = field_infos(cls)
        notes = {name: f"({', '.join(_readers(sources, name, f.default))})" for name, f in fields.items()}
        add_config_args(parser, cls, skip=added, notes=notes)
        added |= set(fields)


def _readers(sources: Collection[DataSource], name: str, default: object) -> list[str]:
    """The sources that read option `name`, each with its default where that is not `default`."""
    out = []
    for s in sources:
        if name in s.options:
            own = field_infos(s.options_type)[name].default
            out.append(s.name if own == default else f"{s.name}: default {own}")
    return out


def options_of(args: argparse.Namespace, source: DataSource) -> SourceOptions:
    """The options of `source` from `data build`'s flags: those it reads, given or at its options_type's defaults."""
    return source.options_type(**config_args(args, source.options_type, only=source.options))


def build(args: argparse.Namespace) -> None:
    source = SOURCES[args.source]
    with Bar(f"building {source.name}") as bar:
        loaded = build_source(source, options_of(args, source), bar)
    if loaded.report:
        print(loaded.report)
    write_jsonl(loaded.records, args.out)
    print(f"wrote {len(loaded.records)} records to {args.out}")


def _wrapped(text: str) -> str:
    return textwrap.fill(text, 100, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)


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
    chosen = token_labelled(records, args.split)
    if not chosen:
        print("no token-labelled records in this split")
        return
    tok = load_model(ModelSpec(args.model, args.dtype, args.device)).tokenizer
    with Bar("tokenizing", total=len(chosen)) as bar:
        table = label_settings(tok, chosen, seed=0, progress=bar)
    print(f"\ntoken labels per label setting ({args.split} split, {args.model} tokenizer):")
    print(table.to_string(index=False))
