"""Atomic file writes: write to a temp file in the same folder, then rename (a crash never leaves half a file). A
written file gets the permissions open() would give it: an existing file's own, a new file those the user's umask
allows (mkstemp alone makes 0600 files, which a colleague on a shared server cannot read)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

_UMASK_GUARD = threading.Lock()


def current_umask() -> int:
    """This process's umask, read from /proc where there is one (os.umask cannot read it without setting it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_GUARD:  # set and restored at once; a file another thread creates meanwhile is private, not open
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def file_mode(path: str | os.PathLike) -> int:
    """The permission bits open(path, "w") leaves: the file's own when it exists, else 0o666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~current_umask()


def give_umask_permissions(*paths: str | os.PathLike) -> None:
    """Files another library wrote privately (safetensors' save_file, and with it PEFT's and transformers'
    save_pretrained, makes 0600 files) given the permissions a new file gets under the umask."""
    mode = 0o666 & ~current_umask()
    for p in paths:
        os.chmod(p, mode)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temp file's path beside `path`, with the permissions `path` is to have, renamed over `path` when the block
    ends without error (removed when it raises): for writers that take a file name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode(path))
        os.close(fd)
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    with atomic_path(path) as tmp, open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        yield f


def copy_file(src: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """`src` copied to `dest` atomically, with the permissions of a file written here (not src's own, as
    shutil.copy2 would keep: a private source would make a private copy)."""
    with open(src, "rb") as fin, atomic_open(dest, "wb") as fout:
        shutil.copyfileobj(fin, fout)
    return Path(dest)


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
