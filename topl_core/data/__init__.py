"""Data: labelled records, their file sources, splits and encoding.

    records.py           Record, Span, read_jsonl, write_jsonl, merge_jsonl
    sources.py           DataSource, SourceOptions, FILE_SOURCES: every file source by name
    halueval.py, fava.py, cliff.py, mlqe.py   the loaders of each source's files
    perturb.py           perturbed summaries from faithful ones, by recipe; the edits it applies are in
                         fact_edits.py (recipe v1: Edit, entity, number, date, negation, relation, invented) and
                         summarizer_edits.py (recipe v2: attribution, swap, extrinsic, modal, copied)
    split.py             the document-level split
    encode.py            prompt + document + response → token ids and token labels; batches
    label_settings.py    the label settings of the label-sensitivity study (apply_label_setting, label_stats)
    overview.py          a data set at a glance: counts, browse filters, a record's tokens
    textform.py          detokenising word-split text

Import the module you need: this package imports none of them.
"""
