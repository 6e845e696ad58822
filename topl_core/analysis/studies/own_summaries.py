"""Training records from the model's own summaries, labelled by an exact lexical rule.

The perturbation data teaches the head what edited reference summaries look like; this adds text the model itself
writes. A summary is labelled with the grounding scorer's word rules (`scorers.analysed_words`: the same stopwords,
stems and number reading), sentence by sentence:

- a number (digits) whose value the document does not contain, and a capitalised name (not sentence-initial) whose
  lower-cased form or stem no document word has, are **bad** — extrinsic facts, the commonest summarizer error;
- every other content word must occur in the document (as a word or a stem); a sentence with any other
  unsupported content word is **left out** (it may paraphrase or may be wrong: no rule decides, so it gets no label);
- a sentence that repeats an earlier one is left out (degenerate generation), and so is a last sentence with no
  closing punctuation (the generation was cut at its token limit mid-sentence).

The record's response is the kept sentences in order, joined by single spaces: its tokens are good except the bad
spans. The rule is lexical, so a kept sentence can still be wrong in ways words do not show (a relation between
two names that both occur); such tokens are labelled good, as in the perturbation data's untouched words.

`OWN_SUMMARIES` is its data source (`data build --source own-summaries`, the Data page's background build): the
options it reads, with the model that writes (`OwnSummaryOptions`), and its builder.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ...data import halueval
from ...data.records import Record, Span
from ...data.sources import DataSource, Loaded, ProgressFn, SourceOptions
from ...foundations.config_fields import config_field
from ...foundations.presets import DEFAULT_MODEL
from ...models.loading import Device
from ..evaluation.config import EvalConfig, Variant
from ..evaluation.documents import EvalDoc
from ..evaluation.evaluate import VariantModels, generate_for
from ..evaluation.text import analysed_words, split_sentences

SOURCE = "own-summaries"
RULE = "lexical-v1"


@dataclass(frozen=True)
class LabelledSummary:
    response: str  # the kept sentences, joined by single spaces
    bad_spans: tuple[Span, ...]
    sentences: int  # in the model's summary
    kept: int


def _sentence_offsets(text: str) -> list[tuple[int, int]]:
    """[start, end) of each of split_sentences(text) in `text` (they are stripped pieces, in order)."""
    out, pos = [], 0
    for sentence in split_sentences(text):
        start = text.index(sentence, pos)
        out.append((start, start + len(sentence)))
        pos = start + len(sentence)
    return out


def _is_closed(text: str) -> bool:
    """Whether text ends a sentence: . ! ? or …, possibly followed by closing quotes or brackets."""
    return text.rstrip().rstrip("\"'”’)]").endswith((".", "!", "?", "…"))


def label_summary(document: str, summary: str) -> LabelledSummary:
    """Apply the module's rule to one summary of `document` (an empty response when no sentence is kept)."""
    doc_words = list(analysed_words(document))
    known = {w.low for w in doc_words} | {w.stem for w in doc_words if w.stem is not None}
    numbers = {w.number for w in doc_words if w.number is not None}
    pieces: list[str] = []
    spans: list[Span] = []
    seen: set[str] = set()
    length = 0
    sentences = _sentence_offsets(summary)
    complete = sentences if sentences and _is_closed(summary[: sentences[-1][1]]) else sentences[:-1]
    for start, end in complete:
        sentence = summary[start:end]
        bad: list[Span] = []
        unverifiable = False
        for w in analysed_words(sentence):
            if w.number is not None and sentence[w.start].isdigit():
                if w.number not in numbers:
                    bad.append(Span(w.start, w.end, "own-number"))
            elif w.stem is not None and w.low not in known and w.stem not in known:
                if w.name:
                    bad.append(Span(w.start, w.end, "own-name"))
                else:
                    unverifiable = True
                    break
        normalised = " ".join(sentence.lower().split())
        if unverifiable or normalised in seen:
            continue
        seen.add(normalised)
        offset = length + (1 if pieces else 0)
        spans += [Span(s.start + offset, s.end + offset, s.kind) for s in bad]
        pieces.append(sentence)
        length = offset + len(sentence)
    return LabelledSummary(" ".join(pieces), tuple(spans), len(sentences), len(pieces))


@dataclass
class OwnSummaryReport:
    summaries: int = 0
    records: int = 0
    sentences: int = 0
    sentences_kept: int = 0
    spans: Counter = field(default_factory=Counter)

    def __str__(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.spans.items())) or "none"
        return (
            f"own summaries: {self.summaries} generated, {self.records} kept as records; sentences kept "
            f"{self.sentences_kept} of {self.sentences} (the others hold a content word the document lacks, or "
            "repeat one); "
            f"bad spans: {kinds}"
        )


