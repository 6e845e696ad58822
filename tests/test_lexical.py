"""The model-free controls of token-level detection (analysis/lexical.py): the lexical control finds exactly the words
a document lacks, is 1.0 AUROC where those are the bad tokens and ≈ 0.5 on labels unrelated to them, and stands in
every detection table beside surprisal (transfer's rows, score-tokens' summary)."""

from __future__ import annotations

import numpy as np
import pytest

from topl_core.analysis.lexical import CONTROLS, LEXICAL, control_scores, labelled_controls, words
from topl_core.analysis.studies.detection_stats import DETECTORS, detection_summary, token_arrays
from topl_core.data.records import Record
from topl_core.foundations.metrics import auroc
from topl_core.inference.token_scores import TokenScores

DOC = "The council of Leeds approved the new budget on Monday. Profits rose by 12 percent in 2023."


def whitespace_tokens(text: str) -> np.ndarray:
    """Offsets of a toy tokenizer that splits words in two halves and keeps punctuation and spaces as tokens."""
    out, i = [], 0
    for s, e, _ in words(text):
        if i < s:
            out.append((i, s))  # the space or punctuation before the word
        mid = s + max(1, (e - s) // 2)
        out += [(s, mid)] + ([(mid, e)] if mid < e else [])
        i = e
    if i < len(text):
        out.append((i, len(text)))
    return np.asarray(out)


def test_words_are_case_folded_runs_of_letters_and_digits():
    assert [w for _, _, w in words("Smith's 1,200 km/h — Ünïcode!")] == ["smith", "s", "1", "200", "km", "h", "ünïcode"]


def test_a_token_takes_the_verdict_of_the_word_it_touches():
    response = "The Leeds council rejected the budget on Friday, by 40 percent."
    offsets = whitespace_tokens(response)
    c = control_scores(DOC, response, offsets)
    text = [response[s:e] for s, e in offsets]
    absent = {text[i] for i in np.flatnonzero(c[LEXICAL])}
    assert absent == {"reje", "cted", "Fri", "day", "4", "0"}  # both halves of a split word; "council" is present
    assert all(c[LEXICAL][i] == 0 for i, t in enumerate(text) if not t.strip(" ,."))  # spaces, punctuation: none
    named = {text[i] for i in np.flatnonzero(c["new number or name"])}
    assert named == {"Fri", "day", "4", "0"}  # "rejected" is new but neither a number nor capitalised
    assert c["position"][0] == 0 and np.all(np.diff(c["position"]) > 0) and c["position"][-1] < 1


def _responses(rng: np.random.Generator, n: int) -> tuple[list[str], list[str], list[np.ndarray], list[np.ndarray]]:
    """n responses of 12 words, each drawn from the document (80%) or invented, their toy tokens and their gold
    labels: bad (0) exactly on the tokens of an invented word, good (1) on the document's words, unlabelled (-1) on
    spaces and punctuation — known from how each response was built, not from the control under test."""
    doc_words = [w for _, _, w in words(DOC)]
    docs, responses, offsets, gold = [], [], [], []
    for _ in range(n):
        picks = [
            (str(rng.choice(doc_words)), False) if rng.random() < 0.8 else (f"zq{rng.integers(1000)}x", True)
            for _ in range(12)
        ]
        response = " ".join(w for w, _ in picks) + "."
        invented, at = [], 0
        for w, new in picks:
            if new:
                invented.append((at, at + len(w)))
            at += len(w) + 1
        off = whitespace_tokens(response)
        labels = [
            -1 if not response[s:e].strip(" .") else 0 if any(a < e and s < b for a, b in invented) else 1
            for s, e in off
        ]
        docs.append(DOC)
        responses.append(response)
        offsets.append(off)
        gold.append(np.array(labels, dtype=np.int64))
    return docs, responses, offsets, gold


def test_the_lexical_control_is_perfect_where_absent_words_are_the_bad_tokens_and_chance_on_noise():
    rng = np.random.default_rng(0)
    docs, responses, offsets, gold = _responses(rng, 40)
    c = labelled_controls(docs, responses, offsets, gold)
    bad = np.concatenate([g[g >= 0] == 0 for g in gold])
    assert len(c[LEXICAL]) == len(bad) and bad.any() and (~bad).any()
    assert auroc(bad, c[LEXICAL]) == 1.0
    noise = rng.random(len(bad)) < 0.2  # labels unrelated to the words
    assert abs(auroc(noise, c[LEXICAL]) - 0.5) < 0.06
    assert abs(auroc(noise, c["position"]) - 0.5) < 0.06


def test_detection_tables_set_the_controls_beside_surprisal_with_intervals():
    """token_arrays and detection_summary (score-tokens) carry every control, on the labelled tokens only, with a
    record-bootstrap interval; transfer's table has one row per detector, the controls included."""
    rng = np.random.default_rng(1)
    records, scores = [], []
    for i in range(30):
        response = "The Leeds council rejected the budget on Friday."
        off = whitespace_tokens(response)
        bad = [(response.find(w), response.find(w) + len(w)) for w in ("rejected", "Friday")]  # not in DOC
        truth = [0 if any(a < e and s < b for a, b in bad) else 1 for s, e in off]
        gold = np.where(rng.random(len(off)) < 0.1, -1, truth).astype(np.int64)
        records.append(Record(id=f"r{i}", document=DOC, response=response, token_labels_known=True))
        scores.append(TokenScores(f"r{i}", response, off, rng.random(len(off)), rng.random(len(off)), gold))
    t = token_arrays(records, scores)
    assert set(CONTROLS) <= set(t) and "frozen probe" not in t  # no frozen probe was scored
    assert all(len(v) == len(t["bad"]) for v in t.values())
    assert set(CONTROLS) <= set(DETECTORS) and DETECTORS.index("surprisal") < DETECTORS.index(LEXICAL)
    s = detection_summary(records, scores, bootstrap=200)
    a = s["aurocs"]
    assert list(a) == ["head", "surprisal", *CONTROLS]
    assert a[LEXICAL].auroc == 1.0 and a[LEXICAL].ci_low == pytest.approx(1.0)
    assert a["head"].ci_low < a["head"].auroc < a["head"].ci_high  # random scores: an interval around ≈ 0.5
