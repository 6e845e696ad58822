"""The one status protocol (topl_core/foundations/status.py): the state table row by row, progress of every kind of
work, and background.read_job on folders written the way a sweep, a foreground run and a dead job leave them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from topl_core.foundations.status import (
    STATE_TABLE,
    Facts,
    progress_of,
    read_status,
    request_stop,
    resolve_state,
    stop_requested,
    update_status,
    write_status,
)
from topl_core.jobs import background


@pytest.mark.parametrize(
    "facts, state",
    [
        (Facts(alive=True, written="running", stop_requested=False, launched=True), "running"),
        (
            Facts(alive=True, written="running", stop_requested=True, launched=False),
            "running",
        ),  # stopping: still running
        (Facts(alive=True, written=None, stop_requested=False, launched=True), "starting"),
        (Facts(alive=False, written="finished", stop_requested=False, launched=True), "finished"),
        (Facts(alive=False, written="failed", stop_requested=True, launched=True), "failed"),  # its own word first
        (Facts(alive=False, written="running", stop_requested=True, launched=False), "cancelled"),
        (Facts(alive=False, written=None, stop_requested=True, launched=True), "cancelled"),
        (Facts(alive=False, written="running", stop_requested=False, launched=False), "interrupted"),
        (Facts(alive=False, written=None, stop_requested=False, launched=True), "interrupted"),
        (Facts(alive=False, written=None, stop_requested=False, launched=False), "unknown"),
    ],
)
def test_state_table(facts, state):
    assert resolve_state(facts) == state


def test_every_row_of_the_state_table_is_reachable():
    """No row is shadowed by the rows above it: for each, some facts make it the first match."""
    import itertools

    first = set()
    for alive, written, stop, launched in itertools.product(
        (True, False), (None, "running", "finished", "failed", "cancelled", "interrupted"), (True, False), (True, False)
    ):
        f = Facts(alive, written, stop, launched)
        first.add(next(name for name, matches, _ in STATE_TABLE if matches(f)))
    assert first == {name for name, _, _ in STATE_TABLE}


def test_progress_of_training_and_sweeps():
    assert progress_of({"state": "running", "step": 3, "steps": 10}) == (3, 10)
    assert progress_of({"state": "running", "done": 2, "total": 5, "current": "s00-k03"}) == (2, 5)
    assert progress_of({"state": "running"}) == (0, 0)


def test_status_round_trip_and_update_keeps_progress(tmp_path):
    assert read_status(tmp_path) == {}
    write_status(tmp_path, "running", done=1, total=4, current="s00-k03")
    update_status(tmp_path, "interrupted", error="killed")
    st = read_status(tmp_path)
    assert st["state"] == "interrupted" and st["done"] == 1 and st["error"] == "killed" and st["pid"] == os.getpid()
    write_status(tmp_path, "running", pid=12345)
    update_status(tmp_path, "interrupted")  # the reader that finds the work dead keeps the work's pid
    assert read_status(tmp_path)["pid"] == 12345
    (tmp_path / "status.json").write_text("{half a fi")  # a torn copy reads as no status, not a crash
    assert read_status(tmp_path) == {}


def test_read_job_reads_a_sweep_and_a_stop_request(tmp_path):
    """A sweep folder (no job.json, no run config) is read through the same function as runs, with its window
    progress; a sweep whose process is gone after a stop request reads as cancelled, without one as interrupted."""
    sweep = tmp_path / "sw"
    (sweep).mkdir()
    (sweep / "sweep.json").write_text("{}")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "topl_core"])
    try:
        write_status(sweep, "running", done=1, total=3, current="s03-k03", pid=live.pid)
        job = background.read_job(sweep)
        assert (job.kind, job.state, job.step, job.steps, job.current) == ("sweep", "running", 1, 3, "s03-k03")
        assert background.cancel(sweep) and stop_requested(sweep)  # not a job: the stop request is the whole cancel
    finally:
        live.kill()
        live.wait()
    assert background.read_job(sweep).state == "cancelled"
    (sweep / "STOP").unlink()
    job = background.read_job(sweep)
    assert job.state == "interrupted" and "without reporting" in job.error
    assert not background.cancel(sweep)  # nothing running: nothing to stop
    assert background.read_job(tmp_path / "empty") is None


def test_a_request_to_stop_nothing_is_harmless(tmp_path):
    request_stop(tmp_path / "new")
    assert stop_requested(tmp_path / "new") and background.read_job(tmp_path / "new") is None


def test_one_writer_per_folder(tmp_path, tiny_records):
    """A folder held by a live process refuses a second writer (naming pid and host); a dead writer's lock is taken
    over; the lock is gone after the work. train() into a locked run directory is refused before it writes."""
    import json
    import socket

    from conftest import tiny_config

    from topl_core.foundations.errors import RunError
    from topl_core.foundations.status import LOCK_FILE, WriterLock
    from topl_core.training.trainer import train

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / LOCK_FILE).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
        with pytest.raises(RunError, match=f"being written by pid {holder.pid}"):
            train(tiny_config(steps=2), tmp_path / "run", records=tiny_records)
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [LOCK_FILE]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    run = train(tiny_config(steps=2), tmp_path / "run", records=tiny_records)  # the dead holder's lock: taken over
    assert run.read_status()["state"] == "finished" and not (run.path / LOCK_FILE).exists()
    # a finished run's status no longer carries a loss: the table shows the last logged one
    assert background.read_job(run.path).loss == run.read_metrics()[-1]["loss"] is not None
    with WriterLock(tmp_path / "other"):  # held by this process: another process is refused
        code = (
            f"from topl_core.foundations.status import WriterLock; WriterLock({str(tmp_path / 'other')!r}).__enter__()"
        )
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert other.returncode != 0 and f"being written by pid {os.getpid()}" in other.stderr
    assert not (tmp_path / "other" / LOCK_FILE).exists()


def test_the_writer_lock_nests_in_its_thread_and_is_handed_to_a_started_process(tmp_path):
    """The same thread may nest the lock (a job around the trainer); another thread of the process (a second app
    session) is refused; a launcher's lock handed over reaches only the process started with its token."""
    import threading

    from topl_core.foundations.errors import RunError
    from topl_core.foundations.status import LOCK_FILE, WriterLock

    folder = tmp_path / "job"
    refused = []

    def other_session():
        try:
            with WriterLock(folder):
                pass
        except RunError as e:
            refused.append(str(e))

    with WriterLock(folder):
        with WriterLock(folder):
            pass
        assert (folder / LOCK_FILE).exists()  # the inner exit keeps the outer lock
        t = threading.Thread(target=other_session)
        t.start()
        t.join()
        assert refused and f"being written by pid {os.getpid()}" in refused[0]
    assert not folder.exists()  # nothing was written: no folder left behind

    lock = WriterLock(folder).__enter__()
    env = lock.hand_over()
    take = "from topl_core.foundations.status import WriterLock; "
    take += f"WriterLock({str(folder)!r}).__enter__(); print('took it')"
    stranger = subprocess.run([sys.executable, "-c", take], capture_output=True, text=True)
    assert stranger.returncode != 0 and "being written by pid" in stranger.stderr
    heir = subprocess.run([sys.executable, "-c", take], capture_output=True, text=True, env={**os.environ, **env})
    assert heir.returncode == 0 and "took it" in heir.stdout, heir.stderr


