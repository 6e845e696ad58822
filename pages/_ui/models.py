"""Cached models: `st.cache_resource`, shared read-only by every session (never mutated), keyed by the spec string
and, for adapters, the run path and fingerprint."""

from __future__ import annotations

import os
import threading

import streamlit as st

from pages._ui.spec import current_model_name, spec_of
from topl_core.analysis.lora_a.probe_head import ProbeHead, ProbeHeadSettings, fit_probe_head
from topl_core.data.records import read_jsonl
from topl_core.inference.generate import load_merged
from topl_core.inference.token_scores import TokenScorer
from topl_core.models.loading import EMBEDDED, load_model
from topl_core.models.tiny import TINY_FAMILIES
from topl_core.training.adapters import open_adapter

# How many models each cache keeps (base, merged per run, token scorer). 8B models on one GPU: set 1.
MAX_MODELS = int(os.environ.get("TOPL_UI_MAX_MODELS", "3"))


@st.cache_resource(show_spinner="Loading model…", max_entries=MAX_MODELS)
def base_model(spec_key: str):
    """The base model for a spec, shared read-only by all sessions."""
    return load_model(spec_of(spec_key))


@st.cache_resource(show_spinner="Merging the adapter into a fresh copy of the base model…", max_entries=MAX_MODELS)
def merged_model(spec_key: str, run_path: str, fingerprint: str):
    """A fresh base model with the run's LoRA merged in (never the shared base model)."""
    return load_merged(spec_of(spec_key), run_path)


@st.cache_resource(show_spinner="Loading the adapter and its head…", max_entries=MAX_MODELS)
def token_scorer(spec_key: str, run_path: str, fingerprint: str, precision: str, probe_head: bool = False):
    """The adapter with its own head, or (probe_head) with the probe head fitted on its hidden states."""
    head = None
    if probe_head:
        probe, _ = probe_heads(spec_key, run_path, fingerprint, precision)
        head = (probe.layer, probe.linear())
    return TokenScorer(load_model(spec_of(spec_key)), run_path, precision=precision, head=head)


@st.cache_resource(show_spinner="Fitting a probe head on the adapter's hidden states (and on the base model)…")
def probe_heads(spec_key: str, run_path: str, fingerprint: str, precision: str) -> tuple[ProbeHead, ProbeHead]:
    """(the probe head of the adapter, the same probe on the base model: the control), fitted on the labelled
    tokens of the default data set (or the run's data); cached on disk by the adapter's fingerprint."""
    adapter = open_adapter(run_path)
    records = read_jsonl(adapter.settings.data)
    spec = spec_of(spec_key)
    settings = ProbeHeadSettings(precision=precision)
    probe = fit_probe_head(adapter, records, settings, base=load_model(spec))
    control = fit_probe_head(adapter, records, settings, adapter_enabled=False, base=load_model(spec))
    return probe, control


@st.cache_resource
def resource_lock(name: str) -> threading.Lock:
    """One lock per shared resource: generation on a shared model touches its tokenizer's padding side."""
    return threading.Lock()


def load_error(e: Exception) -> None:
    """The model itself did not load: its error, and the advice that fits the model picked."""
    st.error(f"**Could not load the model.** {e}")
    name = current_model_name()
    if name in EMBEDDED:
        st.info(f"{name} ships with the workbench: `make setup` converts it again under cache/models; then reload.")
    elif name not in TINY_FAMILIES:
        st.info(
            "Check the hub id or path, or pick an embedded model (smollm2-135m) or a tiny test model in the sidebar."
        )


def step_error(doing: str, e: Exception) -> None:
    """A step after the model loaded (computing vectors, generating, scoring) failed: say which, and its cause."""
    st.error(f"**Could not {doing}.** {e if str(e).strip() else type(e).__name__}")


def layer_count_or_stop(spec: str) -> int:
    """The base model's number of decoder layers; if it cannot be loaded, say why and stop the page."""
    try:
        return base_model(spec).num_layers
    except Exception as e:
        load_error(e)
        st.stop()
