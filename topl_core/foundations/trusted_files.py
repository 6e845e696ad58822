"""Compiled code the app loads and runs (the exported decode steps: shared objects) is held to ssh's rule for keys:
loaded only from a folder the user owns and no one else can write, and only when its bytes are those recorded when
it was built. On a shared server with a group-writable cache (the umask allows it), anyone in the group could
otherwise put code into every user's app.

    check_private_folder(path, uid=None) -> str | None   why `path` is not private (None when it is): the folder is
        the user's and writable by no one else, and every folder above it is the user's or root's and writable by
        no one else — or has the sticky bit (/tmp), where others cannot rename or remove what is not theirs
    check_private_file(path, uid=None) -> str | None     the same for a file: the user's, in a private folder, and
        writable by no one else (unless its folder lets no one else in at all)
    private_folder(preferred, name) -> (folder | None, why | None)   `preferred` when private; else this user's own
        folder for `name` (under $XDG_CACHE_HOME or ~/.cache, topl-workbench/, made 0700), with the one line that
        says why; (None, why) when not even that is private (load no compiled code then)
    record_checksum(path) -> Path        <file>.sha256 beside the file (sha256sum's format), written after a build
    verify_checksum(path) -> str | None  why the file's bytes cannot be trusted: no checksum recorded, or changed
    trusted(path) -> str | None          check_private_file, then verify_checksum: None when the file may be loaded
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .io import atomic_open, sha256_file

CHECKSUM_SUFFIX = ".sha256"
ROOT_UID = 0


def _uid(uid: int | None) -> int:
    return os.geteuid() if uid is None else uid


def _writable_by_others(mode: int) -> str | None:
    if mode & stat.S_IWOTH:
        return "writable by every user"
    if mode & stat.S_IWGRP:
        return "writable by its group"
    return None


def check_private_folder(path: str | os.PathLike, uid: int | None = None) -> str | None:
    """Why the folder `path` is not private to the user `uid` (this process's by default); None when it is."""
    uid = _uid(uid)
    folder = Path(path).resolve()
    try:
        st = os.stat(folder)
    except OSError as e:
        return f"{folder} cannot be read ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if st.st_uid != uid:
        return f"{folder} belongs to uid {st.st_uid}, not to you (uid {uid})"
    if why := _writable_by_others(st.st_mode):
        return f"{folder} is {why} (mode {stat.S_IMODE(st.st_mode):o})"
    for above in folder.parents:
        try:
            st = os.stat(above)
        except OSError as e:
            return f"{above} cannot be read ({e.strerror})"
        if st.st_uid not in (uid, ROOT_UID):
            return f"{above}, a folder above {folder}, belongs to uid {st.st_uid} (another user could replace it)"
        if (why := _writable_by_others(st.st_mode)) and not st.st_mode & stat.S_ISVTX:
            return f"{above}, a folder above {folder}, is {why} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_private_file(path: str | os.PathLike, uid: int | None = None) -> str | None:
    """Why the file `path` is not private to the user `uid`; None when it is the user's, in a private folder, and
    writable by no one else (a file the umask made group-writable passes in a folder no one else may enter)."""
    uid = _uid(uid)
    file = Path(path).resolve()
    if why := check_private_folder(file.parent, uid):
        return why
    try:
        st, folder = os.stat(file), os.stat(file.parent)
    except OSError as e:
        return f"{file} cannot be read ({e.strerror})"
    if st.st_uid != uid:
        return f"{file} belongs to uid {st.st_uid}, not to you (uid {uid})"
    others_enter = folder.st_mode & (stat.S_IXGRP | stat.S_IXOTH)
    if others_enter and (why := _writable_by_others(st.st_mode)):
        return f"{file} is {why} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def own_cache_root() -> Path:
    """This user's own cache folder for the workbench: $XDG_CACHE_HOME/topl-workbench, else ~/.cache/topl-workbench."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "topl-workbench"


def private_folder(preferred: str | os.PathLike, name: str) -> tuple[Path | None, str | None]:
    """Where compiled code of kind `name` may be kept and loaded: `preferred` (made if missing) when it is private,
    with no reason; else this user's own folder, made 0700, with the line that says why `preferred` was not taken;
    (None, why) when neither is private."""
    preferred = Path(preferred)
    try:
        preferred.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    why = check_private_folder(preferred)
    if why is None:
        return preferred, None
    own = own_cache_root() / name
    try:
        own.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(own, 0o700)  # mkdir's mode passes through the umask, and an existing folder keeps its own
        os.chmod(own.parent, 0o700)
    except OSError as e:
        return None, f"{why}; and {own} cannot be made private ({e.strerror}): no compiled code is loaded"
    if other := check_private_folder(own):
        return None, f"{why}; and {other}: no compiled code is loaded"
    return own, f"{why}: compiled code is kept in {own} instead"


def checksum_path(path: str | os.PathLike) -> Path:
    return Path(str(path) + CHECKSUM_SUFFIX)


def record_checksum(path: str | os.PathLike) -> Path:
    """Record the file's sha256 beside it (`sha256sum -c` reads it), atomically; call it right after the build."""
    path = Path(path)
    with atomic_open(checksum_path(path)) as f:
        f.write(f"{sha256_file(path)}  {path.name}\n")
    return checksum_path(path)


def verify_checksum(path: str | os.PathLike) -> str | None:
    """Why the file's bytes cannot be trusted (no checksum recorded, or not those recorded); None when they match."""
    path = Path(path)
    try:
        recorded = checksum_path(path).read_text(encoding="utf-8").split()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return f"{path} has no checksum recorded at its build ({checksum_path(path).name})"
    try:
        actual = sha256_file(path)
    except OSError as e:
        return f"{path} cannot be read ({e.strerror})"
    if actual != recorded:
        return f"{path} is not the file that was built (its sha256 differs from {checksum_path(path).name})"
    return None


def trusted(path: str | os.PathLike) -> str | None:
    """Why the compiled file `path` must not be loaded; None when it may (private, and the bytes that were built)."""
    record = checksum_path(path)
    return check_private_file(path) or (record.exists() and check_private_file(record)) or verify_checksum(path)
