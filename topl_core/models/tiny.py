"""Tiny randomly initialised models (Llama, Qwen3, Gemma3 families) with a tokenizer built in code: the models
tests and offline demos load as "tiny-llama", "tiny-qwen3", "tiny-gemma3". The config of a TOPL run on tiny-llama that
trains in seconds is training/config.py's tiny_topl_config (the training layer sits above this one)."""

from __future__ import annotations

import torch

from ..foundations.errors import ModelError

TINY_FAMILIES = ("tiny-llama", "tiny-qwen3", "tiny-gemma3")

_TINY_CORPUS = (
    "The council approved the new budget on Monday after a long debate. "
    "Police arrested two men in London and released a third without charge. "
    "The company said profits increased by 12 percent in 2023, while sales fell in March. "
    "She won the election with 54 percent of the vote, the commission said on Friday. "
    "Scientists found that the drug did not reduce the risk of heart disease in older patients. "
    "The match ended 3-1 and the manager praised his team. Summarize the following document. Summary: "
    "Translate the following sentence. Document: 0123456789 ,.;:!?'\"()-"
)
_TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_tokenizer(chat: bool = True):
    """A byte-level BPE tokenizer trained in code on a fixed corpus (deterministic, ~400 tokens, offsets
    include the leading space like SmolLM2's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<bos>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator([_TINY_CORPUS] * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token="<|im_end|>" if chat else "<|endoftext|>",
        pad_token="<|endoftext|>",
        bos_token=None if chat else "<bos>",
    )
    if chat:
        tok.chat_template = _TINY_CHAT_TEMPLATE
    return tok


def build_tiny_model(family: str, seed: int = 0):
    """A tiny randomly initialised model of the given family (4 layers, hidden 64) and its tokenizer.

    The embedding rows (tied to the LM head) of the 128 lone non-ASCII byte tokens are shrunk so that their logits
    stay near 0 and greedy text stays readable ASCII: a random model otherwise loops on such a byte and prints only
    U+FFFD, which hides every change a test (or a steering demo on the tiny model) looks for. Inputs keep full byte
    coverage."""
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    tok = build_tiny_tokenizer(chat=family != "tiny-gemma3")
    common = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    if family == "tiny-llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif family == "tiny-qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    elif family == "tiny-gemma3":
        model = Gemma3ForCausalLM(Gemma3TextConfig(head_dim=16, sliding_window=16, **common))
    else:
        raise ModelError(f"Unknown tiny family {family!r}; choose one of {TINY_FAMILIES}.")
    lone_bytes = [i for i in range(len(tok)) if "\ufffd" in tok.decode([i])]
    with torch.no_grad():
        model.get_input_embeddings().weight[lone_bytes] *= 0.01
    return model.float().eval(), tok
