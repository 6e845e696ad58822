"""Time the Steering page's λ slider in a real browser (its goals: docs/performance.md, "The slider: a new λ position"):
`streamlit run app.py` on a free port with an empty TOPL_RUNS_DIR (so the shipped demo TOPL adapter and its default
document are what opens), headless Chromium, the slider moved with the arrow keys. Measured from the key press, polling
the page every animation frame:
- cold visit: until the page is drawn (its title), until the steered box shows its first words (written first), until
  the base model's box does (written last), and until the page is idle;
- a new λ (--jump steps right of the last), pressed --read-s seconds after the page went idle (the time a person
  reads; the page generates the neighbouring positions ahead meanwhile, then builds the compiled decode step): until
  its first words show (the text so far and the cursor, or the text generated ahead), and until the whole summary is
  drawn (a jump of 2 or more lands where nothing was generated ahead);
- one step back right after the new λ is drawn (a neighbour the work ahead has only begun: it is written by this
  reader or the work ahead, docs/performance.md), then forward again onto the new λ (a λ seen): each until the box
  shows that λ's finished text.
With --cpu, where the cores went while each new λ was written (from the key press to the whole summary; Linux's
/proc): the CPU seconds of the app's process and of the browser's, against the seconds the two cores had.

With --json, every figure printed, each move's and their medians, with the machine and the date.

    python scripts/steering_page_timing.py [--moves 3] [--read-s 0] [--jump 1] [--generated-only] [--cpu] [--shot PNG]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from browser_app import app_browser  # scripts/ is this script's folder, first on sys.path

from topl_core.foundations.io import write_json
from topl_core.hardware.machine import machine_description

CURSOR = "\u258d"  # pages/_ui/steering.CURSOR: the box is still being written
AHEAD = "being written ahead\u2026"  # pages/_ui/steering.AHEAD: the box waits for the text generated ahead
# whether the summary box titled `box…` (the page writes the steered box first, the base model's last) has a title
# holding `title` and shows words (not only the wait for a text written ahead), with whole: all of them (no cursor).
# Checked in the page at every animation frame: polling from here would take the cores the page decodes on.
SHOWS = f"""([box, title, whole]) => {{
    const b = [...document.querySelectorAll('.topl-box')]
        .find(x => x.previousElementSibling.textContent.startsWith(box));
    if (!b || !b.previousElementSibling.textContent.includes(title)) return false;
    const text = b.textContent, shown = text.replace('{CURSOR}', '').trim();
    return shown.length > 0 && shown !== '{AHEAD}' && !(whole && text.includes('{CURSOR}'));
}}"""
IDLE = "() => document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state') === 'notRunning'"


def wait(page, since: float, title: str = "", whole: bool = False, box: str = "Steered") -> float:
    """Seconds from `since` (a time.perf_counter()) until the box `box` titled with `title` shows words (whole: all)."""
    page.wait_for_function(SHOWS, arg=[box, title, whole], polling="raf")
    return time.perf_counter() - since


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) used so far by the app (a python process running app.py), the browser (Chromium's
    processes) and the rest of the machine."""
    tick, used = os.sysconf("SC_CLK_TCK"), {"app": 0.0, "browser": 0.0, "other": 0.0}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat, command = (proc / "stat").read_text(), (proc / "cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        browser = b"chrom" in command or b"headless" in command
        kind = "app" if b"app.py" in command else "browser" if browser else "other"
        used[kind] += (int(fields[11]) + int(fields[12])) / tick
    return used


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--moves", type=int, default=3, help="new λ positions, each followed by a step back")
    p.add_argument("--read-s", type=float, default=0.0, help="seconds between the page going idle and a new move")
    p.add_argument("--jump", type=int, default=1, help="slider steps of a new move (pressed at once)")
    p.add_argument("--shot", help="save a screenshot of the page at the end here")
    p.add_argument("--cpu", action="store_true", help="the CPU seconds of the app and the browser per new λ")
    p.add_argument("--json", type=Path, help="write the figures here (docs/bench/steering-page-*.json)")
    p.add_argument(
        "--generated-only",
        action="store_true",
        help="turn 'Only generated tokens' on after the cold visit (the prompt's cache reused: bench --slider's "
        "slider_compiled; by default every position is steered, as the page opens: slider_compiled_all_positions)",
    )
    args = p.parse_args()
    with app_browser() as (browser, url):
        page = browser.new_page(viewport={"width": 1600, "height": 1300})
        page.set_default_timeout(600_000)
        t0 = time.perf_counter()
        page.goto(f"{url}/steering")
        page.get_by_role("heading", name="Steering").first.wait_for()
        drawn = time.perf_counter() - t0
        first = wait(page, t0)
        base_first = wait(page, t0, box="Base model")
        page.wait_for_function(IDLE, polling=100)
        idle = time.perf_counter() - t0
        print(
            f"cold visit: page drawn {drawn:.2f} s, first steered words {first:.2f} s, the base model's first words "
            f"{base_first:.2f} s, page idle {idle:.2f} s",
            flush=True,
        )
        if args.generated_only:
            page.get_by_text("Only generated tokens").click()
            page.wait_for_function(IDLE, polling=100)
        thumb = page.locator('[data-testid="stSlider"]').filter(has_text="hallucinated").get_by_role("slider")
        new_first, new_done, stepped_back, seen, moves = [], [], [], [], []
        pressing = []  # a move's key presses themselves

        # toward the end of the slider with more room: the page may open at a recommended λ, off its centre
        low, now, top = (float(x) for x in thumb.evaluate("e => [e.min, e.value, e.max]"))
        forth, back_key = ("ArrowRight", "ArrowLeft") if top - now >= now - low else ("ArrowLeft", "ArrowRight")

        def move(key: str, times: int = 1) -> tuple[str, float]:
            """Press `key` on the slider: the title the new λ gives the steered box, and when it was pressed."""
            thumb.focus()
            pressed = time.perf_counter()
            for _ in range(times):
                page.keyboard.press(key)
            pressing.append(time.perf_counter() - pressed)
            return f"λ = {float(thumb.evaluate('e => e.value')):+.2f}", pressed

        for _ in range(args.moves):
            page.wait_for_timeout(args.read_s * 1000)
            before = thumb.evaluate("e => e.value")
            new, pressed = move(forth, args.jump)
            if thumb.evaluate("e => e.value") == before:  # the slider's end: no new λ to time
                print(f"the slider is at its end ({new}): no more new positions", flush=True)
                break
            used, spent = cpu_seconds() if args.cpu else {}, None
            new_first.append(wait(page, pressed, new))
            new_done.append(wait(page, pressed, new, whole=True))
            if args.cpu:
                spent = {kind: round(t - used[kind], 2) for kind, t in cpu_seconds().items()}
                print(f"{new}: CPU s {spent} in {new_done[-1]:.2f} s × {os.cpu_count()} cores", flush=True)
            page.wait_for_function(IDLE, polling=100)
            back, pressed = move(back_key)  # one step back at once: a neighbour the work ahead has only begun
            stepped_back.append(wait(page, pressed, back, whole=True))
            page.wait_for_function(IDLE, polling=100)
            again, pressed = move(forth)  # on to the new λ again: seen (one key, as a person steps back and forth)
            seen.append(wait(page, pressed, again, whole=True))
            page.wait_for_function(IDLE, polling=100)
            compiled = page.get_by_text("the compiled decode step", exact=False).count() > 0
            waited = {"first_words_s": new_first[-1], "whole_s": new_done[-1], "step_back_s": stepped_back[-1]}
            decode = "compiled" if compiled else "eager"
            moves.append({"lambda": new, **waited, "seen_s": seen[-1], "decode": decode, "cpu_s": spent})
            print(
                f"{new}: first words {new_first[-1]:.2f} s, whole {new_done[-1]:.2f} s; one step back to {back} "
                f"(right after): {stepped_back[-1]:.3f} s; back on {again} (seen): {seen[-1]:.3f} s; decode "
                f"{'compiled' if compiled else 'eager'} now",
                flush=True,
            )
        med = statistics.median
        print(
            f"medians of {len(new_first)}: new λ first words {med(new_first):.2f} s, whole {med(new_done):.2f} s; "
            f"one step back right after {med(stepped_back):.3f} s; a λ seen {med(seen):.3f} s (pressing the keys of a "
            f"move: {med(pressing):.3f} s)"
        )
        if args.shot:
            page.screenshot(path=args.shot, full_page=True)
    if args.json:
        medians = {
            "first_words_s": med(new_first),
            "whole_s": med(new_done),
            "step_back_s": med(stepped_back),
            "seen_s": med(seen),
        }
        cold = {"page_drawn_s": drawn, "first_steered_words_s": first, "base_first_words_s": base_first, "idle_s": idle}
        what = {"moves": args.moves, "read_s": args.read_s, "jump": args.jump, "generated_only": args.generated_only}
        when = {"machine": machine_description(), "date": time.strftime("%Y-%m-%d")}
        write_json(args.json, {**when, "command": what, "cold_visit": cold, "moves": moves, "medians": medians})
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
