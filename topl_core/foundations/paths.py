"""Where the workbench keeps its files: cache/ and runs/ (both git-ignored), overridable by environment."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Converted models and cached analysis results; TOPL_CACHE_DIR overrides."""
    return Path(os.environ.get("TOPL_CACHE_DIR", PROJECT_ROOT / "cache"))


def runs_dir() -> Path:
    """Training run directories; TOPL_RUNS_DIR overrides."""
    return Path(os.environ.get("TOPL_RUNS_DIR", PROJECT_ROOT / "runs"))


def shared_data_dir() -> Path:
    """../shared/data beside the checkout (CLIFF lives there, not in the project); TOPL_SHARED_DATA overrides."""
    return Path(os.environ.get("TOPL_SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data"))


def examples_dir() -> Path | None:
    """The demo adapters that ship with the repository (examples/adapters), listed beside the user's runs and
    marked as examples; TOPL_EXAMPLES_DIR overrides, and an empty value hides them."""
    raw = os.environ.get("TOPL_EXAMPLES_DIR")
    if raw is None:
        return PROJECT_ROOT / "examples" / "adapters"
    return Path(raw) if raw.strip() else None


def shipped_analysis_cache_dir() -> Path | None:
    """Read-only analysis results shipped beside the demo adapters (examples/analysis-cache), read after the local
    cache and never written nor evicted; hidden with the demo adapters (an empty TOPL_EXAMPLES_DIR)."""
    adapters = examples_dir()
    return None if adapters is None else adapters.parent / "analysis-cache"


def shipped_decks_dir() -> Path | None:
    """The talk decks that ship with the demo adapters (examples/decks: prepared on them, so Talk mode opens on a
    working deck in a fresh clone); hidden with the demo adapters (an empty TOPL_EXAMPLES_DIR)."""
    adapters = examples_dir()
    return None if adapters is None else adapters.parent / "decks"


# The default training/evaluation data set, as configs record it (relative to the project root): scripts/setup.sh
# builds it (600 HaluEval documents with seeded token-level perturbations).
DEFAULT_DATA = "cache/data/halueval-perturbed.jsonl"


def cliff_csv() -> Path:
    """CLIFF's span-labelled CSV, the offline OOD token set (lives in ../shared/data, not in the project)."""
    return shared_data_dir() / "CLIFF_error_types.csv"


def project_path(path: str | Path) -> Path:
    """A path as a config or a user gave it: absolute, or existing from here, else relative to the project root
    (run configs record data paths such as cache/data/halueval-perturbed.jsonl relative to it)."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else PROJECT_ROOT / p


def inside(folder: str | Path, name: str, what: str = "name") -> Path:
    """folder / name for a name a user typed (or an upload carried), kept inside `folder`: a plain file or folder
    name — no path separator, no absolute path, not "." or "..". Anything else is refused with the reason."""
    clean = (name or "").strip()
    if not clean or clean in (".", "..") or any(c in clean for c in "/\\\0") or clean.startswith("~"):
        raise ConfigError(
            f"{what} {name!r}: use a plain name (letters, digits, - _ .), without / \\ or '..' — it becomes a file "
            f"or folder inside {folder}."
        )
    return Path(folder) / clean
