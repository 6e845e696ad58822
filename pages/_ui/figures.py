"""The pages' Plotly figures, drawn from tables the core computed (the pages only choose and place them). The one
heatmap renderer is the core's (topl_core.analysis.figures: heatmap, auroc_heatmap), which a notebook shows too.

lambda_curve(curve, lam, axis_title)    a document's λ curve: factuality, degenerate texts, perplexity
token_bars(table, threshold)            p(good) per token, gold-bad tokens in black, flagged in red
label_settings_bars(table)              the supervised good and bad tokens of each label setting
training_curves(metrics)                a run's training loss and validation metrics by step
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from pandas.api.types import is_numeric_dtype
from plotly.subplots import make_subplots


def lambda_curve(curve: pd.DataFrame, lam: float, axis_title: str) -> go.Figure:
    """A document's λ curve (lambda_study.document_curve): factuality per λ, degenerate texts marked (not scored) on
    the x-axis, perplexity on a log right axis, the slider's λ as a dotted line."""
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=curve["lambda"],
            y=curve["factuality"],
            mode="lines+markers",
            name="factuality",
            customdata=curve["text"].str.slice(0, 120),
            hovertemplate="λ=%{x:.2f}<br>factuality %{y:.3f}<br>%{customdata}<extra></extra>",
        )
    )
    broken = curve[curve["degenerate"]]
    fig.add_trace(
        go.Scatter(
            x=broken["lambda"],
            y=[0.0] * len(broken),
            mode="markers",
            name="degenerate (not scored)",
            marker=dict(symbol="x", size=11, color="#dc2626"),
            customdata=broken["reason"],
            hovertemplate="λ=%{x:.2f}<br>%{customdata}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=curve["lambda"],
            y=curve["perplexity"],
            mode="lines",
            name="perplexity (right axis)",
            yaxis="y2",
            line=dict(dash="dot", color="#6b7280"),
        )
    )
    fig.add_vline(x=lam, line_dash="dot", line_color="#dc2626")
    fig.update_layout(
        xaxis_title=axis_title,
        yaxis=dict(title="factuality (offline scorer)", range=[-0.05, 1.02]),
        yaxis2=dict(title="perplexity", overlaying="y", side="right", type="log", showgrid=False),
        height=320,
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


def token_bars(table: pd.DataFrame, threshold: float) -> go.Figure:
    """p(good) per token position (columns position, token, p_good, surprisal, gold, flagged): gold-bad tokens in
    black, flagged ones (p(good) < threshold) in red, the rest green; the threshold as a dashed line."""
    colors = np.where(table["gold"] == "bad", "#111827", np.where(table["flagged"], "#dc2626", "#16a34a"))
    fig = go.Figure(
        go.Bar(
            x=table["position"],
            y=table["p_good"],
            marker_color=colors,
            customdata=np.stack([table["token"], table["gold"], table["surprisal"]], axis=1),
            hovertemplate="%{customdata[0]}<br>p(good)=%{y:.3f}<br>gold=%{customdata[1]}"
            "<br>surprisal=%{customdata[2]:.2f}<extra></extra>",
        )
    )
    fig.add_hline(y=threshold, line_dash="dash", line_color="#dc2626", annotation_text="threshold")
    fig.update_layout(
        title="p(good) per token (black = gold bad)",
        xaxis_title="token",
        yaxis_title="p(good)",
        yaxis_range=[0, 1],
        height=280,
    )
    return fig


def label_settings_bars(table: pd.DataFrame) -> go.Figure:
    """The supervised tokens of each label setting (data.variants.label_settings_table), good and bad stacked."""
    long = table.melt(id_vars="setting", value_vars=["good", "bad"], var_name="label", value_name="count")
    return px.bar(
        long,
        x="setting",
        y="count",
        color="label",
        barmode="stack",
        color_discrete_map={"good": "#16a34a", "bad": "#dc2626"},
        title="Supervised tokens per label setting",
    )


def training_curves(metrics: pd.DataFrame) -> go.Figure:
    """A run's metrics.jsonl rows: the training loss on the left, every numeric validation metric on the right."""
    counts = ("val_tokens", "val_examples")
    val = [c for c in metrics.columns if c.startswith("val_") and c not in counts and is_numeric_dtype(metrics[c])]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Training loss", "Validation"))
    loss = go.Scatter(x=metrics["step"], y=metrics["loss"], mode="lines", name="loss", line=dict(color="#2563eb"))
    fig.add_trace(loss, 1, 1)
    for col in val:
        v = metrics[["step", col]].dropna()
        fig.add_trace(go.Scatter(x=v["step"], y=v[col], mode="lines+markers", name=col), 1, 2)
    fig.update_xaxes(title_text="step")
    fig.update_layout(height=300, legend=dict(orientation="h", y=-0.25))
    return fig
