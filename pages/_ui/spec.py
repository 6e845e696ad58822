"""The model spec every page shares: a string "name|weights precision|device" in st.session_state, set by the
sidebar picker, and the analysis pages' compute precision (current_precision), set beside it."""

from __future__ import annotations

import streamlit as st

from topl_core.hardware.precision import (
    PRECISIONS,
    ResolvedPrecision,
    describe_precision,
    resolve_decode_precision,
    resolve_precision,
    resolve_weights,
)
from topl_core.models.loading import DEVICES, EMBEDDED, ModelSpec
from topl_core.models.startup import app_default_spec
from topl_core.models.tiny import TINY_FAMILIES

SPEC_KEY = "model_spec"  # session_state: "name|dtype|device"
PRECISION_KEY = "sidebar.precision"  # session_state: the analysis pages' compute precision, "auto" / "fp32" / "bf16"
CUSTOM = "Hugging Face id or local path…"


def split_spec(key: str) -> tuple[str, str, str]:
    name, dtype, device = key.rsplit("|", 2)
    return name, dtype, device


def current_spec() -> str:
    return st.session_state.get(SPEC_KEY) or app_default_spec()


def current_precision() -> ResolvedPrecision:
    """The analysis pages' compute precision (the sidebar's), resolved for the current device: pass it to cached
    computations, so that results of one precision are never served for the other."""
    device = split_spec(current_spec())[2]
    return resolve_precision(st.session_state.get(PRECISION_KEY, "auto"), device)


def current_decode_precision() -> ResolvedPrecision:
    """The precision of a generation's one-token decode steps for the sidebar's choice: the choice itself where it
    names one; for auto, the faster at one token on this device (hardware.precision.resolve_decode_precision)."""
    choice = st.session_state.get(PRECISION_KEY, "auto")
    return resolve_decode_precision(choice, choice, split_spec(current_spec())[2])


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
    """The model picker every page shares (rendered by the frame in the sidebar). Returns the spec string."""
    name, dtype, device = split_spec(app_default_spec())
    choices = model_choices()
    if "sidebar.model_choice" not in st.session_state:
        st.session_state["sidebar.model_choice"] = name if name in choices else CUSTOM
        st.session_state["sidebar.model_custom"] = "" if name in choices else name
        st.session_state["sidebar.dtype"] = dtype
        st.session_state["sidebar.device"] = device
        st.session_state[PRECISION_KEY] = "auto"
    choice = st.sidebar.selectbox(
        "Model",
        choices,
        key="sidebar.model_choice",
        persist_state="session",
        format_func=model_label,
        help="Embedded models run offline on CPU. Paste a hub id (e.g. Qwen/Qwen3-8B) or a "
        "local save_pretrained directory for anything else.",
    )
    if choice == CUSTOM:
        custom = st.sidebar.text_input(
            "Hub id or local path",
            key="sidebar.model_custom",
            persist_state="session",
            placeholder="Qwen/Qwen3-8B or /path/to/model",
        )
        name = custom.strip() or split_spec(current_spec())[0]  # until one is typed: the model already in use
    else:
        name = choice
    with st.sidebar.expander("Precision & device"):
        device = st.selectbox(
            "device",
            list(DEVICES),
            key="sidebar.device",
            persist_state="session",
            help="cuda needs a visible GPU (8B models: bf16 weights on cuda).",
        )
        st.selectbox(
            "weights precision",
            PRECISIONS,
            key="sidebar.dtype",
            persist_state="session",
            format_func=lambda d: f"auto → {resolve_weights(d, device)}" if d == "auto" else d,
            help="auto: fp32 on CPU (bf16 compute there comes from autocast, where the CPU has it), "
            "bf16 on a GPU with bf16 support.",
        )
        st.selectbox(
            "compute precision",
            PRECISIONS,
            key=PRECISION_KEY,
            persist_state="session",
            format_func=lambda p: f"auto → {resolve_precision('auto', device)}" if p == "auto" else p,
            help="What the analysis pages compute in (LoRA-A capture, steering, token scores, generation): bf16 = "
            "autocast. auto = TOPL_PRECISION when set, else bf16 only where this device computes it natively and "
            "fast. Training and sweeps take theirs on their own forms.",
        )
        st.caption(f"here: {describe_precision(st.session_state[PRECISION_KEY], device)}")
    spec = f"{name}|{resolve_weights(st.session_state['sidebar.dtype'], device)}|{device}"  # "auto" resolved: one key
    st.session_state[SPEC_KEY] = spec
    return spec
