"""Defaults and the paper's training presets, as data (no project imports: every layer may read them).

DEFAULT_MODEL is the embedded model every command and page starts on; LORA_MODULES the linear modules LoRA may adapt;
default_lora_end the last LoRA layer when none is given, from the model's own depth; PRESETS the paper's
per-model-family settings: the layer range TOPL puts LoRA on (scaled_layer carries it to a model of another depth) and
the published architecture; MethodHyper the type of a method's paper hyperparameters for one family, which each
method's module holds (training/methods/, docs/design.md §2).
"""

from __future__ import annotations

from dataclasses import dataclass

FLAG_THRESHOLD = 0.5  # a token is "flagged" (the head doubts it) when p(good) is below this
DEFAULT_MODEL = "smollm2-135m"
# The decoder layer's linear modules LoRA may adapt, in site order (attention q, k, v, o, then the MLP's gate, up,
# down): the default LoRA target list and the column order of every layer × module heatmap.
LORA_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def default_lora_end(num_layers: int) -> int:
    """The last decoder layer LoRA goes on (the TOPL head reads its output) when no range is given: two thirds of the
    model's own depth, ⌊2n/3⌋ — SmolLM2's layer 20 of 30, where the CPU defaults were measured (docs/design.md §3,
    docs/evaluation.md §6: the head after 16 against 20), Gemma-3-270M's 12 of 18, a 4-layer tiny model's 2. The
    paper's presets sit deeper (0.82–0.87 of the depth: `--preset`, carried to another depth by scaled_layer)."""
    return max(0, min(num_layers - 1, (2 * num_layers) // 3))


def scaled_layer(layer: int, preset_layers: int, num_layers: int) -> int:
    """The layer at the same fraction of the depth in a model of num_layers (the last layer stays the last)."""
    return round(layer / max(1, preset_layers - 1) * (num_layers - 1))


@dataclass(frozen=True)
class MethodHyper:
    """A method's paper hyperparameters for one model family."""

    lr: float
    batch_size: int
    grad_accum: int = 1
    # the paper states one learning rate per method, so its heads learn at lr (TrainConfig's CPU default is higher)
    head_lr_multiplier: float = 1.0
    # LoRA on every decoder layer (the paper's baselines), or only on the preset's TOPL range (TOPL)
    all_layers: bool = True


@dataclass(frozen=True)
class Preset:
    """The paper's settings for a model family: the layer range TOPL puts LoRA on (its head reads the last of them;
    every other method adapts all `num_layers` layers), and the published configuration of the decoder `hf_id` holds
    (transformers' config fields, model_type first): what the GPU benchmark builds with random weights where no hub
    is reachable and what the memory estimate (training.memory) counts. The per-method learning rates and batches
    are in each method's module (training/methods/)."""

    hf_id: str
    topl_layers: tuple[int, int]
    architecture: dict[str, object]

    @property
    def num_layers(self) -> int:
        return int(self.architecture["num_hidden_layers"])

    def lora_layers(self, all_layers: bool, num_layers: int | None = None) -> tuple[int, int]:
        """(first, last) decoder layer LoRA goes on: every layer, or the TOPL range (MethodHyper.all_layers) — in a
        model of `num_layers` (default: the preset's own), the range at the same fraction of its depth."""
        n = self.num_layers if num_layers is None else num_layers
        if all_layers:
            return (0, n - 1)
        return tuple(scaled_layer(x, self.num_layers, n) for x in self.topl_layers)  # type: ignore[return-value]


PRESETS: dict[str, Preset] = {
    "qwen3-8b": Preset(
        "Qwen/Qwen3-8B",
        (0, 29),
        dict(
            model_type="qwen3",
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        ),
    ),
    "llama3.1-8b": Preset(
        "meta-llama/Llama-3.1-8B-Instruct",
        (0, 27),
        dict(
            model_type="llama",
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            rope_theta=500_000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        ),
    ),
    "gemma3-4b": Preset(
        "google/gemma-3-4b-it",
        (0, 27),
        dict(  # the text decoder of the multimodal checkpoint
            model_type="gemma3_text",
            hidden_size=2560,
            intermediate_size=10240,
            num_hidden_layers=34,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            vocab_size=262208,
            sliding_window=1024,
            query_pre_attn_scalar=256,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
        ),
    ),
}

# Translation (the paper's second task). Language names for the prompt, by ISO 639-1 code; an unknown code is used
# as it is. MLQE_PE_PAIRS: the MLQE-PE pairs with word-level (OK/BAD) tags, what TOPL trains on (WMT20 QE task 2).
LANGUAGES: dict[str, str] = {
    "en": "English",
    "de": "German",
    "zh": "Chinese",
    "et": "Estonian",
    "ne": "Nepali",
    "ro": "Romanian",
    "si": "Sinhala",
    "ru": "Russian",
}
MLQE_PE_PAIRS: tuple[str, ...] = ("en-de", "en-zh")
# FLORES+ file / config names of those languages (the OOD translation set)
FLORES_CODES: dict[str, str] = {
    "en": "eng_Latn",
    "de": "deu_Latn",
    "zh": "cmn_Hans",
    "et": "est_Latn",
    "ne": "npi_Deva",
    "ro": "ron_Latn",
    "si": "sin_Sinh",
    "ru": "rus_Cyrl",
}


def language_pair(pair: str) -> tuple[str, str]:
    """("en", "de") from "en-de"; a pair not written source-target raises ValueError."""
    source, sep, target = pair.partition("-")
    if not (sep and source and target):
        raise ValueError(f"language pair {pair!r}: write it source-target, e.g. en-de.")
    return source, target
