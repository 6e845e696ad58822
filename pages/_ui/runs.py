"""Runs and adapters: the table of run directories (the user's and the shipped demo adapters) and of LoRA adapters
from elsewhere (PEFT folders under the runs folder, or a path / hub id opened on the Runs page), the pickers over
finished ones, and the hint a page shows when it has nothing to open."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from pages._ui.spec import current_model_name
from topl_core.foundations.errors import WorkbenchError
from topl_core.foundations.paths import examples_dir, runs_dir
from topl_core.jobs import background
from topl_core.training.adapters import Adapter, find_adapter_folders, open_adapter
from topl_core.training.run_dirs import RunDir

EXAMPLE_PREFIX = "example: "  # how a shipped demo adapter is named in tables and pickers
OPENED_KEY = "opened_adapters"  # session_state: paths / hub ids opened on the Runs page in this session
COLUMNS = ["run", "method", "model", "state", "step", "steps", "loss", "val_token_auroc", "layers", "lora", "lr",
           "precision", "has_head", "complete", "source", "path", "warnings"]  # fmt: skip


@st.cache_data(ttl=2, show_spinner=False)
def runs_table(root: str, examples: str | None = None) -> pd.DataFrame:
    """All run directories under root, then the shipped demo adapters under `examples` (marked "example"), with
    their config summary and state (refreshed every 2 s)."""
    rows = []
    sources = [(root, "yours")] + ([(examples, "example")] if examples else [])
    for folder, source in sources:
        for stt in background.list_jobs(folder):
            try:
                cfg, meta = RunDir(stt.path).read_config()
            except WorkbenchError:
                continue
            lora = _lora_of(stt.path) if stt.state == "finished" else ""
            rows.append(
                {
                    "run": (EXAMPLE_PREFIX if source == "example" else "") + stt.name,
                    "method": cfg.method,
                    "model": cfg.model,
                    "state": stt.state,
                    "step": stt.step,
                    "steps": stt.steps,
                    "loss": stt.loss,
                    "val_token_auroc": stt.val.get("val_token_auroc"),
                    "layers": f"{cfg.lora.layer_start}–{cfg.lora.layer_end}",
                    "lora": lora,
                    "lr": cfg.lr,
                    "precision": cfg.precision,
                    "has_head": RunDir(stt.path).head_path.exists(),
                    "complete": stt.state == "finished" and RunDir(stt.path).adapter_path.exists(),
                    "source": source,
                    "path": str(stt.path),
                    "warnings": " ".join(stt.warnings),  # what went wrong without stopping the run
                }
            )
        rows += [adapter_row(a, source) for a in _adapters_in(folder)]
    return pd.DataFrame(rows, columns=COLUMNS)


def _lora_of(path: Path) -> str:
    try:
        return open_adapter(path).lora.describe()
    except WorkbenchError:
        return ""  # listed all the same; opening it says what is wrong


def _adapters_in(folder: str) -> list[Adapter]:
    out = []
    for path in find_adapter_folders(folder):
        try:
            out.append(open_adapter(path))
        except WorkbenchError:
            continue  # listed nowhere; opening it by path on the Runs page says why
    return out


def adapter_row(adapter: Adapter, source: str) -> dict:
    """A table row for an adapter that is not a run of this workbench: method unknown, ready to open."""
    layers = adapter.lora.layers_to_transform
    return {
        "run": (EXAMPLE_PREFIX if source == "example" else "") + adapter.name,
        "method": adapter.method or "unknown",
        "model": adapter.base_model,
        "state": "finished",
        "layers": "all" if layers is None else f"{min(layers)}–{max(layers)}",
        "lora": adapter.lora.describe(),
        "has_head": adapter.has_head,
        "complete": True,
        "source": source,
        "path": str(adapter.path),
        "warnings": "",
    }


@st.cache_data(ttl=2, show_spinner=False)
def opened_table(refs: tuple[str, ...]) -> pd.DataFrame:
    rows = []
    for ref in refs:
        try:
            rows.append(adapter_row(open_adapter(ref), "opened"))
        except WorkbenchError:
            continue
    return pd.DataFrame(rows, columns=COLUMNS)


def all_runs() -> pd.DataFrame:
    """The user's runs and adapters (TOPL_RUNS_DIR), the adapters opened in this session, and the shipped demo
    adapters, as runs_table rows."""
    ex = examples_dir()
    table = runs_table(str(runs_dir()), str(ex) if ex is not None else None)
    opened = opened_table(tuple(st.session_state.get(OPENED_KEY, ())))
    opened = opened[~opened["path"].isin(table["path"])]
    return pd.concat([table, opened], ignore_index=True) if not opened.empty else table


def open_by_reference(ref: str) -> Adapter:
    """Open a path or hub id typed on the Runs page and keep it in this session's list (raises WorkbenchError)."""
    adapter = open_adapter(ref.strip())
    refs = st.session_state.setdefault(OPENED_KEY, [])
    if str(adapter.path) not in refs:
        refs.append(str(adapter.path))
    return adapter


def finished_runs(need_head: bool = False, all_models: bool = False) -> pd.DataFrame:
    df = all_runs()
    # .astype(bool): on an empty table the column has dtype object, and indexing with an object Series would
    # select columns by name instead of rows
    df = df[df["complete"].astype(bool)]
    if need_head:
        df = df[df["has_head"].astype(bool)]
    if not all_models:
        df = df[df["model"] == current_model_name()]
    return df


def no_finished_run_hint(need_head: bool = False) -> str:
    """What to do when a page has no adapter to open for the current model: names the next step."""
    what = "with a head (TOPL, SOPL or TLDR) " if need_head else ""
    others = finished_runs(need_head, all_models=True)
    elsewhere = sorted(set(others["model"]) - {current_model_name()})
    hint = (
        f" Finished runs exist for {', '.join(f'**{m}**' for m in elsewhere)}: pick that model in the sidebar."
        if elsewhere
        else ""
    )
    active = all_runs()
    active = active[(active["model"] == current_model_name()) & active["state"].isin(["starting", "running"])]
    if not active.empty:
        hint += f" {len(active)} run(s) for this model are still training: follow them on the **Train** page."
    return (
        f"No finished run {what}for **{current_model_name()}** yet. Train one on the **Train** page "
        f"(a tiny model trains in seconds; SmolLM2 in minutes to an hour on a CPU), or open an adapter trained "
        f"elsewhere on the **Runs** page.{hint}"
    )


def run_picker(
    label: str, key: str, need_head: bool = False, default_method: str | None = None, container=st
) -> str | None:
    """A selectbox over finished runs of the current model. Returns the run path or None (with a hint shown)."""
    df = finished_runs(need_head)
    if df.empty:
        container.info(no_finished_run_hint(need_head))
        return None
    paths = df["path"].tolist()
    labels = {r.path: f"{r.run} · {r.method} · layers {r.layers}" for r in df.itertuples()}
    if key not in st.session_state or st.session_state[key] not in paths:
        # default: the run of the preferred method with the best validation token AUROC (then the newest)
        pref = df[df["method"] == default_method] if default_method else df.iloc[:0]
        if not pref.empty:
            pref = pref.assign(_a=pref["val_token_auroc"].astype(float).fillna(-1.0)).sort_values(
                "_a", ascending=False, kind="stable"
            )
        st.session_state[key] = (pref["path"].tolist() or paths)[0]
    return container.selectbox(
        label, paths, key=key, persist_state="session", format_func=lambda p: labels.get(p, Path(p).name)
    )


def run_fingerprint(run_path: str) -> str:
    return open_adapter(run_path).fingerprint()
