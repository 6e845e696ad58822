"""Factuality CSVs from the AggreFact benchmark: CLIFF span annotations (token level) and AggreFact-style
summary-level labels.

- A CSV with an `annotated_span` column (CLIFF_error_types.csv: dataset, origin, id, doc, summ, model_name, cut,
  error_type, annotated_span) gives token-level records. `annotated_span` is a Python-list string of the
  hallucinated substrings of `summ` (empty for correct summaries), parsed with `ast.literal_eval`. The other shapes
  of AggreFact's error-type CSVs load too: a list of lists (one list per error type; with a list-valued error_type
  of the same length each span's kind is its error type), annotator notes instead of quotes ("[really bad overall]",
  "missing entity": `is_annotator_note`) set aside in meta["annotator_notes"] — a row with only notes becomes a
  summary-level record (token labels unknown), a row with notes beside found spans keeps them (partial) — and
  several spans abbreviated in one string ("Smith; Jones", "Leeds ... 2010": `split_abbreviated`). The load report
  counts what became of the annotations (`CsvLoadReport.spans`).
- A CSV with doc, summ and label columns (AggreFact; label 1 = consistent, 0 = inconsistent) gives
  sequence-level records (`token_labels_known=False`).

Mapping an annotated substring to a character span: scanning the list left to right, each substring takes its
first occurrence in `summ` that does not overlap a span already matched in that row (so "Zelizer" after
"Julian Zelizer:" lands on the later "Zelizer"), or the first occurrence when all overlap (`Record` then merges
the overlapping spans); when the exact text is absent it is matched ignoring whitespace and case ("( 656 ft)"
matches "(656 ft)"). Real annotations have typos, so by default (`on_missing="skip"`) a row with a substring that
is still not found is dropped and reported in `CsvLoadReport.skipped`; `on_missing="raise"` raises DataError
instead. Structural problems (a file that is not UTF-8 or not a well-formed CSV, missing columns, an unparseable
span list, a label other than 0/1, empty text) always raise DataError naming the file and the row.

`detokenized=True` rewrites document and summary with `textform.detokenize` ("30 - year - old" → "30-year-old",
`-lrb-` → "(", "did n't" → "didn't") after the spans are matched, moving the spans with the text; meta then holds
text_form = "detokenized".
"""

from __future__ import annotations

import ast
import io
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

import pandas as pd

from ..foundations.errors import DataError
from .records import Record, Span, read_utf8
from .textform import detokenize

SPAN_COLUMNS = ("doc", "summ", "annotated_span")
LABEL_COLUMNS = ("doc", "summ", "label")
META_COLUMNS = ("dataset", "model_name", "error_type", "cut")
CSV_FIX = 'Close every quoted field with a ", and give every row as many fields as the header.'


@dataclass(frozen=True)
class SkippedRow:
    row: int  # 0-based data row of the CSV (the header is not counted)
    reason: str


@dataclass(frozen=True)
class CsvLoadReport:
    """What a CSV load produced: its records, how many rows were read and which were skipped, and why."""

    path: str
    rows_read: int
    records: tuple[Record, ...]
    skipped: tuple[SkippedRow, ...]
    token_level: bool
    spans: dict[str, int] = field(default_factory=dict)  # what became of the annotations (span CSVs), by outcome

    @property
    def sources(self) -> dict[str, int]:
        return dict(Counter(r.source for r in self.records))

    def __str__(self) -> str:
        level = "token-level" if self.token_level else "sequence-level"
        lines = [
            f"{self.path}: {self.rows_read} rows read, {len(self.records)} {level} records {self.sources}, "
            f"{len(self.skipped)} skipped"
        ]
        lines += [f"  {what}: {n}" for what, n in self.spans.items() if n]
        lines += [f"  row {s.row}: {s.reason}" for s in self.skipped]
        return "\n".join(lines)


def _normalised(text: str) -> tuple[str, list[int]]:
    """`text` without whitespace and lower-cased, and the original offset of every kept character."""
    chars, offsets = [], []
    for i, c in enumerate(text):
        if not c.isspace():
            lowered = c.lower()
            chars.append(lowered if len(lowered) == 1 else c)
            offsets.append(i)
    return "".join(chars), offsets


def _occurrences(text: str, needle: str) -> list[tuple[int, int]]:
    found, start = [], text.find(needle)
    while start != -1:
        found.append((start, start + len(needle)))
        start = text.find(needle, start + 1)
    return found


