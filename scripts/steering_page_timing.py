"""Time the Steering page's λ slider in a real browser (its goals: docs/performance.md, "The slider: a new λ position"):
`streamlit run app.py` on a free port with an empty TOPL_RUNS_DIR (so the shipped demo TOPL adapter and its default
document are what opens), headless Chromium, the slider moved with the arrow keys. Measured from the key press, polling
the page every animation frame:
- cold visit: until the page is drawn (its title), until the first summary box (the base model's) shows words, until
  the steered box shows its first words, and until the page is idle;
- a new λ (--jump steps right of the last), pressed --read-s seconds after the page went idle (the time a person
  reads; the page generates the neighbouring positions ahead meanwhile, then builds the compiled decode step): until
  its first words show (the text so far and the cursor, or the text generated ahead), and until the whole summary is
  drawn (a jump of 2 or more lands where nothing was generated ahead);
- a λ already generated (one step back): until the box shows that λ's finished text.

    python scripts/steering_page_timing.py [--moves 3] [--read-s 0] [--jump 1] [--shot steering.png]
"""

from __future__ import annotations

import argparse
import statistics
import time

from browser_app import app_browser  # scripts/ is this script's folder, first on sys.path

CURSOR = "\u258d"  # pages/_ui/steering.CURSOR: the box is still being written
AHEAD = "being written ahead\u2026"  # pages/_ui/steering.AHEAD: the box waits for the text generated ahead
STEERED = "() => { const b = document.querySelectorAll('.topl-box')[2]; return b ? [b.previousElementSibling.textContent, b.textContent] : null; }"  # noqa: E501
FIRST_BOX_WORDS = (  # the first summary box (the base model's) holds words, the cursor aside
    "() => { const b = document.querySelector('.topl-box'); "
    f"return !!b && b.textContent.replace('{CURSOR}', '').trim().length > 0; }}"
)
IDLE = "() => document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state') === 'notRunning'"


def steered(page) -> tuple[str, str] | None:
    """(the steered box's title, its text), or None before it is drawn."""
    found = page.evaluate(STEERED)
    return tuple(found) if found else None


def words(text: str) -> bool:
    """Whether a box holds words of a summary (being written, or done), not the wait for one generated ahead."""
    shown = text.replace(CURSOR, "").strip()
    return bool(shown) and shown != AHEAD


def wait(page, done, since: float, timeout_s: float = 600) -> float:
    """Seconds from `since` (a time.perf_counter()) until done(steered(page)) holds, polled every 10 ms."""
    t0, deadline = since, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        box = steered(page)
        if box is not None and done(box):
            return time.perf_counter() - t0
        page.wait_for_timeout(10)
    raise SystemExit("the steered box never got there")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--moves", type=int, default=3, help="new λ positions, each followed by a step back")
    p.add_argument("--read-s", type=float, default=0.0, help="seconds between the page going idle and a new move")
    p.add_argument("--jump", type=int, default=1, help="slider steps of a new move (pressed at once)")
    p.add_argument("--shot", help="save a screenshot of the page at the end here")
    args = p.parse_args()
    with app_browser() as (browser, url):
        page = browser.new_page(viewport={"width": 1600, "height": 1300})
        page.set_default_timeout(600_000)
        t0 = time.perf_counter()
        page.goto(f"{url}/steering")
        page.get_by_role("heading", name="Steering").first.wait_for()
        drawn = time.perf_counter() - t0
        page.wait_for_function(FIRST_BOX_WORDS, polling=10)
        base_first = time.perf_counter() - t0
        first = wait(page, lambda b: words(b[1]), t0)
        page.wait_for_function(IDLE, polling=100)
        idle = time.perf_counter() - t0
        print(
            f"cold visit: page drawn {drawn:.2f} s, first summary words (base) {base_first:.2f} s, first steered words "
            f"{first:.2f} s, page idle {idle:.2f} s",
            flush=True,
        )
        thumb = page.locator('[data-testid="stSlider"]').filter(has_text="hallucinated").get_by_role("slider")
        new_first, new_done, seen = [], [], []

        def move(key: str, times: int = 1) -> tuple[str, float]:
            """Press `key` on the slider: the title the new λ gives the steered box, and when it was pressed."""
            thumb.focus()
            pressed = time.perf_counter()
            for _ in range(times):
                page.keyboard.press(key)
            return f"λ = {float(thumb.evaluate('e => e.value')):+.2f}", pressed

        for _ in range(args.moves):
            page.wait_for_timeout(args.read_s * 1000)
            new, pressed = move("ArrowRight", args.jump)
            new_first.append(wait(page, lambda b: new in b[0] and words(b[1]), pressed))
            new_done.append(wait(page, lambda b: new in b[0] and words(b[1]) and CURSOR not in b[1], pressed))
            page.wait_for_function(IDLE, polling=100)
            back, pressed = move("ArrowLeft")
            seen.append(wait(page, lambda b: back in b[0] and CURSOR not in b[1], pressed))
            page.wait_for_function(IDLE, polling=100)
            compiled = page.get_by_text("the compiled decode step", exact=False).count() > 0
            print(
                f"{new}: first words {new_first[-1]:.2f} s, whole {new_done[-1]:.2f} s; "
                f"back to {back}, seen: {seen[-1]:.3f} s; decode {'compiled' if compiled else 'eager'} now",
                flush=True,
            )
            move("ArrowRight")  # on to the λ just generated: the next move is to a new one
            page.wait_for_function(IDLE, polling=100)
        med = statistics.median
        print(
            f"medians of {args.moves}: new λ first words {med(new_first):.2f} s, whole {med(new_done):.2f} s; "
            f"a λ seen {med(seen):.3f} s"
        )
        if args.shot:
            page.screenshot(path=args.shot, full_page=True)


if __name__ == "__main__":
    main()
