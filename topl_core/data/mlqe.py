"""MLQE-PE (WMT20 QE task 2) word-level quality labels as translation records.

Per sentence, the target tag line interleaves gap and word tags for the N machine-translated words
(whitespace-split): gap, w1, gap, w2, ..., wN, gap — 2N+1 tags, word tags at odd positions. OK = good,
BAD = bad. A record's document is the source sentence, its response the MT sentence, and each BAD word becomes
a bad character span of kind "bad_word". BAD gap tags (missing words) have no characters to label and are
ignored. sequence_label is 0 when any word is BAD.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from ..foundations.errors import DataError
from .records import Record, Span, utf8_lines

WORD_TAGS = ("OK", "BAD")
LANG_PAIR = re.compile(r"[a-z]{2}-[a-z]{2}")  # an input naming a language pair is read from the hub copy
HUB_ID = "wmt/wmt20_mlqe_task2"  # formerly "wmt20_mlqe_task2"; configs "en-de" and "en-zh"


def bad_word_spans(translation: str, tags: Sequence[str], where: str) -> tuple[Span, ...]:
    """Character spans of the BAD words of `translation`, given its 2N+1 gap/word tags."""
    words = list(re.finditer(r"\S+", translation))
    if len(tags) != 2 * len(words) + 1:
        raise DataError(
            f"{where}: {len(tags)} tags for {len(words)} MT words; expected 2N+1 = {2 * len(words) + 1} "
            "(gap, word, gap, ..., word, gap). Check that the tag, MT and source files are aligned line by line."
        )
    unknown = sorted({t for t in tags if t not in WORD_TAGS})
    if unknown:
        raise DataError(f"{where}: unknown tag(s) {unknown}; tags must be OK or BAD.")
    return tuple(Span(w.start(), w.end(), "bad_word") for w, tag in zip(words, tags[1::2]) if tag == "BAD")


def mlqe_records(
    sources: Sequence[str],
    translations: Sequence[str],
    tags: Sequence[Sequence[str]],
    id_prefix: str = "mlqe",
    source: str = "mlqe",
    location: str | None = None,
    references: Sequence[str] | None = None,
    lang_pair: str | None = None,
) -> list[Record]:
    """Translation records from aligned source sentences, MT sentences and per-sentence tag lists; the post-edits
    (`references`, the evaluation's references) and the pair ("en-de", named in the prompt) go to meta. Errors name
    f"{location}:{line}" (default f"{source} line {line}"), 1-based."""
    if not len(sources) == len(translations) == len(tags) == len(references if references is not None else tags):
        post_edits = "" if references is None else f" and {len(references)} post-edits"
        raise DataError(
            f"{location or source}: {len(sources)} source sentences, {len(translations)} MT sentences and {len(tags)} "
            f"tag lines{post_edits}; all must have one entry per sentence."
        )
    records = []
    for i, (src, mt, sentence_tags) in enumerate(zip(sources, translations, tags)):
        meta = {"lang_pair": lang_pair} if lang_pair else {}
        if references is not None:
            meta["reference"] = references[i]
        where = f"{location}:{i + 1}" if location else f"{source} line {i + 1}"
        spans = bad_word_spans(mt, sentence_tags, where)
        try:
            records.append(
                Record(
                    id=f"{id_prefix}-{i}",
                    document=src,
                    response=mt,
                    bad_spans=spans,
                    sequence_label=0 if spans else 1,
                    task="translation",
                    source=source,
                    meta=meta,
                )
            )
        except DataError as e:
            raise DataError(f"{where}: {e}") from e
    return records


def load_mlqe_dir(
    directory: str | Path, split: str = "train", source: str = "mlqe", lang_pair: str | None = None
) -> list[Record]:
    """Records from the UTF-8 WMT20 task 2 files `{split}.src`, `{split}.mt` and `{split}.tags` in `directory`, one
    sentence per line (split on "\\n" only: sentences may contain other Unicode line separators); `{split}.pe`, the
    post-edits, become the references when present. The pair defaults to the name of the directory or its parent
    when it reads like one ("en-de/test" → "en-de")."""
    directory = Path(directory)
    lang_pair = lang_pair or next(
        (d.name for d in (directory, directory.parent) if re.fullmatch(r"[a-z]{2,3}-[a-z]{2,3}", d.name)), None
    )
    paths = [directory / f"{split}.{ext}" for ext in ("src", "mt", "tags")]
    absent = [p.name for p in paths if not p.is_file()]
    if absent:
        raise DataError(
            f"{directory}: missing {absent}. An MLQE-PE split needs {[p.name for p in paths]} "
            "(the WMT20 task 2 release, e.g. en-de/train/)."
        )
    sources, translations, tag_lines = ([line.rstrip("\r") for _, line in utf8_lines(p)] for p in paths)
    post_edits = directory / f"{split}.pe"
    return mlqe_records(
        sources,
        translations,
        [line.split() for line in tag_lines],
        id_prefix=f"{source}-{split}",
        source=source,
        location=str(directory / f"{split}.{{src,mt,tags}}"),
        references=[line.rstrip("\r") for _, line in utf8_lines(post_edits)] if post_edits.is_file() else None,
        lang_pair=lang_pair,
    )


def load_mlqe_hub(lang_pair: str = "en-de", split: str = "train", source: str = "mlqe") -> list[Record]:
    """Records from the Hugging Face hub copy (needs a hub; without one, a DataError naming the local fix)."""
    import datasets

    try:
        table = datasets.load_dataset(HUB_ID, lang_pair, split=split)
    except Exception as e:
        raise DataError(
            f"MLQE-PE {lang_pair} [{split}] from the hub ({HUB_ID}) could not be loaded ({type(e).__name__}: {e}). "
            "Without a hub, give --input the directory of a local copy (SPLIT.src / .mt / .tags)."
        ) from e
    src_lang, mt_lang = lang_pair.split("-")
    tag_names = table.features["mt_tags"].feature.int2str
    return mlqe_records(
        [row["translation"][src_lang] for row in table],
        [row["translation"][mt_lang] for row in table],
        [tag_names(row["mt_tags"]) for row in table],
        id_prefix=f"{source}-{lang_pair}-{split}",
        source=source,
        references=[row["pe"] for row in table] if "pe" in table.column_names else None,
        lang_pair=lang_pair,
    )
