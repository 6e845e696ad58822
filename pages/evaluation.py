"""Evaluation: launch an ID/OOD factuality evaluation (or a λ sweep) in the background; read the results table
(ID, OOD, average), the summary-length table (sentences, words), per-document texts — with the offline scorer's
measured quality shown next to its scores. Translation (MLQE-PE ID, FLORES+ or parallel files OOD, chrF or COMET)
has a form of its own and the same results list."""

from pages._ui.frame import ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

import time
from pathlib import Path

import pandas as pd
import streamlit as st

from pages._ui.datasets import dataset_paths
from pages._ui.evaluation_panels import lambda_study, per_document_panel, results_panel, translation_panel
from pages._ui.evaluations import evaluations_dir, read_evaluation
from pages._ui.forms import field_input, mode_settings, opening_values
from pages._ui.jobs import follow, job_failure, job_log, job_row, pick_job
from pages._ui.runs import finished_runs, run_fingerprint
from pages._ui.spec import current_decode_precision, current_model_name, current_precision, current_spec, split_spec
from pages._ui.translation_form import translation_form
from topl_core.analysis.evaluation.config import EvalConfig, EvalJob, LambdaStudy
from topl_core.analysis.evaluation.scorers import DEFAULT_SCORER, PROTOCOLS
from topl_core.foundations.paths import inside
from topl_core.jobs import background, launchers
from topl_core.runtime.modes import MODE_SETTINGS, MODES, STUDY_MODES

st.title("Evaluation")
st.caption(
    "Generate a summary per document with the base, merged and steered models, score its factual "
    "consistency against the document, and count sentences. ID = held-out test split of the training data; "
    "OOD = CLIFF documents (other datasets, real model outputs)."
)

K = "eval."
EVALS = evaluations_dir()
runs = finished_runs()
_, _, device = split_spec(current_spec())


def show_launched(out: Path) -> None:
    """Show the evaluation job just started into `out` below."""
    st.session_state[K + "show"] = out.name
    st.rerun()


with st.expander("Start an evaluation", expanded=not EVALS.is_dir() or not any(EVALS.iterdir())):
    mode = st.radio(
        "Mode",
        ["Results table (base / merged / steered)", "λ sweep (steering study)"],
        horizontal=True,
        key=K + "mode",
        persist_state="session",
    )
    sweep_mode = mode.startswith("λ")
    with st.form("eval.form", border=False):
        a, b = st.columns([3, 1])
        labels = {r.path: f"{r.run} · {r.method}" for r in runs.itertuples()}
        chosen = a.multiselect(
            "Adapters (merged)",
            list(labels),
            default=list(labels)[:2],
            key=K + "runs",
            persist_state="session",
            format_func=lambda p: labels.get(p, Path(p).name),
        )
        # the first adapter's recommendation (`recommend`): the steered rows' λ and the gate's τ open at it
        first = chosen[0] if chosen else None
        vector, gated = (opening_values(first, run_fingerprint(first) if first else "", m) for m in ("vector", "gated"))
        include_base = b.toggle("Base model row", True, key=K + "base", persist_state="session", disabled=sweep_mode)
        a, b, c, d = st.columns(4)
        lambdas_txt = a.text_input(
            "λ values" if sweep_mode else "Also steered with λ",
            "-4 -2 0 1 2 3 4" if sweep_mode else "" if vector.lam is None else f"{vector.lam:g}",
            key=K + f"lambdas.{sweep_mode}",
            persist_state="session",
            help="Space-separated, in normalised units (λ = 1 adds a tenth of each steered site's mean output norm). "
            "λ > 0 pushes toward faithful, λ < 0 toward hallucinated.",
        )
        a.caption(f"Opens at {vector.source} (vector); gated: {gated.source}.")
        n_id = field_input(b, EvalConfig, "n_id", K, 8)
        n_ood = c.number_input(
            "OOD documents",
            0,
            10_000,
            0 if sweep_mode else 8,
            key=K + f"n_ood.{sweep_mode}",
            persist_state="session",
            help="CLIFF: in all, alternating its two sources. With an OOD benchmark below: per dataset (the paper: "
            "300 per LLM-AggreFact dataset).",
        )
        max_new = field_input(d, EvalConfig, "max_new_tokens", K, 64)
        if sweep_mode:
            a, b, c = st.columns([3, 2, 1])
            modes = a.multiselect(
                "Modes",
                list(MODES),
                default=list(STUDY_MODES),
                key=K + "modes",
                persist_state="session",
                format_func=lambda m: MODES[m].label,
                help=" ".join(f"**{m.label}**: {m.help}" for m in MODES.values()),
            )
            # the first mode whose λ is on its own axis rather than in the direction's units (the update's scale)
            scaling_grid = next(m.lambda_grid for m in MODES.values() if not m.action.units_apply)
            scaled_txt = b.text_input(
                "λ values of the modes on their own λ axis (scaling the update, …)",
                " ".join(f"{x:g}" for x in scaling_grid),
                key=K + "cond_lambdas",
                persist_state="session",
            )
            gen_only = c.toggle("Generated tokens only", False, key=K + "gen_only", persist_state="session")
            tau = {"tau": gated.tau} if gated.tau is not None else {}
            settings = mode_settings(st, MODE_SETTINGS, K, tau)  # the modes' own: gated τ and k
        a, b, c = st.columns([2, 2, 1])
        data_opts = dataset_paths()
        data = a.selectbox(
            "ID data (its test split)",
            data_opts,
            key=K + "data",
            persist_state="session",
            format_func=lambda p: Path(p).name,
        )
        scorer = field_input(b, EvalConfig, "scorer", K, DEFAULT_SCORER)
        name = c.text_input("Name", f"eval-{time.strftime('%m%d-%H%M%S')}", key=K + "name", persist_state="session")
        ood_data = field_input(
            st,
            EvalConfig,
            "ood_data",
            K,
            "",
            placeholder="/path/to/llm-aggrefact.csv  (or .parquet, or a hub dataset id)",
        )
        go_eval = st.form_submit_button("Start evaluation", type="primary", icon=":material/play_arrow:")
    if go_eval:
        try:
            lams = tuple(float(x) for x in lambdas_txt.replace(",", " ").split())
            cfg = EvalConfig(
                data=str(Path(data).resolve()) if data else EvalConfig.data,
                n_id=n_id,
                n_ood=int(n_ood),
                max_new_tokens=max_new,
                scorer=scorer.strip() or DEFAULT_SCORER,
                ood_data=ood_data.strip() or None,
                model=current_model_name(),
                device=device,
                precision=current_precision(),
                decode_precision=current_decode_precision(),
            )
            study = None
            if sweep_mode:
                study = LambdaStudy(
                    lams,
                    tuple(modes),
                    "generated" if gen_only else "all",
                    ("ID",) if n_ood == 0 else ("ID", "OOD"),
                    tuple(float(x) for x in scaled_txt.replace(",", " ").split()),
                    tuple(settings.items()),
                )
            job = EvalJob(cfg, tuple(chosen), include_base, () if sweep_mode else lams, study)
            out = inside(EVALS, name, "Evaluation name")
            launchers.launch_evaluation(job, out)
            show_launched(out)
        except (ValueError, background.JobError) as e:
            st.error(str(e))

