"""Helpers shared by the pages, one module per topic. Only thin glue: all computation lives in topl_core.

    frame        the app frame: page config, st.navigation over PAGES, the sidebar; ensure_frame(), a page's first line
    spec         the model spec string "name|dtype|device" and the sidebar model picker
    models       cached models (base, merged, token scorer), the shared locks, model-load errors
    runs         the runs table (the user's runs and the demo adapters), run pickers, fingerprints
    datasets     data-set files, cached records, the data-set picker
    data_build   the Data page's build form for any data source, its background builds, the merge form
    render       colored tokens, legend, word diff, text boxes, Plotly charts, CSV downloads
    token_sets   the labelled token sets of the LoRA-A and Steering pages
    evaluations  evaluation results read back from disk (Evaluation and Runs pages)
    forms        config forms generated from the config dataclasses (Train, Layer sweep), the precision picker
    jobs         the one background-job panel of every page that starts long work: picker, progress with Stop /
                 Cancel or Resume, a failed job's message and log, the fragment that follows a job
    train_jobs   the Train page's live runs: progress, Cancel / Resume (the job panel's row), curves, log

This is a package, not a set of pages/_*.py files: Streamlit 1.67's legacy router runs every pages/*.py file as a page
(only dot-files and __init__.py are skipped, whatever the leading underscore), but it does not look into folders.

Caching rules (docs/design.md §4): models are `st.cache_resource` keyed by the spec string (and the run fingerprint for
adapters); a cached model is shared by every session and is never mutated; small results are `st.cache_data`.
`st.session_state` holds only strings (the spec, run paths) and widget values.
"""
