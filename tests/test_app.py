"""The Streamlit workbench, tested the way it is really run: AppTest.from_file("app.py"), then each page selected
through the app's own st.navigation (so app.py's sidebar model picker is rendered around every page — the
AppTest/st.navigation trap of docs/design.md §4 is checked, not assumed). Tiny random model, tiny adapters trained in a
temporary runs directory (TOPL_RUNS_DIR / TOPL_CACHE_DIR), all offline on CPU.

Also the background jobs of topl_core.jobs.background: a detached training process, cancel by SIGTERM (checkpoint kept,
state "cancelled"), resume to the end, and the run list read back from disk."""

from __future__ import annotations

import ast
import base64
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from conftest import steerable_topl_run, tiny_config, write_mlqe

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
APP = str(REPO / "app.py")
PAGES = [
    "home",
    "data",
    "train",
    "runs",
    "lora_a",
    "steering",
    "token_overlay",
    "talk",
    "layer_sweep",
    "evaluation",
    "reproduce",
]
TIMEOUT = 300  # generous: the machine running the tests may be shared


def build_workbench(root: Path, records) -> dict:
    """A cache (one data set) and runs dir under root: a TOPL run strong enough to steer (conftest.steerable_topl_run:
    trained once per session), and an SFT run. Returns paths and the environment that points the app at them (shared
    with tests/test_browser.py)."""
    from topl_core.data.records import write_jsonl
    from topl_core.training.trainer import train

    data = root / "cache" / "data" / "tiny-perturbed.jsonl"
    write_jsonl(records, data)
    runs = root / "runs"
    steerable_topl_run(data, runs / "topl-tiny", records)
    sft = tiny_config(method="sft", lr=0.01, steps=2, data=str(data), max_doc_tokens=64)
    train(sft, runs / "sft-tiny", records=records)
    env = {
        "TOPL_CACHE_DIR": str(root / "cache"),
        "TOPL_RUNS_DIR": str(runs),
        "TOPL_DEFAULT_MODEL": "tiny-llama",
        "TOPL_EXAMPLES_DIR": "",
    }  # the shipped SmolLM2 demo adapters are tested on their own
    return {"root": root, "data": data, "runs": runs, "env": env}


@pytest.fixture(scope="module")
def workbench(tmp_path_factory, tiny_records):
    wb = build_workbench(tmp_path_factory.mktemp("workbench"), tiny_records)
    old = {k: os.environ.get(k) for k in wb["env"]}
    os.environ.update(wb["env"])
    yield wb
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def open_page(name: str) -> AppTest:
    """Run app.py, then switch to a page through the app's navigation; the sidebar must be there."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if name != "home":
        at.switch_page(f"pages/{name}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    labels = [s.label for s in at.sidebar.selectbox]
    assert "Model" in labels, f"page {name} rendered without app.py's sidebar model picker (navigation trap)"
    assert at.session_state["model_spec"] == "tiny-llama|fp32|cpu"
    return at


def figures(at: AppTest) -> list[dict]:
    return [json.loads(e.proto.spec) for e in at.get("plotly_chart")]


def array(v) -> np.ndarray:
    """A plotly trace array: a list, or plotly 6+'s typed-array dict {dtype, bdata, shape}."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return a.reshape([int(x) for x in str(v["shape"]).split(",")]) if "shape" in v else a
    return np.asarray(v, dtype=float)


def html_boxes(at: AppTest) -> list[str]:
    """The text boxes' markdown, from the box on (the shared CSS block before it is dropped)."""
    return [m.value[m.value.index('<div style="font-weight') :] for m in at.markdown if 'class="topl-box"' in m.value]


def box_body(box: str) -> str:
    return box.split('class="topl-box">', 1)[1].split("</div>", 1)[0]


# --- the navigation frame ---------------------------------------------------------------------------------------


def test_every_page_enters_the_app_frame_first():
    """With a pages/ folder Streamlit's legacy router runs a page *file* directly (no app.py, no sidebar), and a URL
    that names no file gets a "Page not found" dialog. So url paths equal file names, and every page starts with
    ensure_frame() (pages/_ui/frame.py), which re-enters the frame when the router ran the file directly."""
    from pages._ui.frame import PAGES as NAV

    stems = [stem for items in NAV.values() for stem, _, _ in items]
    assert sorted(stems) == sorted(PAGES)
    # the router runs every pages/*.py file as a page (a leading "_" does not hide it): the shared helpers live in
    # the pages/_ui/ package, which it does not look into
    assert sorted(p.stem for p in (REPO / "pages").glob("*.py")) == sorted(PAGES)
    for stem in stems:
        body = ast.parse((REPO / "pages" / f"{stem}.py").read_text()).body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        first, second = body[:2]
        assert isinstance(first, ast.ImportFrom) and first.module == "pages._ui.frame", stem
        assert ast.unparse(second) == "ensure_frame()", f"{stem}: ensure_frame() must come before anything else"


@pytest.mark.parametrize("name", PAGES)
def test_every_page_renders_inside_the_app_frame(workbench, name):
    at = open_page(name)
    assert at.title, f"{name}: no title"
    assert not [e.value for e in at.error if "analysis core" in e.value], "the page could not import the analysis core"


# --- every page has an answer for every state ------------------------------------------------------------------

ANALYSIS_PAGES = ["lora_a", "steering", "token_overlay", "evaluation"]


def page_messages(at: AppTest) -> str:
    return " ".join(m.value for m in [*at.info, *at.warning, *at.error])


@pytest.mark.parametrize("name", PAGES)
def test_every_page_answers_an_empty_workbench(workbench, monkeypatch, tmp_path, name):
    """No runs, no data set, no demo adapters: no traceback, and the analysis pages name the next step."""
    monkeypatch.setenv("TOPL_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TOPL_EXAMPLES_DIR", "")
    at = open_page(name)
    assert at.title
    said = page_messages(at)
    if name in ANALYSIS_PAGES and name != "evaluation":
        assert "No finished run" in said and "**Train** page" in said, said
    if name == "data":
        assert "No data set yet" in said


def _copy_run(src: Path, dst: Path, **status) -> Path:
    import shutil

    from topl_core.training.run_dirs import RunDir

    shutil.copytree(src, dst)
    for f in ("job.json", "STOP"):
        (dst / f).unlink(missing_ok=True)
    if status:
        st = RunDir(dst).read_status()
        RunDir(dst).write_status(**{"step": st["step"], "steps": st["steps"], **status})
    return dst


def test_pages_answer_runs_in_every_state(workbench, monkeypatch, tmp_path):
    """Only a failed run, a run still training (this process stands in for its trainer) and a finished run of
    another model: the pickers offer nothing, and say that a run is still training and which model has finished
    runs. Then an SFT run without a head: the pickers offer it, and the Token overlay offers a probe head for it,
    fits it on a click and colours the tokens with it."""
    import json as _json
    import subprocess
    import sys

    runs = tmp_path / "runs"
    # a live process whose command line names topl_core stands in for the trainer of the running run
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "topl_core"])
    _copy_run(workbench["runs"] / "topl-tiny", runs / "topl-failed", state="failed", error="RuntimeError: boom")
    _copy_run(workbench["runs"] / "topl-tiny", runs / "topl-training", state="running", pid=trainer.pid)
    other = _copy_run(workbench["runs"] / "topl-tiny", runs / "topl-other-model")
    cfg = _json.loads((other / "topl_config.json").read_text())
    cfg["config"]["model"] = "tiny-qwen3"
    (other / "topl_config.json").write_text(_json.dumps(cfg))
    monkeypatch.setenv("TOPL_RUNS_DIR", str(runs))

    try:
        at = open_page("token_overlay")
        said = page_messages(at)
        assert "No finished run for" in said and "still training" in said and "tiny-qwen3" in said, said
        _copy_run(workbench["runs"] / "sft-tiny", runs / "sft-no-head")
        time.sleep(2.1)  # the runs table is cached for 2 s
        at = open_page("token_overlay")
        assert "sft-no-head** has no head" in page_messages(at)
        assert not any('<div class="topl-tokens">' in m.value for m in at.markdown)
        at.button(key="overlay.fit_probe").click().run()
        assert not at.exception, at.exception
        assert "Probe head at layer 2:" in " ".join(c.value for c in at.caption)  # the run's last LoRA layer
        assert any('<div class="topl-tokens">' in m.value for m in at.markdown)  # tokens coloured by the probe head
        at = open_page("lora_a")
        assert at.session_state["lora_a.run_a"].endswith("sft-no-head")  # the only finished tiny-llama adapter
        at = open_page("runs")
        assert set(at.dataframe[0].value["state"]) >= {"failed", "running", "finished"}
    finally:
        trainer.kill()
        trainer.wait()


