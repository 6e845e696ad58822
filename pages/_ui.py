"""Helpers shared by the pages: the current model spec, cached models/scorers, run and data-set pickers, colored
token rendering, and figure downloads. Only thin glue: all computation lives in topl_core.

Caching rules (docs/design.md §4): models are `st.cache_resource` keyed by the spec string (and the run fingerprint for
adapters); a cached model is shared by every session and is never mutated; small results are `st.cache_data`.
`st.session_state` holds only strings (the spec, run paths) and widget values.
"""

from __future__ import annotations

import html
import os
import threading
from pathlib import Path

import pandas as pd
import streamlit as st

from topl_core.models import EMBEDDED, ModelSpec
from topl_core.presets import DEFAULT_MODEL
from topl_core.tiny_models import TINY_FAMILIES
from topl_core.precision import DTYPES, PRECISIONS, describe_precision, resolve_dtype, resolve_precision

SPEC_KEY = "model_spec"  # session_state: "name|dtype|device"
# How many models each cache keeps (base, merged per run, token scorer). 8B models on one GPU: set 1.
MAX_MODELS = int(os.environ.get("TOPL_UI_MAX_MODELS", "3"))


# --- the app frame: navigation + sidebar, around every page ---------------------------------------------------
#
# Streamlit (1.67) treats a folder named `pages/` next to the main script as a legacy multipage app: each script
# run first goes through a router over pages/*.py, which runs app.py only for the main page and runs any other page
# *file* directly — without app.py, so without its sidebar (docs/design.md §4's AppTest/st.navigation trap; it hits the
# real server too: direct links and reloads). And a URL that names no file there gets a "Page not found" dialog.
# So every page's url_path equals its file name (the router finds it: no dialog), and every page starts with
# `ensure_frame()`: when the router ran the file directly, it runs the frame instead (st.navigation picks this very
# page and runs it inside the frame) and stops; inside the frame it does nothing.

PAGES = {
    "Start": [("home", "Home", ":material/home:"), ("data", "Data", ":material/dataset:")],
    "Train": [("train", "Train", ":material/model_training:"), ("runs", "Runs", ":material/compare_arrows:")],
    "Look inside": [("lora_a", "LoRA-A separability", ":material/grid_on:"), ("steering", "Steering", ":material/tune:"),
                    ("token_overlay", "Token overlay", ":material/format_color_text:")],
    "Studies": [("layer_sweep", "Layer sweep", ":material/view_comfy:"),
                ("evaluation", "Evaluation", ":material/fact_check:")],
}
PAGES_DIR = Path(__file__).resolve().parent
_FRAME = threading.local()


def run_frame() -> None:
    """Page config, st.navigation over PAGES, the shared sidebar model picker, then the chosen page."""
    st.set_page_config(page_title="TOPL Workbench", page_icon=":material/biotech:", layout="wide")
    nav = {section: [st.Page(PAGES_DIR / f"{stem}.py", title=title, icon=icon, url_path=stem, default=stem == "home")
                     for stem, title, icon in items] for section, items in PAGES.items()}
    page = st.navigation(nav)
    st.sidebar.caption("Model (shared by every page)")
    sidebar_model_picker()
    _FRAME.active = True
    try:
        page.run()
    finally:
        _FRAME.active = False


def ensure_frame() -> None:
    """First line of every page: a no-op inside the frame; run directly by Streamlit's legacy router, it renders
    the frame (which runs this page inside it) and stops this outer run."""
    if getattr(_FRAME, "active", False):
        return
    run_frame()
    st.stop()


CUSTOM = "Hugging Face id or local path…"


# --- the model spec ---------------------------------------------------------------------------------------


def default_spec() -> str:
    """TOPL_DEFAULT_MODEL may be a name ("tiny-llama", "Qwen/Qwen3-8B") or a full spec "name|dtype|device"."""
    raw = os.environ.get("TOPL_DEFAULT_MODEL", DEFAULT_MODEL).strip() or DEFAULT_MODEL
    parts = raw.split("|")
    name = parts[0]
    dtype = parts[1] if len(parts) > 1 else os.environ.get("TOPL_DEFAULT_DTYPE", "auto")
    device = parts[2] if len(parts) > 2 else os.environ.get("TOPL_DEFAULT_DEVICE", "cpu")
    return f"{name}|{dtype}|{device}"


