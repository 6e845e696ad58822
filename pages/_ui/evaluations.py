"""Evaluations (Evaluation and Runs pages): the eval.json files of evaluation jobs, read back from disk."""

from __future__ import annotations

import json
from pathlib import Path

import streamlit as st

from topl_core.foundations.paths import runs_dir


def evaluations_dir() -> Path:
    return runs_dir() / "evaluations"


@st.cache_data(show_spinner=False, max_entries=64)
def read_evaluation(path: str, mtime: float) -> dict:
    """The eval.json an evaluation job wrote (python -m topl_core evaluate --json)."""
    return json.loads((Path(path) / "eval.json").read_text())


def run_factuality(run_name: str) -> dict:
    """ID / OOD / average factuality and average sentence count of a run's merged adapter, from the newest finished
    evaluation that has it (sentence protocol). Empty when the run was never evaluated."""
    d = evaluations_dir()
    if not d.is_dir():
        return {}
    for e in sorted(d.iterdir(), key=lambda p: -p.stat().st_mtime):
        f = e / "eval.json"
        if not f.exists():
            continue
        try:
            res = read_evaluation(str(e), f.stat().st_mtime)
        except ValueError:
            continue
        for row in res.get("table_sentence", []):
            if row.get("variant") == f"merged ({run_name})":
                return {
                    "ID factuality": row.get("ID"),
                    "OOD factuality": row.get("OOD"),
                    "avg factuality": row.get("average"),
                    "avg sentences": row.get("sentences"),
                    "evaluation": e.name,
                }
    return {}
