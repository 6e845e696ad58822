"""FAVA tagged passages -> perturbed text S' and bad character spans.

FAVA wraps every error in a type tag (`<entity> <relation> <contradictory> <invented> <subjective>
<unverifiable>`) and marks edits with two tags:
- raw `errored_passage` form: `<mark>x</mark>` is erroneous text present in the passage, `<delete>y</delete>`
  is the original text that the error replaced (absent from the passage);
- edited "completion" form: the two are swapped (`<delete>` wraps the erroneous text, `<mark>` the correction).

S' is the passage with the replaced/corrected text removed and all tags stripped. Everything a type tag keeps
in S' is erroneous (for whole-span types such as `<invented>` that is the whole content; for `<entity>` it is
the erroneous edit), so each type tag gives one span with kind = the tag name, trimmed of surrounding
whitespace. An erroneous edit tag outside any type tag gives a span of kind "error". Whitespace around removed
text is kept as it is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Literal

from ..foundations.errors import DataError
from .records import Record, Span, json_lines

FavaForm = Literal["raw", "completion"]
TYPE_TAGS: tuple[str, ...] = ("entity", "relation", "contradictory", "invented", "subjective", "unverifiable")
EDIT_TAGS: tuple[str, ...] = ("mark", "delete")
TAG_RE = re.compile(r"<(/?)([A-Za-z_]+)>")
PASSAGE_KEYS: dict[str, str] = {"raw": "errored_passage", "completion": "completion"}
DOCUMENT_KEYS = ("evidence", "document")


def _edit_roles(form: str) -> tuple[str, str]:
    """(erroneous tag, removed tag) for a form."""
    if form == "raw":
        return "mark", "delete"
    if form == "completion":
        return "delete", "mark"
    raise DataError(f"FAVA form={form!r} must be 'raw' (errored_passage) or 'completion' (edited output).")


def _trimmed_span(text: str, start: int, end: int, kind: str) -> Span | None:
    piece = text[start:end]
    start += len(piece) - len(piece.lstrip())
    end -= len(piece) - len(piece.rstrip())
    return Span(start, end, kind) if start < end else None


def parse_fava(text: str, form: FavaForm) -> tuple[str, tuple[Span, ...]]:
    """S' and its bad spans (sorted) from a FAVA-tagged passage; malformed tags raise DataError with the position."""
    erroneous_tag, removed_tag = _edit_roles(form)
    pieces: list[str] = []
    length = 0
    open_tags: list[tuple[str, int, int]] = []  # (tag, position in `text`, offset in S' where its content starts)
    untrimmed: list[tuple[int, int, str]] = []
    cursor = 0
    for m in TAG_RE.finditer(text):
        if not any(t == removed_tag for t, _, _ in open_tags):  # text inside the removed tag is dropped
            pieces.append(text[cursor : m.start()])
            length += m.start() - cursor
        cursor = m.end()
        closing, tag = m.group(1) == "/", m.group(2)
        if tag not in TYPE_TAGS + EDIT_TAGS:
            raise DataError(
                f"unknown tag <{m.group()[1:-1]}> at character {m.start()}; FAVA tags are {TYPE_TAGS + EDIT_TAGS}."
            )
        if not closing:
            if open_tags and (tag in TYPE_TAGS or open_tags[-1][0] in EDIT_TAGS):
                outer, outer_position, _ = open_tags[-1]
                raise DataError(
                    f"<{tag}> at character {m.start()} is nested inside <{outer}> (opened at character "
                    f"{outer_position}); "
                    "type tags cannot be nested, and <mark>/<delete> may only sit directly inside a type tag."
                )
            open_tags.append((tag, m.start(), length))
            continue
        if not open_tags:
            raise DataError(f"</{tag}> at character {m.start()} closes a tag that was never opened.")
        opened, opened_position, content_start = open_tags.pop()
        if opened != tag:
            raise DataError(
                f"</{tag}> at character {m.start()} does not match <{opened}> opened at character {opened_position}."
            )
        is_type_span = tag in TYPE_TAGS
        is_bare_error = tag == erroneous_tag and not open_tags
        if is_type_span or is_bare_error:
            untrimmed.append((content_start, length, tag if is_type_span else "error"))
    if open_tags:
        tag, position, _ = open_tags[-1]
        raise DataError(f"<{tag}> opened at character {position} is never closed; add </{tag}>.")
    pieces.append(text[cursor:])
    perturbed = "".join(pieces)
    spans = (_trimmed_span(perturbed, start, end, kind) for start, end, kind in untrimmed)
    return perturbed, tuple(sorted((s for s in spans if s), key=lambda s: s.start))


def fava_record(row: object, form: FavaForm, source: str, index: int, where: str) -> Record:
    """One record from a FAVA row (see `fava_records`); anything malformed raises DataError starting with `where`."""
    passage_key = PASSAGE_KEYS[form]
    if not isinstance(row, dict):
        raise DataError(
            f"{where}: expected a JSON object with a document and {passage_key!r}, not a {type(row).__name__}."
        )
    document_key = next((k for k in DOCUMENT_KEYS if row.get(k)), None)
    if document_key is None or passage_key not in row:
        raise DataError(
            f"{where}: needs a document under one of {DOCUMENT_KEYS} and the tagged passage under "
            f"{passage_key!r} for form={form!r}; the row has keys {sorted(map(str, row))}."
        )
    row_id = row.get("id", f"{source}-{index}")
    if isinstance(row_id, bool) or not isinstance(row_id, (str, int)):
        raise DataError(f"{where}, field 'id': {row_id!r:.60} must be a string or an integer.")
    for key in (document_key, passage_key):
        if not isinstance(row[key], str):
            raise DataError(
                f"{where}, field {key!r}: must be a string (text in quotes), not {type(row[key]).__name__}."
            )
    try:
        response, spans = parse_fava(row[passage_key], form)
    except DataError as e:
        raise DataError(f"{where}, field {passage_key!r}: {e}") from e
    try:
        return Record(
            id=str(row_id),
            document=row[document_key],
            response=response,
            bad_spans=spans,
            sequence_label=0 if spans else 1,
            source=source,
        )
    except DataError as e:
        raise DataError(f"{where}: {e}") from e


def fava_records(rows: Iterable[object], form: FavaForm, source: str = "fava") -> list[Record]:
    """Records from FAVA rows with the document under "evidence" or "document" and the tagged passage under
    "errored_passage" (raw form) or "completion" (completion form); ids from "id" (a string or an integer) or
    f"{source}-{row index}". Errors name f"{source} row {index}"."""
    _edit_roles(form)  # rejects an unknown form
    return [fava_record(row, form, source, index, f"{source} row {index}") for index, row in enumerate(rows)]


def load_fava_jsonl(path: str | Path, form: FavaForm, source: str = "fava") -> list[Record]:
    """Records from a UTF-8 JSONL file of FAVA rows (one object per line, blank lines skipped); errors name the file
    and line."""
    _edit_roles(form)
    return [fava_record(row, form, source, index, where) for index, (_, where, row) in enumerate(json_lines(path))]