def match_spans(
    text: str, substrings: Sequence[str], kind: str | Sequence[str] = "error"
) -> tuple[list[Span], list[str]]:
    """Character spans of `substrings` in `text` (see the module docstring for the rule) and the substrings not
    found. Empty substrings are ignored. `kind`: one kind for all, or one per substring."""
    normalised, offsets = _normalised(text)
    kinds = [kind] * len(substrings) if isinstance(kind, str) else list(kind)
    spans: list[Span] = []
    missing: list[str] = []
    for substring, kind in zip(substrings, kinds):
        needle = substring.strip()
        if not needle:
            continue
        candidates = _occurrences(text, needle)
        if not candidates:
            normalised_needle = _normalised(needle)[0]
            candidates = [(offsets[s], offsets[e - 1] + 1) for s, e in _occurrences(normalised, normalised_needle)]
        if not candidates:
            missing.append(substring)
            continue
        free = [(s, e) for s, e in candidates if all(e <= t.start or s >= t.end for t in spans)]
        start, end = (free or candidates)[0]
        spans.append(Span(start, end, kind))
    return sorted(spans, key=lambda s: s.start), missing


def _parse_span_list(value: str, where: str) -> list[list[str]]:
    """The annotated spans grouped as written: a flat list is one group; a list of lists (one list per error type,
    aligned with the error_type column) is one group per inner list."""
    if not value.strip():
        return []
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:  # what literal_eval raises
        raise DataError(
            f"{where}, column annotated_span: {value[:80]!r} is not a Python list literal ({e}). "
            "Write it like ['span one', 'span two'] (or one list per error type) or leave it empty."
        ) from e
    if isinstance(parsed, str):
        parsed = [parsed]
    if not isinstance(parsed, (list, tuple)):
        raise DataError(f"{where}, column annotated_span: expected a list of strings, got {value[:80]!r}.")
    flat = [s for s in parsed if isinstance(s, str)]
    nested = [g for g in parsed if isinstance(g, (list, tuple))]
    if flat and not nested:
        return [flat]
    if nested and not flat and all(isinstance(s, str) for g in nested for s in g):
        return [list(g) for g in nested]
    if not parsed:
        return []
    raise DataError(
        f"{where}, column annotated_span: expected a list of strings or a list of lists of strings, got {value[:80]!r}."
    )


def _group_kinds(error_type: str, groups: int) -> list[str]:
    """The span kind of each group: the aligned entry of a list-valued error_type column, else "error"."""
    try:
        types = ast.literal_eval(error_type) if error_type.strip().startswith("[") else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        types = None
    if isinstance(types, (list, tuple)) and len(types) == groups and all(isinstance(t, str) and t for t in types):
        return list(types)
    return ["error"] * groups


_ELISION = re.compile(r"\s*(?:\.\.\.|…|;|\|)\s*")


def is_annotator_note(annotation: str, summary: str) -> bool:
    """An annotation that describes an error instead of quoting it ("[really bad overall]", "missing entity"):
    bracketed, or of two or more words of which fewer than half occur in the summary. A single word that is not in
    the summary is a typo'd quote, not a note (its row is dropped, not kept with a wrong label)."""
    text = annotation.strip()
    if text in summary:
        return False
    if text.startswith("[") and text.endswith("]"):
        return True
    words = re.findall(r"\w+", text.lower())
    present = set(re.findall(r"\w+", summary.lower()))
    return len(words) >= 2 and sum(w in present for w in words) < len(words) / 2


def split_abbreviated(annotation: str, summary: str) -> list[str]:
    """Several spans written as one ("won the Open ... in 2010", "Smith; Jones"): its parts, when the whole is not
    in the summary (exactly or ignoring whitespace and case) but it splits on "...", "…", ";" or "|"."""
    if not _ELISION.search(annotation) or not match_spans(summary, [annotation])[1]:
        return [annotation]
    return [part for part in _ELISION.split(annotation) if part.strip()]


def _parse_label(value: str, where: str) -> int:
    try:
        label = float(value)
    except ValueError:
        label = None
    if label not in (0.0, 1.0):
        raise DataError(f"{where}, column label: {value!r} must be 1 (consistent) or 0 (inconsistent).")
    return int(label)