def split_spec(key: str) -> tuple[str, str, str]:
    name, dtype, device = key.rsplit("|", 2)
    return name, dtype, device


def current_spec() -> str:
    return st.session_state.get(SPEC_KEY) or default_spec()


def current_model_name() -> str:
    return split_spec(current_spec())[0]


def spec_of(key: str) -> ModelSpec:
    name, dtype, device = split_spec(key)
    return ModelSpec(name, dtype, device)


def model_choices() -> list[str]:
    return [*EMBEDDED, *TINY_FAMILIES, CUSTOM]


def model_label(choice: str) -> str:
    if choice in EMBEDDED:
        return f"{choice} — {EMBEDDED[choice].description.split('(')[0].strip()}"
    if choice in TINY_FAMILIES:
        return f"{choice} — random tiny test model"
    return choice


def sidebar_model_picker() -> str:
    """The model picker every page shares (rendered by app.py in the sidebar). Returns the spec string."""
    name, dtype, device = split_spec(default_spec())
    choices = model_choices()
    if "sidebar.model_choice" not in st.session_state:
        st.session_state["sidebar.model_choice"] = name if name in choices else CUSTOM
        st.session_state["sidebar.model_custom"] = "" if name in choices else name
        st.session_state["sidebar.dtype"] = dtype
        st.session_state["sidebar.device"] = device
    choice = st.sidebar.selectbox("Model", choices, key="sidebar.model_choice",
                                  persist_state="session", format_func=model_label,
                                  help="Embedded models run offline on CPU. Paste a hub id (e.g. Qwen/Qwen3-8B) or a "
                                       "local save_pretrained directory for anything else.")
    if choice == CUSTOM:
        custom = st.sidebar.text_input("Hub id or local path", key="sidebar.model_custom", persist_state="session",
                                       placeholder="Qwen/Qwen3-8B or /path/to/model")
        name = custom.strip() or DEFAULT_MODEL
    else:
        name = choice
    with st.sidebar.expander("Precision & device"):
        device = st.selectbox("device", ["cpu", "cuda"], key="sidebar.device", persist_state="session",
                              help="cuda needs a visible GPU (8B models: bfloat16 on cuda).")
        st.selectbox("weights dtype", DTYPES, key="sidebar.dtype", persist_state="session",
                     format_func=lambda d: f"auto → {resolve_dtype(d, device)}" if d == "auto" else d,
                     help="auto: float32 on CPU (bf16 compute there comes from autocast, where the CPU has it), "
                          "bfloat16 on a GPU with bf16 support.")
        st.caption(f"compute precision here: {describe_precision('auto', device)}")
    spec = f"{name}|{resolve_dtype(st.session_state['sidebar.dtype'], device)}|{device}"  # "auto" resolved: one key
    st.session_state[SPEC_KEY] = spec
    return spec


def precision_select(container, key: str, device: str) -> str:
    """The compute-precision picker of the forms (Train, Layer sweep): "auto" shows what it resolves to here."""
    return container.selectbox(
        "Precision", PRECISIONS, key=key, persist_state="session",
        format_func=lambda p: f"auto → {resolve_precision('auto', device)}" if p == "auto" else p,
        help=f"auto = bf16 autocast only where this machine computes bf16 natively and fast; here: "
             f"{describe_precision('auto', device)}. bf16 on a CPU without it (AVX2 only) runs far slower than fp32.")


# --- cached models ---------------------------------------------------------------------------------------


@st.cache_resource(show_spinner="Loading model…", max_entries=MAX_MODELS)
def base_model(spec_key: str):
    """The base model for a spec, shared read-only by all sessions."""
    from topl_core.models import load_model

    return load_model(spec_of(spec_key))


