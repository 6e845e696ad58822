"""The one record type every data source produces, its JSONL import/export, and the one reader of data files.

Labels are stored as character spans of the response (tokenizer independent); `topl_core.data.encode`
maps them to per-token labels for a given tokenizer. Every parser reads its files with `utf8_lines` /
`read_utf8` / `json_lines`, and a `Record` checks its own field types, so bad data gives a DataError naming the
file, the line and the field, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Literal

from ..foundations.errors import DataError
from ..foundations.io import atomic_open

Task = Literal["summarization", "translation"]
TASKS: tuple[str, ...] = ("summarization", "translation")


@dataclass(frozen=True)
class Span:
    """A bad (unfaithful) character span [start, end) of a record's response: integer offsets (not bool, not 1.0)."""

    start: int
    end: int
    kind: str = "error"  # edit/error type, e.g. "entity", "number", "negation", "invented"

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise DataError(f"bad span {name}={value!r} must be an integer character offset.")
        check_text(self.kind, "bad span kind")


def check_text(value: object, field_name: str, optional: bool = False) -> None:
    """Raise DataError unless `value` is a string that can be written as UTF-8 (None too when `optional`)."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise DataError(f"{field_name} must be a string (text in quotes), got {type(value).__name__} {value!r:.40}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(
            f"{field_name} holds a lone surrogate ({value[e.start]!r} at character {e.start}), which is not text "
            "and cannot be written as UTF-8: fix the \\u escape (a surrogate pair needs both halves) or delete it."
        ) from e


def merged_spans(spans: Iterable[Span]) -> tuple[Span, ...]:
    """Spans sorted by start, with overlapping or touching spans (next.start <= current.end) merged into one span
    that covers both; its kind joins their distinct kinds with "+" in order of start ("entity+number")."""
    out: list[Span] = []
    for s in sorted(spans, key=lambda s: (s.start, s.end)):
        if out and s.start <= out[-1].end:
            last = out[-1]
            kinds = last.kind.split("+")
            kinds += [k for k in s.kind.split("+") if k not in kinds]
            out[-1] = Span(last.start, max(last.end, s.end), "+".join(kinds))
        else:
            out.append(s)
    return tuple(out)


def _span(value: object) -> Span:
    if isinstance(value, Span):
        return value
    if not isinstance(value, dict) or not {"start", "end"} <= set(value) <= {"start", "end", "kind"}:
        raise DataError(f"bad_spans entries must be {{start, end, kind}} objects, got {str(value)[:60]!r}.")
    return Span(**value)


@dataclass(frozen=True)
class Record:
    """One (document, response) example.

    - `bad_spans`: character spans of `response` that are unfaithful. Tokens covering a non-space character
      inside a span are labelled bad (0); all other response tokens are good (1). Spans are stored sorted, and
      overlapping or touching spans are merged into one (`merged_spans`: the kinds joined with "+"), so every
      character is covered at most once.
    - `token_labels_known`: False when only a sequence-level label exists (e.g. HaluEval's hallucinated
      rewrites): token-level objectives must not use such a record.
    - `sequence_label`: 1 = faithful, 0 = unfaithful (an int: not a bool, not 1.0).
    - `faithful_response`: for a perturbed/hallucinated record, the faithful response it pairs with (DPO etc.).
    - `doc_id`: groups records of the same document, so splits are made per document.

    Every text field must be a string that can be written as UTF-8 (no lone surrogates); wrong types raise DataError.

    Example: ``Record("r1", document, "Profits rose 12% in 2023.", bad_spans=(Span(13, 16, "number"),))``
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
        where = f"record {str(self.id)[:80]!r} (source {str(self.source)[:80]!r})"
        try:
            self._check()
        except DataError as e:
            raise DataError(f"{where}: {e}") from e

    def _check(self) -> None:
        for name in ("id", "document", "response", "source", "doc_id", "task", "faithful_response"):
            check_text(getattr(self, name), f"field {name!r}", optional=name == "faithful_response")
        if not self.document.strip():
            raise DataError("empty document. Drop the row or fill in its document text.")
        if not self.response.strip():
            raise DataError("empty response/summary. Drop the row or fill in its response text.")
        if self.task not in TASKS:
            raise DataError(f"task={self.task!r} is not one of {TASKS}.")
        if type(self.sequence_label) is not int or self.sequence_label not in (0, 1):
            raise DataError(
                f"sequence_label={self.sequence_label!r} must be the integer 0 (unfaithful) or 1 (faithful)."
            )
        if type(self.token_labels_known) is not bool:
            raise DataError(f"token_labels_known={self.token_labels_known!r} must be true or false.")
        if not isinstance(self.meta, dict):
            raise DataError(f"meta must be an object (a dict), got {type(self.meta).__name__}.")
        try:
            json.dumps(self.meta, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as e:  # UnicodeEncodeError is a ValueError
            raise DataError(f"meta must be JSON that can be written as UTF-8 ({e}).") from e
        if not isinstance(self.bad_spans, (list, tuple)):
            raise DataError(f"bad_spans must be a list of {{start, end, kind}} objects, got {self.bad_spans!r:.60}.")
        spans = [_span(s) for s in self.bad_spans]
        for s in spans:
            if not (0 <= s.start < s.end <= len(self.response)):
                raise DataError(
                    f"bad span [{s.start}, {s.end}) lies outside the response (length {len(self.response)}) or is "
                    "empty. Spans are character offsets into the response, start < end."
                )
        object.__setattr__(self, "bad_spans", merged_spans(spans))
        if not self.doc_id:
            object.__setattr__(self, "doc_id", self.id)

    @property
    def bad_texts(self) -> list[str]:
        return [self.response[s.start : s.end] for s in self.bad_spans]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, row: object, where: str = "row") -> "Record":
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
            return cls(**row)
        except DataError as e:
            raise DataError(f"{where}: {e}") from e


