"""Config forms (Train, Layer sweep, the Data page's build form) built from the config dataclasses — TrainConfig
with its LoraSettings, SweepConfig, ExecutorConfig and the data sources' SourceOptions — as the CLI builds its
flags: one input per field, the widget chosen by the field's type, worded by the field's own description (label, help,
bounds, choices: topl_core.foundations.config_fields), the default taken from a config instance. A field added to a
config reaches every form that shows that config with no edit here."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Mapping, Sequence

import streamlit as st

from topl_core.analysis.evaluation.recommend import ModeDefaults, opening
from topl_core.foundations.config_fields import field_infos
from topl_core.hardware.precision import PRECISIONS, describe_precision, resolve_precision
from topl_core.runtime.modes import SteerConfig

SIDEBAR_FIELDS = frozenset({"model", "device"})  # chosen in the sidebar, for every page
NO_VALUE = object()  # field_input without a default: the value comes from st.session_state (set by the page)


def field_input(container, cls, name: str, key_prefix: str, default=NO_VALUE, **widget):
    """One input for field `name` of dataclass `cls`, keyed key_prefix + name, kept across pages (persist_state).
    The widget follows the field's type — choices (a Literal's, the field's, or given `options`) → selectbox, tuple →
    multiselect, bool → toggle, int / float → number_input within the field's bounds, anything else → text_input —
    worded by the field's label and help, then `widget`. It starts at `default`; without one, at its value in
    st.session_state. Returns the value as the field's type."""
    info = field_infos(cls)[name]
    bounds = {"min_value": info.min, "max_value": info.max, "step": info.step}
    kw = {"help": info.help or None, **{k: v for k, v in bounds.items() if v is not None}, **widget}
    label = kw.pop("label", info.label)
    options = list(kw.pop("options", info.choices))
    given = default is not NO_VALUE
    kw.update(key=key_prefix + name, persist_state="session")
    if info.is_tuple:  # a tuple with choices offers them all (report_to, modules); else its default's items
        options = options or list(default)
        return tuple(container.multiselect(label, options, **({"default": list(default)} if given else {}), **kw))
    if options:
        return container.selectbox(label, options, **({"index": options.index(default)} if given else {}), **kw)
    if info.type is bool:
        return bool(container.toggle(label, **({"value": default} if given else {}), **kw))
    if info.item is int:  # an optional int (None: left to the config, e.g. LoRA's last layer) starts empty
        value = container.number_input(label, **({"value": default} if given else {}), **{"step": 1, **kw})
        return None if value is None else int(value)
    if info.type is float:
        return float(container.number_input(label, **({"value": default} if given else {}), **{"format": "%g", **kw}))
    return container.text_input(label, **({"value": "" if default is None else str(default)} if given else {}), **kw)


def config_inputs(cls, columns, key_prefix: str, defaults, skip=frozenset()) -> dict:
    """field_input for every field of dataclass `cls` not named in `skip`, in field order over `columns` in turn,
    keyed key_prefix + field name, starting at the field's value in `defaults` (an instance of cls). A field that is
    itself a dataclass (TrainConfig.lora) gets an input per field of its own (`skip` names those too) and comes back
    as `defaults`' value with them replaced. Returns {field: value}, to build cls with the hand-laid fields."""
    return _inputs(cls, itertools.cycle(columns), key_prefix, defaults, frozenset(skip))


def _inputs(cls, columns, key_prefix: str, defaults, skip: frozenset) -> dict:
    values = {}
    for name, info in field_infos(cls).items():
        if name in skip:
            continue
        default = getattr(defaults, name)
        if dataclasses.is_dataclass(info.type):
            values[name] = dataclasses.replace(default, **_inputs(info.type, columns, key_prefix, default, skip))
        else:
            values[name] = field_input(next(columns), cls, name, key_prefix, default)
    return values


def mode_settings(container, names: Sequence[str], key_prefix: str, opens: Mapping[str, float] | None = None) -> dict:
    """An input per steering-mode setting in `names` (the SteerConfig fields a mode's action reads as its own: a
    gated mode's τ and k), side by side in `container`, starting at `opens` (e.g. the adapter's recommended τ), else
    at SteerConfig's defaults; {} for none."""
    if not names:
        return {}
    defaults, columns, opens = SteerConfig(), container.columns(len(names)), opens or {}
    return {
        n: field_input(c, SteerConfig, n, key_prefix, opens.get(n, getattr(defaults, n)))
        for n, c in zip(names, columns)
    }


@st.cache_data(show_spinner=False, max_entries=64)
def opening_values(run: str | None, fingerprint: str, mode: str) -> ModeDefaults:
    """What the steering forms open at for adapter `run` (its fingerprint keys the cache) in `mode`: the recommended
    τ and λ (`python -m topl_core recommend`), or None with the reason — read from the caches, never computed."""
    return opening(run, mode) if run is not None else ModeDefaults(None, None, "defaults: no adapter chosen")


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