def _read_table(path: Path) -> pd.DataFrame:
    """The CSV's cells as strings (a missing trailing cell is ""); a malformed CSV raises DataError naming the file."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)  # a row longer than the header: not dropped silently
        try:
            return pd.read_csv(io.StringIO(read_utf8(path)), dtype=str, keep_default_na=False, index_col=False)
        except pd.errors.EmptyDataError as e:
            raise DataError(
                f"{path}: empty CSV (no header row). A span CSV needs columns {SPAN_COLUMNS}, a label CSV "
                f"{LABEL_COLUMNS}."
            ) from e
        except pd.errors.ParserWarning as e:
            raise DataError(f"{path}: a row has more fields than the header. {CSV_FIX}") from e
        except pd.errors.ParserError as e:
            detail = str(e).removeprefix("Error tokenizing data. C error: ").strip()
            raise DataError(f"{path}: not a well-formed CSV ({detail}). {CSV_FIX}") from e


def csv_rows(path: str | Path, required: Sequence[str]) -> list[dict[str, str]]:
    """The rows of a CLIFF-style CSV as dicts of strings, read like `load_factuality_csv` reads it (UTF-8, malformed
    CSV → DataError); a missing column in `required` raises DataError naming it. For readers that need only
    summary-level columns (the OOD documents, scorer quality)."""
    path = Path(path)
    table = _read_table(path)
    absent = [c for c in required if c not in table.columns]
    if absent:
        raise DataError(
            f"{path}: missing column(s) {absent}; found {list(table.columns)}. Use CLIFF's "
            "CLIFF_error_types.csv or a CSV with these columns."
        )
    return table.to_dict("records")


def load_factuality_csv(
    path: str | Path,
    on_missing: Literal["skip", "raise"] = "skip",
    source_prefix: str | None = None,
    detokenized: bool = False,
) -> CsvLoadReport:
    """Records from a CLIFF span CSV or an AggreFact-style label CSV (detected from the columns).

    source = f"{source_prefix}-{origin}" ("cliff-xsum", "cliff-cnndm"); the prefix defaults to "cliff" for span
    CSVs and "aggrefact" for label CSVs. doc_id = f"{origin}-{id}" (both models' summaries of one article share
    it); the record id is f"{source}:{row}". meta keeps dataset, model_name, error_type and cut when present.
    """
    if on_missing not in ("skip", "raise"):
        raise DataError(f"on_missing={on_missing!r} must be 'skip' (drop rows whose spans are not found) or 'raise'.")
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: CSV not found. Pass the path of CLIFF_error_types.csv or an AggreFact CSV.")
    table = _read_table(path)
    token_level = "annotated_span" in table.columns
    required = SPAN_COLUMNS if token_level else LABEL_COLUMNS
    absent = [c for c in required if c not in table.columns]
    if absent:
        raise DataError(
            f"{path}: missing column(s) {absent}. A span CSV needs {SPAN_COLUMNS}, a label CSV "
            f"{LABEL_COLUMNS}; found {list(table.columns)}."
        )
    prefix = source_prefix or ("cliff" if token_level else "aggrefact")
    records, skipped, counts = [], [], Counter()
    for row, values in enumerate(table.to_dict("records")):
        where = f"{path}, row {row}"
        origin = values.get("origin", "")
        source = f"{prefix}-{origin}" if origin else prefix
        doc_id = f"{origin or prefix}-{values.get('id') or row}"
        summary = detokenize(values["summ"]) if detokenized else None
        common = dict(
            id=f"{source}:{row}",
            document=detokenize(values["doc"]).text if detokenized else values["doc"],
            response=summary.text if summary else values["summ"],
            source=source,
            doc_id=doc_id,
            meta={c: values[c] for c in META_COLUMNS if c in values}
            | ({"text_form": "detokenized"} if summary else {}),
        )
        if token_level:
            quotes, kinds, notes, split = _quotes(values, where)
            spans, missing = match_spans(values["summ"], quotes, kinds)
            if missing:
                reason = f"annotated span(s) {missing} not found in the summary"
                if on_missing == "raise":
                    raise DataError(f"{where}: {reason}. Fix the annotation or load with on_missing='skip'.")
                skipped.append(SkippedRow(row, reason))
                counts["spans dropped with their row"] += len(quotes)
                continue
            counts["spans found"] += len(spans)
            counts["abbreviated annotations split into their spans"] += split
            spans = [summary.span(s) for s in spans] if summary else spans
            if notes:
                counts["annotator notes skipped"] += len(notes)
                common["meta"] = common["meta"] | {"annotator_notes": notes}
            if notes and not spans:  # hallucinated by the annotator's word, but no quoted tokens to label
                counts["rows kept as summary-level (notes only)"] += 1
                labels = dict(token_labels_known=False, sequence_label=0)
            else:
                counts["rows partial (notes beside found spans)"] += bool(notes)
                labels = dict(bad_spans=tuple(spans), sequence_label=0 if spans else 1)
        else:
            labels = dict(token_labels_known=False, sequence_label=_parse_label(values["label"], where))
        try:
            records.append(Record(**common, **labels))
        except DataError as e:
            raise DataError(f"{where}: {e}") from e
    return CsvLoadReport(str(path), len(table), tuple(records), tuple(skipped), token_level, dict(counts))


def _quotes(values: dict[str, str], where: str) -> tuple[list[str], list[str], list[str], int]:
    """(quoted spans, their kinds, annotator notes, how many annotations were split) of a row: the groups flattened
    with their error type, notes set aside, abbreviated spans split into their parts."""
    groups = _parse_span_list(values["annotated_span"], where)
    quotes, kinds, notes, split = [], [], [], 0
    for group, kind in zip(groups, _group_kinds(values.get("error_type", ""), len(groups))):
        for annotation in group:
            if not annotation.strip():
                continue
            if is_annotator_note(annotation, values["summ"]):
                notes.append(annotation)
                continue
            parts = split_abbreviated(annotation, values["summ"])
            split += len(parts) > 1
            quotes += parts
            kinds += [kind] * len(parts)
    return quotes, kinds, notes, split