def _sleeper(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *argv])


def test_a_lock_whose_pid_now_belongs_to_another_process_is_taken_over_with_a_line(tmp_path, tiny_records):
    """A LOCK names its writer by pid and start time. After a reboot, or in a container, its pid can come back as
    some live, unrelated process: that lock no longer blocks the folder — it is taken over, with a warning naming the
    process that has the pid now — while a lock whose pid and start time are its live writer's still refuses."""
    import json
    import socket

    import psutil
    from conftest import tiny_config

    from topl_core.foundations.errors import RunError
    from topl_core.foundations.status import LOCK_FILE, WriterLock
    from topl_core.training.trainer import train

    stranger = _sleeper()
    try:
        started = psutil.Process(stranger.pid).create_time()
        (tmp_path / "run").mkdir()
        lock = {"pid": stranger.pid, "host": socket.gethostname(), "pid_started": started}
        (tmp_path / "run" / LOCK_FILE).write_text(json.dumps(lock))  # its true writer, alive: refused
        with pytest.raises(RunError, match=f"being written by pid {stranger.pid}"):
            WriterLock(tmp_path / "run").__enter__()
        # the writer that wrote this lock started an hour before the process that has its pid now
        (tmp_path / "run" / LOCK_FILE).write_text(json.dumps({**lock, "pid_started": started - 3600}))
        with pytest.warns(RuntimeWarning, match=f"lock of pid {stranger.pid}, .*now belongs to another process"):
            run = train(tiny_config(steps=2), tmp_path / "run", records=tiny_records)
        assert run.read_status()["state"] == "finished" and not (run.path / LOCK_FILE).exists()
        assert stranger.poll() is None  # the unrelated process is left alone
    finally:
        stranger.kill()
        stranger.wait()


