"""Atomic file writes: write to a temp file in the same folder, then rename (a crash never leaves half a file)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, obj) -> Path:
    with atomic_open(path) as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    return Path(path)


def save_tensors(path: str | os.PathLike, tensors: dict, metadata: dict[str, str] | None = None) -> Path:
    """safetensors file written atomically."""
    from safetensors.torch import save

    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=metadata)
    with atomic_open(path, "wb") as f:
        f.write(data)
    return Path(path)


def read_log_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of an append-only JSONL log (metrics, results) written by this project; [] when absent. A line
    that does not parse — one cut short by a crash mid-write — is skipped: the rows before and after it are good."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def sha256_file(path: str | os.PathLike) -> str:
    """The file's sha256 (hex): the checksum recorded for adapter, head and checkpoint files and verified at load."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def checksum_problem(folder: str | os.PathLike, checksums: dict[str, str]) -> tuple[Path, str] | None:
    """The first file of `checksums` (name → sha256, as recorded) that is "missing" or "changed" in `folder`, with
    which; None when every file matches."""
    for name, want in checksums.items():
        path = Path(folder) / name
        if not path.exists():
            return path, "missing"
        if sha256_file(path) != want:
            return path, "changed"
    return None
