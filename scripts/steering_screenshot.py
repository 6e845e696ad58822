"""A screenshot of the Steering page in one mode, on the shipped demo TOPL adapter and its first document, in headless
Chromium (an empty TOPL_RUNS_DIR): the mode picked, its settings typed in, λ moved with the arrow keys, the page
left to finish. docs/screenshots/steering-gated.png is

    python scripts/steering_screenshot.py --mode "Detect, then steer" --setting "τ: the gate's threshold=0.9" \\
        --steps 4 --out docs/screenshots/steering-gated.png
"""

from __future__ import annotations

import argparse

from browser_app import app_browser  # scripts/ is this script's folder, first on sys.path
from steering_page_timing import IDLE


def settle(page) -> None:
    """Until the script run is over (it may start a moment after the input that asked for it)."""
    page.wait_for_timeout(500)
    page.wait_for_function(IDLE, polling=100, timeout=900_000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, help="the start of the mode's label on the page's radio")
    p.add_argument("--setting", action="append", default=[], help="LABEL=VALUE of one of the mode's settings")
    p.add_argument("--steps", type=int, default=0, help="arrow-key steps of λ from its neutral value (< 0: left)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    with app_browser() as (browser, url):
        page = browser.new_page(viewport={"width": 1600, "height": 1500})
        page.set_default_timeout(900_000)
        page.goto(f"{url}/steering")
        page.locator(".topl-box").nth(2).wait_for()
        settle(page)
        page.get_by_text(args.mode).first.click()
        settle(page)
        for setting in args.setting:
            label, value = setting.split("=", 1)
            box = page.locator('[data-testid="stNumberInput"]').filter(has_text=label).locator("input")
            box.fill(value)
            box.press("Enter")
            settle(page)
        thumb = page.locator('[data-testid="stSlider"]').filter(has_text="hallucinated").get_by_role("slider")
        for _ in range(abs(args.steps)):
            thumb.focus()
            page.keyboard.press("ArrowRight" if args.steps > 0 else "ArrowLeft")
            settle(page)
        page.screenshot(path=args.out, full_page=True)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
