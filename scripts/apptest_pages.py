"""Every page of the app run in-process with Streamlit's AppTest (no browser): each page's script on the sidebar's
default model (TOPL_DEFAULT_MODEL, e.g. "tiny-llama|auto|cuda") and the runs of TOPL_RUNS_DIR, failing on an exception
or an error box. What scripts/gpu_check.py --pages apptest runs where no browser is at hand (the GPU machines lent
here have none); ../shared/tools/visit_pages.py is the check in a real browser, with screenshots.

    TOPL_DEFAULT_MODEL="tiny-llama|auto|cuda" TOPL_RUNS_DIR=runs python scripts/apptest_pages.py [--timeout 600]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]


def visit(page: str, timeout: float) -> list[str]:
    """The problems of one page: exceptions and error boxes, as their text."""
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=timeout)
    at.run()
    if page != "home":
        at.switch_page(f"pages/{page}.py").run()
    return [f"exception: {e.value}" for e in at.exception] + [f"error box: {e.value}" for e in at.error]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timeout", type=float, default=600, help="seconds a page may run (a first load on a GPU)")
    args = p.parse_args()
    failed = 0
    for page in sorted(path.stem for path in (REPO / "pages").glob("*.py")):
        t = time.perf_counter()
        problems = visit(page, args.timeout)
        failed += bool(problems)
        print(f"{page}: {time.perf_counter() - t:.0f}s {'; '.join(problems)[:1500] if problems else 'clean'}")
    print(f"{failed} of the pages failed" if failed else "every page ran without an exception or an error box")
    return 1 if failed else 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The pages' background threads (the slider's work ahead, the decode step's build) may be inside a CUDA call as
    # Python finalizes: 3.12 ends such a daemon thread with pthread_exit, which torch's C++ frames turn into
    # "terminate called without an active exception" (SIGABRT, after every page passed, on an H200). The pages'
    # verdict is in: leave without finalizing.
    os._exit(status)
