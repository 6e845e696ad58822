"""Factuality evaluation of base, merged and steered models.

    config.py        EvalConfig, Variant, LambdaStudy, EvalJob: what is evaluated, with which settings
    documents.py     id_documents, ood_documents: on which documents
    evaluate.py      evaluate, results_table: the evaluation
    lambda_study.py  lambda_sweep, lambda_curve: the λ study
    gated_comparison.py  GatedStudy, choose, compare, paired_table: gated vs always-on steering, held out
    scorers.py       make_scorer, Scorer: factuality scorers; quality.py: their measured quality
    text.py          sentence and word analysis of texts
    translation.py   translate, evaluate_translation, translation_table: the translation evaluation
    indicator.py     indicator_table: the paper's indicator table

Import the module you need: this package imports none of them.
"""
