"""The app frame around every page: page config, navigation, the sidebar model picker.

Streamlit (1.67) treats a folder named `pages/` next to the main script as a legacy multipage app: each script run
first goes through a router over pages/*.py, which runs app.py only for the main page and runs any other page *file*
directly — without app.py, so without its sidebar (docs/design.md §4's AppTest/st.navigation trap; it hits the real
server too: direct links and reloads). And a URL that names no file there gets a "Page not found" dialog. So every
page's url_path equals its file name (the router finds it: no dialog), and every page starts with `ensure_frame()`:
when the router ran the file directly, it runs the frame instead (st.navigation picks this very page and runs it
inside the frame) and stops; inside the frame it does nothing.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import streamlit as st

from pages._ui.spec import sidebar_model_picker
from topl_core.foundations.idle_children import busy

PAGES = {
    "Start": [("home", "Home", ":material/home:"), ("data", "Data", ":material/dataset:")],
    "Train": [("train", "Train", ":material/model_training:"), ("runs", "Runs", ":material/compare_arrows:")],
    "Look inside": [
        ("lora_a", "LoRA-A separability", ":material/grid_on:"),
        ("steering", "Steering", ":material/tune:"),
        ("token_overlay", "Token overlay", ":material/format_color_text:"),
        ("talk", "Talk mode", ":material/co_present:"),
    ],
    "Studies": [
        ("layer_sweep", "Layer sweep", ":material/view_comfy:"),
        ("evaluation", "Evaluation", ":material/fact_check:"),
        ("reproduce", "Reproduce the paper", ":material/science:"),
    ],
}
PAGES_DIR = Path(__file__).resolve().parent.parent
_FRAME = threading.local()


def run_frame() -> None:
    """Page config, st.navigation over PAGES, the shared sidebar model picker, then the chosen page."""
    st.set_page_config(page_title="TOPL Workbench", page_icon=":material/biotech:", layout="wide")
    nav = {
        section: [
            st.Page(PAGES_DIR / f"{stem}.py", title=title, icon=icon, url_path=stem, default=stem == "home")
            for stem, title, icon in items
        ]
        for section, items in PAGES.items()
    }
    page = st.navigation(nav)
    st.sidebar.caption("Model (shared by every page)")
    sidebar_model_picker()
    _FRAME.active = True
    try:
        with busy():  # a compiled decode step's build waits while a page runs (topl_core/foundations/idle_children.py)
            page.run()
    finally:
        _FRAME.active = False


def ensure_frame() -> None:
    """First line of every page: a no-op inside the frame; run directly by Streamlit's legacy router, it renders
    the frame (which runs this page inside it) and stops this outer run."""
    if getattr(_FRAME, "active", False):
        return
    run_frame()
    st.stop()


@contextmanager
def core_imports() -> Iterator[None]:
    """Wrap a page's imports of the analysis core: a missing or broken core is said in words (and the page stops)
    instead of a traceback."""
    try:
        yield
    except ImportError as e:
        st.error(f"The analysis core is not available: {e}")
        st.stop()
