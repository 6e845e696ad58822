"""What the workbench keeps under cache/ (paths.cache_dir()), the disk each part takes, and bounds on the two parts
that grow with use: the analysis results (every adapter fingerprint, precision and setting) and the compiled decode
steps (a package per model architecture and length: 3.6 MB each for SmolLM2, far more for an 8B model).

    CACHE_KINDS                  the folders of cache/: what each holds, whether `cache --clear` may remove it, its cap
    usage() -> list[Usage]       each folder's size, entries and when its entries were last used
    clear(kinds, older_than_s=None) -> list[Path]   remove a kind's entries (all, or those unused for that long)
    enforce_cap(kind) -> list[Path]                 remove the least recently used entries until the kind fits its cap
    touch(path)                  mark an entry used now (a cache hit), so the cap evicts it last
    cap_bytes(kind) -> int | None                   the cap: TOPL_CACHE_ANALYSIS_MB, TOPL_CACHE_DECODE_STEPS_MB
    summary_line() -> str        one line for the Home page

An entry of the analysis cache is a result and its key file (<key>.<suffix>, <key>.key.json); of the compiled steps a
package, its checksum and its build lock (<key>.pt2, <key>.pt2.sha256, <key>.lock). Either is computed or built again
when it is missing, so evicting one costs time, never a result. Nothing else is evicted: the held-out evaluation log
beside the analysis results, a package still being built or whose build lock is held, and never the read-only
results shipped with the demo adapters (examples/analysis-cache: they are not under cache/).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .errors import ConfigError
from .paths import cache_dir, shipped_analysis_cache_dir

MB = 1 << 20
KEY = re.compile(r"[0-9a-f]{16,64}")  # the file names of keyed entries: a cache key or a package key
IN_PROGRESS_S = 6 * 3600  # a partial build younger than this is a build under way (a build stops after 30 min)


@dataclass(frozen=True)
class CacheKind:
    name: str  # the folder under cache/, and the name `cache --clear` takes
    holds: str
    layout: Literal["keyed", "folders"]  # keyed: files named by a key, grouped by it; folders: each child an entry
    clearable: bool  # `cache --clear` may remove it (what is rebuilt or recomputed when missing)
    cap_env: str | None = None  # the setting of its cap, in MB
    default_cap_mb: float | None = None

    @property
    def path(self) -> Path:
        return cache_dir() / self.name


CACHE_KINDS: dict[str, CacheKind] = {
    k.name: k
    for k in (
        CacheKind(
            "analysis",
            "analysis results (LoRA-A projections and probes, steering vectors, token scores, evaluations), keyed by "
            "settings and adapter fingerprint; computed again when missing",
            "keyed",
            True,
            "TOPL_CACHE_ANALYSIS_MB",
            2048,
        ),
        CacheKind(
            "decode-steps",
            "compiled decode steps (AOTInductor packages, one per model architecture and length); built again when "
            "missing (about a minute for SmolLM2 on 2 cores)",
            "keyed",
            True,
            "TOPL_CACHE_DECODE_STEPS_MB",
            1024,
        ),
        CacheKind(
            "models",
            "base models converted from the embedded GGUF files; converted again when missing (~35 s each)",
            "folders",
            True,
        ),
        CacheKind(
            "gguf",
            "GGUF files joined from an embedded model's part packages; joined again when missing",
            "folders",
            True,
        ),
        CacheKind(
            "machine",
            "this machine's measured choices (bf16 speed, the linear kernel); measured again when missing",
            "folders",
            True,
        ),
        CacheKind(
            "data",
            "data sets built here and their background builds (not cleared: delete them by hand)",
            "folders",
            False,
        ),
        CacheKind("uploads", "files uploaded on the Data page (not cleared: delete them by hand)", "folders", False),
    )
}


@dataclass(frozen=True)
class Entry:
    files: tuple[Path, ...]  # a keyed entry's files; a folder entry's one folder
    bytes: int
    last_used: float  # the latest modification time of its files (a hit touches it)

    @property
    def busy(self) -> bool:
        """A build under way: a partial package, or a build lock another process holds."""
        for f in self.files:
            if ".partial." in f.name and time.time() - _mtime(f) < IN_PROGRESS_S:
                return True
            if f.suffix == ".lock" and _lock_held(f):
                return True
        return False


@dataclass(frozen=True)
class Usage:
    name: str
    path: Path
    holds: str
    bytes: int
    entries: int
    cap: int | None  # bytes
    last_used: float | None
    clearable: bool


def cap_bytes(kind: str) -> int | None:
    """The kind's cap in bytes: its setting (MB; "none" or empty for no cap), else its default; None without one."""
    k = CACHE_KINDS[kind]
    if k.cap_env is None:
        return None
    raw = os.environ.get(k.cap_env)
    if raw is None:
        return int(k.default_cap_mb * MB)
    if raw.strip().lower() in ("", "none"):
        return None
    try:
        mb = float(raw)
        if mb < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{k.cap_env}={raw!r}: give the cap of cache/{kind} in MB (a number ≥ 0), or none.") from None
    return int(mb * MB)


