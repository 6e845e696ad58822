"""Data: browse examples with gold labels as colored tokens; label-sensitivity settings with their stats; build or
import a data set from any data source (one a model writes, as a background job) and merge data sets."""

from pages._ui.frame import ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

from collections import Counter
from pathlib import Path

import pandas as pd
import streamlit as st

from pages._ui.data_build import build_form, merge_form
from pages._ui.datasets import dataset_picker, records_of
from pages._ui.figures import label_settings_bars
from pages._ui.models import base_model, load_error
from pages._ui.render import csv_download, plot
from pages._ui.spec import current_spec
from topl_core.analysis.studies.data_sources import SOURCES
from topl_core.analysis.token_colors import legend_html, token_html
from topl_core.data import overview
from topl_core.data.records import Record
from topl_core.data.split import SPLITS
from topl_core.foundations.errors import DataError

st.title("Data")
st.caption("Token-level supervision: a document, a response, and a good/bad label for every response token.")


@st.cache_data(show_spinner="Tokenizing and applying the label settings…", max_entries=16)
def label_table(path: str, mtime: float, spec: str, split: str, limit: int, seed: int) -> pd.DataFrame:
    records = overview.token_labelled(records_of(path), split, limit)
    return overview.label_settings(base_model(spec).tokenizer, records, seed) if records else pd.DataFrame()


def records_or_error(path: str | None) -> list[Record] | None:
    """The picked data set's records, or None after showing why it cannot be read (the DataError names the line)."""
    if not path:
        return None
    try:
        return records_of(path)
    except (DataError, OSError) as ex:
        st.error(f"**Cannot read this data set.** {ex}")
        return None


tab_browse, tab_labels, tab_build = st.tabs(["Browse", "Label settings", "Build or import"])

with tab_browse:
    records = records_or_error(dataset_picker("data.dataset"))
    if records is not None:
        counts = overview.counts(records)
        c = st.columns(4)
        c[0].metric("Records", counts.records)
        c[1].metric("Documents", counts.documents)
        c[2].metric("With token labels", f"{counts.token_labelled_pct:.0f}%")
        c[3].metric("Unfaithful (sequence label 0)", counts.unfaithful)

        f1, f2, f3 = st.columns([2, 1, 1])
        sources = sorted({r.source for r in records})
        chosen_sources = f1.multiselect(
            "Sources", sources, default=sources, key="data.sources", persist_state="session"
        )
        split = f2.selectbox("Split", [overview.ALL, *SPLITS], key="data.split", persist_state="session")
        only_bad = f3.toggle("Only records with bad spans", value=True, key="data.only_bad", persist_state="session")
        pool = overview.browse(records, split, chosen_sources, only_bad)
        if not pool:
            st.warning("No record matches these filters.")
        else:
            i = st.number_input(
                f"Record (of {len(pool)})", 0, len(pool) - 1, 0, key="data.index", persist_state="session"
            )
            r = pool[int(i)]
            kinds = Counter(s.kind for s in r.bad_spans)
            st.markdown(
                f"**{r.id}** · source `{r.source}` · task `{r.task}` · sequence label "
                f"**{'faithful' if r.sequence_label else 'unfaithful'}**"
                + (" · edits: " + ", ".join(f"`{k}`×{n}" for k, n in kinds.items()) if kinds else "")
            )
            left, right = st.columns([3, 2], gap="large")
            with left:
                st.markdown("**Response** (gold token labels, model tokenizer)")
                try:
                    tokens, gold = overview.response_tokens(base_model(current_spec()).tokenizer, r)
                    st.markdown(token_html(tokens, gold=gold), unsafe_allow_html=True)
                    st.markdown(legend_html(with_head=False), unsafe_allow_html=True)
                    if gold is None:
                        st.caption("This record has a sequence label only (no token labels).")
                except Exception as ex:
                    load_error(ex)
                if r.faithful_response and r.faithful_response != r.response:
                    st.markdown("**Faithful response it pairs with**")
                    st.markdown(f"> {r.faithful_response}")
            with right:
                st.markdown("**Document**")
                with st.container(height=320):
                    st.write(r.document)

with tab_labels:
    st.markdown(
        "Label-sensitivity settings (docs/design.md §2): the token labels TOPL would be trained on under each "
        "setting, counted on the current model's tokens."
    )
    path_l = dataset_picker("data.labels_dataset")
    if path_l:
        c1, c2, c3 = st.columns(3)
        split_l = c1.selectbox("Split", [*SPLITS, overview.ALL], key="data.labels_split", persist_state="session")
        limit = c2.number_input(
            "Records (at most)", 10, 100_000, 300, step=50, key="data.labels_limit", persist_state="session"
        )
        seed = c3.number_input("Seed", 0, 10_000, 0, key="data.labels_seed", persist_state="session")
        try:
            table = label_table(path_l, Path(path_l).stat().st_mtime, current_spec(), split_l, int(limit), int(seed))
        except (DataError, OSError) as ex:  # the data set, not the model
            table = None
            st.error(f"**Cannot read this data set.** {ex}")
        except Exception as ex:
            table = None
            load_error(ex)
        if table is not None and table.empty:
            st.warning("No token-labelled records in this split.")
        elif table is not None:
            st.dataframe(
                table,
                hide_index=True,
                key="data.labels_table",
                column_config={
                    "pct_good": st.column_config.NumberColumn("% good", format="%.1f"),
                    "pct_bad": st.column_config.NumberColumn("% bad", format="%.1f"),
                },
            )
            plot(label_settings_bars(table), key="data.labels_fig")
            csv_download(table, "label_settings.csv", key="data.labels_csv")

with tab_build:
    st.markdown(
        "Build a records JSONL under `cache/data/` from any supported source; it then appears in every "
        "data-set picker (Train, Token overlay, Evaluation …)."
    )
    b1, b2 = st.columns([1, 2])
    source = SOURCES[b1.selectbox("Source", list(SOURCES), key="data.build_source", persist_state="session")]
    b2.info(source.help)
    build_form(source)
    with st.expander("Merge data sets (e.g. perturbations + the model's own summaries)"):
        merge_form()
