"""Jobs: long work in a detached process, started, read back from files and stopped one way.

    background.py  launch, read_job, list_jobs, cancel, log_tail, JobStatus: any `python -m topl_core` command as
                   a background job (its process is cli/job_runner.py)
    launchers.py   the typed launchers: launch_train, launch_sweep, launch_evaluation, launch_translation,
                   launch_data_build, launch_reproduce, launch_deck (a config in, the command line built in one
                   place), read_data_build

Import the module you need: this package imports none of them.
"""