def test_shipped_examples_are_listed_beside_the_users_runs_and_open(workbench, monkeypatch, tmp_path):
    """Adapters in the examples folder (the shipped demos; here the tiny runs) appear, marked as examples, beside
    the user's runs (none here) and open on the analysis pages."""
    monkeypatch.setenv("TOPL_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("TOPL_EXAMPLES_DIR", str(workbench["runs"]))
    at = open_page("home")
    runs = at.dataframe[0].value
    assert {"example: topl-tiny", "example: sft-tiny"} <= set(runs["run"])
    at = open_page("steering")
    assert at.session_state["steer.run"] == str(workbench["runs"] / "topl-tiny")
    assert len(html_boxes(at)) == 3  # base | merged | steered from the example adapter


def test_model_picker_sets_the_spec_for_every_page(workbench):
    at = open_page("home")
    at.sidebar.selectbox(key="sidebar.model_choice").set_value("tiny-qwen3").run()
    assert at.session_state["model_spec"] == "tiny-qwen3|fp32|cpu"
    assert not at.exception
    at.switch_page("pages/data.py").run()
    assert at.session_state["model_spec"] == "tiny-qwen3|fp32|cpu"
    assert at.sidebar.selectbox(key="sidebar.model_choice").value == "tiny-qwen3"


def test_custom_model_error_is_shown_not_raised(workbench):
    at = open_page("home")
    at.sidebar.selectbox(key="sidebar.model_choice").set_value(
        at.sidebar.selectbox(key="sidebar.model_choice").options[-1]
    )
    at.run()
    at.sidebar.text_input(key="sidebar.model_custom").set_value(str(workbench["root"] / "no-such-model")).run()
    assert not at.exception
    assert any("Could not load the model" in e.value for e in at.error)


# --- pages ------------------------------------------------------------------------------------------------------


def test_home_shows_model_and_adapters(workbench):
    at = open_page("home")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Layers"] == "4" and metrics["Hidden size"] == "64"
    runs = at.dataframe[0].value
    assert {"topl-tiny", "sft-tiny"} <= set(runs["run"])


def test_data_browse_labels_and_build(workbench):
    at = open_page("data")
    tokens = [m.value for m in at.markdown if "topl-tokens" in m.value]
    assert tokens and "rgba(220,38,38" in tokens[0], "the browsed record shows no bad (red) token"
    first = tokens[0]
    at.number_input(key="data.index").set_value(1).run()
    assert [m.value for m in at.markdown if "topl-tokens" in m.value][0] != first
    # label settings: one row per setting with token counts
    table = next(d.value for d in at.dataframe if "setting" in d.value.columns)
    assert len(table) == 7 and (table["tokens"] > 0).all()
    # build: import the JSONL back under another name
    at.selectbox(key="data.build_source").set_value("jsonl").run()
    at.text_input(key="data.build.jsonl.input").set_value(str(workbench["data"])).run()
    at.text_input(key="data.build.jsonl.out").set_value("copy.jsonl").run()
    at.button(key="data.build_go").click().run()
    assert not at.exception
    assert any("Wrote 80 records" in s.value for s in at.success)
    assert (workbench["root"] / "cache" / "data" / "copy.jsonl").exists()
    # a name that would leave the data folder is refused, and nothing is written
    for name in ("../../escaped.jsonl", "/tmp/escaped.jsonl", "sub/../../escaped.jsonl"):
        at.text_input(key="data.build.jsonl.out").set_value(name).run()
        at.button(key="data.build_go").click().run()
        assert not at.exception and any("use a plain name" in e.value for e in at.error), name
    assert not list(workbench["root"].rglob("escaped.jsonl")) and not Path("/tmp/escaped.jsonl").exists()


def test_a_data_source_added_in_one_place_reaches_the_cli_and_the_data_page(workbench, monkeypatch, tmp_path, capsys):
    """A data source is one entry of the source registry (analysis/studies/data_sources.py's SOURCES). Inserted here
    (tab-separated lines of document, response and its bad words), it is a `data build --source` choice with its
    help, builds in-process, and the Data page lists it, shows its help and the inputs of the options it reads (only
    those), and builds the same records."""
    from topl_core.analysis.studies.data_sources import SOURCES
    from topl_core.cli import build_parser, main
    from topl_core.data.records import Record, Span, read_jsonl
    from topl_core.data.sources import DataSource, Loaded

    def load_tsv(options, progress) -> Loaded:
        records = []
        for i, line in enumerate(Path(options.input).read_text().splitlines()[: options.limit]):
            document, response, bad = line.split("\t")
            start = response.index(bad)
            span = Span(start, start + len(bad), "entity")
            records.append(Record(id=f"tsv-{i}", document=document, response=response, bad_spans=(span,), source="tsv"))
        return Loaded(records)

    help = "Tab-separated document, response and its bad words."
    monkeypatch.setitem(SOURCES, "tsv", DataSource("tsv", help, ("input", "limit"), load_tsv))
    tsv = tmp_path / "tiny.tsv"
    tsv.write_text("Paris is in France.\tParis is in Spain.\tSpain\nThe cat sat.\tThe dog sat.\tdog\nA b.\tA c.\tc\n")

    with pytest.raises(SystemExit):
        build_parser(["data", "build", "--help"]).parse_args(["data", "build", "--help"])
    assert f"tsv: {help}" in capsys.readouterr().out
    argv = ["data", "build", "--source", "tsv", "--input", str(tsv), "--limit", "2", "--out", str(tmp_path / "c.jsonl")]
    assert main(argv) == 0
    from_cli = read_jsonl(tmp_path / "c.jsonl")
    assert [r.bad_texts for r in from_cli] == [["Spain"], ["dog"]]

    at = open_page("data")
    assert "tsv" in at.selectbox(key="data.build_source").options
    at.selectbox(key="data.build_source").set_value("tsv").run()
    assert help in [i.value for i in at.info]
    shown = {w.key for widgets in (at.selectbox, at.number_input, at.text_input) for w in widgets}
    assert "data.build.tsv.limit" in shown and at.number_input(key="data.build.tsv.limit").value == 600
    assert not {k for k in shown if k.startswith("data.build.tsv.")} - {
        f"data.build.tsv.{o}" for o in ("input", "limit", "out")
    }
    at.text_input(key="data.build.tsv.input").set_value(str(tsv)).run()
    at.button(key="data.build_go").click().run()
    assert not at.exception and any("Wrote 3 records (3 with bad spans)" in s.value for s in at.success)
    assert read_jsonl(workbench["root"] / "cache" / "data" / "tsv.jsonl")[:2] == from_cli


def test_a_data_source_a_model_writes_reaches_the_cli_the_data_page_and_the_launcher(
    workbench, monkeypatch, tmp_path, capsys
):
    """A source that runs in the background, with options of its own (the model that writes, a bool) and its own
    default limit, is one entry of the registry. Inserted here, `data build --source` offers it with its flags, typed,
    and builds it at its defaults; the Data page lists it with an input for each option it reads (the model at the
    sidebar's, no input path: it reads none) and starts it through the launcher, whose command line the CLI reads
    back to the same options and builds (what the job process runs)."""
    import dataclasses

    from topl_core.analysis.studies.data_sources import SOURCES
    from topl_core.cli import build_parser, main
    from topl_core.cli.data import options_of
    from topl_core.data.records import Record, read_jsonl
    from topl_core.data.sources import DataSource, Loaded, SourceOptions
    from topl_core.foundations.config_fields import config_field
    from topl_core.jobs import launchers

    @dataclasses.dataclass(frozen=True)
    class EchoOptions(SourceOptions):
        limit: int = config_field(2, label="Documents", help="documents to summarise", min=1)
        model: str = config_field("nobody", label="Model", help="the model whose name each summary says")
        shout: bool = config_field(False, label="Shout", help="upper-case the summaries")

    def build_echo(o: EchoOptions, progress) -> Loaded:
        records = []
        for i in range(o.limit):
            text = f"{o.model} wrote summary {i}."
            response = text.upper() if o.shout else text
            records.append(Record(id=f"echo-{i}", document=f"Document {i}.", response=response, source="echo"))
            progress(i + 1, o.limit)
        return Loaded(records, f"echo: {len(records)} summaries")

    help = "Each document summarised by a model that only says its name."
    options = ("model", "limit", "shout")
    entry = DataSource(
        "echo", help, options, build_echo, input_required=False, options_type=EchoOptions, background=True
    )
    monkeypatch.setitem(SOURCES, "echo", entry)

    with pytest.raises(SystemExit):
        build_parser(["data", "build", "--help"]).parse_args(["data", "build", "--help"])
    shown_help = capsys.readouterr().out
    assert f"echo: {help}" in shown_help and "--shout" in shown_help and "echo: default nobody" in shown_help
    assert main(["data", "build", "--source", "echo", "--shout", "--out", str(tmp_path / "cli.jsonl")]) == 0
    assert [r.response for r in read_jsonl(tmp_path / "cli.jsonl")] == [f"NOBODY WROTE SUMMARY {i}." for i in range(2)]

    launched = []

    def launch(argv, job_dir, **kw) -> Path:  # the job process would run `python -m topl_core <argv>`
        launched.append((argv, Path(job_dir), kw))
        return Path(job_dir)

    monkeypatch.setattr(launchers, "launch", launch)
    at = open_page("data")
    assert "echo" in at.selectbox(key="data.build_source").options
    at.selectbox(key="data.build_source").set_value("echo").run()
    assert help in [i.value for i in at.info]
    widgets = (at.text_input, at.number_input, at.toggle, at.selectbox)
    keys = {w.key for ws in widgets for w in ws if w.key and w.key.startswith("data.build.echo.")}
    assert keys == {f"data.build.echo.{o}" for o in (*options, "out")}
    assert at.text_input(key="data.build.echo.model").value == "tiny-llama"  # the sidebar's model
    assert at.number_input(key="data.build.echo.limit").value == 2
    at.number_input(key="data.build.echo.limit").set_value(3)
    at.toggle(key="data.build.echo.shout").set_value(True)
    at.button(key="data.build_go").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    ((argv, job_dir, kw),) = launched
    data_dir = workbench["root"] / "cache" / "data"
    assert job_dir == data_dir / "jobs" / "echo" and kw["info"]["out"] == str(data_dir / "echo.jsonl")
    assert options_of(build_parser(argv).parse_args(argv), entry) == EchoOptions(
        limit=3, model="tiny-llama", shout=True
    )
    assert main(argv) == 0
    assert [r.response for r in read_jsonl(data_dir / "echo.jsonl")] == [
        f"TINY-LLAMA WROTE SUMMARY {i}." for i in range(3)
    ]


def test_data_page_builds_own_summaries_in_the_background_and_merges(workbench):
    """The own-summaries source runs `data build --source own-summaries` as a background job from the Data page (SmolLM2
    needs about a minute for one batch of summaries: docs/reliability.md, "Figures behind the tests' choices"; so the
    tiny model writes them here: its random text keeps no sentence, and the page says why the build failed and how to
    resume). Merge joins data sets in order and refuses files that share records."""
    import dataclasses

    from topl_core.data.records import read_jsonl, write_jsonl
    from topl_core.jobs import background

    data_dir = workbench["root"] / "cache" / "data"
    at = open_page("data")
    at.selectbox(key="data.build_source").set_value("own-summaries").run()
    assert at.text_input(key="data.build.own-summaries.model").value == "tiny-llama"  # the sidebar's model
    assert at.number_input(key="data.build.own-summaries.limit").value == 240  # the source's own default
    at.number_input(key="data.build.own-summaries.limit").set_value(3)
    at.text_input(key="data.build.own-summaries.out").set_value("own-tiny").run()
    at.button(key="data.build_go").click().run()
    job_dir = data_dir / "jobs" / "own-tiny"
    assert background.wait(job_dir, timeout_s=TIMEOUT).state == "failed", background.log_tail(job_dir)
    assert "--limit 3 --model tiny-llama" in background.log_tail(job_dir)
    at.run()
    assert any("Start it again with the same settings" in w.value for w in at.warning)
    assert any("no records to write" in c.value for c in at.code), [c.value for c in at.code]
    assert not (data_dir / "own-tiny.jsonl").exists()

    records = read_jsonl(workbench["data"])
    other = [dataclasses.replace(r, id=r.id + ":copy") for r in records[:3]]
    write_jsonl(other, data_dir / "other.jsonl")
    at.multiselect(key="data.merge_inputs").set_value([str(workbench["data"]), str(data_dir / "other.jsonl")])
    at.text_input(key="data.merge_out").set_value("mix").run()
    at.button(key="data.merge_go").click().run()
    assert read_jsonl(data_dir / "mix.jsonl") == records + other
    at.multiselect(key="data.merge_inputs").set_value([str(workbench["data"]), str(data_dir / "mix.jsonl")]).run()
    at.button(key="data.merge_go").click().run()  # the same records twice: refused
    assert any("occurs more than once" in e.value for e in at.error)


def test_train_form_keeps_its_values_across_a_page_switch(workbench):
    """Streamlit drops the state of widgets that are not rendered: without persist_state the Train form came back
    from another page on its inputs' minimums (lr 1e-7, batch 1, layers 0–0). Both the defaults and the user's
    choices must survive a visit to another page. (Edits inside the form that were never submitted are not sent to
    the app: Streamlit forms hold them in the browser.)"""
    from topl_core.training.config import TrainConfig

    at = open_page("train")
    assert at.number_input(key="train.lr").value == TrainConfig().lr
    at.selectbox(key="train.method").set_value("tldr").run()  # fills the form with TLDR's defaults: all layers
    at.switch_page("pages/data.py").run()
    at.switch_page("pages/train.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="train.method").value == "tldr"
    assert at.number_input(key="train.lr").value == TrainConfig(method="tldr").lr
    assert at.number_input(key="train.batch_size").value == TrainConfig(method="tldr").batch_size
    assert (at.number_input(key="train.layer_start").value, at.number_input(key="train.layer_end").value) == (0, 3)
    assert at.text_input(key="train.run_name").value.startswith("tldr-")


def test_train_form_has_an_input_for_every_trainconfig_field(workbench):
    """Every TrainConfig field (and LoRA field) has an input keyed train.<field> — laid out by hand or generated
    from the dataclass — except model and device, which the sidebar sets; so a new field reaches the form as it
    reaches the CLI. The generated inputs start at the dataclass defaults."""
    import dataclasses

    from topl_core.training.config import LoraSettings, TrainConfig

    at = open_page("train")
    widgets = [*at.number_input, *at.selectbox, *at.text_input, *at.multiselect, *at.toggle]
    keys = {w.key.removeprefix("train.") for w in widgets if w.key and w.key.startswith("train.")}
    want = {f.name for f in dataclasses.fields(TrainConfig)} - {"model", "device", "lora"}
    want |= {f.name for f in dataclasses.fields(LoraSettings)}
    assert want <= keys, sorted(want - keys)
    for name in ("weight_decay", "warmup_steps", "tdpo_alpha", "max_grad_norm", "split_seed"):
        assert at.session_state[f"train.{name}"] == getattr(TrainConfig(), name)


# What the Layer-sweep form does not ask: the sidebar's model and device, the method (a sweep trains TOPL), the LoRA
# layers (each window's), the validation and checkpoint schedule (follows the steps, as in the CLI), the losses of
# other methods, and SweepConfig's explicit windows (the CLI's --windows) — its `train` is asked field by field.
SWEEP_NOT_ASKED = {
    "model",
    "device",
    "method",
    "layer_start",
    "layer_end",
    "eval_every",
    "checkpoint_every",
    "beta",
    "tdpo_alpha",
    "probe_layers",
    "train",
    "windows",
}


def form_keys(at: AppTest, prefix: str) -> set[str]:
    widgets = [*at.number_input, *at.selectbox, *at.text_input, *at.multiselect, *at.toggle]
    return {w.key.removeprefix(prefix) for w in widgets if w.key and w.key.startswith(prefix)}


def test_layer_sweep_form_has_an_input_for_every_field_a_window_trains_with(workbench):
    """Every field of the TrainConfig (and LoraSettings) a sweep window trains with, and every SweepConfig field, has
    an input keyed sweep.<field>, laid out by hand or generated from the dataclass as on the Train page; the inputs
    start at the sweep's own defaults (SweepConfig(), whose `train` is the template of every window)."""
    import dataclasses

    from topl_core.analysis.studies.sweeps import SweepConfig
    from topl_core.foundations.executor import ExecutorConfig
    from topl_core.training.config import LoraSettings, TrainConfig

    at = open_page("layer_sweep")
    want = {f.name for cls in (TrainConfig, LoraSettings, SweepConfig) for f in dataclasses.fields(cls)}
    want -= SWEEP_NOT_ASKED | {"lora"}
    assert want <= form_keys(at, "sweep."), sorted(want - form_keys(at, "sweep."))
    sweep = SweepConfig()
    for name in (
        "steps",
        "lr",
        "batch_size",
        "max_doc_tokens",
        "max_val_examples",
        "micro_batch_size",
        "head_lr_multiplier",
        "weight_decay",
        "split_seed",
        "label_setting",
    ):
        assert at.session_state[f"sweep.{name}"] == getattr(sweep.train, name), name
    for name in ("r", "alpha", "dropout"):
        assert at.session_state[f"sweep.{name}"] == getattr(sweep.train.lora, name), name
    for name in ("stride", "reuse_prefix", "n_generate", "max_new_tokens", "scorer"):
        assert at.session_state[f"sweep.{name}"] == getattr(sweep, name), name
    assert tuple(at.multiselect(key="sweep.modules").value) == sweep.train.lora.modules
    executor = ExecutorConfig()  # where the windows run: every field, at its default
    for f in dataclasses.fields(ExecutorConfig):
        want = getattr(executor, f.name)
        assert at.session_state[f"sweep.executor.{f.name}"] == ("" if want is None else want), f.name


def test_a_new_config_field_reaches_the_train_and_sweep_forms(workbench, monkeypatch):
    """A field added to TrainConfig shows up, at its default, in both the Train and the Layer-sweep forms, and one
    added to SweepConfig in the Layer-sweep form — with no edit to either page (both are built by pages/_ui/forms)."""
    import dataclasses

    import topl_core.analysis.studies.study as study
    import topl_core.analysis.studies.sweeps as sweeps
    import topl_core.training.config as config

    @dataclasses.dataclass(frozen=True)
    class ExtendedTrainConfig(config.TrainConfig):
        extra_knob: int = 7
        extra_rate: float = 0.25
        extra_mode: Literal["plain", "fancy"] = "fancy"  # resolved in this module: Literal imported at its top
        extra_sinks: tuple[Literal["here", "there"], ...] = ()  # as report_to: every choice offered, none chosen

    @dataclasses.dataclass(frozen=True)
    class ExtendedSweepConfig(sweeps.SweepConfig):
        extra_sweep_knob: int = 3

    monkeypatch.setattr(config, "TrainConfig", ExtendedTrainConfig)
    monkeypatch.setattr(study, "TrainConfig", ExtendedTrainConfig)  # every study's default template
    monkeypatch.setattr(sweeps, "SweepConfig", ExtendedSweepConfig)
    new = {"extra_knob": 7, "extra_rate": 0.25, "extra_mode": "fancy", "extra_sinks": []}
    for page, prefix, fields in (("train", "train.", new), ("layer_sweep", "sweep.", {**new, "extra_sweep_knob": 3})):
        at = open_page(page)
        assert set(fields) <= form_keys(at, prefix), (page, sorted(set(fields) - form_keys(at, prefix)))
        for name, default in fields.items():
            assert at.session_state[prefix + name] == default, (page, name)
    assert at.selectbox(key="sweep.extra_mode").options == ["plain", "fancy"]
    assert at.multiselect(key="sweep.extra_sinks").options == ["here", "there"]


def test_train_form_follows_a_preset_as_the_cli_does(workbench):
    """Picking a paper preset fills the form from the same mapping as `train --preset` (preset_config), with the
    LoRA layers carried to the loaded model's depth; going back to the CPU defaults restores TrainConfig's values."""
    from topl_core.training.config import TrainConfig, preset_config

    at = open_page("train")
    at.selectbox(key="train.preset").set_value("qwen3-8b").run()
    assert not at.exception, [e.value for e in at.exception]
    paper = preset_config("qwen3-8b", "topl")
    for key in ("lr", "head_lr_multiplier", "batch_size", "grad_accum"):
        assert at.number_input(key=f"train.{key}").value == getattr(paper, key), key
    # Qwen3-8B's TOPL range 0–29 of 36 layers, at the same fraction of tiny-llama's 4: 0–round(29/35·3) = 0–2
    assert (at.number_input(key="train.layer_start").value, at.number_input(key="train.layer_end").value) == (0, 2)
    at.selectbox(key="train.preset").set_value("none (CPU defaults)").run()
    assert at.number_input(key="train.head_lr_multiplier").value == TrainConfig().head_lr_multiplier
    assert at.number_input(key="train.lr").value == TrainConfig().lr


def test_train_form_refills_values_streamlit_dropped(workbench):
    """A session where the form was already filled for this model (train.for_model set) but whose widget values
    are gone — however Streamlit lost them — refills those from the defaults instead of showing the inputs'
    minimums, and keeps the values still there."""
    from topl_core.training.config import TrainConfig

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["train.for_model"] = "tiny-llama|fp32|cpu"
    at.session_state["train.batch_size"] = 3
    at.run()
    at.switch_page("pages/train.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.number_input(key="train.lr").value == TrainConfig().lr
    assert at.number_input(key="train.layer_end").value == 2  # tiny-llama has 4 layers: ⌊2·4/3⌋
    assert at.text_input(key="train.run_name").value.startswith("topl-")
    assert at.number_input(key="train.batch_size").value == 3


def test_train_page_launches_a_background_run(workbench):
    from topl_core.jobs import background

    at = open_page("train")
    at.selectbox(key="train.method").set_value("topl").run()
    at.text_input(key="train.run_name").set_value("from-page")
    at.number_input(key="train.steps").set_value(2)
    at.number_input(key="train.eval_every").set_value(1)
    at.selectbox(key="train.precision").set_value("fp32")
    at.number_input(key="train.layer_end").set_value(1)
    at.number_input(key="train.max_doc_tokens").set_value(64)
    at.button[[b.label for b in at.button].index("Start training")].click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    run_dir = workbench["runs"] / "from-page"
    assert at.session_state["train.watch"] == str(run_dir.resolve())
    status = background.wait(run_dir, timeout_s=240)
    assert status.state == "finished", background.log_tail(run_dir)
    cfg = json.loads((run_dir / "topl_config.json").read_text())["config"]
    assert cfg["steps"] == 2 and cfg["lora"]["layer_end"] == 1 and cfg["model"] == "tiny-llama"
    at.run()  # the page reads the finished run back from disk
    assert any("from-page" in m.value and "finished" in m.value for m in at.markdown)
    assert any(len(f["data"]) >= 2 for f in figures(at)), "no loss / validation curves for the run"


def test_train_page_refuses_an_unreachable_tracker_before_launching(workbench):
    """As the CLI does: an MLflow server that is not there is named on the page, with the fix, and nothing starts."""
    from conftest import free_port

    uri = f"http://127.0.0.1:{free_port()}"
    at = open_page("train")
    at.text_input(key="train.run_name").set_value("unreachable-tracker")
    at.multiselect(key="train.report_to").set_value(["mlflow"])
    at.text_input(key="train.mlflow_tracking_uri").set_value(uri)
    at.button[[b.label for b in at.button].index("Start training")].click().run()
    assert not at.exception, [e.value for e in at.exception]
    (error,) = [e.value for e in at.error]
    assert f"{uri}: MLflow's tracking store" in error and "not reachable" in error and "mlflow server" in error
    assert not (workbench["runs"] / "unreachable-tracker").exists()


def test_runs_page_shows_what_went_wrong_without_stopping_a_run(workbench, monkeypatch, tmp_path):
    """A run whose tracker failed mid-run (status.add_warning, as the trainer records it) finished all the same: the
    Runs page says what happened beside the table; a run without warnings gets none."""
    from topl_core.foundations.status import add_warning

    runs = tmp_path / "runs"
    warned = _copy_run(workbench["runs"] / "topl-tiny", runs / "topl-warned")
    _copy_run(workbench["runs"] / "sft-tiny", runs / "sft-quiet")
    add_warning(warned, "the mlflow tracker failed at step 3 (MlflowException: gone); training went on without it")
    monkeypatch.setenv("TOPL_RUNS_DIR", str(runs))
    at = open_page("runs")
    assert not at.exception, [e.value for e in at.exception]
    (warning,) = [w.value for w in at.warning]
    assert "**topl-warned**" in warning and "mlflow tracker failed at step 3" in warning
    assert set(at.dataframe[0].value["state"]) == {"finished"}


def test_runs_page_config_diff(workbench):
    at = open_page("runs")
    at.multiselect(key="runs.compare").set_value(["topl-tiny", "sft-tiny"]).run()
    assert not at.exception
    diff = next(d.value for d in at.dataframe if "topl-tiny" in getattr(d.value, "columns", []))
    assert "method" in diff.index and "lr" in diff.index and "steps" in diff.index
    assert list(diff.loc["method"]) == ["topl", "sft"]


def test_lora_a_heatmap_has_layers_by_modules_cells(workbench):
    at = open_page("lora_a")
    at.selectbox(key="lora_a.run_a").set_value(str(workbench["runs"] / "topl-tiny")).run()
    assert at.selectbox(key="lora_a.run_b").value.endswith("sft-tiny")  # TOPL vs SFT by default
    heats = [f for f in figures(at) if f["data"] and f["data"][0]["type"] == "heatmap"]
    assert len(heats) == 3  # TOPL, SFT, difference
    z = array(heats[0]["data"][0]["z"])
    assert z.shape == (4, 7)  # 4 layers × 7 modules
    assert np.isfinite(z[:3]).all() and np.isnan(z[3]).all()  # LoRA on layers 0–2 only
    assert ((z[:3] >= 0) & (z[:3] <= 1)).all()
    metrics = {m.label: m.value for m in at.metric}
    assert 0 <= float(metrics["Mean AUROC over sites"]) <= 1 and "Random-init A control" in metrics


def test_steering_lambda_slider_changes_the_steered_text(workbench):
    at = open_page("steering")
    at.selectbox(key="steer.run").set_value(str(workbench["runs"] / "topl-tiny")).run()
    boxes = html_boxes(at)
    assert len(boxes) == 3  # base | merged | steered
    merged_at_zero, steered_at_zero = boxes[1], boxes[2]
    assert "λ = +0.00" in steered_at_zero
    assert box_body(merged_at_zero) == box_body(steered_at_zero), "λ = 0 must reproduce the merged text"
    assert "\ufffd" not in box_body(merged_at_zero), "the tiny model's text must stay readable for these checks"
    # a random tiny model sits in a repetition attractor that one direction may only deepen: try both ends of the
    # widest range; at least one must change the text
    at.selectbox(key="steer.range.constant").set_value(64.0).run()
    changed_at = []
    for lam in (64.0, -64.0):
        at.slider(key="steer.lambda.constant").set_value(lam).run()
        assert not at.exception
        steered = html_boxes(at)[2]
        assert f"λ = {lam:+.2f}" in steered
        if 'class="topl-diff-ins"' in box_body(steered):
            changed_at.append(lam)
            break
    assert changed_at, "the λ slider did not change the steered text at either end of ±64"
    assert any('data-changed="1"' in m.value for m in at.markdown)
    # every λ of the slider as one batch: the curve has all 17 positions, and the boxes, now read from the batch,
    # show the texts that each λ generated alone gave
    alone = [box_body(b) for b in html_boxes(at)]
    at.button(key="steer.curve_go").click().run()
    at.run()
    assert not at.exception
    curve = next(f for f in figures(at) if f["data"] and f["data"][0].get("name") == "factuality")
    assert array(curve["data"][0]["x"]).tolist() == [-64.0 + 8.0 * k for k in range(17)]
    assert [box_body(b) for b in html_boxes(at)] == alone
    sites = next(d.value for d in at.dataframe if "site" in d.value.columns)
    assert 1 <= len(sites) <= 4 and all(k.endswith(("o_proj", "down_proj")) for k in sites["site"])
    assert (sites["mean ‖output‖"] > 0).all() and (sites["raw λ per unit"] > 0).all()
    assert "raw λ" in " ".join(c.value for c in at.caption)  # the paper's scale is shown under the slider
    python, curl = (c.value for c in at.code[-2:])  # the request for these settings, ready to paste
    assert f"\"steering\": {{'mode': 'vector', 'lambda': {changed_at[0]}}}" in python and '"steering"' in curl
    compile(python, "<pasted>", "exec")


def test_the_steering_page_builds_the_compiled_decode_step_then_takes_it(workbench, monkeypatch):
    """The app's default (TOPL_COMPILED_DECODE=auto; the suite pins 0): as soon as the steering session exists, the
    slider's engine builds the compiled decode step for the document's length on its warmer thread (on a CPU the
    exported package, by a child process); the page says so under the texts once it is built, and a new λ is written
    with it (tests/test_steering.py holds its text to the eager one; tests/test_slider.py the engine's warmer)."""
    monkeypatch.setenv("TOPL_COMPILED_DECODE", "auto")
    at = open_page("steering")
    at.selectbox(key="steer.run").set_value(str(workbench["runs"] / "topl-tiny")).run()
    at.slider(key="steer.top_k").set_value(3).run()  # a session of its own: the others were built without the step
    assert not at.exception and "compiled decode step" not in " ".join(c.value for c in at.caption)
    for _ in range(2):  # one graph is built at a time: the first may be the page's previous session's (run alone,
        # the one without top_k), so this session's is asked for by the page's next run
        for thread in [t for t in threading.enumerate() if t.name == "topl-decode-warmer"]:
            thread.join(300)
        at.run()
    lam = at.slider(key="steer.lambda.constant").max
    at.slider(key="steer.lambda.constant").set_value(lam).run()
    assert not at.exception and "compiled decode step" in " ".join(c.value for c in at.caption)
    assert f"λ = {lam:+.2f}" in html_boxes(at)[2] and box_body(html_boxes(at)[2]).strip()


def test_a_registered_steering_mode_reaches_page_cli_and_study(workbench, monkeypatch):
    """A new steering mode is one registry entry (negated_mode: the LoRA-B direction negated). The Steering page offers
    it and steers with it, `steer` and `evaluate` accept it; the λ study runs it in test_evaluation.py."""
    from conftest import negated_mode

    from topl_core.cli import build_parser
    from topl_core.runtime.modes import MODES

    negated = negated_mode()
    monkeypatch.setitem(MODES, "negated", negated)

    at = open_page("steering")
    at.selectbox(key="steer.run").set_value(str(workbench["runs"] / "topl-tiny")).run()
    assert negated.label in at.radio(key="steer.mode").options
    at.radio(key="steer.mode").set_value("negated").run()
    assert not at.exception, [e.value for e in at.exception]
    at.slider(key="steer.lambda.constant").set_value(2.0).run()
    assert not at.exception and "LoRA-B vector, negated, λ = +2.00" in html_boxes(at)[2]

    for argv in (["steer", "--run", "r", "--document", "d", "--mode", "negated"], ["evaluate", "--modes", "negated"]):
        build_parser(argv).parse_args(argv)  # an unknown mode exits with argparse's error
    # in the λ study: tests/test_evaluation.py::test_evaluate_runner_and_lambda_sweep


def test_steering_conditional_mode_spans_base_to_merged(workbench):
    """Scaling the adapter's update: λ = 1 (the slider's start) shows the merged text, λ = 0 the base model's."""
    at = open_page("steering")
    at.selectbox(key="steer.run").set_value(str(workbench["runs"] / "topl-tiny")).run()
    at.radio(key="steer.mode").set_value("conditional").run()
    assert not at.exception
    base, merged, steered = (box_body(b) for b in html_boxes(at))
    assert steered == merged and at.slider(key="steer.lambda.conditional").value == 1.0
    at.slider(key="steer.lambda.conditional").set_value(0.0).run()
    assert not at.exception and base != merged
    # the steered box shows its text as a diff against the merged one: drop the struck-out words, keep the rest
    steered = re.sub(r'<span class="topl-diff-del">.*?</span>', "", box_body(html_boxes(at)[2]))
    steered = re.sub(r"<[^>]+>", "", steered).split()
    assert steered == re.sub(r"<[^>]+>|\(empty\)", " ", base).split()
    assert all("factuality" in c or "DEGENERATE" in c for c in (b.split("</div>")[-2] for b in html_boxes(at)))


def test_token_overlay_threshold_flags_tokens(workbench):
    at = open_page("token_overlay")
    at.selectbox(key="overlay.run").set_value(str(workbench["runs"] / "topl-tiny")).run()
    spans = [m.value for m in at.markdown if "p(good)=" in m.value]
    assert spans, "no token carries its p(good) on hover"
    flagged = lambda: int({m.label: m.value for m in at.metric}["Flagged"])  # noqa: E731
    at.slider(key="overlay.threshold").set_value(1.0).run()
    n_all = flagged()
    at.slider(key="overlay.threshold").set_value(0.0).run()
    assert flagged() == 0 and n_all == int({m.label: m.value for m in at.metric}["Tokens"])
    assert "Gold bad tokens" in {m.label for m in at.metric}
    # the summary sets the head against the model-free controls too, and each token says whether its word is new
    assert any("lexical control" in c.value and "surprisal AUROC" in c.value for c in at.caption)
    assert any("lexical control=" in m.value for m in at.markdown if "p(good)=" in m.value)


def test_the_server_listens_on_this_machine_only_with_usage_statistics_off():
    """What `make app` (a bare `streamlit run app.py` in the repository) gets, as Streamlit itself resolves its
    config: the loopback address, no usage statistics, XSRF and CORS protection left on, and the toolbar without
    Streamlit's developer options (no Deploy button; tests/test_browser.py looks for it in every page)."""
    import subprocess
    import sys

    shown = subprocess.run(
        [sys.executable, "-m", "streamlit", "config", "show"], cwd=REPO, capture_output=True, text=True, timeout=120
    ).stdout
    settings = dict(re.findall(r"^(\w+) = (.+)$", shown, flags=re.M))  # the lines not commented out
    assert settings["address"] == '"127.0.0.1"' and settings["gatherUsageStats"] == "false"
    assert settings.get("enableXsrfProtection", "true") == "true" and settings.get("enableCORS", "true") == "true"
    assert settings["toolbarMode"] == '"viewer"'


# --- background jobs --------------------------------------------------------------------------------------------


def test_job_cancel_checkpoints_and_resume_finishes(workbench, tmp_path):
    """SIGTERM to the job's process group reaches the trainer's exception path (checkpoint + 'cancelled'), and the
    run resumes from that checkpoint to the end; the state is read from disk only."""
    from topl_core.jobs import background, launchers
    from topl_core.training.run_dirs import RunDir

    cfg = tiny_config(
        data=str(workbench["data"]),
        steps=400,
        checkpoint_every=1000,
        eval_every=1000,
        max_doc_tokens=64,
        max_val_examples=4,
    )
    run_dir = tmp_path / "long"
    launchers.launch_train(cfg, run_dir)
    deadline = time.monotonic() + 180
    while (st := background.read_job(run_dir)).step < 2:
        assert st.active, background.log_tail(run_dir)
        assert time.monotonic() < deadline, "the job never started stepping"
        time.sleep(0.2)
    assert st.state == "running" and st.eta_s is not None and st.steps == 400
    assert background.cancel(run_dir)
    st = background.wait(run_dir, timeout_s=60)
    assert st.state == "cancelled", background.log_tail(run_dir)
    assert (run_dir / "checkpoint" / "state.json").exists(), "SIGTERM did not reach the trainer's checkpoint path"
    stopped = RunDir(run_dir).read_status()["step"]
    assert stopped >= 2
    assert [j.name for j in background.list_jobs(tmp_path)] == ["long"]
    with pytest.raises(background.JobError):
        launchers.launch_train(cfg.with_overrides(steps=5), run_dir)  # another config into the same directory
    # resume: it continues from the checkpoint (not from 0); stop it again after a step or two
    launchers.resume_train(run_dir)
    time.sleep(0.5)
    while (st := background.read_job(run_dir)).step <= stopped + 1 and st.active:
        time.sleep(0.2)
    assert background.cancel(run_dir)
    st = background.wait(run_dir, timeout_s=60)
    assert st.state == "cancelled" and st.step > stopped
    assert "resuming" in background.log_tail(run_dir, 200)


def test_two_sessions_launching_the_same_run_at_once_start_one_job(workbench, tmp_path):
    """Two app sessions press Train with the same run name at the same moment: one job starts, the other session
    gets a JobError naming the holder, and the run that trains is the same as a run made alone."""
    import threading

    import torch

    from topl_core.jobs import background, launchers
    from topl_core.training.run_dirs import RunDir
    from topl_core.training.trainer import train

    cfg = tiny_config(data=str(workbench["data"]), steps=3, max_doc_tokens=64)
    run_dir = tmp_path / "twin"
    barrier, outcomes = threading.Barrier(2), []

    def press_train():
        barrier.wait()
        try:
            outcomes.append(launchers.launch_train(cfg, run_dir))
        except background.JobError as e:
            outcomes.append(e)

    sessions = [threading.Thread(target=press_train) for _ in range(2)]
    for t in sessions:
        t.start()
    for t in sessions:
        t.join()
    errors = [o for o in outcomes if isinstance(o, background.JobError)]
    assert len(errors) == 1 and "being written by pid" in str(errors[0]), outcomes
    st = background.wait(run_dir, timeout_s=300)
    assert st.state == "finished", background.log_tail(run_dir)
    alone = train(cfg, tmp_path / "alone")
    twin = RunDir(run_dir)
    assert twin.adapter_path.read_bytes() == alone.adapter_path.read_bytes()
    a, b = twin.load_head().state_dict(), alone.load_head().state_dict()  # (its header's metadata order varies)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_job_state_survives_a_restart_and_detects_dead_processes(workbench, tmp_path):
    """A run whose process vanished without a word reads as 'interrupted' (resumable), not 'running'."""
    from topl_core.foundations.io import write_json
    from topl_core.jobs import background
    from topl_core.training.run_dirs import RunDir

    run = RunDir(tmp_path / "ghost")
    run.write_config(tiny_config(data=str(workbench["data"])), {})
    run.write_status("running", 3, 4)
    write_json(run.checkpoint_dir / "state.json", {"step": 2})
    job = {"kind": "train", "argv": [], "pid": 2**22 + 12345, "started": time.time()}
    write_json(run.path / background.JOB_FILE, job)
    st = background.read_job(run.path)
    assert st.state == "interrupted" and not st.active and st.step == 2  # its last checkpoint, where it resumes
    # runs grouped in a folder (e.g. runs/baselines/<method>) are listed with their relative name
    grouped = RunDir(tmp_path / "baselines" / "sft")
    grouped.write_config(tiny_config(data=str(workbench["data"]), method="sft"), {})
    assert sorted(j.name for j in background.list_jobs(tmp_path)) == ["baselines/sft", "ghost"]


def test_a_killed_job_says_how_it_died(workbench, tmp_path):
    """A job killed outright (SIGKILL: out of memory, `kill -9`) cannot write its own exit file; the app process that
    launched it reaps it, names the signal, and records it in status.json so other sessions read the same."""
    import os
    import signal

    from topl_core.jobs import background, launchers

    cfg = tiny_config(data=str(workbench["data"]), steps=400, max_doc_tokens=64)
    run_dir = tmp_path / "killed"
    launchers.launch_train(cfg, run_dir)
    pid = background.read_job(run_dir).pid
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    st = background.wait(run_dir, timeout_s=30)
    assert st.state == "interrupted" and "killed by SIGKILL" in st.error, st
    assert json.loads((run_dir / "status.json").read_text())["returncode"] == -signal.SIGKILL
    assert background.read_job(run_dir).error == st.error  # read back from the file now, the child being reaped


def test_layer_sweep_runs_in_the_background_and_fills_the_heatmap(workbench):
    """Started from the form (windows in the job's own process: Ray tasks are tried in
    test_studies_as_ray_tasks_equal_the_serial_ones_and_fill_the_page, where the executor reaches sweep.json too)."""
    from topl_core.jobs import background

    at = open_page("layer_sweep")
    at.text_input(key="sweep.name").set_value("tiny-sweep")
    at.multiselect(key="sweep.sizes").set_value([1, 2])
    at.number_input(key="sweep.stride").set_value(2)
    at.number_input(key="sweep.steps").set_value(2)
    at.selectbox(key="sweep.precision").set_value("fp32")
    at.number_input(key="sweep.max_doc_tokens").set_value(64)
    at.button[[b.label for b in at.button].index("Start sweep")].click().run()
    assert not at.exception, [e.value for e in at.exception]
    sweep_dir = workbench["runs"] / "sweeps" / "tiny-sweep"
    assert json.loads((sweep_dir / "sweep.json").read_text())["executor"]["kind"] == "local"  # the form's default
    st = background.wait(sweep_dir, timeout_s=300)
    assert st.state == "finished", background.log_tail(sweep_dir, 40)
    at.run()
    assert not at.exception
    heat = next(f for f in figures(at) if f["data"] and f["data"][0]["type"] == "heatmap")
    z = array(heat["data"][0]["z"])
    assert z.shape == (2, 2)  # starts {0, 2} × sizes {1, 2}: 4 windows on 4 layers
    assert np.isfinite(z).all()
    assert any("4/4 windows" in p.proto.text for p in at.get("progress"))


def test_studies_as_ray_tasks_equal_the_serial_ones_and_fill_the_page(workbench, tiny_records):
    """On a local Ray instance started here (2 CPUs): four sweep windows run as Ray tasks give the serial sweep's
    rows and adapters, each trained in a worker process, and the Layer sweep page shows them; a window that cannot
    train is reported with its traceback while the others finish; a finished sweep run again redoes nothing. A
    label study's settings and an evaluation's variants as Ray tasks give the serial tables."""
    import ray
    from safetensors.torch import load_file

    from topl_core.analysis.evaluation.config import EvalConfig, Variant
    from topl_core.analysis.evaluation.evaluate import evaluate
    from topl_core.analysis.studies.label_sensitivity import LabelStudyConfig, run_label_study
    from topl_core.analysis.studies.sweep_results import heatmap_table, read_sweep
    from topl_core.analysis.studies.sweeps import SweepConfig, run_sweep
    from topl_core.foundations.errors import RunError
    from topl_core.foundations.executor import ExecutorConfig

    cfg = SweepConfig(
        train=tiny_config(steps=2, eval_every=2, checkpoint_every=1, data=str(workbench["data"])),
        windows=((0, 1), (1, 2), (2, 2), (3, 1)),
    )
    sweeps = workbench["runs"] / "sweeps"
    serial = run_sweep(cfg, sweeps / "serial", records=tiny_records).set_index("window")
    labels = LabelStudyConfig(train=cfg.train, settings=("original", "random"))
    labels_serial = run_label_study(labels, workbench["runs"] / "labels-serial", records=tiny_records)
    variants = [Variant.base("tiny-llama"), Variant.merged(str(workbench["runs"] / "topl-tiny"))]
    ecfg = EvalConfig(data=str(workbench["data"]), n_id=2, n_ood=0, max_new_tokens=8, model="tiny-llama")
    eval_serial = evaluate(variants, ecfg, use_cache=False, measure_quality=False).per_doc
    on_ray = ExecutorConfig(kind="ray")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        events: list[dict] = []
        par = run_sweep(cfg, sweeps / "ray", events.append, records=tiny_records, executor=on_ray)
        broken = sweeps / "ray-broken"
        (broken / "windows" / "s01-k02").mkdir(parents=True)
        (broken / "windows" / "s01-k02" / "notes.txt").write_text("not a run")
        with pytest.raises(RunError, match="s01-k02"):
            run_sweep(cfg, broken, records=tiny_records, executor=on_ray)
        labels_ray = run_label_study(labels, workbench["runs"] / "labels-ray", records=tiny_records, executor=on_ray)
        eval_ray = evaluate(variants, ecfg, use_cache=False, measure_quality=False, executor=on_ray).per_doc
    finally:
        ray.shutdown()
    np.testing.assert_allclose(labels_ray["val_token_auroc"], labels_serial["val_token_auroc"], rtol=1e-5)
    assert list(labels_ray["setting"]) == ["original", "random"]
    assert eval_ray[["variant", "doc_id", "text"]].equals(eval_serial[["variant", "doc_id", "text"]])
    par = par.set_index("window")
    assert sorted(par.index) == sorted(serial.index) == ["s00-k01", "s01-k02", "s02-k02", "s03-k01"]
    for col in ("val_token_auroc", "loss"):
        np.testing.assert_allclose(par.loc[serial.index, col], serial[col], rtol=1e-5, atol=1e-6)
    for w in serial.index:
        a = load_file(sweeps / "ray" / "windows" / w / "adapter_model.safetensors")
        b = load_file(sweeps / "serial" / "windows" / w / "adapter_model.safetensors")
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=1e-4, atol=1e-6)
        assert json.loads((sweeps / "ray" / "windows" / w / "status.json").read_text())["pid"] != os.getpid()
    assert [e["event"] for e in events] == ["plan"] + ["done"] * 4  # rows reach this process as tasks end
    assert json.loads((sweeps / "ray" / "sweep.json").read_text())["executor"]["kind"] == "ray"

    status = json.loads((broken / "status.json").read_text())
    assert status["state"] == "failed" and "not a run directory" in status["error"]
    assert "not a run directory" in (broken / "task-errors" / "s01-k02.log").read_text()
    assert sorted(read_sweep(broken)["window"]) == ["s00-k01", "s02-k02", "s03-k01"]  # the others finished

    rows = (sweeps / "ray" / "results.jsonl").read_text()
    run_sweep(cfg, sweeps / "ray", records=tiny_records)  # all done: no task, no Ray
    assert (sweeps / "ray" / "results.jsonl").read_text() == rows

    at = open_page("layer_sweep")
    at.selectbox(key="sweep.show").set_value("sweeps/ray").run()
    assert not at.exception, [e.value for e in at.exception]
    heat = next(f for f in figures(at) if f["data"] and f["data"][0]["type"] == "heatmap")
    np.testing.assert_allclose(array(heat["data"][0]["z"]), heatmap_table(read_sweep(sweeps / "ray")).to_numpy())
    assert any("4/4 windows" in p.proto.text for p in at.get("progress"))


def start_job_and_wait(at: AppTest, button: str, job_dir: Path) -> None:
    """Press the page's `button` (a form that launches a background job into job_dir), wait for the job to finish
    and rerun the page, with no error or exception box on the way."""
    from topl_core.jobs import background

    at.button[[b.label for b in at.button].index(button)].click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    st = background.wait(job_dir, timeout_s=300)
    assert st.state == "finished", background.log_tail(job_dir, 40)
    at.run()
    assert not at.exception, [e.value for e in at.exception]


def test_a_translation_evaluation_runs_from_the_evaluation_page(workbench, tmp_path):
    """The translation form launches evaluate-mt on an MLQE-PE split (ID) and parallel files (OOD); the page shows
    the chrF table per variant with the scorer's Spearman ρ against 1 − HTER, and the translations."""

    mlqe = write_mlqe(tmp_path / "en-de") / "test"
    src, ref = tmp_path / "ood.en", tmp_path / "ood.de"
    src.write_text("The dog runs.\nIt rains.\n", encoding="utf-8")
    ref.write_text("Der Hund rennt.\nEs regnet.\n", encoding="utf-8")
    at = open_page("evaluation")
    at.multiselect(key="mt.runs").set_value([str(workbench["runs"] / "topl-tiny")])
    at.number_input(key="mt.n_id").set_value(3)
    at.number_input(key="mt.n_ood").set_value(2)
    at.number_input(key="mt.max_new").set_value(8)
    at.text_input(key="mt.mlqe").set_value(str(mlqe))
    at.text_input(key="mt.ood_src").set_value(str(src))
    at.text_input(key="mt.ood_ref").set_value(str(ref))
    at.text_input(key="mt.name").set_value("tiny-mt")
    start_job_and_wait(at, "Start translation evaluation", workbench["runs"] / "evaluations" / "tiny-mt")
    table = next(d.value for d in at.dataframe if {"variant", "ID", "OOD", "n_ID"} <= set(d.value.columns))
    assert list(table["variant"]) == ["base", "merged (topl-tiny)"]
    assert table["n_ID"].tolist() == [3, 3] and table["n_OOD"].tolist() == [2, 2]
    assert table["ID"].between(0, 1).all()
    assert any("Spearman ρ with MLQE-PE" in i.value for i in at.info), "the scorer's measured agreement is missing"
    sentences = next(d.value for d in at.dataframe if "reference" in d.value.columns)
    assert len(sentences) == 2 * (3 + 2) and set(sentences["reference"]) >= {"Der Hund rennt.", "Es regnet."}


def test_evaluation_runs_in_the_background_and_shows_tables(workbench):

    at = open_page("evaluation")
    topl = str(workbench["runs"] / "topl-tiny")
    at.multiselect(key="eval.runs").set_value([topl])
    at.text_input(key="eval.lambdas.False").set_value("3")
    at.number_input(key="eval.n_id").set_value(2)
    at.number_input(key="eval.n_ood.False").set_value(1)
    at.number_input(key="eval.max_new_tokens").set_value(12)
    at.text_input(key="eval.name").set_value("tiny-eval")
    edir = workbench["runs"] / "evaluations" / "tiny-eval"
    start_job_and_wait(at, "Start evaluation", edir)
    frames = [d.value for d in at.dataframe]
    table = next(f for f in frames if {"variant", "ID", "OOD"} <= set(f.columns))
    assert list(table["variant"]) == ["base", "merged (topl-tiny)", "steered λ=3 (topl-tiny)"]
    assert table["n_ID"].tolist() == [2, 2, 2]
    # the lengths beside factuality, with the supported sentences per summary (a count that does not reward saying less)
    assert any({"variant", "sentences", "words", "supported"} == set(f.columns) for f in frames), "no length table"
    assert any("measured AUROC" in i.value for i in at.info), "the offline scorer's measured quality is not shown"
    scatter = next(f for f in figures(at) if "full summary vs sentence" in f["layout"]["title"]["text"])
    summaries = int((table["n_ID"] + table["n_OOD"]).sum())  # 3 variants × (2 ID + 1 OOD when CLIFF is beside)
    assert sum(len(array(trace["x"])) for trace in scatter["data"]) == summaries
    assert any("Spearman ρ between the sentence-level and the full-summary" in c.value for c in at.caption)
    # the Runs page picks the run's ID/OOD factuality up from this evaluation
    at.switch_page("pages/runs.py").run()
    at.multiselect(key="runs.compare").set_value(["topl-tiny"]).run()
    res = next(d.value for d in at.dataframe if "ID factuality" in d.value.columns)
    assert res.loc[0, "evaluation"] == "tiny-eval" and 0 <= res.loc[0, "ID factuality"] <= 1
    # ... and puts it beside the run's LoRA-A AUROC in the paper's indicator table
    at.toggle(key="runs.indicator").set_value(True).run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    indicator = next(d.value for d in at.dataframe if "lora_a_auroc" in d.value.columns)
    assert list(indicator["method"]) == ["topl-tiny", "random-init A (control)"]
    assert indicator.loc[0, "id_factuality"] == pytest.approx(res.loc[0, "ID factuality"])
    assert any("Spearman ρ" in c.value for c in at.caption)


def test_steering_study_runs_in_the_background_and_shows_its_curves(workbench):
    """The Evaluation page's λ sweep: two modes on one adapter → per-mode curves, the degenerate share and the
    table with paired changes; the conditional mode's λ = 1 is the merged model (change 0 by construction)."""
    from topl_core.jobs import background

    at = open_page("evaluation")
    at.radio(key="eval.mode").set_value("λ sweep (steering study)").run()
    at.multiselect(key="eval.runs").set_value([str(workbench["runs"] / "topl-tiny")])
    at.text_input(key="eval.lambdas.True").set_value("0 8")
    at.multiselect(key="eval.modes").set_value(["vector", "conditional"])
    at.text_input(key="eval.cond_lambdas").set_value("0 1")
    at.number_input(key="eval.n_id").set_value(2)
    at.number_input(key="eval.n_ood.True").set_value(0)
    at.number_input(key="eval.max_new_tokens").set_value(8)
    at.text_input(key="eval.name").set_value("tiny-study")
    at.button[[b.label for b in at.button].index("Start evaluation")].click().run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    edir = workbench["runs"] / "evaluations" / "tiny-study"
    st = background.wait(edir, timeout_s=300)
    assert st.state == "finished", background.log_tail(edir, 40)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    curve = next(d.value for d in at.dataframe if {"mode", "lambda", "factuality"} <= set(d.value.columns))
    assert sorted(zip(curve["mode"], curve["lambda"])) == [
        ("conditional", 0.0),
        ("conditional", 1.0),
        ("vector", 0.0),
        ("vector", 8.0),
    ]
    neutral = curve[(curve["mode"] == "conditional") & (curve["lambda"] == 1.0)]
    assert float(neutral["change"].iloc[0]) == 0.0 and {"degenerate", "perplexity"} <= set(curve.columns)
    assert len(at.get("plotly_chart")) == 4  # factuality and degenerate share, for each mode family


def test_a_run_started_from_the_command_line_reads_as_running(workbench, tmp_path):
    """No job.json (a foreground `python -m topl_core train`): liveness comes from status.json's pid."""
    import subprocess
    import sys

    from topl_core.jobs import background
    from topl_core.training.run_dirs import RunDir

    # a live process whose command line names topl_core, standing in for a foreground training run
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "topl_core"])
    try:
        run = RunDir(tmp_path / "cli-run")
        run.write_config(tiny_config(data=str(workbench["data"])), {})
        background.write_json(run.status_path, {"state": "running", "step": 2, "steps": 4, "pid": proc.pid})
        assert background.read_job(run.path).state in ("running", "starting")
    finally:
        proc.kill()
        proc.wait()
    assert background.read_job(run.path).state == "interrupted"


