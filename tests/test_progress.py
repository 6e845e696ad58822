"""The CLI progress bar: ETA from the mean time per unit, lines in a log, in-place redraws on a terminal."""

from __future__ import annotations

import io

from topl_core.foundations.progress import Bar, format_seconds


def test_log_mode_writes_a_line_per_tenth_and_never_the_same_line_twice():
    out = io.StringIO()
    bar = Bar("scoring", stream=out, tty=False)
    for i in range(1, 101):
        bar(i, 100)
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert 10 <= len(lines) <= 11, lines  # every 10% (the first at 10/100), the last says done, no duplicate
    assert lines[-1].startswith("scoring [") and "100/100 100%" in lines[-1] and lines[-1].endswith("done")
    assert "ETA" in lines[0]


def test_terminal_mode_redraws_in_place_and_ends_the_line():
    out = io.StringIO()
    with Bar("capturing", total=4, stream=out, tty=True) as bar:
        for i in range(1, 5):
            bar(i)
    text = out.getvalue()
    assert text.startswith("\rcapturing [") and text.endswith("\n") and text.count("\n") == 1
    assert "4/4 100%" in text


def test_eta_is_mean_time_per_unit_times_units_left():
    bar = Bar("x", total=10, stream=io.StringIO(), tty=False)
    bar.t0 -= 20.0  # 20 s for the first 4 units → 5 s each → 30 s for the 6 left
    bar.done = 4
    assert abs(bar.eta_s() - 30.0) < 0.5
    assert format_seconds(30) == "0:30" and format_seconds(3725) == "1:02:05"


def test_stages_count_as_they_begin_and_close_completes_the_last():
    out = io.StringIO()
    bar = Bar("variants", total=3, stream=out, tty=False)
    for name in ("base", "merged", "steered"):
        bar.stage(f"{name}: generating 8 summaries")
        assert bar.done == ["base", "merged", "steered"].index(name)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "base: generating 8 summaries"
    assert "3/3 100%" in lines[-1]
