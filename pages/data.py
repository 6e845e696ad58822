"""Data: browse examples with gold labels as colored tokens; label-sensitivity variants with their stats; build or
import a data set (perturbation generator, HaluEval pairs, FAVA, CLIFF/AggreFact CSV, MLQE-PE, JSONL; the model's own
summaries as a background job) and merge data sets."""

from pages._ui.frame import ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

import re
from collections import Counter
from pathlib import Path

import pandas as pd
import plotly.express as px
import streamlit as st

from pages._ui.datasets import dataset_paths, dataset_picker, records_of
from pages._ui.forms import field_input
from pages._ui.models import base_model, load_error
from pages._ui.render import csv_download, legend_html, plot, token_html
from pages._ui.spec import current_model_name, current_spec
from topl_core import jobs, launchers
from topl_core.analysis.evaluation.config import EvalConfig
from topl_core.config_fields import field_infos
from topl_core.data.encode import encode_record
from topl_core.data.records import Record, merge_jsonl, write_jsonl
from topl_core.data.sources import SOURCES, DataSource, SourceOptions, read_source
from topl_core.data.split import split_records
from topl_core.data.variants import label_settings_table
from topl_core.errors import ConfigError, DataError
from topl_core.models import DEVICES
from topl_core.paths import cache_dir, inside

st.title("Data")
st.caption("Token-level supervision: a document, a response, and a good/bad label for every response token.")


@st.cache_data(show_spinner="Tokenizing and applying the label settings…", max_entries=16)
def label_table(path: str, mtime: float, spec: str, split: str, limit: int, seed: int) -> pd.DataFrame:
    records = records_of(path)
    if split != "all":
        records = split_records(records)[split]
    records = [r for r in records if r.token_labels_known][:limit]
    if not records:
        return pd.DataFrame()
    tok = base_model(spec).tokenizer
    return label_settings_table([encode_record(tok, r).response_labels for r in records], seed=seed)


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
        docs = len({r.doc_id for r in records})
        c = st.columns(4)
        c[0].metric("Records", len(records))
        c[1].metric("Documents", docs)
        c[2].metric(
            "With token labels", f"{100 * sum(r.token_labels_known for r in records) / max(1, len(records)):.0f}%"
        )
        c[3].metric("Unfaithful (sequence label 0)", sum(r.sequence_label == 0 for r in records))

        f1, f2, f3 = st.columns([2, 1, 1])
        sources = sorted({r.source for r in records})
        chosen_sources = f1.multiselect(
            "Sources", sources, default=sources, key="data.sources", persist_state="session"
        )
        split = f2.selectbox("Split", ["all", "train", "val", "test"], key="data.split", persist_state="session")
        only_bad = f3.toggle("Only records with bad spans", value=True, key="data.only_bad", persist_state="session")
        pool = records if split == "all" else split_records(records)[split]
        pool = [r for r in pool if r.source in chosen_sources and (r.bad_spans or not only_bad)]
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
                    tok = base_model(current_spec()).tokenizer
                    e = encode_record(tok, r, max_response_tokens=512)
                    tokens = [r.response[s:t] for s, t in e.response_offsets]
                    gold = e.response_labels if r.token_labels_known else None
                    st.markdown(token_html(tokens, gold=gold), unsafe_allow_html=True)
                    st.markdown(legend_html(with_head=False), unsafe_allow_html=True)
                    if not r.token_labels_known:
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
        split_l = c1.selectbox(
            "Split", ["train", "val", "test", "all"], key="data.labels_split", persist_state="session"
        )
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
            long = table.melt(id_vars="setting", value_vars=["good", "bad"], var_name="label", value_name="count")
            fig = px.bar(
                long,
                x="setting",
                y="count",
                color="label",
                barmode="stack",
                color_discrete_map={"good": "#16a34a", "bad": "#dc2626"},
                title="Supervised tokens per label setting",
            )
            plot(fig, key="data.labels_fig")
            csv_download(table, "label_settings.csv", key="data.labels_csv")

OPTIONS = field_infos(SourceOptions)  # the build form's inputs, as `data build` has them
BUILD_JOBS = cache_dir() / "data" / "jobs"  # one folder per background build (the generated sources), by output name
BAR_COUNT = re.compile(r"\] (\d+)/(\d+) ")  # "… [####....] 16/240  7% …": a progress.Bar line in a job log


def quick_builder(source: DataSource) -> None:
    """Read a file source (seconds) and write it here, in this session: an input for each option it reads."""
    input_path = None
    if "input" in source.options:
        input_path = st.text_input(
            OPTIONS["input"].label,
            key=f"data.build_input.{source.name}",
            persist_state="session",
            placeholder="" if source.input_required else "empty: its own file (see above)",
            help=OPTIONS["input"].help,
        )
        upload = st.file_uploader(
            "…or upload a file", type=["jsonl", "csv", "json"], key=f"data.build_upload.{source.name}"
        )
        if upload is not None:
            try:  # the browser sends the file's name: it becomes a path only inside cache/uploads
                up = inside(cache_dir() / "uploads", upload.name, "Uploaded file name")
                up.parent.mkdir(parents=True, exist_ok=True)
                up.write_bytes(upload.getvalue())
                input_path = str(up)
            except (ConfigError, OSError) as ex:
                st.error(str(ex))
    others = [name for name in source.options if name != "input"]
    columns = st.columns(max(1, len(others)))
    values = {
        name: field_input(column, SourceOptions, name, "data.build_", OPTIONS[name].default)
        for name, column in zip(others, columns)
    }
    out_name = st.text_input(
        "Output name", value=f"{source.name}.jsonl", key=f"data.build_out.{source.name}", persist_state="session"
    )
    if st.button("Build data set", type="primary", key="data.build_go", icon=":material/build:"):
        try:
            out = data_file(out_name)
            with st.spinner(f"Reading {source.name}…"):
                loaded = read_source(source, SourceOptions(input=input_path or None, **values))
                recs = loaded.records
                write_jsonl(recs, out)
            bad = sum(bool(r.bad_spans) for r in recs)
            wrote = f"Wrote {len(recs)} records ({bad} with bad spans) to `{out}`."
            st.success("\n\n".join(filter(None, [wrote, loaded.report])))
        except (DataError, ConfigError, OSError) as ex:
            st.error(str(ex))