def test_a_run_started_from_a_script_shows_running_while_it_runs_and_its_end_after(tmp_path):
    """Work started from a notebook or a script (`topl.train(...)`: no job, a command line that need not name
    topl_core) writes its status with its pid and start time: read as running while that process runs it, and as
    what it said once it ended, though the notebook's process lives on."""
    folder, go = tmp_path / "run", tmp_path / "go"
    script = tmp_path / "notebook.py"  # its command line: python notebook.py
    script.write_text(
        "import sys, time\n"
        "from pathlib import Path\n"
        "from topl_core.foundations.status import write_status\n"
        f"write_status({str(folder)!r}, 'running', step=1, steps=3)\n"
        f"while not Path({str(go)!r}).exists(): time.sleep(0.01)\n"
        f"write_status({str(folder)!r}, 'finished', step=3, steps=3)\n"
        "time.sleep(120)\n"
    )
    kernel = subprocess.Popen([sys.executable, str(script)], cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 60
        while read_status(folder).get("state") != "running":
            assert kernel.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        job = background.read_job(folder)
        assert (job.state, job.step, job.steps, job.pid) == ("running", 1, 3, kernel.pid)
        go.touch()
        while read_status(folder).get("state") != "finished":
            assert kernel.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        assert background.read_job(folder).state == "finished" and kernel.poll() is None  # it lives on
    finally:
        kernel.kill()
        kernel.wait()


def test_a_job_whose_pid_now_belongs_to_another_process_reads_interrupted_and_says_so(tmp_path):
    """A job's process is known by the pid and start time job.json records: a live process that got the pid later is
    not the job (even one whose command line names topl_core); the job reads "interrupted", its error names the other
    process, and Cancel sends it no signal."""
    import json

    import psutil

    folder = tmp_path / "job"
    folder.mkdir()
    other = _sleeper("topl_core")
    try:
        started = psutil.Process(other.pid).create_time() - 3600  # the job's process started an hour before
        job = {"kind": "train", "argv": [], "pid": other.pid, "pid_started": started, "started": time.time() - 3600}
        (folder / background.JOB_FILE).write_text(json.dumps(job))
        write_status(folder, "running", step=2, steps=10, pid=other.pid, pid_started=started)
        st = background.read_job(folder)
        assert st.state == "interrupted", st
        assert f"pid {other.pid}" in st.error and "now belongs to another process" in st.error
        assert not background.cancel(folder) and other.poll() is None  # nothing running there: no SIGTERM
    finally:
        other.kill()
        other.wait()


def test_sigkill_anywhere_then_resume_gives_the_uninterrupted_run(tmp_path, tiny_records):
    """`python -m topl_core train` killed outright (SIGKILL: no handler runs) twice, wherever it happens to be:
    each time the run reads "interrupted" at its last checkpoint's step, and resuming to the end gives the same
    adapter and head as a run never interrupted."""
    import signal
    import time

    from topl_core.data.records import write_jsonl
    from topl_core.training.run_dirs import RunDir
    from topl_core.training.trainer import train

    data = write_jsonl(tiny_records, tmp_path / "d.jsonl")

    def train_cli(*args) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "topl_core", "train", *args], stderr=subprocess.PIPE, text=True)

    config = ["--model", "tiny-llama", "--data", str(data), "--steps", "30", "--eval-every", "1000",
              "--checkpoint-every", "4", "--max-doc-tokens", "64", "--lora-layer-end", "2"]  # fmt: skip
    run, killed_at = RunDir(tmp_path / "killed"), []
    for kill_after, args in ((6, [*config, "--out", str(run.path)]), (17, ["--resume", str(run.path)])):
        proc = train_cli(*args)
        deadline = time.monotonic() + 180
        while len(run.read_metrics()) < kill_after:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        st = background.read_job(run.path)
        assert st.state == "interrupted" and st.step == run.checkpoint_step() and st.step % 4 == 0
        killed_at.append(len(run.read_metrics()))
    train(run.read_config()[0], run.path)  # resumed to the end (here, in this process: one interpreter start less)
    assert run.read_status()["state"] == "finished"
    assert killed_at[0] >= 6 and killed_at[1] >= 17  # two different places
    assert [r["step"] for r in run.read_metrics()] == list(range(1, 31))
    done = train(run.read_config()[0], tmp_path / "straight")  # the same config, never interrupted
    assert run.adapter_path.read_bytes() == done.adapter_path.read_bytes()
    a, b = run.load_head().state_dict(), done.load_head().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_stops_a_command_line_training_cleanly(tmp_path, tiny_records):
    """SIGTERM to `python -m topl_core train` (what kill, a scheduler or a container stop sends): the same clean stop
    as Cancel — a checkpoint of the last step, state "cancelled", exit code 130 — and --resume continues it."""
    import json
    import signal
    import time

    from topl_core.data.records import write_jsonl

    data = write_jsonl(tiny_records, tmp_path / "d.jsonl")
    out = tmp_path / "run"
    args = ["train", "--model", "tiny-llama", "--data", str(data), "--steps", "400", "--eval-every", "1000",
            "--checkpoint-every", "1000", "--max-doc-tokens", "64", "--lora-layer-end", "2",
            "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "topl_core", *args], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while read_status(out).get("step", 0) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130, proc.stderr.read()
    status = read_status(out)
    ckpt = json.loads((out / "checkpoint" / "state.json").read_text())["step"]
    assert status["state"] == "cancelled" and ckpt == status["step"] >= 2
    assert background.read_job(out).state == "cancelled"


@pytest.mark.parametrize("name", ["../up", "/abs/path", "a/b", "..", ".", "", "  ", "~user", "a\\\\b"])
def test_a_typed_name_never_leaves_its_folder(tmp_path, name):
    from topl_core.foundations.errors import ConfigError
    from topl_core.foundations.paths import inside

    with pytest.raises(ConfigError, match="plain name"):
        inside(tmp_path, name, "Run name")
    assert inside(tmp_path, " run-1.v2 ") == tmp_path / "run-1.v2"
