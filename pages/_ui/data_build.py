"""The Data page's build and merge forms: any data source's build form, made from its registry entry (the inputs of the
options it reads, an upload where it reads a file, a background job where it runs one), the newest background build's
progress, and the merge of data sets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import streamlit as st

from pages._ui.datasets import dataset_paths
from pages._ui.forms import SIDEBAR_FIELDS, field_input
from pages._ui.jobs import follow, job_failure, job_row
from pages._ui.spec import current_spec, split_spec
from topl_core.data.records import merge_jsonl, write_jsonl
from topl_core.data.sources import DataSource, SourceOptions, build_source
from topl_core.foundations.config_fields import field_infos
from topl_core.foundations.errors import ConfigError, DataError
from topl_core.foundations.paths import cache_dir, inside
from topl_core.jobs import background, launchers
from topl_core.jobs.background import JobStatus

BUILD_JOBS = cache_dir() / "data" / "jobs"  # one folder per background build, by output name
KEY = "data.build_"  # the build job panel's widget keys


def data_file(name: str) -> Path:
    """A file under cache/data named by the user: a plain name, .jsonl added when missing."""
    return inside(cache_dir() / "data", name if name.endswith(".jsonl") else name + ".jsonl", "Output name")


def build_form(source: DataSource) -> None:
    """An input for each option `source` reads (keyed data.build.<source>.<option>, starting at its options' defaults;
    a model or device at the sidebar's), the output name and the button: a build in this session, or in the
    background for a source that runs there (then the newest background build below)."""
    key = f"data.build.{source.name}."
    name, _dtype, device = split_spec(current_spec())
    sidebar = {"model": name, "device": device}
    defaults = dataclasses.replace(
        source.options_type(), **{k: sidebar[k] for k in SIDEBAR_FIELDS & set(source.options)}
    )
    values = {"input": input_path(source, key)} if "input" in source.options else {}
    others = [o for o in source.options if o != "input"]
    for o, column in zip(others, st.columns(max(1, len(others)))):
        values[o] = field_input(column, source.options_type, o, key, getattr(defaults, o))
    out_name = st.text_input("Output name", value=f"{source.name}.jsonl", key=key + "out", persist_state="session")
    label, icon = ("Start generating", "play_arrow") if source.background else ("Build data set", "build")
    if st.button(label, type="primary", key="data.build_go", icon=f":material/{icon}:"):
        try:
            options = source.options_type(**{o: v.strip() if isinstance(v, str) else v for o, v in values.items()})
            if source.background:
                start_build(source, options, data_file(out_name))
            else:
                build_here(source, options, data_file(out_name))
        except (DataError, ConfigError, OSError, background.JobError) as ex:
            st.error(str(ex))
    if source.background and (found := background.list_jobs(BUILD_JOBS)):
        follow(found[0].path, KEY, build_job_panel)  # the newest background build, of any source


def input_path(source: DataSource, key: str) -> str | None:
    """The input path typed, or the file uploaded (kept under cache/uploads); None for neither."""
    info = field_infos(SourceOptions)["input"]
    placeholder = "" if source.input_required else "empty: its own file (see above)"
    path = st.text_input(
        info.label, key=key + "input", persist_state="session", placeholder=placeholder, help=info.help
    )
    upload = st.file_uploader("…or upload a file", type=["jsonl", "csv", "json"], key=key + "upload")
    if upload is not None:
        try:  # the browser sends the file's name: it becomes a path only inside cache/uploads
            up = inside(cache_dir() / "uploads", upload.name, "Uploaded file name")
            up.parent.mkdir(parents=True, exist_ok=True)
            up.write_bytes(upload.getvalue())
            path = str(up)
        except (ConfigError, OSError) as ex:
            st.error(str(ex))
    return path or None


def build_here(source: DataSource, options: SourceOptions, out: Path) -> None:
    """Build a source that takes seconds in this session, and say what was written."""
    with st.spinner(f"Reading {source.name}…"):
        loaded = build_source(source, options)
        write_jsonl(loaded.records, out)
    bad = sum(bool(r.bad_spans) for r in loaded.records)
    wrote = f"Wrote {len(loaded.records)} records ({bad} with bad spans) to `{out}`."
    st.success("\n\n".join(filter(None, [wrote, loaded.report])))


def start_build(source: DataSource, options: SourceOptions, out: Path) -> None:
    """Start `data build` of a source that takes minutes to hours as a background job: it outlives the page."""
    launchers.launch_data_build(source, options, out, inside(BUILD_JOBS, out.stem, "Output name"))


def build_job_panel(job: JobStatus | None) -> None:
    """A background build: its progress and Cancel while it runs, then what it wrote or why it stopped."""
    build = launchers.read_data_build(job.path) if job is not None else None
    if build is None:  # a build started by an older version, which stored no info: nothing to show
        return
    name = f"`{build.out.name}` ({build.source})"
    if build.job.active:
        text = f"{name} {build.job.state}: {build.done} of {build.total}"
        job_row(build.job, KEY, build.done / max(build.total, 1), text, stop="Cancel")
    elif build.job.state == "finished":
        st.success("\n\n".join([f"{name} built.", *build.said]))
    else:
        why = f"{build.job.state}: {build.job.error}" if build.job.error else build.job.state
        again = (
            "Start it again with the same settings to continue (the source's help above says what a stopped build "
            "keeps)."
        )
        job_failure(job.path, f"Building {name} {why}. {again}", lines=15, warn=True)


def merge_form() -> None:
    """Join data sets, in order, into one (records that occur twice are refused)."""
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
