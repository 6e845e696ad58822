"""Inference: using a trained run.

    generate.py      merged generation (load_merged, generate, stream_generate, GenerationConfig)
    token_scores.py  per-token p(good) of the head and surprisal of a text (TokenScorer, TokenScores,
                     detection_auroc) — not factuality scoring, which is analysis/evaluation/scorers.py

Import the module you need: this package imports none of them.
"""
