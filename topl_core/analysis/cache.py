"""Disk cache for analysis results: keyed by a config dict + the adapter's fingerprint + the base model's
fingerprint, stored atomically as json / npz / parquet under cache_dir()/analysis/<kind>/<key>.<suffix>
(never pickle), reloaded instantly. The local cache is bounded (foundations/cache_usage.py: TOPL_CACHE_ANALYSIS_MB,
least recently used entries evicted after each write; a hit marks its entry used); the shipped one is never touched.

    cached(kind, key, compute, codec=JSON, *, adapter=None, base_fingerprint=None, refresh=False, enabled=True)
        -> the value: loaded from disk when present (the local cache, then the read-only shipped cache of the
        demo adapters, examples/analysis-cache), else compute() — written atomically, then returned.
        `key` is any JSON-able dict (the config of the computation). With `adapter` (anything open_adapter
        opens), the adapter's fingerprint and its base model's (a run's topl_config.json meta; for an adapter
        from elsewhere, the base model's name) join the key, so a changed adapter or config gives a different
        key. `base_fingerprint` adds a base model fingerprint explicitly (for analyses of a base model without an
        adapter).
    stored(kind, key, codec=JSON, *, adapter=None, base_fingerprint=None) -> the cached value, or None (never computes)
    full_key(key, adapter=None, base_fingerprint=None) -> dict the dict that is hashed
    cache_key(key_dict) -> str                                 sha256 of the canonical JSON (24 hex)
    cache_path(kind, key_dict, codec) -> Path

Codecs (value ⇄ file): JSON (JSON-able values; floats round-trip exactly), NPZ (dict[str, np.ndarray]; no object
arrays), PARQUET (pandas DataFrame), and json_codec(to_json, from_json) / npz_codec(to_arrays, from_arrays) to
wrap value types. Next to every entry, <key>.key.json records the full key dict (for people reading the cache) and
the sha256 of the entry's bytes. An entry is used only when its key file names the same kind and key and its bytes
match that checksum: a file edited into other valid content, a key file swapped in, or a write cut between the entry
and its key file is recomputed, never trusted — with a RuntimeWarning naming the file and why.
"""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Mapping

import numpy as np

from ..foundations.cache_usage import enforce_cap, touch
from ..foundations.io import atomic_open, sha256_file, write_json
from ..foundations.paths import cache_dir, shipped_analysis_cache_dir
from ..training.adapters import open_adapter


@dataclass(frozen=True)
class Codec:
    suffix: str
    dump: Callable[[Any, IO[bytes]], None]  # write the value to a binary file object
    load: Callable[[bytes], Any]  # the value from the file's bytes (read once: they are checksummed too)


def _json_dump(value, f: IO[bytes]) -> None:
    f.write(json.dumps(value, sort_keys=True, allow_nan=True).encode("utf-8"))


def _npz_dump(value: Mapping[str, np.ndarray], f: IO[bytes]) -> None:
    arrays = {k: np.asarray(v) for k, v in value.items()}
    bad = [k for k, v in arrays.items() if v.dtype == object]
    if bad:
        raise TypeError(
            f"NPZ codec: arrays {bad} have dtype object (would need pickle); convert them to str or numbers."
        )
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    f.write(buf.getvalue())


