"""Files the workbench writes get the permissions the user's umask allows, as open() would give them: a finished run
(and its checkpoint on the way), an export, a deck and its HTML, the analysis cache — under umask 022 a colleague on a
shared server reads them all, under 077 nobody else reads any. The umask is the process's, so each case runs in its own
subprocess."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from conftest import REPO, cache_sharing_the_costly_parts

from topl_core.foundations.io import write_json

# train (cancelled after step 1: a checkpoint), resume to the end, export, prepare a deck and export its HTML; print
# the permission bits of every file written on the way
SCRIPT = """
import json, os, sys
from pathlib import Path

os.umask(int(sys.argv[2], 8))
root = Path(sys.argv[1])
sys.path.insert(0, sys.argv[3])
from conftest import make_pairs, tiny_config
from topl_core.cli import main
from topl_core.data.perturb import build_perturbation_records
from topl_core.data.records import write_jsonl
from topl_core.training.trainer import train

def modes(folder):
    return {str(p): p.stat().st_mode & 0o777 for p in Path(folder).rglob("*") if p.is_file()}

records = build_perturbation_records(make_pairs(40), seed=0)
data = write_jsonl(records, root / "data.jsonl")
cfg = tiny_config(steps=3, checkpoint_every=1, eval_every=3, lr=0.05, data=str(data))
run = root / "run"
train(cfg, run, progress=lambda p: p.step < 1, records=records)
seen = modes(run)
train(cfg, run, records=records)
assert main(["export", str(run), str(root / "export")]) == 0
deck = ["steer", "--run", str(run), "--deck", str(root / "deck"), "--data", str(data), "--top-k", "2",
        "--document", records[0].document, "--lambdas", "0", "--max-new-tokens", "2",
        "--export-html", str(root / "talk.html")]
assert main(deck) == 0
print(json.dumps(seen | modes(root) | modes(Path(os.environ["TOPL_CACHE_DIR"]) / "analysis")))
"""

EXPECTED = [  # relative to the work folder: at least these are among the files checked
    "run/checkpoint/adapter.safetensors",
    "run/checkpoint/optimizer.pt",
    "run/checkpoint/state.json",
    "run/adapter_model.safetensors",
    "run/adapter_config.json",
    "run/head.safetensors",
    "run/status.json",
    "run/topl_config.json",
    "run/metrics.jsonl",
    "run/README.md",
    "export/adapter_model.safetensors",
    "export/head.safetensors",
    "export/topl_config.json",
    "deck/deck.json",
    "deck/doc-000.json",
    "deck/head.json",
    "deck/status.json",
    "talk.html",
    "data.jsonl",
]


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_every_file_written_has_the_umask_permissions(tmp_path, umask):
    work, cache = tmp_path / "work", cache_sharing_the_costly_parts(tmp_path / "cache")
    work.mkdir()
    env = {**os.environ, "TOPL_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(work), oct(umask), str(REPO / "tests")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    modes = json.loads(done.stdout.strip().splitlines()[-1])
    checked = {os.path.relpath(p, work) for p in modes if p.startswith(str(work))}
    assert set(EXPECTED) <= checked, sorted(set(EXPECTED) - checked)
    assert any(p.startswith(str(cache / "analysis")) for p in modes), "the deck wrote no analysis cache entry"
    wrong = {p: oct(m) for p, m in modes.items() if m != 0o666 & ~umask}
    assert not wrong, wrong
    others_read = {p for p, m in modes.items() if m & stat.S_IROTH and m & stat.S_IRGRP}
    assert others_read == (set(modes) if umask == 0o022 else set())


def test_rewriting_a_file_keeps_its_own_permissions(tmp_path):
    """As open("w") does: a file someone made group-writable (or private) keeps that mode when it is replaced."""
    path = tmp_path / "status.json"
    write_json(path, {"state": "running"})
    for mode in (0o664, 0o600):
        os.chmod(path, mode)
        write_json(path, {"state": "finished"})
        assert stat.S_IMODE(path.stat().st_mode) == mode and json.loads(path.read_text()) == {"state": "finished"}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temp file left beside it
