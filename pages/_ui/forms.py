"""Config forms (Train, Layer sweep, the Data page's build form) built from the config dataclasses — TrainConfig
with its LoraSettings, SweepConfig, ExecutorConfig and the data sources' SourceOptions — as the CLI builds its
flags: one input per field, the widget chosen by the field's type, the default taken from a config instance. A field
added to a config reaches every form that shows that config with no edit here; FIELD_WIDGETS only words a field
better (label, bounds, format, help, options) than its type alone can."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import typing

from topl_core.data.variants import LABEL_SETTINGS
from topl_core.precision import PRECISIONS, describe_precision, resolve_precision
from topl_core.presets import LORA_MODULES

SIDEBAR_FIELDS = frozenset({"model", "device"})  # chosen in the sidebar, for every page
NO_VALUE = object()  # field_input without a default: the value comes from st.session_state (set by the page)

# Keyword arguments of a field's widget, by field name (TrainConfig, LoraSettings, SweepConfig); a field without an
# entry gets a label from its name and, for a float, the "%g" format.
FIELD_WIDGETS: dict[str, dict] = {
    # TrainConfig
    "steps": dict(label="Steps", min_value=1, max_value=1_000_000),
    "lr": dict(label="Learning rate", min_value=1e-7, max_value=1.0, format="%.1e", step=1e-5),
    "head_lr_multiplier": dict(
        label="Head lr × (of lr)",
        min_value=0.01,
        max_value=100_000.0,
        help="The head (TOPL, SOPL, TLDR) learns at lr × this; the LoRA at lr.",
    ),
    "batch_size": dict(label="Batch size", min_value=1, max_value=1024),
    "grad_accum": dict(label="Gradient accumulation", min_value=1, max_value=1024),
    "gradient_checkpointing": dict(
        label="Gradient checkpointing", help="Recompute activations in the backward pass: less memory, ~⅓ more time."
    ),
    "micro_batch_size": dict(
        label="Micro-batch size",
        min_value=1,
        max_value=1024,
        help="Examples per forward/backward pass. Splitting a batch keeps its gradient "
        "(micro-batches are weighted by tokens) and cuts peak memory.",
    ),
    "seed": dict(label="Seed", min_value=0, max_value=1_000_000),
    "max_doc_tokens": dict(label="Max document tokens", min_value=16, max_value=32_768),
    "max_response_tokens": dict(label="Max response tokens", min_value=8, max_value=8192),
    "eval_every": dict(label="Validate every (steps)", min_value=1, max_value=100_000),
    "checkpoint_every": dict(label="Checkpoint every", min_value=1, max_value=100_000),
    "max_val_examples": dict(label="Validation examples", min_value=1, max_value=100_000),
    "label_setting": dict(label="Label setting", options=LABEL_SETTINGS),
    "probe_layers": dict(
        label="Side probes at layers",
        help="TOPL/TLDR: a linear probe at each of these layers (below the head's), trained in the same forward "
        "without changing the run; validation shows each one's token AUROC, to choose the head layer from data.",
    ),
    "beta": dict(label="β (DPO/TDPO)", min_value=0.0, max_value=10.0),
    "report_to": dict(
        label="Report to",
        help="Experiment trackers that also get every logged metric and the config: TensorBoard event files in the "
        "run folder (tensorboard --logdir runs/), MLflow at the tracking URI. Needs pip install -e '.[tracking]'.",
    ),
    "mlflow_tracking_uri": dict(
        label="MLflow tracking URI", help="Empty: the SQLite store mlflow.db in the runs folder. E.g. http://host:5000"
    ),
    # LoraSettings
    "r": dict(label="Rank r", min_value=1, max_value=256),
    "alpha": dict(label="α", min_value=0.1, max_value=1024.0),
    "dropout": dict(label="Dropout", min_value=0.0, max_value=0.9),
    "layer_start": dict(label="First layer", min_value=0),
    "layer_end": dict(label="Last layer", min_value=0),
    "modules": dict(label="Modules", options=LORA_MODULES),
    # SweepConfig
    "sizes": dict(label="Window sizes k"),
    "stride": dict(label="Start every … layers", min_value=1),
    "reuse_prefix": dict(
        label="Reuse frozen prefix",
        help="Layers below a window carry no LoRA: their activations are computed once and reused.",
    ),
    "n_generate": dict(label="Also score generations on … test docs", min_value=0, max_value=1000),
    "max_new_tokens": dict(label="Max new tokens (generations)", min_value=8, max_value=1024),
    "scorer": dict(
        label="Scorer (generations)",
        help="'grounding' = the offline default; with a hub: hub:nli:<model id> or "
        "hub:minicheck-lm:bespokelabs/Bespoke-MiniCheck-7B",
    ),
    # SourceOptions (the Data page's build form; help from the field's metadata)
    "limit": dict(label="Limit (documents / rows)", min_value=1, max_value=100_000),
    "recipe": dict(label="Edit recipe"),
    "fava_form": dict(label="FAVA form"),
    "mlqe_split": dict(label="MLQE split"),
    # ExecutorConfig (where a study's tasks run)
    "kind": dict(
        label="Run the windows",
        format_func=lambda k: {"local": "here, one after another", "ray": "as Ray tasks"}[k],
        help="Ray runs windows side by side, each in its own worker process: on this machine (a Ray instance "
        "started for the sweep) or on a cluster (its address).",
    ),
    "address": dict(label="Ray address", help="Empty: start Ray on this machine. 'auto' or host:port: join a cluster."),
    "cpus_per_task": dict(label="CPUs per task", min_value=0.1, max_value=1024.0),
    "gpus_per_task": dict(label="GPUs per task", min_value=0.0, max_value=64.0),
    "max_retries": dict(label="Retries (worker died)", min_value=0, max_value=100),
}


@functools.cache
def field_types(cls) -> dict:
    """The resolved type of every field of a config dataclass."""
    return typing.get_type_hints(cls)


def field_input(container, cls, name: str, key_prefix: str, default=NO_VALUE, **widget):
    """One input for field `name` of dataclass `cls`, keyed key_prefix + name, kept across pages (persist_state).
    The widget follows the field's type — Literal or given options → selectbox, tuple → multiselect, bool → toggle,
    int / float → number_input, anything else → text_input — worded by FIELD_WIDGETS[name], then `widget`. It starts
    at `default`; without one, at its value in st.session_state. Returns the value as the field's type."""
    typ = field_types(cls)[name]
    kw = {**FIELD_WIDGETS.get(name, {}), **widget}
    label = kw.pop("label", name.replace("_", " ").capitalize())
    options = kw.pop("options", None)
    given = default is not NO_VALUE
    kw.update(key=key_prefix + name, persist_state="session")
    if typing.get_origin(typ) is tuple:
        item = typing.get_args(typ)[0]  # a tuple of Literal choices offers them all (report_to); else its default
        choices = typing.get_args(item) if typing.get_origin(item) is typing.Literal else default
        options = list(options if options is not None else choices)
        return tuple(container.multiselect(label, options, **({"default": list(default)} if given else {}), **kw))
    if typing.get_origin(typ) is typing.Literal or options is not None:
        options = list(options if options is not None else typing.get_args(typ))
        return container.selectbox(label, options, **({"index": options.index(default)} if given else {}), **kw)
    if typ is bool:
        return bool(container.toggle(label, **({"value": default} if given else {}), **kw))
    if typ is int:
        return int(container.number_input(label, **({"value": default} if given else {}), **{"step": 1, **kw}))
    if typ is float:
        fmt = {} if name in FIELD_WIDGETS else {"format": "%g"}
        return float(container.number_input(label, **({"value": default} if given else {}), **fmt, **kw))
    return container.text_input(label, **({"value": "" if default is None else str(default)} if given else {}), **kw)


