"""Bad data never gives a traceback: every data parser either returns valid records or raises DataError naming the
file (and the line/row where there is one).

- Fuzz (hypothesis): for each parser, random bytes, random text and mutated valid rows (truncated lines, wrong JSON
  types in every field, lists instead of objects, huge / negative / float offsets, missing columns, empty files,
  stray CSV quotes, lone surrogates). `FUZZ_EXAMPLES` cases per parser and kind of input, derandomized so CI is
  stable; TOPL_FUZZ_EXAMPLES=5000 tries that many new (random) cases.
- A corpus of nasty files (tests/fixtures/nasty/) through each parser and, for a few, through `data build` /
  `data inspect` (exit code 2, `error: …` on stderr, no traceback).
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from topl_core.cli import main
from topl_core.data.cliff import load_factuality_csv
from topl_core.data.fava import load_fava_jsonl
from topl_core.data.halueval import halueval_pair_records, halueval_perturbation_records, load_halueval_rows
from topl_core.data.mlqe import load_mlqe_dir
from topl_core.data.records import Record, Span, read_jsonl, write_jsonl
from topl_core.foundations.errors import DataError

NASTY = Path(__file__).parent / "fixtures" / "nasty"
FUZZ_EXAMPLES = int(os.environ.get("TOPL_FUZZ_EXAMPLES", "200"))
fuzz = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize="TOPL_FUZZ_EXAMPLES" not in os.environ,  # CI: the same cases every run; asked for more: new ones
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# text with lone surrogates, quotes, tags, separators and line breaks mixed in
chars = st.characters() | st.integers(0xD800, 0xDFFF).map(chr) | st.sampled_from("\"',<>[]\\\n\r\u2028\ufeff")
texts = st.text(chars, max_size=30)
numbers = (
    st.integers(-5, 60) | st.integers(-(2**80), 2**80) | st.floats() | st.sampled_from([0.0, 1.0, True, False, 1e400])
)
json_scalars = st.none() | st.booleans() | numbers | texts
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=6
)

VALID_RECORD = {
    "id": "r1",
    "document": "The council of Leeds approved the budget on Monday.",
    "response": "The Leeds council approved the budget.",
    "bad_spans": [{"start": 4, "end": 9, "kind": "entity"}],
    "token_labels_known": True,
    "sequence_label": 0,
    "faithful_response": "The council approved the budget.",
    "task": "summarization",
    "source": "fuzz",
    "doc_id": "d1",
    "meta": {"note": "x"},
}
VALID_HALUEVAL = {"document": "A long document.", "right_summary": "Right.", "hallucinated_summary": "Wrong."}
VALID_FAVA = {
    "id": "f1",
    "evidence": "Messi is Argentine.",
    "errored_passage": "Messi is <entity><mark>Brazilian</mark><delete>Argentine</delete></entity>.",
}
FAVA_PIECES = "<entity> </entity> <mark> </mark> <delete> </delete> <invented> </invented> <b> </x> < > word".split()
fava_passages = st.lists(st.sampled_from([*FAVA_PIECES, " ", "\n", "\u2028"]) | texts, max_size=12).map("".join)


@st.composite
def mutated_rows(draw, valid: dict, field_values: dict[str, st.SearchStrategy] | None = None) -> object:
    """A valid row with one mutation: a field set to any JSON value (or one meant for it), a field deleted, an
    unknown field added, spans replaced by random ones, or the row turned into a list or a scalar."""
    row = json.loads(json.dumps(valid))
    key = draw(st.sampled_from(sorted(row)))
    values = (field_values or {}).get(key, st.nothing())
    mutation = draw(st.sampled_from(["set", "set", "typed", "delete", "add", "spans", "list", "scalar", "none"]))
    if mutation == "set":
        row[key] = draw(json_values)
    elif mutation == "typed":
        row[key] = draw(values | json_values)
    elif mutation == "delete":
        del row[key]
    elif mutation == "add":
        row[draw(texts)] = draw(json_values)
    elif mutation == "spans":
        span = st.fixed_dictionaries({"start": numbers, "end": numbers}, optional={"kind": json_scalars})
        row["bad_spans"] = draw(st.lists(span | json_values, max_size=4))
    elif mutation == "list":
        return list(row.values())
    elif mutation == "scalar":
        return draw(json_scalars)
    return row


clean = st.text(st.characters(exclude_characters="\n<>"), min_size=1, max_size=25).filter(str.strip)
valid_halueval = st.fixed_dictionaries({k: clean for k in VALID_HALUEVAL})
valid_fava = st.fixed_dictionaries(
    {
        "evidence": clean,
        "errored_passage": clean | st.sampled_from([VALID_FAVA["errored_passage"], "<invented>Made up.</invented> ok"]),
    },
    optional={"id": clean | st.integers()},
)


@st.composite
def valid_records(draw) -> dict:
    """VALID_RECORD with another id and document and random (often overlapping or touching) spans."""
    n = len(VALID_RECORD["response"])
    ends = st.integers(0, n - 1).flatmap(lambda start: st.tuples(st.just(start), st.integers(start + 1, n)))
    spans = [{"start": a, "end": b, "kind": draw(st.sampled_from("ab"))} for a, b in draw(st.lists(ends, max_size=4))]
    return {**VALID_RECORD, "id": draw(clean), "document": draw(clean), "bad_spans": spans}


@st.composite
def jsonl_bytes(draw, valid_rows: st.SearchStrategy[dict], valid: dict, field_values: dict | None = None) -> bytes:
    """A JSONL file of 1-3 valid rows (written with or without a BOM, CRLF or blank lines), or with one corruption:
    a mutated row, a line cut short, or bytes that are not UTF-8."""
    rows: list[object] = [draw(valid_rows) for _ in range(draw(st.integers(1, 3)))]
    corruption = draw(st.sampled_from(["none", "none", "row", "row", "cut", "bytes"]))
    i = draw(st.integers(0, len(rows) - 1))
    if corruption == "row":
        rows[i] = draw(mutated_rows(valid, field_values))
    lines = [json.dumps(row, ensure_ascii=draw(st.booleans())) for row in rows]
    if corruption == "cut":
        lines[i] = lines[i][: draw(st.integers(0, len(lines[i]) - 1))]
    data = draw(st.sampled_from(["\n", "\r\n", "\n\n"])).join(lines).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    if corruption == "bytes":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=4)) + data[at:]
    return data


any_bytes = st.binary(max_size=300)
any_text = texts.map(lambda t: t.encode("utf-8", "surrogatepass"))


def files_of(structured: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Mostly structured files, the rest random bytes or random text."""
    return st.one_of(structured, structured, structured, any_bytes, any_text)


