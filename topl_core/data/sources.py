"""The file sources `data build` reads, by name, and what every source is (`DataSource`): what it reads, the options it
takes and how it builds its records.

A file source reads a file (or the embedded HaluEval) with a loader in this package, in seconds. A source a model
writes (the model's own summaries, minutes to hours) is a `DataSource` too, with its own options class (a
`SourceOptions` subclass adding the model that writes, …) and `background=True`; its builder generates as the
evaluation does, layers above this one, so its entry sits beside its builder in analysis/studies/, and the registry
of every source, `analysis/studies/data_sources.SOURCES`, joins those entries to `FILE_SOURCES`. The CLI (`data build
--source`, its choices, flags and help) and the Data page (its picker, help and build form) read that registry and
ask the entry, never its name; `launchers.launch_data_build` takes an entry and runs `data build` in the background.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..foundations.config_fields import config_field, field_infos
from ..foundations.errors import ConfigError, DataError
from ..foundations.paths import cliff_csv
from . import cliff, fava, halueval, mlqe
from .fava import FavaForm
from .perturb import RECIPES
from .records import Record, read_jsonl

ProgressFn = Callable[[int, int], None]  # progress(done, total), e.g. a progress.Bar


@dataclass(frozen=True)
class SourceOptions:
    """The settings a source may read; each source names the ones it reads (`DataSource.options`). Each field is a
    `data build` flag (`--fava-form` for fava_form) and a Data page input, described by its config_field. A source
    with settings of its own (the model that writes its responses) or other defaults subclasses it."""

    input: str | None = config_field(
        None,
        label="Input path (file, or directory for MLQE-PE)",
        help="input path: a file, or a directory for mlqe (a source with a default file reads that when none is given)",
    )
    limit: int = config_field(
        600,
        label="Limit (documents / rows)",
        help="documents / rows to read (HaluEval has 10,000)",
        min=1,
        max=100_000,
    )
    seed: int = config_field(0, label="Seed", help="seed of the random edits", min=0)
    recipe: str = config_field(
        "v1",
        label="Edit recipe",
        help="perturbation edit recipe: v1 = entity, number, date, negation, relation, invented; v2 adds attribution, "
        "swap, extrinsic, modal, copied and lower-cases 15% of documents (docs/evaluation.md §6)",
        choices=sorted(RECIPES),
    )
    fava_form: FavaForm = config_field(
        "raw", label="FAVA form", help="FAVA's raw errored_passage form, or its edited completion form"
    )
    mlqe_split: str = config_field("train", label="MLQE split", help="the MLQE-PE split: reads SPLIT.src / .mt / .tags")

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ConfigError(f"limit={self.limit}: read at least one document or row (limit >= 1).")
        for name, f in field_infos(type(self)).items():
            if f.choices and getattr(self, name) not in f.choices:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {list(f.choices)}.")


@dataclass(frozen=True)
class Loaded:
    records: list[Record]
    report: str = ""  # what the loader has to say beside the records (rows a CSV skipped), "" when nothing


Builder = Callable[[SourceOptions, ProgressFn | None], Loaded]


@dataclass(frozen=True)
class DataSource:
    name: str  # the `--source` value
    help: str  # shown by `data build --help` and on the Data page
    options: tuple[str, ...]  # the fields of options_type it reads: its `data build` flags and the Data page's inputs
    build: Builder  # its records from an options_type instance, reporting progress(done, total)
    input_required: bool = True  # False: with no input it reads its own default file
    options_type: type[SourceOptions] = SourceOptions  # a subclass adds the source's own settings or defaults
    background: bool = False  # minutes to hours (a model writes): the Data page runs `data build` as a background job

    def __post_init__(self) -> None:
        if not issubclass(self.options_type, SourceOptions):
            raise ConfigError(f"source {self.name!r}: options_type must be SourceOptions or a subclass of it.")
        fields = field_infos(self.options_type)
        if unknown := set(self.options) - set(fields):
            raise ConfigError(f"source {self.name!r}: options {sorted(unknown)} are not fields of {self.options_type}.")


def build_source(source: DataSource, options: SourceOptions, progress: ProgressFn | None = None) -> Loaded:
    """The records of `source`, built with `options` (an instance of its options_type)."""
    if not isinstance(options, source.options_type):
        raise ConfigError(f"source {source.name!r} reads {source.options_type.__name__}, not {type(options).__name__}.")
    if source.input_required and options.input is None:
        raise DataError(f"source {source.name!r} needs an input path (--input PATH).")
    return source.build(options, progress)


def _halueval_perturbed(o: SourceOptions, progress: ProgressFn | None) -> Loaded:
    rows = halueval.load_halueval_rows(o.input, limit=o.limit)
    return Loaded(halueval.halueval_perturbation_records(rows, seed=o.seed, progress=progress, recipe=o.recipe))


def _halueval_pairs(o: SourceOptions, progress: ProgressFn | None) -> Loaded:
    return Loaded(halueval.halueval_pair_records(halueval.load_halueval_rows(o.input, limit=o.limit)))


def _fava(o: SourceOptions, progress: ProgressFn | None) -> Loaded:
    return Loaded(fava.load_fava_jsonl(o.input, o.fava_form)[: o.limit])


def _factuality_csv(o: SourceOptions, progress: ProgressFn | None) -> Loaded:
    # no input reaches here only for cliff (aggrefact requires one): the shipped CLIFF CSV
    report = cliff.load_factuality_csv(o.input if o.input is not None else cliff_csv())
    return Loaded(list(report.records)[: o.limit], str(report))


def _mlqe(o: SourceOptions, progress: ProgressFn | None) -> Loaded:
    """A directory of SPLIT.src / .mt / .tags, or a language pair ("en-de", "en-zh") read from the hub copy."""
    if o.input and not Path(o.input).exists() and mlqe.LANG_PAIR.fullmatch(o.input):
        return Loaded(mlqe.load_mlqe_hub(o.input, split=o.mlqe_split)[: o.limit])
    return Loaded(mlqe.load_mlqe_dir(o.input, split=o.mlqe_split)[: o.limit])


def _jsonl(o: SourceOptions, progress: ProgressFn | None) -> Loaded:
    return Loaded(read_jsonl(o.input)[: o.limit])


FILE_SOURCES: dict[str, DataSource] = {
    s.name: s
    for s in (
        DataSource(
            "halueval-perturbed",
            "HaluEval's faithful summaries with seeded edits (entity/number/date swaps, negation, relation changes, "
            "invented sentences): token labels. Embedded, offline (or a HaluEval summarization JSONL as input).",
            ("input", "limit", "seed", "recipe"),
            _halueval_perturbed,
            input_required=False,
        ),
        DataSource(
            "halueval-pairs",
            "HaluEval right vs hallucinated summaries: sequence labels only (SOPL, DPO). Embedded, offline (or a "
            "HaluEval summarization JSONL as input).",
            ("input", "limit"),
            _halueval_pairs,
            input_required=False,
        ),
        DataSource(
            "fava",
            "JSONL rows of FAVA tagged text (<entity>, <relation>, … with <mark>/<delete>).",
            ("input", "limit", "fava_form"),
            _fava,
        ),
        DataSource(
            "cliff",
            "CLIFF/AggreFact span CSV (real model hallucinations with annotated spans): the OOD token-level set. "
            "Without an input, the shipped CLIFF CSV.",
            ("input", "limit"),
            _factuality_csv,
            input_required=False,
        ),
        DataSource(
            "aggrefact",
            "AggreFact CSV with doc, summ, label (summary-level labels).",
            ("input", "limit"),
            _factuality_csv,
        ),
        DataSource(
            "mlqe",
            "MLQE-PE directory with SPLIT.src / .mt / .tags (word-level OK/BAD), or a language pair (en-de) read from "
            "the hub copy: translation task.",
            ("input", "limit", "mlqe_split"),
            _mlqe,
        ),
        DataSource(
            "jsonl", "A records JSONL written by this workbench (validated and copied).", ("input", "limit"), _jsonl
        ),
    )
}
