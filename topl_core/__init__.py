"""TOPL Workbench core: data, models, training, analysis. Never imports streamlit.

The notebook API is `import topl_core as topl`: the names of `__all__`, each the very function or class the pages and
the CLI call (its docstring has an example; examples/quickstart.ipynb uses them end to end):

    adapters, models    open_adapter, Adapter, load_adapter, load_model, ModelSpec, load_merged, GenerationConfig
    data                read_jsonl, Record, labelled_split (the labelled records of a split of an adapter's own data)
    training            TrainConfig, LoraSettings, train
    LoRA-A              probe_run, ProbeSettings (→ ProbeResult: .lora / .control Separability, .table(), .figure()),
                        comparison_table, auroc_heatmap
    steering            build_steering_vectors, SteeringVectors, steer (a context manager), SteerConfig,
                        SteeringSession (λ grids, stream_steered)
    token scores        TokenScorer, TokenScores, TokenOverlay (coloured tokens in Jupyter)
    decks               DeckConfig, create_deck, prepare_deck, read_deck, Deck, show_deck (talk mode inline)
    evaluation          evaluate, EvalConfig, Variant

Importing the package imports none of them: each is imported from its module the first time it is touched (PEP 562
`__getattr__`), so `python -m topl_core --help` lists the commands without loading torch.
"""

import importlib
import warnings

# PEFT (0.21) calls transformers' deprecated `is_gradient_checkpointing` on every adapter load/injection; the warning
# is theirs to fix and only floods CLI output and job logs.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
# transformers imports tqdm.auto, which in a Jupyter kernel without ipywidgets warns (stderr, in red) that it shows text
# progress bars instead: they are what a notebook of this API gets.
warnings.filterwarnings("ignore", message="IProgress not found")

# public name → the module that defines it (the names a notebook needs; imported on first use)
_EXPORTS: dict[str, str] = {
    "open_adapter": "topl_core.training.adapters",
    "Adapter": "topl_core.training.adapters",
    "load_adapter": "topl_core.training.adapters",
    "load_model": "topl_core.models.loading",
    "ModelSpec": "topl_core.models.loading",
    "load_merged": "topl_core.inference.generate",
    "GenerationConfig": "topl_core.inference.generate",
    "read_jsonl": "topl_core.data.records",
    "Record": "topl_core.data.records",
    "labelled_split": "topl_core.analysis.lora_a.probe",
    "TrainConfig": "topl_core.training.config",
    "LoraSettings": "topl_core.training.config",
    "train": "topl_core.training.trainer",
    "probe_run": "topl_core.analysis.lora_a.probe",
    "ProbeSettings": "topl_core.analysis.lora_a.probe",
    "comparison_table": "topl_core.analysis.lora_a.separability",
    "auroc_heatmap": "topl_core.analysis.figures",
    "build_steering_vectors": "topl_core.analysis.steering.extract",
    "SteeringVectors": "topl_core.runtime.vectors",
    "steer": "topl_core.runtime.modes",
    "SteerConfig": "topl_core.runtime.modes",
    "SteeringSession": "topl_core.runtime.session",
    "TokenScorer": "topl_core.inference.token_scores",
    "TokenScores": "topl_core.inference.token_scores",
    "TokenOverlay": "topl_core.analysis.token_colors",
    "DeckConfig": "topl_core.analysis.studies.deck",
    "create_deck": "topl_core.analysis.studies.deck",
    "prepare_deck": "topl_core.analysis.studies.deck_prepare",
    "read_deck": "topl_core.analysis.studies.deck",
    "Deck": "topl_core.analysis.studies.deck",
    "show_deck": "topl_core.analysis.studies.deck_html",
    "evaluate": "topl_core.analysis.evaluation.evaluate",
    "EvalConfig": "topl_core.analysis.evaluation.config",
    "Variant": "topl_core.analysis.evaluation.config",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use and kept here (later lookups are plain attributes)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'topl_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