@pytest.mark.parametrize("page", ["lora_a", "steering", "token_overlay", "runs", "layer_sweep", "evaluation"])
def test_analysis_pages_in_bf16(workbench, page, monkeypatch):
    """Each analysis page once with bf16 forced (what "auto" gives on a bf16 CPU or a GPU): no exception, no error
    box, and the pages that compute say so in bf16."""
    monkeypatch.setenv("TOPL_PRECISION", "bf16")
    at = open_page(page)
    key = {"lora_a": "lora_a.run_a", "steering": "steer.run", "token_overlay": "overlay.run"}.get(page)
    if key:
        at.selectbox(key=key).set_value(str(workbench["runs"] / "topl-tiny")).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert "auto → bf16" in str(at.sidebar.selectbox(key="sidebar.precision").format_func("auto"))
    if page == "lora_a":
        assert any("Computed in bf16" in c.value for c in at.caption)
    if page == "steering":
        assert len(html_boxes(at)) == 3  # base | merged | steered


def talk_page_data(at: AppTest) -> dict:
    """The deck inlined in talk mode's embedded page (topl_core.analysis.studies.deck_html)."""
    (frame,) = at.get("iframe")
    page = frame.proto.srcdoc
    return json.loads(page.split('id="deck-data">', 1)[1].split("</script>", 1)[0].replace("<\\/", "</"))


