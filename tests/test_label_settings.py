import numpy as np
import pytest

from topl_core.data.label_settings import (
    DENSE_MIN_BAD_FRACTION,
    LABEL_SETTINGS,
    apply_label_setting,
    label_settings_table,
    label_stats,
)
from topl_core.foundations.errors import DataError


@pytest.fixture
def labels():
    rng = np.random.default_rng(0)
    examples = []
    for i in range(40):
        n = int(rng.integers(5, 30))
        bad_rate = 0.4 if i % 4 == 0 else 0.05  # a few dense examples, many sparse ones
        example = np.where(rng.random(n) < bad_rate, 0, 1)
        example[: int(rng.integers(0, 3))] = -1  # unsupervised prefix
        examples.append(example)
    return examples


def supervised_mask(labels):
    return [a != -1 for a in labels]


def test_every_setting_keeps_shapes_and_only_drops_supervision(labels):
    for setting in LABEL_SETTINGS:
        out = apply_label_setting(labels, setting, seed=1)
        assert [a.shape for a in out] == [a.shape for a in labels]
        if setting != "random":  # only "random" moves labels; the others keep a label or set it to -1
            for before, after in zip(labels, out):
                assert np.all((after == before) | (after == -1))
        again = apply_label_setting(labels, setting, seed=1)  # deterministic for a seed
        np.testing.assert_array_equal(np.concatenate(out), np.concatenate(again))


def test_original_and_random_keep_counts(labels):
    original = label_stats(labels)
    assert label_stats(apply_label_setting(labels, "original", 0)) == original
    shuffled = apply_label_setting(labels, "random", 0)
    stats = label_stats(shuffled)
    assert (stats["good"], stats["bad"]) == (original["good"], original["bad"])
    for before, after in zip(supervised_mask(labels), supervised_mask(shuffled)):
        np.testing.assert_array_equal(before, after)
    assert not all(np.array_equal(a, b) for a, b in zip(labels, shuffled))


@pytest.mark.parametrize(
    "setting, pct_bad", [("balanced", 50), ("bad_skewed", 75), ("good_skewed", 25), ("dense_balanced", 50)]
)
def test_subsampled_ratios(labels, setting, pct_bad):
    original = label_stats(labels)
    stats = label_stats(apply_label_setting(labels, setting, 0))
    assert abs(stats["bad"] - stats["tokens"] * pct_bad / 100) <= 1
    if setting == "balanced":
        assert stats["bad"] == stats["good"] == min(original["bad"], original["good"])
    if setting == "bad_skewed":  # bad is the minority here: every bad token is kept
        assert stats["bad"] == original["bad"]


def test_dense_balanced_uses_only_dense_examples(labels):
    out = apply_label_setting(labels, "dense_balanced", 0)
    for before, after in zip(labels, out):
        supervised = np.count_nonzero(before != -1)
        dense = supervised and np.count_nonzero(before == 0) / supervised >= DENSE_MIN_BAD_FRACTION
        if not dense:
            assert np.all(after == -1)
    assert 0 < label_stats(out)["examples"] < len(labels)


def test_good_only(labels):
    stats = label_stats(apply_label_setting(labels, "good_only", 0))
    assert stats["bad"] == 0 and stats["good"] == label_stats(labels)["good"] and stats["pct_good"] == 100.0


def test_table_and_stats(labels):
    table = label_settings_table(labels, seed=0)
    assert list(table.setting) == list(LABEL_SETTINGS)
    assert np.allclose(table.pct_good + table.pct_bad, 100.0)
    assert (table.tokens == table.good + table.bad).all()
    assert label_stats([np.array([1, 0, -1, 1])]) == {
        "tokens": 3,
        "good": 2,
        "bad": 1,
        "pct_good": 200 / 3,
        "pct_bad": 100 / 3,
        "examples": 1,
    }
    assert label_stats([])["tokens"] == 0


def test_invalid_input():
    with pytest.raises(DataError, match="label setting 'noisy'"):
        apply_label_setting([np.array([1])], "noisy", 0)
    with pytest.raises(DataError, match=r"labels\[1\]: values \[2\]"):
        apply_label_setting([np.array([1]), np.array([2, 0])], "original", 0)
    with pytest.raises(DataError, match=r"labels\[0\]: expected a 1-D integer array"):
        label_stats([np.array([[1, 0]])])
