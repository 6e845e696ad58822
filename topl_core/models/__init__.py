"""Models: which base model a spec names, loading it, and reaching inside it.

    loading.py       ModelSpec, load_model, LoadedModel: embedded GGUF, hub ids, local paths, "<preset>@random"
    tiny.py          tiny random models with a tokenizer built in code, for tests (build_tiny_model)
    architecture.py  decoder layers and stack, final norm, base causal LM, the forward from an intermediate state
    forward.py       early-exit head features, head p(good), next-token log-probs, the LM head helper

Import the module you need: this package imports none of them (they import torch and transformers).
"""