translation_form(labels, device, show_launched)

evals = background.list_jobs(EVALS)  # newest first
if not evals:
    st.info("No evaluation yet: start one above (a few documents take a minute with SmolLM2 on a CPU).")
    st.stop()
sel = pick_job("Evaluation", [j.name for j in evals], K + "show")
edir = EVALS / sel


def panel(job: background.JobStatus | None) -> None:
    state = job.state if job else "unknown"
    if job is not None and job.active:
        lines = [ln for ln in background.log_tail(edir, 50).splitlines() if "generating" in ln or "λ =" in ln]
        said = lines[-1] if lines else "loading models…"
        job_row(job, K, 0.5 if lines else 0.0, f"{state} · {said}", stop="Cancel")
        return
    if state != "finished":
        job_failure(edir, f"Evaluation {state}: {job.error if job else ''}")
        return
    res = read_evaluation(str(edir), (edir / "eval.json").stat().st_mtime)
    if res.get("task") == "translation":
        translation_panel(res, edir / "per_doc.csv", sel)
        return
    quality = res.get("scorer_quality")
    if quality:
        rows = pd.DataFrame(quality["rows"])
        sent = rows[rows["protocol"] == "sentence"]
        st.info(
            f"**Scorer {quality['scorer']}** — measured AUROC of faithful vs hallucinated summaries (sentence "
            "protocol): "
            + ", ".join(f"{r.dataset} **{r.auroc:.2f}**" for r in sent.itertuples())
            + ". Read small differences between rows against this.",
            icon=":material/straighten:",
        )
    protocol = st.radio(
        "Protocol",
        list(PROTOCOLS),
        horizontal=True,
        key=K + "protocol",
        persist_state="session",
        format_func=lambda p: {"sentence": "sentence-level (score each sentence, average)", "full": "full summary"}[p],
    )
    if "lambda_curve" in res:
        key = "lambda_curve" if protocol == "sentence" or "lambda_curve_full" not in res else "lambda_curve_full"
        lambda_study(pd.DataFrame(res[key]), res, sel)
    else:
        results_panel(res, protocol, sel, edir / "per_doc.csv")
    per_document_panel(edir / "per_doc.csv", sel)


follow(edir, K, panel)
job_log(edir, command=True)
