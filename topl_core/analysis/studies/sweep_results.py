"""A layer sweep's results (sweeps.py runs the sweep and appends a row per finished window): the rows read back, the
heatmap of start × size, one line per window size, and the reuse comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ...foundations.io import read_log_rows

RESULTS_FILE = "results.jsonl"  # one JSON row per finished window, in a sweep's folder


def read_sweep(sweep_dir: str | Path):
    """Results so far, one row per finished window (the latest row when a window appears twice)."""
    import pandas as pd

    rows = read_log_rows(Path(sweep_dir) / RESULTS_FILE)
    if not rows:
        return pd.DataFrame(columns=["window", "start", "size", "end", "val_token_auroc", "train_s"])
    df = pd.DataFrame(rows).drop_duplicates("window", keep="last")
    return df.sort_values(["size", "start"]).reset_index(drop=True)


def heatmap_table(df, value: str = "val_token_auroc"):
    """Rows = window start layer, columns = window size, cells = `value` (NaN where not run)."""
    return df.pivot_table(index="start", columns="size", values=value, aggfunc="last").sort_index()


def lines_table(df, sizes: Sequence[int] = (3, 6, 12), value: str = "val_token_auroc"):
    """Long table for the k = 3, 6, 12 lines: size, start, value (sorted)."""
    sub = df[df["size"].isin(list(sizes))][["size", "start", value]]
    return sub.sort_values(["size", "start"]).reset_index(drop=True)


def compare_reuse(with_reuse, without_reuse):
    """Per window: training time with and without frozen-prefix reuse, the ratio, and both AUROCs (they should
    agree: reuse changes where the prefix is computed, not what is computed)."""
    a = with_reuse.set_index("window")[["start", "size", "train_s", "val_token_auroc"]]
    b = without_reuse.set_index("window")[["train_s", "val_token_auroc"]]
    out = a.join(b, lsuffix="_reuse", rsuffix="_plain", how="inner")
    out["saving"] = 1 - out["train_s_reuse"] / out["train_s_plain"]
    return out.reset_index().sort_values(["size", "start"]).reset_index(drop=True)