def touch(path: str | os.PathLike) -> None:
    """Mark the entry at `path` used now (its file's modification time), so it is evicted after the others."""
    try:
        os.utime(path)
    except OSError:  # read-only (a shipped result) or gone: nothing to mark
        pass


def entries(kind: str) -> list[Entry]:
    """The kind's entries, least recently used first. A keyed kind's files not named by a key (the held-out log)
    are no entries: never evicted nor cleared."""
    k = CACHE_KINDS[kind]
    if not k.path.is_dir():
        return []
    if k.layout == "folders":
        out = [Entry((p,), _size(p), _latest(p)) for p in sorted(k.path.iterdir())]
    else:
        groups: dict[tuple[Path, str], list[Path]] = {}
        for root, _, names in os.walk(k.path):
            for name in names:
                key = name.split(".", 1)[0]
                if KEY.fullmatch(key):
                    groups.setdefault((Path(root), key), []).append(Path(root) / name)
        out = [
            Entry(tuple(sorted(fs)), sum(_size(f) for f in fs), max(_mtime(f) for f in fs)) for fs in groups.values()
        ]
    return sorted(out, key=lambda e: e.last_used)


def usage() -> list[Usage]:
    """Every folder of cache/, the known kinds first (in CACHE_KINDS' order), then any other folder or file."""
    root = cache_dir()
    out = []
    for k in CACHE_KINDS.values():
        found = entries(k.name)
        size = _size(k.path) if k.path.exists() else 0
        last = max((e.last_used for e in found), default=None)
        out.append(Usage(k.name, k.path, k.holds, size, len(found), cap_bytes(k.name), last, k.clearable))
    if root.is_dir():
        for p in sorted(root.iterdir()):
            if p.name not in CACHE_KINDS:
                out.append(Usage(p.name, p, "not the workbench's own folder", _size(p), 1, None, _latest(p), False))
    return out


def clear(kinds: list[str], older_than_s: float | None = None) -> list[Path]:
    """Remove the entries of `kinds` (only the clearable ones), or only those unused for `older_than_s` seconds;
    a build under way is left. Returns what was removed."""
    for kind in kinds:
        if kind not in CACHE_KINDS or not CACHE_KINDS[kind].clearable:
            clearable = ", ".join(k.name for k in CACHE_KINDS.values() if k.clearable)
            raise ConfigError(f"cache kind {kind!r}: the workbench clears only {clearable}.")
    now, removed = time.time(), []
    for kind in kinds:
        for e in entries(kind):
            if (older_than_s is None or now - e.last_used >= older_than_s) and not e.busy:
                removed += _remove(e)
    return removed


def enforce_cap(kind: str) -> list[Path]:
    """Remove the kind's least recently used entries until it fits its cap (a build under way is kept and counted).
    Returns what was removed."""
    cap = cap_bytes(kind)
    if cap is None:
        return []
    found = entries(kind)
    total, removed = sum(e.bytes for e in found), []
    for e in found:
        if total <= cap:
            break
        if not e.busy:
            removed += _remove(e)
            total -= e.bytes
    return removed


def summary_line() -> str:
    """The caches in one line: cache/'s total, and each capped kind against its cap."""
    rows = usage()
    total = sum(u.bytes for u in rows)
    parts = [
        f"{u.name} {human_bytes(u.bytes)}" + (f" of {human_bytes(u.cap)}" if u.cap is not None else "")
        for u in rows
        if u.bytes or u.cap is not None
    ]
    return f"{human_bytes(total)} in {cache_dir()}" + (f" ({', '.join(parts)})" if parts else "")


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", MB), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _remove(e: Entry) -> list[Path]:
    shipped = shipped_analysis_cache_dir()
    removed = []
    for f in e.files:
        if shipped is not None and f.resolve().is_relative_to(shipped.resolve()):
            continue  # the read-only results shipped with the demo adapters: never removed
        if f.is_dir() and not f.is_symlink():
            shutil.rmtree(f, ignore_errors=True)
        else:
            f.unlink(missing_ok=True)
        removed.append(f)
    return removed


def _mtime(p: Path) -> float:
    try:
        return p.lstat().st_mtime
    except OSError:
        return 0.0


def _size(p: Path) -> int:
    """Bytes on disk under `p` (a link counts as itself, not what it points to: the tests' shared models)."""
    try:
        if p.is_symlink() or not p.is_dir():
            return p.lstat().st_size
    except OSError:
        return 0
    return sum(_size(p / name) for name in os.listdir(p))


def _latest(p: Path) -> float:
    if p.is_symlink() or not p.is_dir():
        return _mtime(p)
    return max([_mtime(p), *(_latest(p / name) for name in os.listdir(p))])


def _lock_held(lock: Path) -> bool:
    """Whether another process holds the build lock (exported_decode takes it with flock while it builds)."""
    try:
        with open(lock, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError:
        return False
    return False