def test_talk_mode_answers_every_deck_state(workbench, tmp_path):
    """Talk mode: no deck yet → prepare one from the page (a real background job) → the view holds every prepared
    summary, coloured by the run's head, with its AUROC (its slider and keys are tested in a browser:
    tests/test_deck.py, tests/test_browser.py); a deck still preparing shows its progress and stops on a click; a
    failed deck says why; an adapter without a head is named as such."""
    import shutil
    import subprocess
    import sys

    from topl_core.analysis.studies.deck import DeckConfig, create_deck, decks_dir, read_deck
    from topl_core.analysis.studies.deck_prepare import prepare_deck
    from topl_core.foundations.status import write_status
    from topl_core.jobs import background

    shutil.rmtree(decks_dir(), ignore_errors=True)
    at = open_page("talk")
    assert "No deck yet" in page_messages(at)
    at.selectbox(key="talk.run").set_value(str(workbench["runs"] / "topl-tiny")).run()
    at.radio(key="talk.source").set_value("Paste").run()
    docs = [workbench_doc(workbench, i) for i in (0, 1)]
    at.text_area(key="talk.pasted").set_value("\n---\n".join(docs))
    at.number_input(key="talk.bound").set_value(8.0)
    at.number_input(key="talk.steps").set_value(1)
    at.number_input(key="talk.max_new").set_value(8)
    at.text_input(key="talk.name").set_value("tiny-deck").run()
    at.button(key="talk.prepare").click().run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    folder = decks_dir() / "tiny-deck"
    st = background.wait(folder, timeout_s=300)
    assert st.state == "finished" and st.kind == "deck", background.log_tail(folder, 40)
    deck = read_deck(folder)
    assert deck.complete and deck.config.lambdas == (-8.0, 0.0, 8.0) and list(deck.config.documents) == docs

    at.run()
    assert not at.exception, [e.value for e in at.exception]
    view = at.get("iframe")[0].proto.srcdoc
    assert "not an independent judge" in view and "validation token AUROC" in view
    # the view is the deck's own page, embedded: every λ of every document inlined, coloured by the head
    data = talk_page_data(at)
    assert data["lambdas"] == [-8.0, 0.0, 8.0] and data["has_head"]
    for d, shown in zip(deck.documents, data["docs"]):
        assert shown["document"] == d.document and shown["base"]["text"] == d.base.text
        for lam, s in zip(deck.config.lambdas, shown["positions"]):
            assert s["text"] == d.at(lam).text and [t for t, _, _ in s["tokens"] or []] == list(d.at(lam).tokens)
    assert "__toplDeckKeys" in view  # the keys of the whole app window
    assert at.download_button(key="talk.export")

    # a deck still preparing: a live process whose command line names topl_core stands in for the job
    cfg = deck.config
    preparing = create_deck(decks_dir() / "preparing", cfg)
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "topl_core"], start_new_session=True
    )
    try:
        (preparing / background.JOB_FILE).write_text(json.dumps({"kind": "deck", "argv": [], "pid": worker.pid}))
        write_status(preparing, "running", done=3, total=8, eta_s=12.0, current="document 1/2, λ = +8", pid=worker.pid)
        at.run().selectbox(key="talk.deck").set_value(str(preparing)).run()
        assert not at.exception, [e.value for e in at.exception]
        bar = at.get("progress")[0].proto
        assert "3 / 8 summaries" in bar.text and "12 s left" in bar.text
        at.button(key="talk.stop").click().run()
        worker.wait(timeout=30)
    finally:
        worker.kill()
    at.run()
    assert "not complete (0 / 8 summaries; cancelled)" in page_messages(at)
    assert at.button(key="talk.resume")

    failed = create_deck(decks_dir() / "failed", cfg)
    write_status(failed, "failed", error="RuntimeError: out of luck")
    at.run().selectbox(key="talk.deck").set_value(str(failed)).run()
    assert "out of luck" in " ".join(e.value for e in at.error)

    no_head = create_deck(
        decks_dir() / "sft", DeckConfig(str(workbench["runs"] / "sft-tiny"), docs[:1], (0.0,), max_new_tokens=4)
    )
    assert prepare_deck(no_head).state == "finished"
    at.run().selectbox(key="talk.deck").set_value(str(no_head)).run()
    assert not at.exception
    assert "has no head" in " ".join(w.value for w in at.warning)
    assert not talk_page_data(at)["has_head"] and talk_page_data(at)["docs"][0]["base"]["tokens"] is None

    # a document file cut short: named, with what resuming does; prepared again, the view says what was redone
    doc = no_head / "doc-000.json"
    doc.write_text(doc.read_text()[:40])
    said = page_messages(at.run())
    assert f"{doc}: unreadable (JSONDecodeError" in said and "resuming makes its summaries again" in said
    assert prepare_deck(no_head).state == "finished"
    at.run()
    assert not at.exception and f"{doc}: unreadable" in " ".join(i.value for i in at.info)
    shutil.rmtree(decks_dir())  # the other tests' runs list stays as it was


def workbench_doc(workbench, i: int) -> str:
    from topl_core.data.records import read_jsonl

    return list(dict.fromkeys(r.document for r in read_jsonl(workbench["data"])))[i]