def data_file(name: str) -> Path:
    """A file under cache/data named by the user: a plain name, .jsonl added when missing."""
    return inside(cache_dir() / "data", name if name.endswith(".jsonl") else name + ".jsonl", "Output name")


def own_summaries_builder() -> None:
    """Generate the model's own summaries in a background job (`data build --source own-summaries`): minutes to
    hours, so it outlives the page; the same settings started again resume from the cached chunks."""
    o1, o2, o3, o4 = st.columns([2, 1, 1, 1])
    model = o1.text_input(
        "Model that writes the summaries",
        value=current_model_name(),
        key="data.own_model",
        persist_state="session",
        help="an embedded model's name, a hub id or a local folder",
    )
    limit = o2.number_input("HaluEval documents", 1, 10_000, 240, key="data.own_limit", persist_state="session")
    max_new = o3.number_input(
        "Max new tokens", 8, 1024, EvalConfig.max_new_tokens, key="data.own_max_new", persist_state="session"
    )
    device = o4.selectbox("Device", list(DEVICES), key="data.own_device", persist_state="session")
    out_name = st.text_input(
        "Output name", value="own-summaries.jsonl", key="data.build_out.own-summaries", persist_state="session"
    )
    if st.button("Start generating", type="primary", key="data.own_go", icon=":material/play_arrow:"):
        try:
            out = data_file(out_name)
            job_dir = inside(BUILD_JOBS, out.stem, "Output name")
            launchers.launch_own_summaries(model.strip(), int(limit), int(max_new), device, out, job_dir)
        except (ConfigError, jobs.JobError) as ex:
            st.error(str(ex))
    job_dir = newest_build_job()
    if job_dir is not None:
        job = jobs.read_job(job_dir)
        st.fragment(build_job_panel, run_every=2 if job is not None and job.active else None)(job_dir)


def newest_build_job() -> Path | None:
    found = [p for p in BUILD_JOBS.glob("*") if (p / jobs.JOB_FILE).exists()] if BUILD_JOBS.is_dir() else []
    return max(found, key=lambda p: (p / jobs.JOB_FILE).stat().st_mtime, default=None)


def build_job_panel(job_dir: Path) -> None:
    """The newest background build: its progress and Cancel while it runs, then what it wrote or why it stopped."""
    job = jobs.read_job(job_dir)
    if job is None:
        return
    info = jobs.job_info(job_dir)
    if "out" not in info:  # a build started by an older version, which stored no info: nothing to show
        return
    out = info["out"]
    log = jobs.log_tail(job_dir, 40)
    was_running = st.session_state.get("data.own_was_running")
    st.session_state["data.own_was_running"] = job.active
    if job.active:
        counts = BAR_COUNT.findall(log)
        done, total = map(int, counts[-1]) if counts else (0, int(info["limit"]))
        c1, c2 = st.columns([5, 1], vertical_alignment="center")
        c1.progress(done / max(total, 1), text=f"`{Path(out).name}` {job.state}: {done} of {total} summaries")
        if c2.button("Cancel", key="data.own_cancel", icon=":material/stop:"):
            jobs.cancel(job_dir)
        return
    if was_running:  # it just ended: every data-set picker should see the new file
        st.rerun(scope="app")
    if job.state == "finished":
        report = [ln for ln in log.splitlines() if ln.startswith(("own summaries:", "wrote "))]
        st.success("\n\n".join([f"`{Path(out).name}` built.", *report]))
    else:
        st.warning(
            f"Building `{Path(out).name}` {job.state}{': ' + job.error if job.error else ''}. Start it again with "
            "the same settings to resume: finished chunks of summaries are kept."
        )
        st.code(jobs.log_tail(job_dir, 15) or "(empty log)", language=None)


def merge_form() -> None:
    paths = dataset_paths()
    chosen = st.multiselect("Data sets, in order", paths, key="data.merge_inputs", format_func=lambda p: Path(p).name)
    out_name = st.text_input("Output name", value="merged.jsonl", key="data.merge_out", persist_state="session")
    if st.button("Merge", key="data.merge_go", icon=":material/merge:", disabled=len(chosen) < 2):
        try:
            records = merge_jsonl(chosen)
            out = write_jsonl(records, data_file(out_name))
            st.success(f"Wrote {len(records)} records from {len(chosen)} files to `{out}`.")
        except (DataError, ConfigError, OSError) as ex:
            st.error(str(ex))


with tab_build:
    st.markdown(
        "Build a records JSONL under `cache/data/` from any supported source; it then appears in every "
        "data-set picker (Train, Token overlay, Evaluation …)."
    )
    b1, b2 = st.columns([1, 2])
    source = SOURCES[b1.selectbox("Source", list(SOURCES), key="data.build_source", persist_state="session")]
    b2.info(source.help)
    if source.generated:  # own-summaries: a background job
        own_summaries_builder()
    else:
        quick_builder(source)
    with st.expander("Merge data sets (e.g. perturbations + the model's own summaries)"):
        merge_form()
