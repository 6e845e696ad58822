"""TOPL Workbench: `python app.py` (what `make app` runs), or `streamlit run app.py`.

The app frame (pages/_ui/frame.py: run_frame): page config, st.navigation over the pages in pages/, and the
sidebar model picker shared by every page — kept in st.session_state as a spec string "name|dtype|device";
TOPL_DEFAULT_MODEL sets the default (e.g. `tiny-llama`, or `Qwen/Qwen3-8B|bfloat16|cuda` on a GPU machine). Pages are
thin: widgets → a config → one topl_core call → render. Why every page starts with ensure_frame(): see
pages/_ui/frame.py.

`python app.py [streamlit options]` first imports what loading the default model imports (models.startup.warm_up), then
serves the app as `streamlit run app.py [options]` in the same process: those imports (seconds on a 2-core CPU:
docs/performance.md, "Figures behind the code's choices") are then done before the server answers, not while the first
page waits for its first generated words. Imported from a page's thread they could not be: transformers' lazy imports
are not safe from two threads at once.
"""

import sys

from streamlit import runtime
from streamlit.web import cli as streamlit_cli

from pages._ui.frame import run_frame
from topl_core.models.startup import app_default_spec, warm_up

# A thread waiting for the GIL gets it after at most this long (Python's default: 5 ms). A decode step takes the GIL
# back a few times a token; beside the server's threads each take-back waited up to 5 ms (docs/performance.md, "The
# slider on the page")
sys.setswitchinterval(0.001)
if runtime.exists():  # a script run of the Streamlit server
    run_frame()
else:
    warm_up(app_default_spec().split("|")[0])
    sys.exit(streamlit_cli.main(["run", __file__, *sys.argv[1:]]))