@st.cache_resource(show_spinner="Merging the adapter into a fresh copy of the base model…", max_entries=MAX_MODELS)
def merged_model(spec_key: str, run_path: str, fingerprint: str):
    """A fresh base model with the run's LoRA merged in (never the shared base model)."""
    from topl_core.generate import load_merged

    return load_merged(spec_of(spec_key), run_path)


@st.cache_resource(show_spinner="Loading the adapter and its head…", max_entries=MAX_MODELS)
def token_scorer(spec_key: str, run_path: str, fingerprint: str):
    from topl_core.models import load_model
    from topl_core.scoring import TokenScorer

    return TokenScorer(load_model(spec_of(spec_key)), run_path)


@st.cache_resource
def resource_lock(name: str) -> threading.Lock:
    """One lock per shared resource: generation on a shared model touches its tokenizer's padding side."""
    return threading.Lock()


def load_error(e: Exception) -> None:
    st.error(f"**Could not load the model.** {e}")
    st.info("Pick an embedded model (smollm2-135m) or a tiny test model in the sidebar.")


def layer_count_or_stop(spec: str) -> int:
    """The base model's number of decoder layers; if it cannot be loaded, say why and stop the page."""
    try:
        return base_model(spec).num_layers
    except Exception as e:
        load_error(e)
        st.stop()


# --- runs ----------------------------------------------------------------------------------------------------


EXAMPLE_PREFIX = "example: "  # how a shipped demo adapter is named in tables and pickers


@st.cache_data(ttl=2, show_spinner=False)
def runs_table(root: str, examples: str | None = None) -> pd.DataFrame:
    """All run directories under root, then the shipped demo adapters under `examples` (marked "example"), with
    their config summary and state (refreshed every 2 s)."""
    from topl_core import jobs
    from topl_core.runs import RunDir

    rows = []
    sources = [(root, "yours")] + ([(examples, "example")] if examples else [])
    for folder, source in sources:
        for stt in jobs.list_jobs(folder):
            try:
                cfg, meta = RunDir(stt.path).read_config()
            except Exception:
                continue
            rows.append({
                "run": (EXAMPLE_PREFIX if source == "example" else "") + stt.name, "method": cfg.method,
                "model": cfg.model, "state": stt.state, "step": stt.step, "steps": stt.steps, "loss": stt.loss,
                "val_token_auroc": stt.val.get("val_token_auroc"),
                "layers": f"{cfg.lora.layer_start}–{cfg.lora.layer_end}", "lr": cfg.lr, "precision": cfg.precision,
                "has_head": (stt.path / "head.safetensors").exists(),
                "complete": stt.state == "finished" and (stt.path / "adapter_model.safetensors").exists(),
                "source": source, "path": str(stt.path),
            })
    return pd.DataFrame(rows, columns=["run", "method", "model", "state", "step", "steps", "loss", "val_token_auroc",
                                       "layers", "lr", "precision", "has_head", "complete", "source", "path"])


def all_runs() -> pd.DataFrame:
    """The user's runs (TOPL_RUNS_DIR) and the shipped demo adapters, as runs_table rows."""
    from topl_core.paths import examples_dir, runs_dir

    ex = examples_dir()
    return runs_table(str(runs_dir()), str(ex) if ex is not None else None)


def finished_runs(need_head: bool = False, all_models: bool = False) -> pd.DataFrame:
    df = all_runs()
    # .astype(bool): on an empty table the column has dtype object, and indexing with an object Series would
    # select columns by name instead of rows
    df = df[df["complete"].astype(bool)]
    if need_head:
        df = df[df["has_head"].astype(bool)]
    if not all_models:
        df = df[df["model"] == current_model_name()]
    return df


def no_finished_run_hint(need_head: bool = False) -> str:
    """What to do when a page has no adapter to open for the current model: names the next step."""
    what = "with a head (TOPL, SOPL or TLDR) " if need_head else ""
    others = finished_runs(need_head, all_models=True)
    elsewhere = sorted(set(others["model"]) - {current_model_name()})
    hint = (f" Finished runs exist for {', '.join(f'**{m}**' for m in elsewhere)}: pick that model in the sidebar."
            if elsewhere else "")
    active = all_runs()
    active = active[(active["model"] == current_model_name()) & active["state"].isin(["starting", "running"])]
    if not active.empty:
        hint += f" {len(active)} run(s) for this model are still training: follow them on the **Train** page."
    return (f"No finished run {what}for **{current_model_name()}** yet. Train one on the **Train** page "
            f"(a tiny model trains in seconds; SmolLM2 in minutes to an hour on a CPU).{hint}")


