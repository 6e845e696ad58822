"""TOPL Workbench: `streamlit run app.py`.

The app frame: page config, the sidebar model picker shared by every page (kept in st.session_state as a spec
string "name|dtype|device"; TOPL_DEFAULT_MODEL sets the default, e.g. `tiny-llama` or `Qwen/Qwen3-8B|bfloat16|cuda`)
and st.navigation over the pages in pages/. Pages are thin: widgets → a config → one topl_core call → render.

Why the page files end in `_page.py`: when a folder named `pages/` sits next to the main script, Streamlit (1.67)
first runs its legacy multipage router over pages/*.py, and a request whose URL path equals a page *file* name runs
that file directly — without this script, so without the sidebar model picker (the AppTest/st.navigation trap of
DESIGN.md §4, which also hits the real server). With every url_path below different from every file stem, the
legacy router always falls back to this script, and st.navigation picks the page. tests/test_app.py checks this.
"""

from __future__ import annotations

import streamlit as st

st.set_page_config(page_title="TOPL Workbench", page_icon=":material/biotech:", layout="wide")

from pages._ui import sidebar_model_picker  # noqa: E402  (after set_page_config)

PAGES = {
    "Start": [
        st.Page("pages/home_page.py", title="Home", icon=":material/home:", url_path="home", default=True),
        st.Page("pages/data_page.py", title="Data", icon=":material/dataset:", url_path="data"),
    ],
    "Train": [
        st.Page("pages/train_page.py", title="Train", icon=":material/model_training:", url_path="train"),
        st.Page("pages/runs_page.py", title="Runs", icon=":material/compare_arrows:", url_path="runs"),
    ],
    "Look inside": [
        st.Page("pages/lora_a_page.py", title="LoRA-A separability", icon=":material/grid_on:", url_path="lora-a"),
        st.Page("pages/steering_page.py", title="Steering", icon=":material/tune:", url_path="steering"),
        st.Page("pages/token_overlay_page.py", title="Token overlay", icon=":material/format_color_text:",
                url_path="token-overlay"),
    ],
    "Studies": [
        st.Page("pages/layer_sweep_page.py", title="Layer sweep", icon=":material/view_comfy:",
                url_path="layer-sweep"),
        st.Page("pages/evaluation_page.py", title="Evaluation", icon=":material/fact_check:", url_path="evaluation"),
    ],
}

page = st.navigation(PAGES)
st.sidebar.caption("Model (shared by every page)")
sidebar_model_picker()
page.run()
