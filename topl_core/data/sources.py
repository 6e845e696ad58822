"""Every source `data build` reads, by name: what it is, the options it takes and its loader. The CLI (`data build
--source`, its choices, flags and help) and the Data page (its source picker, help and build form) read `SOURCES`,
so a new source is one entry here, and its test.

Two kinds of source. A *file* source reads a file (or the embedded HaluEval) with a loader in this package, in
seconds. A *generated* source has a model write the responses — `own-summaries`, minutes to hours, built by
analysis/studies/own_summaries.py two layers above this one (it generates as the evaluation does). Its entry holds
its name, help and options but no loader: the CLI's `data build` (processes layer) runs it and the Data page starts
it as a background job. Naming the loader here by a dotted path imported at call time would make the data layer
depend on the analysis layer while hiding that from the layer check (tests/test_architecture.py); an entry that says
"generated" leaves the dependency where the imports show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config_fields import config_field, field_infos
from ..errors import ConfigError, DataError
from ..paths import cliff_csv
from . import cliff, fava, halueval, mlqe
from .fava import FavaForm
from .perturb import RECIPES
from .records import Record, read_jsonl

ProgressFn = Callable[[int, int], None]  # progress(done, total), e.g. a progress.Bar


@dataclass(frozen=True)
class SourceOptions:
    """The settings a source may read; each source names the ones it reads (`DataSource.options`). Each field is a
    `data build` flag (`--fava-form` for fava_form) and a Data page input, described by its config_field."""

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
        for name, f in field_infos(SourceOptions).items():
            if f.choices and getattr(self, name) not in f.choices:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {list(f.choices)}.")


@dataclass(frozen=True)
class Loaded:
    records: list[Record]
    report: str = ""  # what the loader has to say beside the records (rows a CSV skipped), "" when nothing


Loader = Callable[[SourceOptions, ProgressFn | None], Loaded]


@dataclass(frozen=True)
class DataSource:
    name: str  # the `--source` value
    help: str  # shown by `data build --help` and on the Data page
    options: tuple[str, ...]  # the SourceOptions fields it reads: the Data page shows these inputs
    load: Loader | None  # None: a generated source (see the module's docstring)
    input_required: bool = True  # False: with no input it reads its own default file

    def __post_init__(self) -> None:
        unknown = set(self.options) - set(field_infos(SourceOptions))
        if unknown:
            raise ConfigError(f"source {self.name!r}: options {sorted(unknown)} are not SourceOptions fields.")

    @property
    def generated(self) -> bool:
        return self.load is None


def read_source(source: DataSource, options: SourceOptions, progress: ProgressFn | None = None) -> Loaded:
    """The records of a file source, read with `options`."""
    if source.generated:
        raise ConfigError(f"source {source.name!r} is generated with a model: build it with `data build`.")
    if source.input_required and options.input is None:
        raise DataError(f"source {source.name!r} needs an input path (--input PATH).")
    return source.load(options, progress)


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


SOURCES: dict[str, DataSource] = {
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
        DataSource(
            "own-summaries",
            "The model's own greedy summaries of HaluEval documents (--model, --device, --max-new-tokens), labelled "
            "by a lexical rule: a number or a name the document lacks is bad; a sentence with any other word the "
            "document lacks is left out (docs/evaluation.md §6). Generation is cached: started again with the same "
            "settings, a stopped build resumes (SmolLM2: ~5 s per document on 2 CPU cores; the Data page runs it in "
            "the background).",
            ("input", "limit"),
            None,
            input_required=False,
        ),
    )
}
