"""Train: a form for any method with the paper's presets; the run starts in a separate process
(topl_core.jobs.background), and the page follows it live — progress bar with ETA, loss curve, validation metrics —
with cancel and resume.
Everything shown is read from the run directories, so it survives page reloads and app restarts."""

from pages._ui.frame import ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

from pathlib import Path

import streamlit as st

from pages._ui.datasets import dataset_paths
from pages._ui.forms import SIDEBAR_FIELDS, config_inputs, field_input, precision_select
from pages._ui.models import layer_count_or_stop
from pages._ui.spec import current_spec, split_spec
from pages._ui.train_jobs import train_jobs_panel
from topl_core.foundations.errors import ConfigError
from topl_core.foundations.paths import inside, runs_dir
from topl_core.foundations.presets import PRESETS
from topl_core.jobs import background, launchers
from topl_core.training.config import LoraSettings, TrainConfig, preset_config
from topl_core.training.methods import METHODS

st.title("Train")
st.caption(
    "TOPL and its baselines with one training loop. Runs go to a background process: close the tab, "
    "reload, or restart the app — the run keeps going and is picked up again here."
)

spec = current_spec()
model_name, _dtype, device = split_spec(spec)
n_layers = layer_count_or_stop(spec)

K = "train."
NO_PRESET = "none (CPU defaults)"
DEFAULT = TrainConfig()  # every input starts at TrainConfig's own default (one place for defaults)
# Laid out by hand below (with the inputs of pages/_ui/forms.py); every other TrainConfig field gets a generated input
# under "More settings", so a field added to TrainConfig appears in this form (as in the CLI) without an edit here.
# tests/test_app.py checks it.
HAND_LAID = {
    "method",
    "data",
    "lora",
    "lr",
    "batch_size",
    "grad_accum",
    "steps",
    "precision",
    "eval_every",
    "seed",
    "label_setting",
    "beta",
    "checkpoint_every",
    "max_doc_tokens",
    "max_response_tokens",
    "max_val_examples",
    "micro_batch_size",
    "head_lr_multiplier",
    "probe_layers",  # its options are the model's layers
}


def form_defaults() -> dict:
    """The form's values for the chosen method + preset (the paper's hyperparameters, its layer range carried to this
    model's depth; without a preset the range from the model's own depth, TrainConfig.for_depth) and a fresh run
    name."""
    method, preset = st.session_state[K + "method"], st.session_state[K + "preset"]
    if preset == NO_PRESET:
        base = TrainConfig(method=method).for_depth(n_layers)
    else:  # the CLI's --preset mapping, so the form and the CLI cannot disagree
        base = preset_config(preset, method, num_layers=n_layers, model=model_name)
    layers = (base.lora.layer_start, base.lora.layer_end)
    values = {
        "lr": base.lr,
        "head_lr_multiplier": base.head_lr_multiplier,
        "batch_size": base.batch_size,
        "grad_accum": base.grad_accum,
        "layer_start": layers[0],
        "layer_end": layers[1],
    }
    if METHODS[method].lora_all_layers:  # TLDR: defined with LoRA on every layer
        values.update(layer_start=0, layer_end=n_layers - 1)
    values["run_name"] = launchers.default_run_name(TrainConfig(method=method, model=model_name))
    return values


def apply_defaults() -> None:
    """Another method or preset picked: the whole form follows it."""
    for k, v in form_defaults().items():
        st.session_state[K + k] = v


st.session_state.setdefault(K + "method", "topl")
st.session_state.setdefault(K + "preset", NO_PRESET)
if st.session_state.get(K + "for_model") != spec:  # first visit, or another model picked: reset the form
    st.session_state[K + "for_model"] = spec
    apply_defaults()
else:
    # Streamlit drops the state of a widget that a completed script run did not render, and the form's inputs have
    # no value of their own: refill what is gone, keep what the user typed
    for k, v in form_defaults().items():
        st.session_state.setdefault(K + k, v)

if st.session_state.pop(K + "new_name", False):
    st.session_state[K + "run_name"] = launchers.default_run_name(
        TrainConfig(method=st.session_state[K + "method"], model=model_name)
    )
if flash := st.session_state.pop(K + "flash", None):
    st.success(flash, icon=":material/rocket_launch:")

# --- the form -------------------------------------------------------------------------------------------------

