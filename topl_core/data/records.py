"""The one record type every data source produces, and its JSONL import/export.

Labels are stored as character spans of the response (tokenizer independent); `topl_core.data.encode`
maps them to per-token labels for a given tokenizer.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Literal

from ..errors import DataError
from ..io import atomic_open

Task = Literal["summarization", "translation"]
TASKS: tuple[str, ...] = ("summarization", "translation")


@dataclass(frozen=True)
class Span:
    """A bad (unfaithful) character span [start, end) of a record's response."""

    start: int
    end: int
    kind: str = "error"  # edit/error type, e.g. "entity", "number", "negation", "invented"


@dataclass(frozen=True)
class Record:
    """One (document, response) example.

    - `bad_spans`: character spans of `response` that are unfaithful. Tokens covering a non-space character
      inside a span are labelled bad (0); all other response tokens are good (1).
    - `token_labels_known`: False when only a sequence-level label exists (e.g. HaluEval's hallucinated
      rewrites): token-level objectives must not use such a record.
    - `sequence_label`: 1 = faithful, 0 = unfaithful.
    - `faithful_response`: for a perturbed/hallucinated record, the faithful response it pairs with (DPO etc.).
    - `doc_id`: groups records of the same document, so splits are made per document.
    """

    id: str
    document: str
    response: str
    bad_spans: tuple[Span, ...] = ()
    token_labels_known: bool = True
    sequence_label: int = 1
    faithful_response: str | None = None
    task: Task = "summarization"
    source: str = "unknown"
    doc_id: str = ""
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        where = f"record {self.id!r} (source {self.source!r})"
        if not self.document or not self.document.strip():
            raise DataError(f"{where}: empty document. Drop the row or fill in its document text.")
        if not self.response or not self.response.strip():
            raise DataError(f"{where}: empty response/summary. Drop the row or fill in its response text.")
        if self.task not in TASKS:
            raise DataError(f"{where}: task={self.task!r} is not one of {TASKS}.")
        if self.sequence_label not in (0, 1):
            raise DataError(f"{where}: sequence_label={self.sequence_label!r} must be 0 (unfaithful) or 1 (faithful).")
        spans = tuple(s if isinstance(s, Span) else Span(**s) for s in self.bad_spans)
        object.__setattr__(self, "bad_spans", spans)
        for s in spans:
            if not (0 <= s.start < s.end <= len(self.response)):
                raise DataError(
                    f"{where}: bad span [{s.start}, {s.end}) lies outside the response (length "
                    f"{len(self.response)}). Spans are character offsets into the response."
                )
        if not self.doc_id:
            object.__setattr__(self, "doc_id", self.id)

    @property
    def bad_texts(self) -> list[str]:
        return [self.response[s.start : s.end] for s in self.bad_spans]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict, where: str = "row") -> "Record":
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}.")
        missing = [k for k in ("id", "document", "response") if k not in row]
        if missing:
            raise DataError(f"{where}: missing field(s) {missing}; every row needs id, document and response.")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(row) - known)
        if unknown:
            raise DataError(f"{where}: unknown field(s) {unknown}; allowed fields are {sorted(known)}.")
        try:
            spans = tuple(Span(**s) for s in row.get("bad_spans", ()))
        except TypeError as e:
            raise DataError(f"{where}: bad_spans entries must be {{start, end, kind}} objects ({e}).") from e
        try:
            return cls(**{**row, "bad_spans": spans})
        except (DataError, TypeError) as e:
            raise DataError(f"{where}: {e}") from e


def write_jsonl(records: Iterable[Record], path: str | os.PathLike) -> Path:
    """Write records as JSONL atomically (a temp file renamed into place: a crash never leaves half a file). No
    records is an error, so an empty or unreadable input never replaces a data set with nothing."""
    records = list(records)
    if not records:
        state = "left as it was" if Path(path).exists() else "not written"
        raise DataError(
            f"no records to write to {path} ({state}): the input gave none. Check its path, format and limit."
        )
    with atomic_open(path) as f:
        for r in records:
            f.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")
    return Path(path)


def json_lines(path: Path) -> Iterator[tuple[int, str, object]]:
    """(0-based line index, "path:line" for messages, parsed value) for each non-blank line of a JSONL file; a line
    that is not JSON raises DataError naming it."""
    with path.open(encoding="utf-8") as f:
        for line_index, line in enumerate(f):
            if not line.strip():
                continue
            where = f"{path}:{line_index + 1}"
            try:
                yield line_index, where, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{where}: not valid JSON ({e.msg} at column {e.colno}). Fix or delete that line."
                ) from e


def iter_jsonl(path: str | os.PathLike) -> Iterator[Record]:
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: file not found. Build a data set first: python -m topl_core data build --out {path}")
    for _, where, row in json_lines(path):
        yield Record.from_json(row, where)


def read_jsonl(path: str | os.PathLike) -> list[Record]:
    return list(iter_jsonl(path))