def must_parse_or_refuse(parse: Callable[[Path], object], path: Path) -> object | None:
    """parse(path), or None when it raises DataError naming the file; any other exception fails the test."""
    try:
        parsed = parse(path)
    except DataError as e:
        assert path.name in str(e), f"the error does not name {path.name}: {e}"
        event("refused")
        return None
    event("records parsed", min(3, len(parsed.records if hasattr(parsed, "records") else parsed)))
    return parsed


def assert_valid(records: list[Record], folder: Path) -> None:
    """Every record is a Record that writes as UTF-8 JSONL and reads back equal."""
    assert all(isinstance(r, Record) for r in records)
    if records:
        assert read_jsonl(write_jsonl(records, folder / "round-trip.jsonl")) == records


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def written(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


# --- records JSONL -------------------------------------------------------------------------------------------------


@fuzz
@given(files_of(jsonl_bytes(valid_records(), VALID_RECORD)))
def test_fuzz_records_jsonl(folder, data):
    records = must_parse_or_refuse(read_jsonl, written(folder, "records.jsonl", data))
    if records is not None:
        assert_valid(records, folder)


@fuzz
@given(st.fixed_dictionaries({}, optional={k: json_values for k in Record.__dataclass_fields__}))
def test_fuzz_record_fields(fields):
    """Records made in code: any JSON value in any field gives a valid Record or DataError."""
    try:
        record = Record(**{"id": "x", "document": "d", "response": "a response", **fields})
    except DataError:
        return
    json.dumps(record.to_json(), ensure_ascii=False).encode("utf-8")
    assert all(a.end < b.start for a, b in zip(record.bad_spans, record.bad_spans[1:]))  # merged: no overlap, no touch


# --- HaluEval ------------------------------------------------------------------------------------------------------


@fuzz
@given(files_of(jsonl_bytes(valid_halueval, VALID_HALUEVAL)))
def test_fuzz_halueval(folder, data):
    rows = must_parse_or_refuse(load_halueval_rows, written(folder, "halueval.jsonl", data))
    if rows is not None:
        assert_valid(halueval_pair_records(rows) + halueval_perturbation_records(rows, seed=0), folder)


# --- FAVA ----------------------------------------------------------------------------------------------------------


@fuzz
@given(
    files_of(jsonl_bytes(valid_fava, VALID_FAVA, {"errored_passage": fava_passages})),
    st.sampled_from(["raw", "completion"]),
)
def test_fuzz_fava(folder, data, form):
    if form == "completion":
        data = data.replace(b"errored_passage", b"completion")
    records = must_parse_or_refuse(lambda p: load_fava_jsonl(p, form), written(folder, "fava.jsonl", data))
    if records is not None:
        assert_valid(records, folder)


# --- CLIFF / AggreFact CSV -----------------------------------------------------------------------------------------

SUMMARY = "Obraniak , 30 , was taken -lrb- in Rize -rrb- after the 5 - 1 win ."
VALID_CELLS = {
    "doc": st.sampled_from(["A document -lrb- with brackets -rrb- .", 'Another, "quoted" document.']) | clean,
    "summ": st.sampled_from([SUMMARY, SUMMARY.lower(), "did n't , `` he '' said"]),
    "annotated_span": st.lists(
        st.sampled_from(["Obraniak", "in Rize", "5 - 1", "30 ,", "( in", "absent", ""]), max_size=3
    )
    .map(repr)
    .map(lambda r: "" if r == "[]" else r),
    "label": st.sampled_from(["0", "1", "1.0"]),
}
BAD_CELLS = st.sampled_from(["", " ", "['x'", "[1, 2]", "(" * 300, "1" * 5000, "{'a': 1}", "['\\ud800']", "yes", "2"])


@st.composite
def csv_bytes(draw) -> bytes:
    """A span CSV or a label CSV of valid rows (extra columns allowed), or with one corruption: a bad or random cell, a
    required column missing, the file cut short, a stray quote, or a row with an extra field."""
    columns = [*draw(st.sampled_from([("doc", "summ", "annotated_span"), ("doc", "summ", "label")]))]
    columns += draw(st.lists(st.sampled_from(["origin", "id", "model_name", "cut"]), max_size=2, unique=True))
    rows = [[draw(VALID_CELLS.get(c, clean)) for c in columns] for _ in range(draw(st.integers(0, 3)))]
    corruption = draw(st.sampled_from(["none", "none", "cell", "column", "cut", "quote", "extra field"]))
    if corruption == "cell" and rows:
        draw(st.sampled_from(rows))[draw(st.integers(0, len(columns) - 1))] = draw(BAD_CELLS | texts)
    if corruption == "column":
        index = draw(st.integers(0, 2))
        rows = [row[:index] + row[index + 1 :] for row in [columns, *rows]]
        columns, rows = rows[0], rows[1:]
    out = io.StringIO()
    csv.writer(out).writerows([columns, *rows])
    text = out.getvalue()
    at = draw(st.integers(0, len(text)))
    edits = {"cut": text[:at], "quote": text[:at] + '"' + text[at:], "extra field": text + "a,b,c,d,e,f,g,h\n"}
    return edits.get(corruption, text).encode("utf-8", "surrogatepass")


@fuzz
@given(files_of(csv_bytes()), st.booleans(), st.sampled_from(["skip", "raise"]))
def test_fuzz_factuality_csv(folder, data, detokenized, on_missing):
    path = written(folder, "factuality.csv", data)
    report = must_parse_or_refuse(lambda p: load_factuality_csv(p, on_missing, detokenized=detokenized), path)
    if report is not None:
        assert_valid(list(report.records), folder)


# --- MLQE-PE -------------------------------------------------------------------------------------------------------


@st.composite
def mlqe_files(draw) -> dict[str, bytes]:
    """{ext: bytes} of aligned src / mt / tags lines (MT words with their 2N+1 OK/BAD tags), or with one corruption:
    a line's tags or text replaced by random ones, a line dropped from one file, or one file of random bytes or text."""
    lines = []
    for _ in range(draw(st.integers(0, 3))):
        mt = " ".join(
            draw(st.lists(st.sampled_from(["Die", "Katze", "saß", "\u2028."]) | clean, min_size=1, max_size=4))
        )
        n_tags = 2 * len(mt.split()) + 1
        lines.append(
            [
                draw(clean),
                mt,
                " ".join(draw(st.lists(st.sampled_from(["OK", "BAD"]), min_size=n_tags, max_size=n_tags))),
            ]
        )
    corruption = draw(st.sampled_from(["none", "field", "drop", "file"]))
    column = draw(st.integers(0, 2))
    if corruption == "field" and lines:
        random_tags = st.lists(st.sampled_from(["OK", "BAD", "ok", "GAP"]), max_size=9).map(" ".join)
        draw(st.sampled_from(lines))[column] = draw(
            random_tags | st.text(chars.filter(lambda c: c != "\n"), max_size=20)
        )
    files = {}
    for i, ext in enumerate(("src", "mt", "tags")):
        file_lines = [line[i] for line in lines][: -1 if corruption == "drop" and i == column else None]
        files[ext] = "".join(f"{line}\n" for line in file_lines).encode("utf-8", "surrogatepass")
    if corruption == "file":
        files[("src", "mt", "tags")[column]] = draw(any_bytes | any_text)
    return files


@fuzz
@given(mlqe_files())
def test_fuzz_mlqe(folder, files):
    directory = folder / "mlqe"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    for ext, data in files.items():
        written(directory, f"train.{ext}", data)
    records = must_parse_or_refuse(load_mlqe_dir, directory)
    if records is not None:
        assert_valid(records, folder)


# --- the corpus of nasty files -------------------------------------------------------------------------------------

PARSERS: dict[str, Callable[[Path], object]] = {
    "jsonl": read_jsonl,
    "halueval": load_halueval_rows,
    "fava": lambda p: load_fava_jsonl(p, "raw"),
    "csv": load_factuality_csv,
    "mlqe": load_mlqe_dir,
}
REFUSED = [  # (file, parser, what the message says after the file's name)
    ("garbage.bin", "jsonl", r":1: not UTF-8 text \(byte 0x[0-9a-f]{2} at offset 2\): save it as UTF-8"),
    ("garbage.bin", "halueval", r":1: not UTF-8 text"),
    ("garbage.bin", "fava", r":1: not UTF-8 text"),
    ("garbage.bin", "csv", r":1: not UTF-8 text"),
    ("cp1252.jsonl", "jsonl", r":2: not UTF-8 text \(byte 0x93 at offset 161\)"),
    ("cp1252.csv", "csv", r":2: not UTF-8 text \(byte 0xe9"),
    ("mlqe_cp1252", "mlqe", r"/train.src:1: not UTF-8 text \(byte 0xe9"),
    ("truncated.jsonl", "jsonl", r":2: not valid JSON \(Unterminated string"),
    ("fava_truncated.jsonl", "fava", r":1: not valid JSON"),
    ("deep.jsonl", "jsonl", r":1: not valid JSON \(maximum recursion depth"),
    ("list_row.jsonl", "jsonl", r":2: expected a JSON object, got list"),
    ("fava_list_row.jsonl", "fava", r":1: expected a JSON object .*, not a list"),
    ("fava_nonstring.jsonl", "fava", r":2, field 'errored_passage': must be a string"),
    ("fava_number_document.jsonl", "fava", r":1, field 'evidence': must be a string"),
    ("halueval_nonstring.jsonl", "halueval", r":1: field\(s\) \['hallucinated_summary'\] missing, empty or not a"),
    ("number_for_string.jsonl", "jsonl", r":2: record 'b' .*field 'response' must be a string .*got int 42"),
    ("id_number.jsonl", "jsonl", r":1: record '7' .*field 'id' must be a string"),
    ("lone_surrogate.jsonl", "jsonl", r":2: a \\u escape gives a lone surrogate"),
    ("float_span.jsonl", "jsonl", r":1: record 'a' .*bad span start=1.0 must be an integer"),
    ("bool_label.jsonl", "jsonl", r":2: record 'b' .*sequence_label=True must be the integer 0"),
    ("huge_offset.jsonl", "jsonl", r":1: record 'a' .*bad span \[0, 10{30}\) lies outside the response"),
    ("empty.csv", "csv", r": empty CSV \(no header row\)"),
    ("unterminated.csv", "csv", r": not a well-formed CSV \(EOF inside string"),
    ("long_row.csv", "csv", r": a row has more fields than the header"),
    ("bad_span_list.csv", "csv", r", row 0, column annotated_span: .* not a Python list literal"),
    ("number_label.csv", "csv", r", row 0, column label: '2' must be 1"),
    ("mlqe_mismatch", "mlqe", r"/train.\{src,mt,tags\}: 3 source sentences, 2 MT sentences and 3 tag lines"),
]


@pytest.mark.parametrize("name, parser, message", REFUSED)
def test_nasty_file_is_refused_naming_file_and_line(name, parser, message):
    with pytest.raises(DataError) as e:
        PARSERS[parser](NASTY / name)
    assert re.search(re.escape(name) + message, str(e.value)), str(e.value)


def test_bom_is_dropped_and_overlapping_spans_are_merged():
    assert [r.id for r in read_jsonl(NASTY / "bom.jsonl")] == ["a"]
    (record,) = read_jsonl(NASTY / "overlapping_spans.jsonl")
    assert record.bad_spans == (Span(4, 15, "entity+relation"),)
    touching = Record(id="t", document="d", response="abcdefgh", bad_spans=(Span(4, 6, "x"), Span(0, 2), Span(2, 4)))
    assert touching.bad_spans == (Span(0, 6, "error+x"),)  # sorted, then merged left to right
    assert Record(id="s", document="d", response="abc", bad_spans=(Span(0, 2, "a"), Span(1, 3, "a"))).bad_spans == (
        Span(0, 3, "a"),
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"sequence_label": 1.0}, r"sequence_label=1.0 must be the integer"),
        ({"sequence_label": True}, r"sequence_label=True must be the integer"),
        ({"token_labels_known": 1}, r"token_labels_known=1 must be true or false"),
        ({"bad_spans": [{"start": 1.0, "end": 2}]}, r"bad span start=1.0 must be an integer"),
        ({"bad_spans": [{"start": 0, "end": False}]}, r"bad span end=False must be an integer"),
        ({"bad_spans": [{"start": 0, "end": 2, "kind": 5}]}, r"bad span kind must be a string"),
        ({"bad_spans": [[0, 2]]}, r"bad_spans entries must be \{start, end, kind\} objects"),
        ({"bad_spans": "0-2"}, r"bad_spans must be a list"),
        ({"faithful_response": 5}, r"field 'faithful_response' must be a string"),
        ({"doc_id": None}, r"field 'doc_id' must be a string"),
        ({"task": ["summarization"]}, r"field 'task' must be a string"),
        ({"response": "a\ud800b"}, r"field 'response' holds a lone surrogate \('\\ud800' at character 1\)"),
        ({"meta": []}, r"meta must be an object"),
        ({"meta": {"x": {1, 2}}}, r"meta must be JSON"),
    ],
)
def test_record_types_are_checked(fields, message):
    with pytest.raises(DataError, match=r"record 'x' \(source 'unknown'\): " + message):
        Record(**{"id": "x", "document": "A document.", "response": "A response.", **fields})
    assert Record(id="x", document="d", response="r", faithful_response=None, sequence_label=0).doc_id == "x"


