"""Headless Chromium on a fresh `streamlit run app.py`, for the scripts that time or photograph the app
(talk_timing.py, steering_page_timing.py, steering_screenshot.py).

    with app_browser(runs_dir) as (browser, url): ...   the app on a free port with TOPL_RUNS_DIR=runs_dir (an empty
                                                        temporary folder when None); both stopped after
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from playwright.sync_api import Browser, sync_playwright

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("TOPL_CHROMIUM", "/usr/bin/chromium")


def start_app(runs_dir: Path) -> tuple[subprocess.Popen, str]:
    """The app on a free local port, once it answers its health check: (the process, its URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TOPL_RUNS_DIR": str(runs_dir), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "app.py", "--server.port", str(port), "--server.headless", "true"]
    cmd += ["--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer"]
    log = open(os.environ["TOPL_APP_LOG"], "ab") if os.environ.get("TOPL_APP_LOG") else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)  # TOPL_APP_LOG: its output
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return proc, url
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    raise SystemExit("streamlit did not start")


@contextmanager
def app_browser(runs_dir: Path | None = None) -> Iterator[tuple[Browser, str]]:
    with tempfile.TemporaryDirectory() as empty:
        proc, url = start_app(runs_dir or Path(empty))
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
                try:
                    yield browser, url
                finally:
                    browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
