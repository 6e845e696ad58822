import pytest

from topl_core.data.mlqe import bad_word_spans, load_mlqe_dir, mlqe_records
from topl_core.foundations.errors import DataError

SOURCES = ["The cat sat on the mat .", "Hello world ."]
TRANSLATIONS = ["Die Katze  saß auf der Matte .", "Hallo Welt ."]
TAG_LINES = [
    "OK OK OK BAD OK BAD BAD OK OK OK OK OK OK OK OK",  # Die OK, Katze BAD, saß BAD, then a BAD gap
    "OK OK OK OK OK OK OK",
]


def test_records_mark_bad_words_only():
    first, second = mlqe_records(SOURCES, TRANSLATIONS, [t.split() for t in TAG_LINES])
    assert first.task == "translation" and first.document == SOURCES[0] and first.response == TRANSLATIONS[0]
    assert first.bad_texts == ["Katze", "saß"] and all(s.kind == "bad_word" for s in first.bad_spans)
    assert first.sequence_label == 0
    assert second.bad_spans == () and second.sequence_label == 1


def test_bad_gap_tags_are_ignored():
    assert bad_word_spans("a b", "BAD OK BAD OK BAD".split(), "x") == ()


def test_tag_count_mismatch_names_the_line():
    tags = [TAG_LINES[0].split(), TAG_LINES[1].split()[:-1]]
    with pytest.raises(DataError, match=r"mlqe line 2: 6 tags for 3 MT words; expected 2N\+1 = 7"):
        mlqe_records(SOURCES, TRANSLATIONS, tags)
    with pytest.raises(DataError, match=r"2 source sentences, 1 MT sentences and 2 tag lines"):
        mlqe_records(SOURCES, TRANSLATIONS[:1], [t.split() for t in TAG_LINES])
    with pytest.raises(DataError, match=r"line 1: unknown tag\(s\) \['ok'\]"):
        mlqe_records(SOURCES[:1], ["a"], [["OK", "ok", "OK"]])


def test_load_directory(tmp_path):
    for ext, lines in (("src", SOURCES), ("mt", TRANSLATIONS), ("tags", TAG_LINES)):
        (tmp_path / f"dev.{ext}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    records = load_mlqe_dir(tmp_path, split="dev")
    assert [r.id for r in records] == ["mlqe-dev-0", "mlqe-dev-1"]
    assert records[0].bad_texts == ["Katze", "saß"]
    with pytest.raises(DataError, match=r"missing \['train.src', 'train.mt', 'train.tags'\]"):
        load_mlqe_dir(tmp_path)
