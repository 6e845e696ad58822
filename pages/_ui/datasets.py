"""Data sets: the records JSONL files under cache/data, read once per file version, and the data-set picker."""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from topl_core.data.records import read_jsonl
from topl_core.foundations.paths import DEFAULT_DATA, cache_dir


def dataset_paths() -> list[str]:
    """The data sets under cache/data, the default one (paths.DEFAULT_DATA) first, then by name."""
    d = cache_dir() / "data"
    default = Path(DEFAULT_DATA).name
    return sorted((str(p) for p in d.glob("*.jsonl")), key=lambda p: (Path(p).name != default, p)) if d.is_dir() else []


@st.cache_data(show_spinner="Reading records…", max_entries=8)
def load_records(path: str, mtime: float):
    return read_jsonl(path)


def records_of(path: str):
    return load_records(path, os.path.getmtime(path))


def dataset_picker(key: str, container=st, help: str | None = None) -> str | None:
    paths = dataset_paths()
    if not paths:
        container.info("No data set yet: build one on the **Data** page (or run `make setup`).")
        return None
    return container.selectbox(
        "Data set", paths, key=key, persist_state="session", format_func=lambda p: Path(p).name, help=help
    )
