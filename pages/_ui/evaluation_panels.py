"""The Evaluation page's result panels: the λ study's curves, the protocols' agreement, the translation table."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from pages._ui.render import csv_download, plot, rho_text
from topl_core.runtime.modes import MODES

KEY = "eval."  # the Evaluation page's widget keys


def score_table(table: pd.DataFrame, score_cols: list[str], key: str) -> None:
    """A results table: one row per variant, its scores in [0, 1] drawn as bars, and the documents counted."""
    st.dataframe(
        table[["variant", *score_cols, "n_ID", "n_OOD"]],
        hide_index=True,
        key=key,
        column_config={
            c: st.column_config.ProgressColumn(c, min_value=0.0, max_value=1.0, format="%.3f") for c in score_cols
        },
    )


def lambda_study(curve: pd.DataFrame, res: dict, name: str) -> None:
    """The λ curves of a steering study: per adapter, factuality with its 95% interval for each mode (the controls
    on the same axes as the LoRA-B vector), the share of degenerate texts and perplexity below; the conditional
    mode (λ scales the adapter's update) on its own axis."""
    if "mode" not in curve:  # a sweep written before the study had modes
        curve = curve.assign(mode="vector", run=", ".join(res.get("sites") or []) or "adapter")
    st.caption(
        "95% intervals: mean ± 1.96 s.e. over documents. Solid: all texts; dotted: factuality of the texts that are "
        "not degenerate. Modes that add a vector in normalised λ (every mode the same length at each site); modes "
        "that scale the adapter's update on their own axis (0 = base, 1 = merged)."
    )
    families: dict[str, list[str]] = {}
    for m in MODES.values():
        families.setdefault(m.family, []).append(m.name)
    for run, part in curve.groupby("run", sort=False):
        for family, modes in families.items():
            sub = part[part["mode"].isin(modes)]
            if sub.empty:
                continue
            fig = go.Figure()
            lower = go.Figure()
            for m, g in sub.groupby("mode", sort=False):
                color = MODES[m].colour if m in MODES else None
                fig.add_trace(
                    go.Scatter(
                        x=g["lambda"],
                        y=g["factuality"],
                        name=m,
                        mode="lines+markers",
                        line=dict(color=color),
                        error_y=dict(type="data", array=(g["factuality_hi"] - g["factuality"]).fillna(0)),
                    )
                )
                if "factuality_fluent" in g:
                    fig.add_trace(
                        go.Scatter(
                            x=g["lambda"],
                            y=g["factuality_fluent"],
                            name=f"{m}, fluent texts",
                            mode="lines",
                            line=dict(color=color, dash="dot"),
                        )
                    )
                    lower.add_trace(
                        go.Scatter(
                            x=g["lambda"], y=g["degenerate"], name=m, mode="lines+markers", line=dict(color=color)
                        )
                    )
            title = MODES[modes[0]].axis_title
            fig.update_layout(
                title=f"{Path(run).name}: factuality vs λ",
                xaxis_title=title,
                yaxis=dict(title="factuality", range=[0, 1]),
                height=340,
            )
            lower.update_layout(
                title="share of degenerate texts", xaxis_title=title, yaxis=dict(range=[-0.02, 1.02]), height=340
            )
            c1, c2 = st.columns([3, 2])
            with c1:
                plot(fig, key=KEY + f"lam_curve.{run}.{family}")
            with c2:
                plot(lower, key=KEY + f"lam_degenerate.{run}.{family}")
    first = ["run", "mode", "lambda", "factuality", "factuality_lo", "factuality_hi", "change", "change_lo"]
    first += ["change_hi", "degenerate", "factuality_fluent", "perplexity", "distinct_2", "sentences", "words"]
    shown = [c for c in first if c in curve] + [
        c for c in curve.columns if c not in first and not c.endswith(("_sem", "_n"))
    ]
    st.dataframe(curve[shown], hide_index=True, key=KEY + "lam_table")
    csv_download(curve, f"{name}-lambda-curve.csv", key=KEY + "lam_csv")


def protocol_panel(res: dict, per_doc: Path) -> None:
    """Sentence-level against full-summary scores, per summary, with the Spearman ρ evaluate measured."""
    agreement = res.get("protocol_agreement")
    if not agreement or not per_doc.exists():
        return
    st.subheader("Do the protocols agree?")
    st.caption(
        f"Spearman ρ between the sentence-level and the full-summary score: {rho_text(agreement['summaries'])} over "
        f"{agreement['n_summaries']} summaries, {rho_text(agreement['variants'])} over the {agreement['n_variants']} "
        "variants' means (— below three). Low agreement means the choice of protocol can reorder the methods."
    )
    df = pd.read_csv(per_doc)
    fig = px.scatter(
        df,
        x="score_full",
        y="score_sentence",
        color="variant",
        hover_data=[c for c in ("set", "source", "doc_id") if c in df],
        range_x=[0, 1],
        range_y=[0, 1],
        title="Factuality per summary: full summary vs sentence-level",
    )
    fig.add_shape(type="line", x0=0, y0=0, x1=1, y1=1, line={"dash": "dot", "color": "gray"})
    plot(fig, key=KEY + "protocols")


def translation_panel(res: dict, per_sentence: Path, name: str) -> None:
    """An evaluate-mt result: the scorer's measured agreement, the table per variant, the translations."""
    agreement = res.get("scorer_agreement")
    if agreement:
        st.info(
            f"**Scorer {agreement['scorer']}** — Spearman ρ with MLQE-PE's human post-editing effort (1 − HTER) "
            f"over {agreement['n']} machine translations: **{rho_text(agreement['spearman'])}**. Read small "
            "differences between rows against this.",
            icon=":material/straighten:",
        )
    else:
        st.caption(f"Scorer {res['scorer']}: its agreement with human judgement needs an MLQE-PE split with .hter.")
    table = pd.DataFrame(res["table"])
    cfg = res["config"]
    st.subheader(f"Translation {cfg['lang_pair']} · {res['scorer']}")
    score_cols = [c for c in ("ID", "OOD", "average") if c in table]
    score_table(table, score_cols, KEY + "mt_table")
    csv_download(table, f"{name}-translation.csv", key=KEY + "mt_csv")
    if per_sentence.exists():
        with st.expander("Translations, per sentence"):
            df = pd.read_csv(per_sentence, keep_default_na=False)
            st.dataframe(df[["variant", "set", "source", "reference", "text", "score"]], hide_index=True)


def results_panel(res: dict, protocol: str, name: str, per_doc_csv: Path) -> None:
    """A results table (base / merged / steered): factuality per set as a table and bars, the summaries' lengths,
    the CSV, and the protocols' agreement."""
    table = pd.DataFrame(res[f"table_{protocol}"])
    # ID, OOD, average, then one column per OOD source (CLIFF's two, or a benchmark's datasets and their mean)
    lengths = [c for c in ("sentences", "words", "supported") if c in table]  # "supported": results from before it
    score_cols = [c for c in table.columns if c not in ("variant", *lengths, "n_ID", "n_OOD")]
    st.subheader("Factuality")
    score_table(table, score_cols, KEY + "table")
    long = table.melt(
        id_vars="variant",
        value_vars=[c for c in ("ID", "OOD", "average") if c in table],
        var_name="set",
        value_name="factuality",
    )
    plot(
        px.bar(
            long,
            x="variant",
            y="factuality",
            color="set",
            barmode="group",
            range_y=[0, 1],
            title=f"Factuality ({protocol} protocol)",
        ),
        key=KEY + "bars",
    )
    st.subheader("Summary length")
    st.caption(
        "Factuality per sentence rewards saying less: read it beside the length and the supported sentences per "
        "summary (the sum of its sentences' scores), a count that does not reward shorter summaries."
    )
    st.dataframe(
        table[["variant", *lengths]],
        hide_index=True,
        key=KEY + "lengths",
        column_config={
            "sentences": st.column_config.NumberColumn("avg sentences", format="%.2f"),
            "words": st.column_config.NumberColumn("avg words", format="%.1f"),
            "supported": st.column_config.NumberColumn("supported sentences", format="%.2f"),
        },
    )
    csv_download(table, f"{name}-{protocol}.csv", key=KEY + "table_csv")
    protocol_panel(res, per_doc_csv)


def per_document_panel(per_doc: Path, name: str) -> None:
    """Every generated summary with its scores, in an expander, and its CSV."""
    if per_doc.exists():
        with st.expander("Generated summaries, per document"):
            df = pd.read_csv(per_doc)
            st.dataframe(
                df[
                    [
                        c
                        for c in (
                            "variant",
                            "lambda",
                            "set",
                            "source",
                            "doc_id",
                            "score_sentence",
                            "score_full",
                            "n_sentences",
                            "text",
                        )
                        if c in df
                    ]
                ],
                hide_index=True,
                key=KEY + "per_doc",
            )
            csv_download(df, f"{name}-per-document.csv", key=KEY + "per_doc_csv")