def _npz_load(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _parquet_dump(value, f: IO[bytes]) -> None:
    value.to_parquet(f, index=True)


def _parquet_load(data: bytes):
    import pandas as pd

    return pd.read_parquet(io.BytesIO(data))


JSON = Codec("json", _json_dump, lambda data: json.loads(data.decode("utf-8")))
NPZ = Codec("npz", _npz_dump, _npz_load)
PARQUET = Codec("parquet", _parquet_dump, _parquet_load)


def json_codec(to_json: Callable[[Any], Any], from_json: Callable[[Any], Any]) -> Codec:
    """A JSON codec for a value type with to_json/from_json."""
    return Codec("json", lambda v, f: _json_dump(to_json(v), f), lambda data: from_json(JSON.load(data)))


def npz_codec(to_arrays: Callable[[Any], Mapping[str, np.ndarray]], from_arrays: Callable[[Mapping], Any]) -> Codec:
    """An NPZ codec for a value type with to_arrays/from_arrays."""
    return Codec("npz", lambda v, f: _npz_dump(to_arrays(v), f), lambda data: from_arrays(_npz_load(data)))


def analysis_cache_dir() -> Path:
    return cache_dir() / "analysis"


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def cache_key(key: Mapping) -> str:
    return hashlib.sha256(_canonical(key).encode()).hexdigest()[:24]


def full_key(key: Mapping, adapter=None, base_fingerprint: str | None = None) -> dict:
    """The key dict that is hashed: `key` plus the adapter and base model fingerprints."""
    out = {"config": dict(key)}
    if adapter is not None:
        adapter = open_adapter(adapter)
        out["adapter_fingerprint"] = adapter.fingerprint()
        out["base_fingerprint"] = adapter.base_fingerprint
        if adapter.run is None:  # no recorded base fingerprint: the base model it is analysed on joins the key
            out["base_model"] = adapter.base_model
    if base_fingerprint is not None:
        out["base_fingerprint"] = base_fingerprint
    return out


def shipped_cache_dir() -> Path | None:
    """Read-only analysis results shipped beside the demo adapters (examples/analysis-cache), so that the first
    visit of a page on a demo adapter needs no computation. Same layout and keys as the local cache; absent
    when the demo adapters are hidden (TOPL_EXAMPLES_DIR empty)."""
    return shipped_analysis_cache_dir()


def shipped_cache_path(local: Path) -> Path | None:
    """Where the entry at `local` (under analysis_cache_dir()) would lie in the shipped cache."""
    shipped = shipped_cache_dir()
    return shipped / local.relative_to(analysis_cache_dir()) if shipped is not None else None


def cache_path(kind: str, key_dict: Mapping, codec: Codec) -> Path:
    if not kind or "/" in kind or kind.startswith("."):
        raise ValueError(f"cache kind={kind!r}: use a plain folder name such as 'separability'.")
    return analysis_cache_dir() / kind / f"{cache_key(key_dict)}.{codec.suffix}"


def cached(
    kind: str,
    key: Mapping,
    compute: Callable[[], Any],
    codec: Codec = JSON,
    *,
    adapter=None,
    base_fingerprint: str | None = None,
    refresh: bool = False,
    enabled: bool = True,
):
    """Return the cached value for (kind, key, adapter, base), computing and storing it when absent.
    `refresh=True` recomputes and overwrites; `enabled=False` computes without touching the cache."""
    if not enabled:
        return compute()
    kd = full_key(key, adapter, base_fingerprint)
    path = cache_path(kind, kd, codec)
    if not refresh:
        found = _load(kind, kd, codec, path)
        if found is not _ABSENT:
            return found
    value = compute()
    with atomic_open(path, "wb") as f:
        codec.dump(value, f)
    write_json(key_file(path), {"kind": kind, **kd, "sha256": sha256_file(path)})
    enforce_cap("analysis")  # within cache_usage's cap (TOPL_CACHE_ANALYSIS_MB): least recently used out first
    return value


def stored(kind: str, key: Mapping, codec: Codec = JSON, *, adapter=None, base_fingerprint: str | None = None):
    """The value `cached` would return for this key without computing it: None when neither cache holds it."""
    kd = full_key(key, adapter, base_fingerprint)
    found = _load(kind, kd, codec, cache_path(kind, kd, codec))
    return None if found is _ABSENT else found


_ABSENT = object()


def _load(kind: str, kd: Mapping, codec: Codec, path: Path):
    """The entry at `path` (the local cache), else its twin in the shipped cache; _ABSENT when neither is usable."""
    for candidate in (path, shipped_cache_path(path)):
        if candidate is None or not candidate.exists():
            continue
        try:
            value = codec.load(_intact_bytes(candidate, kind, kd))
            if candidate == path:  # used now: the size cap evicts it after the entries unused longer
                touch(candidate)
            return value
        except Exception as e:  # unreadable, changed or foreign: said, then recomputed (a local one overwritten)
            warnings.warn(
                f"{candidate}: unusable ({type(e).__name__}: {e}); the result is computed again.",
                RuntimeWarning,
                stacklevel=3,
            )
    return _ABSENT


def key_file(entry: Path) -> Path:
    """<key>.key.json beside the entry <key>.<suffix>: its kind, full key and the sha256 of its bytes."""
    return entry.with_name(entry.name.rsplit(".", 1)[0] + ".key.json")


def _intact_bytes(entry: Path, kind: str, kd: Mapping) -> bytes:
    """The entry's bytes when its key file names this kind and key and the bytes match the checksum recorded there;
    raises otherwise (absent, unreadable, changed or foreign)."""
    recorded = json.loads(key_file(entry).read_text(encoding="utf-8"))
    data = entry.read_bytes()
    if not isinstance(recorded, dict):
        raise ValueError(f"{key_file(entry).name} holds no key")
    checksum = recorded.pop("sha256", None)
    if recorded.pop("kind", None) != kind or cache_key(recorded) != cache_key(kd):
        raise ValueError(f"{key_file(entry).name} names another kind or key")
    if checksum != hashlib.sha256(data).hexdigest():
        raise ValueError("its bytes do not match the checksum in its key file: changed since it was written")
    return data
