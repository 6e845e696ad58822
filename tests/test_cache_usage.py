"""Disk used by the caches, visible in one command and bounded by a setting (foundations/cache_usage.py, `cache`):
each folder's size and what it holds, clearing by kind and by age, and least-recently-used eviction under a cap for
the analysis results and the compiled packages — never the shipped results, a build under way, or what is not a
cache entry."""

from __future__ import annotations

import fcntl
import os
import shutil
import time

import pytest

from topl_core.cli import main
from topl_core.foundations.cache_usage import CACHE_KINDS, cap_bytes, clear, enforce_cap, entries, usage
from topl_core.foundations.errors import ConfigError

DAY = 86400
KEY = "0123456789abcdef01234567"  # an analysis entry's key (24 hex)
PACKAGES = ("14ac0c661ab9145c05bb", "89c9122bd7fbbdd36cec", "aaaabbbbccccdddd0000")  # package keys (20 hex)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TOPL_CACHE_DIR", str(root))

    def put(rel: str, size: int = 100, age_days: float = 0.0):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        when = time.time() - age_days * DAY
        os.utime(path, (when, when))
        return path

    put(f"analysis/separability/{KEY}.json", 1000)
    put(f"analysis/separability/{KEY}.key.json", 200)
    put("analysis/transfer/heldout_log.jsonl", 50)  # a record of held-out evaluations, no cache entry
    for i, key in enumerate(PACKAGES):
        put(f"decode-steps/{key}.pt2", 3000, age_days=40 - 10 * i)
        put(f"decode-steps/{key}.pt2.sha256", 80, age_days=40 - 10 * i)
        put(f"decode-steps/{key}.lock", 0, age_days=40 - 10 * i)
    put("models/smollm2-135m/model.safetensors", 5000)
    put("machine/bf16-x.json", 10)
    put("data/mine.jsonl", 700)
    put("uploads/notes.csv", 30)
    return root


def test_each_folder_its_size_and_what_it_holds_in_one_command(cache, capsys):
    rows = {u.name: u for u in usage()}
    assert list(rows) == list(CACHE_KINDS)
    assert (rows["analysis"].bytes, rows["analysis"].entries) == (1250, 1)  # the log counts in size, not as an entry
    assert (rows["decode-steps"].bytes, rows["decode-steps"].entries) == (3 * 3080, 3)
    assert rows["models"].bytes == 5000 and rows["data"].bytes == 700 and not rows["data"].clearable
    assert rows["analysis"].cap == 2048 << 20 and rows["models"].cap is None
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    for name, u in rows.items():
        assert name in out and u.holds in out
    assert "9.0 KB" in out and "2.0 GB" in out


def test_clear_by_kind_and_by_age_leaves_what_is_not_a_cache_entry(cache, capsys):
    assert main(["cache", "--clear", "decode-steps", "--older-than", "25"]) == 0  # the two packages unused 30, 40 days
    assert "cleared 6 files of decode-steps unused for 25 days" in capsys.readouterr().out
    assert sorted(p.name for p in (cache / "decode-steps").iterdir()) == sorted(
        f"{PACKAGES[2]}{suffix}" for suffix in (".pt2", ".pt2.sha256", ".lock")
    )
    removed = clear(["analysis"])
    assert {p.name for p in removed} == {f"{KEY}.json", f"{KEY}.key.json"}
    assert (cache / "analysis/transfer/heldout_log.jsonl").exists()
    with pytest.raises(ConfigError, match="clears only analysis, decode-steps, models, gguf, machine"):
        clear(["data"])
    assert main(["cache", "--older-than", "3"]) == 2  # an age without kinds
    assert main(["cache", "--clear", "all"]) == 0
    assert not (cache / "models/smollm2-135m").exists() and (cache / "data/mine.jsonl").exists()
    assert (cache / "uploads/notes.csv").exists()


def test_compiled_packages_above_their_cap_go_least_recently_used_first_but_not_a_build_under_way(cache, monkeypatch):
    monkeypatch.setenv("TOPL_CACHE_DECODE_STEPS_MB", str(4000 / (1 << 20)))  # room for one package
    oldest, middle, newest = PACKAGES
    (cache / f"decode-steps/{middle}.2345.partial.pt2").write_bytes(b"y" * 10)  # being built now
    with open(cache / f"decode-steps/{oldest}.lock", "rb") as lock:  # another process builds it again
        fcntl.flock(lock, fcntl.LOCK_EX)
        removed = enforce_cap("decode-steps")
    # the oldest is locked and the middle one being built: kept (and counted), so the newest is the one free to go
    assert {p.name for p in removed} == {f"{newest}.pt2", f"{newest}.pt2.sha256", f"{newest}.lock"}
    (cache / f"decode-steps/{middle}.2345.partial.pt2").unlink()
    removed = enforce_cap("decode-steps")  # the build done, its lock free: the least recently used goes
    assert {p.name for p in removed} == {f"{oldest}.pt2", f"{oldest}.pt2.sha256", f"{oldest}.lock"}
    assert [e.files[0].name.split(".")[0] for e in entries("decode-steps")] == [middle]
    monkeypatch.setenv("TOPL_CACHE_DECODE_STEPS_MB", "none")
    assert cap_bytes("decode-steps") is None and enforce_cap("decode-steps") == []
    monkeypatch.setenv("TOPL_CACHE_DECODE_STEPS_MB", "lots")
    with pytest.raises(ConfigError, match="TOPL_CACHE_DECODE_STEPS_MB='lots'"):
        cap_bytes("decode-steps")


def test_the_analysis_cache_keeps_its_cap_evicting_the_least_recently_used_never_the_shipped(tmp_path, monkeypatch):
    """Each write brings the local analysis cache back under TOPL_CACHE_ANALYSIS_MB; a hit marks its entry used, so
    the entry evicted is the one unused longest, and it is simply computed again when asked for; the read-only
    results shipped with the demo adapters are read, never evicted."""
    from topl_core.analysis.cache import cached

    value = {"aurocs": [i / 7 for i in range(1500)]}
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "ship-build"))
    cached("probe", {"which": "shipped"}, lambda: value)
    shipped = tmp_path / "examples" / "analysis-cache"
    shutil.copytree(tmp_path / "ship-build" / "analysis", shipped)
    (tmp_path / "examples" / "adapters").mkdir()
    monkeypatch.setenv("TOPL_EXAMPLES_DIR", str(tmp_path / "examples" / "adapters"))
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))

    computed = []

    def compute(name):
        def run():
            computed.append(name)
            return value

        return run

    for name in ("a", "b"):
        cached("probe", {"which": name}, compute(name))
        time.sleep(0.01)
    entry = entries("analysis")[0].bytes
    monkeypatch.setenv("TOPL_CACHE_ANALYSIS_MB", str(2.5 * entry / (1 << 20)))  # two entries fit, not three
    assert cached("probe", {"which": "a"}, compute("a")) == value  # a hit: a is now the more recently used
    time.sleep(0.01)
    cached("probe", {"which": "c"}, compute("c"))  # over the cap: b, unused longest, goes
    assert computed == ["a", "b", "c"]
    for name in ("a", "c", "shipped"):
        assert cached("probe", {"which": name}, compute(name)) == value
    assert computed == ["a", "b", "c"]  # a and c kept, the shipped one read from examples/analysis-cache
    cached("probe", {"which": "b"}, compute("b"))
    assert computed == ["a", "b", "c", "b"]  # evicted, so computed again
    assert len(entries("analysis")) == 2
    assert len(list(shipped.rglob("*.json"))) == 2  # the shipped entry and its key file, untouched
