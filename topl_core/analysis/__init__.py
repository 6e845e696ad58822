"""Opening adapters up, in the rooms the app's sidebar shows, beside the disk cache every result goes through.

    lora_a/      LoRA sites, LoRA-A capture, separability, the cached probe pipeline, probe heads, UMAP
    steering/    the mode registry, steering vectors, the hooks that apply them, sessions, control-vector export,
                 fluency
    evaluation/  text analysis, factuality scorers and their measured quality, evaluation and the λ study,
                 translation, the paper's indicator table
    studies/     studies of many trainings or scorings: layer sweeps, label sensitivity, detection transfer, the
                 model's own summaries as training data
    cache.py     cached(kind, key, compute, codec): local, then the shipped cache of the demo adapters
    lexical.py   the model-free controls of every detection table (the lexical control: a token's word absent from
                 the document)

No streamlit anywhere; each module documents its public API in its docstring.
"""
