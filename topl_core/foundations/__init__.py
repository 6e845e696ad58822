"""Foundations: what every layer above may use; nothing here imports torch at module top or a module above.

    paths.py          where files live: cache_dir, runs_dir, DEFAULT_DATA, examples_dir, cliff_csv
    io.py             atomic writes with the user's umask (atomic_open, write_json, copy_file), checksums, read_log_rows
    errors.py         every user-facing error type (WorkbenchError and its kinds)
    status.py         the status / stop protocol of long work: write_status, read_status, request_stop, WriterLock
    progress.py       the CLI progress bar (Bar)
    metrics.py        auroc, weighted_aurocs
    services.py       check_reachable: the probe of an outside service before work starts
    presets.py        the defaults and the paper's model-family presets as data (PRESETS, MethodHyper)
    config_fields.py  each config setting described once (config_field) and the flags read from it
    executor.py       where a study's independent tasks run: run_tasks, ExecutorConfig, worker_memo
    cache_usage.py    each cache folder's size and contents, clearing by kind or age, size caps (LRU eviction)
    trusted_files.py  compiled code only from a folder the user alone can write, checksummed at build and load

Import the module you need (`from topl_core.foundations.paths import runs_dir`): this package imports none of them.
"""
