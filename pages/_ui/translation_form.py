"""The Evaluation page's translation form (the paper's second task): adapters, language pair, the ID and OOD sets,
the scorer; launches a background translation evaluation."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import streamlit as st

from pages._ui.evaluations import evaluations_dir
from pages._ui.spec import current_model_name, current_precision
from topl_core.analysis.evaluation.translation import TranslationConfig, TranslationJob
from topl_core.foundations.paths import inside
from topl_core.foundations.presets import MLQE_PE_PAIRS
from topl_core.jobs import background, launchers


def translation_form(labels: dict[str, str], device: str, show_launched: Callable[[Path], None]) -> None:
    """The form in an expander; `labels`: {run path: its label} of the adapters offered; `show_launched(out)` is
    called with the new evaluation's folder."""
    with st.expander("Start a translation evaluation (the paper's second task)"):
        with st.form("mt.form", border=False):
            a, b = st.columns([3, 1])
            mt_runs = a.multiselect(
                "Adapters (merged)",
                list(labels),
                key="mt.runs",
                persist_state="session",
                format_func=lambda p: labels.get(p, Path(p).name),
            )
            mt_base = b.toggle("Base model row", True, key="mt.base", persist_state="session")
            a, b, c, d = st.columns(4)
            lang_pair = a.selectbox(
                "Language pair",
                MLQE_PE_PAIRS,
                key="mt.lang_pair",
                accept_new_options=True,
                persist_state="session",
                help="source-target, e.g. en-de; MLQE-PE's word-level pairs are listed, any other can be typed.",
            )
            mt_n_id = b.number_input("ID sentences", 0, 100_000, 16, key="mt.n_id", persist_state="session")
            mt_n_ood = c.number_input("OOD sentences", 0, 100_000, 16, key="mt.n_ood", persist_state="session")
            mt_max_new = d.number_input("Max new tokens", 8, 1024, 96, key="mt.max_new", persist_state="session")
            mlqe = st.text_input(
                "ID: MLQE-PE split folder",
                "",
                key="mt.mlqe",
                persist_state="session",
                placeholder="/path/to/wmt20/en-de/test  (test.src and test.pe; test.hter to measure the scorer)",
            )
            a, b, c = st.columns(3)
            flores = a.text_input(
                "OOD: FLORES+ folder or hub id", "", key="mt.flores", persist_state="session", placeholder="flores_plus"
            )
            ood_src = b.text_input("… or OOD source file", "", key="mt.ood_src", persist_state="session")
            ood_ref = c.text_input("… and its reference file", "", key="mt.ood_ref", persist_state="session")
            a, b = st.columns([3, 1])
            mt_scorer = a.text_input(
                "Scorer",
                "chrf",
                key="mt.scorer",
                persist_state="session",
                help="'chrf' = the offline default (its Spearman ρ with MLQE-PE's 1 − HTER is shown when the split has "
                "a .hter file); with a hub and unbabel-comet: comet:Unbabel/XCOMET-XL",
            )
            mt_name = b.text_input("Name", f"mt-{time.strftime('%m%d-%H%M%S')}", key="mt.name", persist_state="session")
            go_mt = st.form_submit_button("Start translation evaluation", type="primary", icon=":material/translate:")
        if go_mt:
            try:
                mt_cfg = TranslationConfig(
                    lang_pair=lang_pair,
                    model=current_model_name(),
                    device=device,
                    scorer=mt_scorer.strip() or "chrf",
                    max_new_tokens=int(mt_max_new),
                    precision=current_precision(),
                )
                given = {
                    k: v.strip() or None
                    for k, v in (("mlqe", mlqe), ("flores", flores), ("src", ood_src), ("ref", ood_ref))
                }
                mt_job = TranslationJob(
                    mt_cfg,
                    tuple(mt_runs),
                    mt_base,
                    mlqe=given["mlqe"],
                    flores=given["flores"],
                    ood_src=given["src"],
                    ood_ref=given["ref"],
                    n_id=int(mt_n_id),
                    n_ood=int(mt_n_ood),
                )
                out = inside(evaluations_dir(), mt_name, "Evaluation name")
                launchers.launch_translation(mt_job, out)
                show_launched(out)
            except (ValueError, background.JobError) as e:
                st.error(str(e))
