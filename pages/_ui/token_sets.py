"""Labelled token sets (LoRA-A and Steering pages): the tokens on which separability and μ+ / μ− are measured."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from pages._ui.datasets import dataset_picker
from topl_core.analysis.lora_a.probe import (
    TOKEN_SET_RECORDS,
    ProbeResult,
    ProbeSettings,
    labelled_records,
    labelled_split,
    probe_run,
)
from topl_core.data.cliff import load_factuality_csv
from topl_core.data.records import read_jsonl
from topl_core.data.split import split_records
from topl_core.foundations.errors import DataError
from topl_core.foundations.paths import cliff_csv, project_path
from topl_core.training.adapters import open_adapter

TOKEN_SETS = ("run's data · val split", "run's data · test split", "CLIFF spans (OOD)", "another data set")
DEFAULT_LIMIT = TOKEN_SET_RECORDS


def default_token_set(run_path: str) -> tuple:
    """token_set()'s arguments for the pickers' default: the run's val split, DEFAULT_LIMIT records."""
    return TOKEN_SETS[0], run_path, None, "all", DEFAULT_LIMIT


@st.cache_data(show_spinner="Reading the token set…", max_entries=16)
def token_set(kind: str, run_path: str, data_path: str | None, split: str, limit: int) -> tuple[str, list]:
    """(description, labelled records) for a token-set choice. Raises DataError/RunError with a message to show."""
    if kind.startswith("CLIFF"):
        path = cliff_csv()
        if not path.is_file():
            raise DataError(f"CLIFF spans not found at {path} (set TOPL_SHARED_DATA to its folder).")
        recs = labelled_records(load_factuality_csv(path).records)
        return f"CLIFF ({path.name})", recs[:limit]
    if kind.startswith("run's data"):
        split = "val" if "val" in kind else "test"
        data = project_path(open_adapter(run_path).settings.data)  # an adapter from elsewhere: the default data set
        return f"{data.name} [{split}]", labelled_split(run_path, split, limit)
    if not data_path:
        raise DataError("pick a data set")
    recs = read_jsonl(data_path)
    if split != "all":
        recs = split_records(recs)[split]
    return f"{Path(data_path).name} [{split}]", labelled_records(recs)[:limit]


def token_set_picker(prefix: str, run_path: str, container=st, default_limit: int = DEFAULT_LIMIT):
    """Widgets for a token set; returns the arguments of token_set() (all hashable)."""
    c1, c2, c3 = container.columns([2, 2, 1])
    kind = c1.selectbox(
        "Token set",
        TOKEN_SETS,
        key=f"{prefix}.token_set",
        persist_state="session",
        help="Labelled tokens on which LoRA-A separability (and μ+ / μ− for steering) are measured.",
    )
    data_path, split = None, "all"
    if kind == "another data set":
        data_path = dataset_picker(f"{prefix}.token_data", container=c2)
        split = c2.selectbox(
            "Split", ["val", "test", "train", "all"], key=f"{prefix}.token_split", persist_state="session"
        )
    limit = c3.number_input(
        "Records",
        4,
        5000,
        default_limit,
        step=8,
        key=f"{prefix}.token_limit",
        persist_state="session",
        help="More records → steadier AUROCs, slower capture (cached on disk afterwards).",
    )
    return kind, run_path, data_path, split, int(limit)


@st.cache_data(show_spinner="Capturing LoRA-A projections and scoring every site (cached on disk)…", max_entries=16)
def lora_a_probe(run: str, fp: str, ts: tuple, precision: str, folds: int = 5, control: bool = True) -> ProbeResult:
    """LoRA-A separability of a run on a token set (token_set's arguments), with the random-A control; `fp` (the
    run's fingerprint) keys Streamlit's cache, the disk cache keys itself."""
    desc, records = token_set(*ts)
    if not records:
        raise ValueError("the token set holds no records with token labels")
    settings = ProbeSettings(folds=folds, random_control=control, precision=precision)
    return probe_run(run, records, settings, token_set=desc)