def own_summary_records(
    rows: Sequence[dict], summaries: Sequence[str], generator: str
) -> tuple[list[Record], OwnSummaryReport]:
    """Records of `summaries` (one per row {doc_id, document}, written by model `generator`) under the rule; a
    summary with no kept sentence gives no record. doc_id is the row's, so a document's own summary falls in the
    same train/val/test split as its perturbation records."""
    if len(rows) != len(summaries):
        raise ValueError(f"{len(rows)} documents but {len(summaries)} summaries: give one summary per document.")
    report = OwnSummaryReport()
    records: list[Record] = []
    for row, summary in zip(rows, summaries):
        report.summaries += 1
        labelled = label_summary(row["document"], summary)
        report.sentences += labelled.sentences
        report.sentences_kept += labelled.kept
        if not labelled.kept:
            continue
        report.spans.update(s.kind for s in labelled.bad_spans)
        records.append(
            Record(
                id=f"{row['doc_id']}:own",
                document=row["document"],
                response=labelled.response,
                bad_spans=labelled.bad_spans,
                sequence_label=0 if labelled.bad_spans else 1,
                source=SOURCE,
                doc_id=row["doc_id"],
                meta={"generator": generator, "rule": RULE, "sentences": labelled.sentences, "kept": labelled.kept},
            )
        )
    report.records = len(records)
    return records, report


def generate_own_summaries(
    model: str,
    rows: Sequence[dict],
    chunk: int = 16,
    device: str = "cpu",
    progress: Callable[[int], None] | None = None,
    max_new_tokens: int = EvalConfig.max_new_tokens,
) -> list[str]:
    """The base model's greedy summary of each row's document, as the evaluation generates them (same prompt,
    document length and cache; at most max_new_tokens): cached per chunk of `chunk` documents, so an interrupted
    build resumes where it stopped."""
    cfg = EvalConfig(model=model, device=device, max_new_tokens=max_new_tokens)
    models = VariantModels(cfg)
    docs = [EvalDoc("train", SOURCE, r["doc_id"], r["document"]) for r in rows]
    out: list[str] = []
    for i in range(0, len(docs), chunk):
        out += generate_for(Variant.base(model), docs[i : i + chunk], cfg, models)
        if progress is not None:
            progress(len(out))
    return out


@dataclass(frozen=True)
class OwnSummaryOptions(SourceOptions):
    """The options of `data build --source own-summaries`: the HaluEval documents to summarise, and how."""

    limit: int = config_field(240, label="HaluEval documents", help="documents / rows to read", min=1, max=10_000)
    model: str = config_field(
        DEFAULT_MODEL,
        label="Model that writes the summaries",
        help="the model that writes the summaries: an embedded model's name, a hub id or a local folder",
    )
    device: Device = config_field("cpu", label="Device", help="where the model generates")
    max_new_tokens: int = config_field(
        EvalConfig.max_new_tokens,
        label="Max new tokens",
        help="the longest summary, in tokens (the evaluation's default)",
        min=8,
        max=1024,
    )


def build_own_summaries(o: OwnSummaryOptions, progress: ProgressFn | None) -> Loaded:
    """The labelled records of the model's own summaries of `o.limit` HaluEval documents (`o.input`: another
    HaluEval summarization JSONL), with the rule's report."""
    rows = halueval.load_halueval_rows(o.input, limit=o.limit)
    done = None if progress is None else lambda n: progress(n, len(rows))
    summaries = generate_own_summaries(o.model, rows, device=o.device, progress=done, max_new_tokens=o.max_new_tokens)
    records, report = own_summary_records(rows, summaries, o.model)
    return Loaded(records, str(report))


OWN_SUMMARIES = DataSource(
    SOURCE,
    "The model's own greedy summaries of HaluEval documents (--model, --device, --max-new-tokens), labelled by a "
    "lexical rule: a number or a name the document lacks is bad; a sentence with any other word the document lacks is "
    "left out (docs/evaluation.md §6). Generation is cached: started again with the same settings, a stopped build "
    "resumes (minutes to hours: docs/data.md has the time per document; the Data page runs it in the background).",
    ("input", "model", "limit", "max_new_tokens", "device"),
    build_own_summaries,
    input_required=False,
    options_type=OwnSummaryOptions,
    background=True,
)
