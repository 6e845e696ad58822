"""What the app's start needs of the models: its default model, and the imports that loading it makes, done ahead.

app_default_spec() -> "name|dtype|device"   TOPL_DEFAULT_MODEL (and TOPL_DEFAULT_DTYPE / _DEVICE), else SmolLM2
warm_up(spec)                                import what loading `spec` and merging an adapter into it import
"""

from __future__ import annotations

import os

from ..foundations.errors import ModelError
from ..foundations.presets import DEFAULT_MODEL
from ..hardware.precision import precision_word
from .loading import EMBEDDED, ModelSpec, converted_embedded_dir, decoder_config


def app_default_spec() -> str:
    """The app's default model as a spec string "name|dtype|device": TOPL_DEFAULT_MODEL may be a name ("tiny-llama",
    "Qwen/Qwen3-8B") or a full spec; TOPL_DEFAULT_DTYPE and TOPL_DEFAULT_DEVICE fill in what a name leaves out."""
    raw = os.environ.get("TOPL_DEFAULT_MODEL", DEFAULT_MODEL).strip() or DEFAULT_MODEL
    parts = raw.split("|")
    name = parts[0]
    dtype = precision_word(parts[1] if len(parts) > 1 else os.environ.get("TOPL_DEFAULT_DTYPE", "auto"))
    device = parts[2] if len(parts) > 2 else os.environ.get("TOPL_DEFAULT_DEVICE", "cpu")
    return f"{name}|{dtype}|{device}"


def warm_up(spec: ModelSpec | str = DEFAULT_MODEL) -> None:
    """Import what loading `spec` and merging an adapter into it import first (its configuration, tokenizer and model
    classes, PEFT) without loading its weights: on a 2-core CPU these imports were most of the Steering page's first
    wait for words (docs/performance.md, "Figures behind the code's choices"). `python app.py` calls it before
    serving. A model that cannot be read is left to the load that follows, which says what is wrong in words."""
    import peft  # noqa: F401  (merging an adapter)
    from transformers import AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config = decoder_config(spec)
    except ModelError:
        return
    MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)  # imports the architecture's modeling module
    name = spec.name if isinstance(spec, ModelSpec) else spec
    if name in EMBEDDED:  # decoder_config converted it, under the loaders' lock, where it was not yet
        AutoTokenizer.from_pretrained(converted_embedded_dir(name))
