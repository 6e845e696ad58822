"""Studies of many trainings or scorings, and what they prepare.

    sweeps.py              SweepConfig, run_sweep, resume_sweep: layer sweeps; sweep_results.py: their results
    label_sensitivity.py   LabelStudyConfig, run_label_study: TOPL trained per label setting
    transfer.py            transfer_table: detection transfer (dev / held-out AUROC with CIs); detection_stats.py:
                           the labelled tokens' arrays and their AUROCs with CIs; layer_scan.py: the frozen probe at
                           every layer
    own_summaries.py       OWN_SUMMARIES: the model's own summaries as labelled training records
    data_sources.py        SOURCES: the registry of every data source (here because a source a model writes is
                           built by a study)
    deck.py                DeckConfig, create_deck, read_deck, Deck: talk-mode decks; deck_prepare.py: preparing
                           one; deck_html.py (above deck.py): its page as one HTML file, show_deck (inline in
                           Jupyter) and PNG frames
    reproduce.py           run_reproduce, resume_reproduce, read_tasks: the paper's tables in one study;
                           reproduce_config.py: ReproduceConfig; method_runs.py: every method with its paper settings
                           scaled to the model; reproduce_tables.py, reproduce_claims.py, reproduce_report.py,
                           report_files.py, report_figures.py: its tables, verdicts, report, the report's files and
                           figures; paper_numbers.py: the paper's figures as data
    study.py               Study: what a study's tasks share

Import the module you need: this package imports none of them.
"""
