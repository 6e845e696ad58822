"""The core's Plotly figures, drawn from tables it computed: the pages place them, a notebook shows them as they are.
Plotly is imported inside each function (importing this module costs nothing).

    heatmap(table, title, ...)               the one heatmap renderer: LoRA-A AUROC by layer × module (the LoRA-A
                                             page, Separability.figure), layer sweeps by start × size
    auroc_heatmap(table, title, diverging)   a layer × module AUROC table (Separability.heatmap), or a difference of two
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only: plotly and pandas are imported where a figure is drawn
    import pandas as pd
    import plotly.graph_objects as go


def heatmap(
    table: pd.DataFrame,
    title: str,
    *,
    x: list[str] | None = None,
    hover: str = "%{y} · %{x}<br>%{z:.3f}",
    colorbar: str = "",
    zrange: tuple[float, float] | None = None,
    diverging: bool = False,
    decimals: int = 2,
    labels: bool = True,
    height: int | None = None,
    axis_titles: tuple[str, str] = ("", ""),
) -> go.Figure:
    """`table` (rows on y, columns on x; NaN cells left blank) as a heatmap. `diverging`: red–blue centred on 0 with a
    symmetric range (a difference of two tables); else Viridis over `zrange` (default: the data's). `labels`: write
    each cell's value (`decimals`) in it.

    Example: ``heatmap(sweep_table, "AUROC by start × size", axis_titles=("size", "start"))``"""
    import plotly.graph_objects as go

    z = table.to_numpy(dtype=float)
    if diverging:
        lim = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 0.1
        scale = dict(colorscale="RdBu", zmid=0, zmin=-lim, zmax=lim)
    else:
        scale = dict(colorscale="Viridis", **(dict(zmin=zrange[0], zmax=zrange[1]) if zrange else {}))
    text = np.where(np.isnan(z), "", np.vectorize(lambda v: f"{v:.{decimals}f}")(np.nan_to_num(z)))
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x if x is not None else [str(c) for c in table.columns],
            y=table.index.tolist(),
            text=text,
            hoverongaps=False,
            hovertemplate=hover + "<extra></extra>",
            colorbar=dict(title=colorbar, thickness=12),
            **scale,
        )
    )
    fig.update_layout(
        title=title,
        height=height or max(320, 18 * len(table) + 120),
        xaxis_title=axis_titles[0],
        yaxis_title=axis_titles[1],
        yaxis=dict(autorange="reversed", dtick=1 if len(table) <= 32 else 2),
    )
    if labels:
        fig.update_traces(texttemplate="%{text}")
    return fig


def auroc_heatmap(table: pd.DataFrame, title: str, diverging: bool = False) -> go.Figure:
    """A layer × module AUROC table (Separability.heatmap: rows layers, columns modules) on the 0.5–1 scale, or with
    `diverging` a difference of two such tables centred on 0; cell values written in small tables (≤ 12 layers).

    Example: ``auroc_heatmap(topl.heatmap() - sft.heatmap(), "TOPL − SFT", diverging=True)``"""
    return heatmap(
        table,
        title,
        x=[str(c).replace("_proj", "") for c in table.columns],
        hover="layer %{y} · %{x}<br>AUROC %{z:.3f}",
        colorbar="Δ" if diverging else "AUROC",
        zrange=None if diverging else (0.5, 1.0),
        diverging=diverging,
        labels=len(table) <= 12,
        axis_titles=("module", "layer"),
    )