def records_fingerprint(records: Iterable[Record]) -> str:
    """Identifies a list of Records (ids, texts, spans, labels; not their meta), in 16 hex: what a run trained on,
    and part of the key of any cached result on a token set."""
    h = hashlib.sha256()
    for r in records:
        d = r.to_json()
        d.pop("meta", None)
        h.update(json.dumps(d, sort_keys=True, separators=(",", ":"), default=str).encode())
    return h.hexdigest()[:16]


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


def utf8_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(0-based line index, text) for each line of a UTF-8 file, split on "\\n" only and without it (a "\\r" before
    it is kept; a leading byte-order mark is dropped). Every data parser reads its files through this: a file that
    cannot be opened, or a byte that is not UTF-8, raises DataError naming the file, the line, the byte and the fix."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            offset = 0
            for index, raw in enumerate(f):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{path}:{index + 1}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {offset + e.start}): "
                        "save it as UTF-8 (an editor's 'save with encoding', or `iconv -f WINDOWS-1252 -t UTF-8` "
                        "for Windows text)."
                    ) from e
                yield index, (text.removeprefix("\ufeff") if index == 0 else text).removesuffix("\n")
                offset += len(raw)
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e}). Check the path and its permissions.") from e


def read_utf8(path: str | os.PathLike) -> str:
    """The whole text of a UTF-8 file (see `utf8_lines`), lines joined with "\\n"."""
    return "\n".join(line for _, line in utf8_lines(path))


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def json_lines(path: str | os.PathLike) -> Iterator[tuple[int, str, object]]:
    """(0-based line index, "path:line" for messages, parsed value) for each non-blank line of a UTF-8 JSONL file;
    a line that is not JSON, or whose \\u escapes leave a lone surrogate, raises DataError naming it."""
    for line_index, line in utf8_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{line_index + 1}"
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, too many digits, too deeply nested
            detail = f"{e.msg}, column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
            raise DataError(f"{where}: not valid JSON ({detail}). Fix or delete that line.") from e
        if _SURROGATE_ESCAPE.search(line):
            try:
                json.dumps(value, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError as e:
                raise DataError(
                    f"{where}: a \\u escape gives a lone surrogate (half of a pair), which is not text and cannot be "
                    "written as UTF-8: fix the escape (a pair needs both halves, e.g. \\ud83d\\ude00) or delete it."
                ) from e
        yield line_index, where, value


def iter_jsonl(path: str | os.PathLike) -> Iterator[Record]:
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: file not found. Build a data set first: python -m topl_core data build --out {path}")
    for _, where, row in json_lines(path):
        yield Record.from_json(row, where)


def read_jsonl(path: str | os.PathLike) -> list[Record]:
    """Every record of a JSONL file (one Record per line), validated.

    Example: ``records = read_jsonl("cache/data/halueval-perturbed.jsonl")``"""
    return list(iter_jsonl(path))


def merge_jsonl(paths: Iterable[str | os.PathLike]) -> list[Record]:
    """The records of several JSONL files, in order (e.g. perturbations + the model's own summaries). Refused
    (DataError) when an id repeats: a file given twice, or two builds of one source, would train on doubles."""
    paths = [str(p) for p in paths]
    records = [r for path in paths for r in read_jsonl(path)]
    twice = [i for i, n in Counter(r.id for r in records).items() if n > 1]
    if twice:
        raise DataError(
            f"record id {twice[0]!r} occurs more than once in {paths} ({len(twice)} ids in all): merge files "
            "of different records (a file given twice, or two builds of one source, repeat ids)."
        )
    return records
