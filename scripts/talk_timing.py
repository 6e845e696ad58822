"""Time talk mode's slider moves in a real browser: `streamlit run app.py` on a free port with TOPL_RUNS_DIR=RUNS
(its decks/ holding a prepared deck), headless Chromium on the Talk mode page, λ moved with the arrow keys pressed in
the app window; each move is timed from the key press until the view shows the new λ. Prints the per-move times
(median, max) and optionally saves a screenshot of the page and of the deck's exported HTML (opened from disk).

    python scripts/talk_timing.py --runs-dir RUNS --deck NAME [--moves 8] [--shot talk.png] [--export-shot x.png]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from browser_app import REPO, app_browser  # scripts/ is this script's folder, first on sys.path

sys.path.insert(0, str(REPO))

from topl_core.analysis.studies.deck import read_deck  # noqa: E402
from topl_core.analysis.studies.deck_html import write_deck_html  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs-dir", required=True, type=Path)
    p.add_argument("--deck", required=True, help="the deck's folder name under RUNS/decks")
    p.add_argument("--moves", type=int, default=8)
    p.add_argument("--shot", help="save a screenshot of talk mode here")
    p.add_argument("--export-shot", help="save a screenshot of the exported HTML (opened from disk) here")
    p.add_argument(
        "--shot-keys", nargs="*", default=[], help="keys pressed before each screenshot (from document 1, λ neutral)"
    )
    args = p.parse_args()
    deck = read_deck(args.runs_dir / "decks" / args.deck)
    if deck is None or not deck.complete:
        raise SystemExit(f"{args.runs_dir / 'decks' / args.deck}: no complete deck there")
    lambdas = deck.config.lambdas
    with app_browser(args.runs_dir) as (browser, url):
        page = browser.new_page(viewport={"width": 1600, "height": 1300})
        page.set_default_timeout(120_000)
        page.goto(f"{url}/talk")
        page.locator("iframe").first.wait_for()
        view = page.frame_locator("iframe").first
        view.locator("#steered[data-lambda]").wait_for()
        frame = next(f for f in page.frames if f != page.main_frame and f.url == "about:srcdoc")

        def wait_for(lam: float) -> None:
            frame.wait_for_function(
                "w => +document.getElementById('steered').dataset.lambda === w", arg=float(lam), polling="raf"
            )

        page.locator("h1").first.click()  # nothing focused: the keys of the app window reach the view
        times, index = [], lambdas.index(deck.config.how.neutral)
        step = 1
        for _ in range(args.moves):
            if not 0 <= index + step < len(lambdas):
                step = -step  # sweep to one end, then back
            index += step
            t0 = time.perf_counter()
            page.keyboard.press("ArrowRight" if step > 0 else "ArrowLeft")
            wait_for(lambdas[index])
            times.append(time.perf_counter() - t0)
            text = view.locator("#steered").inner_text()[:60].replace("\n", " ")
            print(f"λ → {lambdas[index]:+g}: {times[-1] * 1000:.0f} ms  {text!r}")
        print(f"{len(times)} moves: median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms")
        page.keyboard.press("PageDown")
        view.get_by_text(f"Document 2 / {len(deck.documents)}").wait_for()
        print("PageDown → document 2")
        if args.shot:
            page.reload()
            page.frame_locator("iframe").first.locator("#steered[data-lambda]").wait_for()
            page.locator("h1").first.click()
            for key in args.shot_keys:
                page.keyboard.press(key)
            page.wait_for_timeout(500)
            page.screenshot(path=args.shot, full_page=True)
        if args.export_shot:
            with tempfile.TemporaryDirectory() as d:
                path = write_deck_html(deck, Path(d) / "deck.html")
                ctx = browser.new_context(offline=True, viewport={"width": 1600, "height": 1000})
                export = ctx.new_page()
                export.goto(path.as_uri())
                for key in args.shot_keys:
                    export.keyboard.press(key)
                export.screenshot(path=args.export_shot, full_page=True)


if __name__ == "__main__":
    main()
