"""The job process: `python -m topl_core.cli.job_runner --job-dir DIR -- <topl_core cli args>` runs one CLI command as a
background job started by topl_core.jobs.background.launch, and writes its final status (the status protocol of
topl_core.foundations.status) when the command ended without saying how. It turns SIGTERM into KeyboardInterrupt so
that cancelled work unwinds (checkpoint, status "cancelled") and dumps a native crash's traceback into the job's log."""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time
from pathlib import Path

from ..foundations.errors import RunError
from ..foundations.status import ENDED_STATES, WriterLock, read_status, stop_cleanly_on_sigterm, update_status
from ..jobs.background import LOG_FILE
from . import CANCELLED
from . import main as cli_main


def main(argv: list[str] | None = None) -> int:
    """`python -m topl_core.cli.job_runner --job-dir DIR -- <topl_core cli args>`: run one CLI command as a job."""
    p = argparse.ArgumentParser(prog="python -m topl_core.cli.job_runner")
    p.add_argument("--job-dir", required=True)
    p.add_argument("cli_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cli_args = args.cli_args[1:] if args.cli_args[:1] == ["--"] else args.cli_args
    job_dir = Path(args.job_dir)
    stop_cleanly_on_sigterm()
    faulthandler.enable()  # a crash in native code (SIGSEGV, SIGABRT) leaves its Python traceback in job.log
    try:
        with WriterLock(job_dir):  # handed over by the launcher; the work's own lock on job_dir nests inside it
            return _run_job(job_dir, cli_args)
    except RunError as e:  # another writer holds job_dir: leave its status alone
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run_job(job_dir: Path, cli_args: list[str]) -> int:
    update_status(job_dir, "running", pid=os.getpid())
    state, rc, error = "failed", 1, None
    try:
        rc = cli_main(cli_args)
        state = "finished" if rc == 0 else "cancelled" if rc == CANCELLED else "failed"
        if rc and rc != CANCELLED:
            error = f"exit code {rc} (see {LOG_FILE})"
    except KeyboardInterrupt:
        state, rc = "cancelled", CANCELLED
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
        state, error = ("finished", None) if rc == 0 else ("failed", str(e.code))
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        # the work's own final word (the trainer's "cancelled" at step 7, say) stands; else the exit says how it ended
        if read_status(job_dir).get("state") not in ENDED_STATES:
            update_status(job_dir, state, returncode=rc, ended=time.time(), error=error)
    return rc


if __name__ == "__main__":
    sys.exit(main())
