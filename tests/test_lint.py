"""ruff (configured in pyproject.toml: pyflakes rules, syntax errors, line length 120, import order) is clean over
the project's code, and the code is formatted as `ruff format` leaves it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CODE = ("topl_core", "pages", "scripts", "tests", "app.py")


@pytest.mark.parametrize("command", [["check", "--output-format", "concise"], ["format", "--check"]])
def test_ruff_is_clean(command):
    pytest.importorskip("ruff", reason="ruff is not installed (requirements.txt pins it)")
    proc = subprocess.run([sys.executable, "-m", "ruff", *command, *CODE], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, (
        f"ruff {' '.join(command)}:\n{proc.stdout}{proc.stderr}(`ruff format` fixes the format)"
    )