def run_picker(label: str, key: str, need_head: bool = False, default_method: str | None = None,
               container=st) -> str | None:
    """A selectbox over finished runs of the current model. Returns the run path or None (with a hint shown)."""
    df = finished_runs(need_head)
    if df.empty:
        container.info(no_finished_run_hint(need_head))
        return None
    paths = df["path"].tolist()
    labels = {r.path: f"{r.run} · {r.method} · layers {r.layers}" for r in df.itertuples()}
    if key not in st.session_state or st.session_state[key] not in paths:
        # default: the run of the preferred method with the best validation token AUROC (then the newest)
        pref = df[df["method"] == default_method] if default_method else df.iloc[:0]
        if not pref.empty:
            pref = pref.assign(_a=pref["val_token_auroc"].astype(float).fillna(-1.0)).sort_values("_a", ascending=False,
                                                                                                  kind="stable")
        st.session_state[key] = (pref["path"].tolist() or paths)[0]
    return container.selectbox(label, paths, key=key,
                               persist_state="session", format_func=lambda p: labels.get(p, Path(p).name))


def run_fingerprint(run_path: str) -> str:
    from topl_core.runs import RunDir

    return RunDir(run_path).fingerprint()


# --- data sets ---------------------------------------------------------------------------------------------


def dataset_paths() -> list[str]:
    from topl_core.paths import cache_dir

    d = cache_dir() / "data"
    return sorted(str(p) for p in d.glob("*.jsonl")) if d.is_dir() else []


@st.cache_data(show_spinner="Reading records…", max_entries=8)
def load_records(path: str, mtime: float):
    from topl_core.data.records import read_jsonl

    return read_jsonl(path)


def records_of(path: str):
    return load_records(path, os.path.getmtime(path))


def dataset_picker(key: str, container=st, help: str | None = None) -> str | None:
    paths = dataset_paths()
    if not paths:
        container.info("No data set yet: build one on the **Data** page (or run `make setup`).")
        return None
    return container.selectbox("Data set", paths, key=key,
                               persist_state="session", format_func=lambda p: Path(p).name, help=help)


# --- rendering ---------------------------------------------------------------------------------------------

TOKEN_CSS = """
<style>
.topl-tokens {line-height: 2.1; font-size: 1.02rem; font-family: ui-sans-serif, system-ui, sans-serif;}
.topl-tok {border-radius: 3px; padding: 1px 0; white-space: pre-wrap;}
.topl-gold-bad {border-bottom: 3px solid #111; }
.topl-flag {outline: 1.5px solid #b91c1c; outline-offset: -1px;}
.topl-legend span {display:inline-block; padding: 0 .45em; margin-right: .4em; border-radius: 3px; font-size: .85rem;}
.topl-diff-ins {background: #fde68a; border-radius: 3px; padding: 0 1px;}
.topl-diff-del {color: #9ca3af; text-decoration: line-through;}
.topl-box {border: 1px solid rgba(128,128,128,.35); border-radius: 8px; padding: .7rem .9rem; min-height: 6rem;
           line-height: 1.6; font-size: 1.02rem;}
</style>
"""


def p_color(p: float) -> str:
    """Background for p(good): red for likely hallucinated, fading to a light green for confident good."""
    if p < 0.5:
        a = 0.25 + 0.6 * (0.5 - p) / 0.5
        return f"rgba(220,38,38,{a:.2f})"
    a = 0.08 + 0.3 * (p - 0.5) / 0.5
    return f"rgba(22,163,74,{a:.2f})"


