"""TOPL Workbench: `streamlit run app.py`.

The app frame (pages/_ui/frame.py: run_frame): page config, st.navigation over the pages in pages/, and the
sidebar model picker shared by every page — kept in st.session_state as a spec string "name|dtype|device";
TOPL_DEFAULT_MODEL sets the default (e.g. `tiny-llama`, or `Qwen/Qwen3-8B|bfloat16|cuda` on a GPU machine). Pages are
thin: widgets → a config → one topl_core call → render. Why every page starts with ensure_frame(): see
pages/_ui/frame.py.
"""

from pages._ui.frame import run_frame

run_frame()