@pytest.mark.parametrize(
    "argv, name",
    [
        (["data", "build", "--source", "fava", "--input", "fava_truncated.jsonl"], "fava_truncated.jsonl:1"),
        (["data", "build", "--source", "fava", "--input", "fava_nonstring.jsonl"], "fava_nonstring.jsonl:2"),
        (["data", "build", "--source", "jsonl", "--input", "cp1252.jsonl"], "cp1252.jsonl:2"),
        (["data", "build", "--source", "aggrefact", "--input", "unterminated.csv"], "unterminated.csv"),
        (["data", "build", "--source", "mlqe", "--input", "mlqe_mismatch"], "mlqe_mismatch"),
        (["data", "build", "--source", "halueval-pairs", "--input", "garbage.bin"], "garbage.bin:1"),
        (["data", "inspect", "float_span.jsonl"], "float_span.jsonl:1"),
        (["data", "inspect", "lone_surrogate.jsonl"], "lone_surrogate.jsonl:2"),
        (["steer", "--run", "examples/adapters/topl-smollm2", "--document-file", "cp1252.jsonl"], "cp1252.jsonl:2"),
    ],
)
def test_cli_says_error_with_exit_code_2(argv, name, tmp_path, capsys):
    argv = [str(NASTY / a) if (NASTY / a).exists() else a for a in argv]
    out = tmp_path / "out.jsonl"
    assert main(argv + (["--out", str(out)] if argv[1] == "build" else [])) == 2
    err = capsys.readouterr().err
    assert "error: " in err and name in err and "Traceback" not in err, err
    assert not out.exists()


def test_cli_inspect_prints_merged_spans_once(capsys):
    assert main(["data", "inspect", str(NASTY / "overlapping_spans.jsonl")]) == 0
    assert "response: The [[council met]]<entity+relation>.\n" in capsys.readouterr().out


def test_merged_spans_cover_the_same_characters():
    rng = random.Random(0)
    spans = [Span(s, s + rng.randint(1, 4), rng.choice("ab")) for s in rng.choices(range(30), k=12)]
    merged = Record(id="m", document="d", response="x" * 40, bad_spans=tuple(spans)).bad_spans
    covered = {i for s in spans for i in range(s.start, s.end)}
    assert {i for s in merged for i in range(s.start, s.end)} == covered
    assert all(a.end < b.start for a, b in zip(merged, merged[1:]))