any_active = any(j.active for j in background.list_jobs() if j.kind == "train")
with st.expander("New run", expanded=not any_active, icon=":material/add:"):
    c1, c2, c3 = st.columns([1, 1, 2])
    c1.selectbox(
        "Method",
        list(METHODS),
        key=K + "method",
        persist_state="session",
        on_change=apply_defaults,
        format_func=lambda m: METHODS[m].label,
    )
    c2.selectbox(
        "Preset",
        [NO_PRESET, *PRESETS],
        key=K + "preset",
        persist_state="session",
        on_change=apply_defaults,
        help="The paper's learning rate, batch and LoRA layers for that model family (8B/4B, GPU).",
    )
    c3.info(METHODS[st.session_state[K + "method"]].description)

    with st.form("train.form", border=False):
        a, b, c, d = st.columns(4)
        run_name = a.text_input("Run name", key=K + "run_name", persist_state="session")
        data_paths = dataset_paths()
        data = b.selectbox(
            "Data set", data_paths, key=K + "data", persist_state="session", format_func=lambda p: Path(p).name
        )
        steps = field_input(c, TrainConfig, "steps", K, DEFAULT.steps)
        lr = field_input(d, TrainConfig, "lr", K)  # lr, batch, accumulation, layers, head lr: form_defaults()
        a, b, c, d = st.columns(4)
        batch = field_input(a, TrainConfig, "batch_size", K)
        accum = field_input(b, TrainConfig, "grad_accum", K)
        precision = precision_select(c, K + "precision", device)
        eval_every = field_input(d, TrainConfig, "eval_every", K, DEFAULT.eval_every)
        st.markdown(
            f"**LoRA** — the model has {n_layers} layers (0–{n_layers - 1}); "
            "the TOPL head sits after the last LoRA layer."
        )
        a, b, c, d, e = st.columns(5)
        layer_start = field_input(a, LoraSettings, "layer_start", K, max_value=n_layers - 1)
        layer_end = field_input(b, LoraSettings, "layer_end", K, max_value=n_layers - 1)
        r = field_input(c, LoraSettings, "r", K, DEFAULT.lora.r)
        alpha = field_input(d, LoraSettings, "alpha", K, DEFAULT.lora.alpha)
        dropout = field_input(e, LoraSettings, "dropout", K, DEFAULT.lora.dropout)
        modules = field_input(st, LoraSettings, "modules", K, DEFAULT.lora.modules)
        with st.expander("More settings"):
            a, b, c, d = st.columns(4)
            label_setting = field_input(a, TrainConfig, "label_setting", K, DEFAULT.label_setting)
            beta = field_input(b, TrainConfig, "beta", K, DEFAULT.beta)
            seed = field_input(c, TrainConfig, "seed", K, DEFAULT.seed)
            ckpt = field_input(d, TrainConfig, "checkpoint_every", K, DEFAULT.checkpoint_every)
            a, b, c, d = st.columns(4)
            max_doc = field_input(a, TrainConfig, "max_doc_tokens", K, DEFAULT.max_doc_tokens)
            max_resp = field_input(b, TrainConfig, "max_response_tokens", K, DEFAULT.max_response_tokens)
            max_val = field_input(c, TrainConfig, "max_val_examples", K, DEFAULT.max_val_examples)
            micro = field_input(d, TrainConfig, "micro_batch_size", K, DEFAULT.micro_batch_size)
            has_head = METHODS[st.session_state[K + "method"]].uses_head
            a, b = st.columns([1, 3])
            head_mult = field_input(a, TrainConfig, "head_lr_multiplier", K, disabled=not has_head)
            probe_layers = field_input(b, TrainConfig, "probe_layers", K, DEFAULT.probe_layers, options=range(n_layers))
            other = config_inputs(TrainConfig, st.columns(4), K, DEFAULT, skip=HAND_LAID | SIDEBAR_FIELDS)
        submitted = st.form_submit_button("Start training", type="primary", icon=":material/play_arrow:")

if submitted:
    try:
        if not data:
            raise ConfigError("data: no data set; build one on the Data page first.")
        cfg = TrainConfig(
            method=st.session_state[K + "method"],
            model=model_name,
            data=str(Path(data).resolve()),
            lora=LoraSettings(
                r=int(r),
                alpha=float(alpha),
                dropout=float(dropout),
                layer_start=int(layer_start),
                layer_end=int(layer_end),
                modules=tuple(modules),
            ),
            lr=float(lr),
            head_lr_multiplier=float(head_mult),
            batch_size=int(batch),
            grad_accum=int(accum),
            micro_batch_size=int(micro),
            steps=int(steps),
            seed=int(seed),
            precision=precision,
            device=device,
            max_doc_tokens=int(max_doc),
            max_response_tokens=int(max_resp),
            eval_every=int(eval_every),
            checkpoint_every=int(ckpt),
            max_val_examples=int(max_val),
            label_setting=label_setting,
            beta=float(beta),
            probe_layers=tuple(probe_layers),
            **other,
        )
        name = run_name.strip() or launchers.default_run_name(cfg)
        path = launchers.launch_train(cfg, inside(runs_dir(), name, "Run name"))
        st.session_state[K + "watch"] = str(path)
        st.session_state[K + "detail"] = path.name  # show the new run's curves
        st.session_state[K + "flash"] = f"Started **{name}** in the background (pid {background.read_job(path).pid})."
        st.session_state[K + "new_name"] = True
        st.rerun()
    except (ConfigError, background.JobError, ValueError) as e:
        st.error(str(e))

# --- live jobs ------------------------------------------------------------------------------------------------

st.fragment(train_jobs_panel, run_every=1.5 if any_active else None)()