def token_html(tokens, p_good=None, gold=None, threshold: float = 0.5, extra=None) -> str:
    """Tokens as colored spans. Background = head p(good) (when given), or gold labels alone; a black underline
    marks gold-bad tokens; a red outline marks tokens the head flags (p(good) < threshold). Hover shows values."""
    out = []
    for i, t in enumerate(tokens):
        classes, style, title = ["topl-tok"], "", []
        g = None if gold is None else int(gold[i])
        if p_good is not None:
            p = float(p_good[i])
            style = f"background:{p_color(p)};"
            title.append(f"p(good)={p:.3f}")
            if p < threshold:
                classes.append("topl-flag")
        elif g is not None and g >= 0:
            style = f"background:{'rgba(220,38,38,.55)' if g == 0 else 'rgba(22,163,74,.12)'};"
        if g is not None and g >= 0:
            title.append("gold: " + ("bad" if g == 0 else "good"))
            if g == 0 and p_good is not None:
                classes.append("topl-gold-bad")
        if extra is not None:
            title.extend(f"{k}={v[i]:.3f}" for k, v in extra.items())
        title.insert(0, repr(t))
        out.append(f'<span class="{" ".join(classes)}" style="{style}" title="{html.escape(" · ".join(title))}">'
                   f"{html.escape(t).replace(chr(10), '<br>')}</span>")  # no raw newline: it would end the HTML block
    return TOKEN_CSS + '<div class="topl-tokens">' + "".join(out) + "</div>"


def legend_html(with_head: bool = True) -> str:
    items = []
    if with_head:
        items += [f'<span style="background:{p_color(0.02)}">p(good) ≈ 0</span>',
                  f'<span style="background:{p_color(0.4)}">0.4</span>',
                  f'<span style="background:{p_color(0.7)}">0.7</span>',
                  f'<span style="background:{p_color(0.99)}">≈ 1</span>',
                  '<span style="border-bottom:3px solid #111">gold bad</span>',
                  '<span style="outline:1.5px solid #b91c1c">flagged (below threshold)</span>']
    else:
        items += ['<span style="background:rgba(220,38,38,.55)">bad (hallucinated span)</span>',
                  '<span style="background:rgba(22,163,74,.12)">good</span>']
    return TOKEN_CSS + '<div class="topl-legend">' + "".join(items) + "</div>"


def diff_html(reference: str, text: str) -> str:
    """`text` with the words that differ from `reference` highlighted (insertions) or struck through (deletions)."""
    import difflib

    a, b = reference.split(), text.split()
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(html.escape(" ".join(b[j1:j2])))
            continue
        if op in ("delete", "replace") and i2 > i1:
            out.append(f'<span class="topl-diff-del">{html.escape(" ".join(a[i1:i2]))}</span>')
        if op in ("insert", "replace") and j2 > j1:
            out.append(f'<span class="topl-diff-ins">{html.escape(" ".join(b[j1:j2]))}</span>')
    return " ".join(out)


def text_box(title: str, body_html: str, caption: str = "") -> str:
    cap = f'<div style="opacity:.65;font-size:.8rem;margin-top:.35rem">{html.escape(caption)}</div>' if caption else ""
    return (TOKEN_CSS + f'<div style="font-weight:600;margin-bottom:.3rem">{html.escape(title)}</div>'
            f'<div class="topl-box">{body_html}</div>{cap}')


def csv_download(df: pd.DataFrame, name: str, key: str, label: str = "Download CSV", container=st) -> None:
    container.download_button(label, df.to_csv(index=False).encode(), file_name=name, mime="text/csv", key=key,
                              icon=":material/download:")


PLOTLY_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def plot(fig, key: str, container=st) -> None:
    """Plotly chart; its toolbar's camera button downloads a PNG (rendered by the browser, no kaleido needed)."""
    fig.update_layout(margin=dict(l=10, r=10, t=40, b=10))
    container.plotly_chart(fig, key=key, config=PLOTLY_CONFIG, width="stretch")


# --- labelled token sets (LoRA-A, Steering) ------------------------------------------------------------------

TOKEN_SETS = ("run's data · val split", "run's data · test split", "CLIFF spans (OOD)", "another data set")


