"""The one background-job panel (pages/_ui/jobs.py) that every page starting long work shows, on a job of any kind:
the bar and Stop while it runs (a stop request and SIGTERM to its process group), Resume through the page's launcher
once it stopped early, a failed job's error and log, the command line it runs. No model: a sleeping process whose
command line names topl_core stands in for the job."""

from __future__ import annotations

import json
import subprocess
import sys

from streamlit.testing.v1 import AppTest

from topl_core.foundations.status import stop_requested, write_status
from topl_core.jobs import background


def panel_page(job_dir: str) -> None:
    from pathlib import Path

    from pages._ui.jobs import follow, job_failure, job_log, job_row

    folder = Path(job_dir)

    def resume(path: Path) -> None:  # the page's typed launcher
        (path / "resumed").write_text("by the panel")

    def body(job) -> None:
        text = f"{job.state} · {job.step}/{job.steps} steps" if job else "no job"
        job_row(job, "page.", job.fraction if job else 0.0, text, stopping="Stopping…", resume=resume)
        if job is not None and job.state == "failed":
            job_failure(folder, f"It failed: {job.error}")

    follow(folder, "page.", body, every=0.5)
    job_log(folder, command=True)


def open_panel(job_dir) -> AppTest:
    return AppTest.from_function(panel_page, args=(str(job_dir),), default_timeout=30).run()


def test_the_panel_stops_a_running_job_and_resumes_it(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "topl_core"], start_new_session=True
    )
    try:
        job = {"kind": "deck", "argv": ["steer", "--deck", str(folder)], "pid": worker.pid}
        (folder / background.JOB_FILE).write_text(json.dumps(job))
        write_status(folder, "running", done=3, total=8, pid=worker.pid)
        at = open_panel(folder)
        assert not at.exception, [e.value for e in at.exception]
        (bar,) = at.get("progress")
        assert bar.proto.text == "running · 3/8 steps"
        assert f"python -m topl_core steer --deck {folder}" in [c.value for c in at.code]
        assert [b.key for b in at.button] == ["page.stop"]  # no Resume while it runs
        at.button(key="page.stop").click().run()
        assert stop_requested(folder)
        assert worker.wait(timeout=30) != 0  # SIGTERM to its process group
    finally:
        worker.kill()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.get("progress")[0].proto.text.startswith("cancelled · ")
    at.button(key="page.resume").click().run()
    assert (folder / "resumed").read_text() == "by the panel"


def test_the_panel_says_why_a_job_failed(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / background.LOG_FILE).write_text("Traceback …\nRuntimeError: boom\n")
    (folder / background.JOB_FILE).write_text(json.dumps({"kind": "evaluate", "argv": ["evaluate"], "pid": None}))
    write_status(folder, "failed", error="RuntimeError: boom")
    at = open_panel(folder)
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == ["It failed: RuntimeError: boom"]
    assert "RuntimeError: boom" in [c.value for c in at.caption]  # under the bar
    assert any("RuntimeError: boom" in c.value and "Traceback" in c.value for c in at.code)  # the log's end
    assert [b.key for b in at.button] == ["page.resume"]