def config_inputs(cls, columns, key_prefix: str, defaults, skip=frozenset()) -> dict:
    """field_input for every field of dataclass `cls` not named in `skip`, in field order over `columns` in turn,
    keyed key_prefix + field name, starting at the field's value in `defaults` (an instance of cls). A field that is
    itself a dataclass (TrainConfig.lora) gets an input per field of its own (`skip` names those too) and comes back
    as `defaults`' value with them replaced. Returns {field: value}, to build cls with the hand-laid fields."""
    return _inputs(cls, itertools.cycle(columns), key_prefix, defaults, frozenset(skip))


def _inputs(cls, columns, key_prefix: str, defaults, skip: frozenset) -> dict:
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        typ, default = field_types(cls)[f.name], getattr(defaults, f.name)
        if dataclasses.is_dataclass(typ):
            values[f.name] = dataclasses.replace(default, **_inputs(typ, columns, key_prefix, default, skip))
        else:
            values[f.name] = field_input(next(columns), cls, f.name, key_prefix, default)
    return values


def precision_select(container, key: str, device: str) -> str:
    """The compute-precision picker of the forms (Train, Layer sweep): "auto" shows what it resolves to here."""
    return container.selectbox(
        "Precision",
        PRECISIONS,
        key=key,
        persist_state="session",
        format_func=lambda p: f"auto → {resolve_precision('auto', device)}" if p == "auto" else p,
        help=f"auto = bf16 autocast only where this machine computes bf16 natively and fast; here: "
        f"{describe_precision('auto', device)}. bf16 on a CPU without it (AVX2 only) runs far slower than fp32.",
    )