@st.cache_data(show_spinner="Reading the token set…", max_entries=16)
def token_set(kind: str, run_path: str, data_path: str | None, split: str, limit: int) -> tuple[str, list]:
    """(description, labelled records) for a token-set choice. Raises DataError/RunError with a message to show."""
    from topl_core.analysis.probe import labelled_records
    from topl_core.data.records import read_jsonl
    from topl_core.errors import DataError
    from topl_core.data.split import split_records
    from topl_core.paths import PROJECT_ROOT
    from topl_core.runs import RunDir

    if kind.startswith("CLIFF"):
        from topl_core.data.cliff import load_factuality_csv
        from topl_core.paths import cliff_csv

        path = cliff_csv()
        if not path.is_file():
            raise DataError(f"CLIFF spans not found at {path} (set TOPL_SHARED_DATA to its folder).")
        recs = labelled_records(load_factuality_csv(path).records)
        return f"CLIFF ({path.name})", recs[:limit]
    if kind.startswith("run's data"):
        cfg, _ = RunDir(run_path).read_config()
        p = Path(cfg.data)
        p = p if p.is_absolute() else PROJECT_ROOT / p
        split = "val" if "val" in kind else "test"
        recs = split_records(read_jsonl(p), seed=cfg.split_seed)[split]
        return f"{p.name} [{split}]", labelled_records(recs)[:limit]
    if not data_path:
        raise DataError("pick a data set")
    recs = read_jsonl(data_path)
    if split != "all":
        recs = split_records(recs)[split]
    return f"{Path(data_path).name} [{split}]", labelled_records(recs)[:limit]


def token_set_picker(prefix: str, run_path: str, container=st, default_limit: int = 48):
    """Widgets for a token set; returns the arguments of token_set() (all hashable)."""
    c1, c2, c3 = container.columns([2, 2, 1])
    kind = c1.selectbox("Token set", TOKEN_SETS, key=f"{prefix}.token_set", persist_state="session",
                        help="Labelled tokens on which LoRA-A separability (and μ+ / μ− for steering) are measured.")
    data_path, split = None, "all"
    if kind == "another data set":
        data_path = dataset_picker(f"{prefix}.token_data", container=c2)
        split = c2.selectbox("Split", ["val", "test", "train", "all"], key=f"{prefix}.token_split",
                             persist_state="session")
    limit = c3.number_input("Records", 4, 5000, default_limit, step=8, key=f"{prefix}.token_limit",
                            persist_state="session",
                            help="More records → steadier AUROCs, slower capture (cached on disk afterwards).")
    return kind, run_path, data_path, split, int(limit)


# --- evaluations (Evaluation and Runs pages) ---------------------------------------------------------------


def evaluations_dir() -> Path:
    from topl_core.paths import runs_dir

    return runs_dir() / "evaluations"


@st.cache_data(show_spinner=False, max_entries=64)
def read_evaluation(path: str, mtime: float) -> dict:
    """The eval.json an evaluation job wrote (python -m topl_core evaluate --json)."""
    import json

    return json.loads((Path(path) / "eval.json").read_text())


def run_factuality(run_name: str) -> dict:
    """ID / OOD / average factuality and average sentence count of a run's merged adapter, from the newest finished
    evaluation that has it (sentence protocol). Empty when the run was never evaluated."""
    d = evaluations_dir()
    if not d.is_dir():
        return {}
    for e in sorted(d.iterdir(), key=lambda p: -p.stat().st_mtime):
        f = e / "eval.json"
        if not f.exists():
            continue
        try:
            res = read_evaluation(str(e), f.stat().st_mtime)
        except ValueError:
            continue
        for row in res.get("table_sentence", []):
            if row.get("variant") == f"merged ({run_name})":
                return {"ID factuality": row.get("ID"), "OOD factuality": row.get("OOD"),
                        "avg factuality": row.get("average"), "avg sentences": row.get("sentences"),
                        "evaluation": e.name}
    return {}


if __name__ == "__main__":  # the legacy router runs every pages/*.py as a page, this one included (URL /ui)
    ensure_frame()
