"""The public Python API (`import topl_core as topl`, topl_core/__init__.py) and the quickstart notebook: every name
of `__all__` is the documented function or class of a core module, importing the package loads nothing heavy, the
verbs work on tiny-llama adapters trained for 2 steps, the README's Python example runs on them, and
examples/quickstart.ipynb (committed without outputs) runs top to bottom on them and shows a Plotly figure, a token
overlay and a deck."""

from __future__ import annotations

import html
import importlib
import inspect
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import all_hooks, tiny_config

import topl_core as topl
from topl_core.analysis.studies.deck_html import deck_html
from topl_core.data.records import write_jsonl

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"


def test_every_public_name_is_a_documented_core_object():
    assert len(set(topl.__all__)) == len(topl.__all__)
    for name in topl.__all__:
        obj = getattr(topl, name)
        assert not isinstance(obj, types.ModuleType), f"topl.{name} is a module (a submodule shadows the name)"
        module = topl._EXPORTS[name]
        assert obj is getattr(importlib.import_module(module), name), f"topl.{name} is not {module}.{name}"
        assert module.startswith("topl_core.") and not module.startswith("topl_core.cli"), module
        doc = inspect.getdoc(obj) or ""
        assert doc and not doc.startswith(f"{name}("), f"topl.{name} has no docstring of its own"
        assert "Example" in doc, f"topl.{name}'s docstring has no example"
    assert set(topl.__all__) <= set(dir(topl))


def test_importing_the_package_loads_no_module_of_the_api():
    """`import topl_core` (and so `python -m topl_core --help`) imports neither torch nor the API's modules."""
    code = "import sys, topl_core; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('topl_core')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['topl_core']"
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        getattr(topl, "nothing_here")


@pytest.fixture(scope="module")
def adapters(tiny_records, tmp_path_factory) -> dict[str, Path]:
    """A TOPL and an SFT adapter on tiny-llama, 2 steps each, trained through the API on a data file of their own."""
    root = tmp_path_factory.mktemp("api")
    data = root / "tiny.jsonl"
    write_jsonl(tiny_records, data)
    out = {"data": data}
    for method in ("topl", "sft"):
        cfg = tiny_config(method=method, lr=0.05, steps=2, max_doc_tokens=64, data=str(data))
        out[method] = topl.train(cfg, root / f"{method}-tiny", records=tiny_records).path
    return out


def test_the_verbs_on_a_tiny_model(adapters, tmp_path):
    adapter = topl.open_adapter(adapters["topl"])
    assert adapter.method == "topl" and adapter.has_head and adapter.base_model == "tiny-llama"
    records = topl.labelled_split(adapter, "train", limit=12)
    assert len(records) == 12 and all(r.token_labels_known for r in records)

    res = topl.probe_run(adapter, records, topl.ProbeSettings(folds=2, n_boot=20))
    fig = res.lora.figure()
    assert fig.data[0].type == "heatmap" and fig.layout.title.text == res.lora.name
    assert fig.data[0].z.shape == res.lora.heatmap().shape
    table = topl.comparison_table({"TOPL": res.lora}, control=res.control)
    assert list(table["method"]) == ["TOPL", "random-init A (control)"]

    vectors = topl.build_steering_vectors(adapter, records, topl.ProbeSettings(random_control=False, folds=2), 2)
    session = topl.SteeringSession.from_run(adapter, vectors)
    model = session.lm.model
    ids = session.lm.tokenizer("The council approved the budget.", return_tensors="pt").input_ids
    hooks = all_hooks(model)
    with torch.no_grad():
        plain = model(ids).logits
        with topl.steer(model, vectors, 4.0):
            steered = model(ids).logits
        after = model(ids).logits
    assert not torch.allclose(plain, steered) and torch.equal(plain, after) and all_hooks(model) == hooks

    gen = topl.GenerationConfig(max_new_tokens=4)
    grid = session.generate_grid(records[0].document, [-2.0, 0.0, 2.0], gen)
    assert len(grid) == 3 and grid[1] == session.generate_steered(records[0].document, 0.0, gen)
    assert list(session.stream_steered(records[0].document, 2.0, gen))[-1] == grid[2]

    scores = topl.TokenScorer(topl.load_model("tiny-llama"), adapter).score([records[0]])[0]
    overlay = topl.TokenOverlay.from_scores(scores)
    page = overlay._repr_html_()
    assert page.count('<span class="topl-tok') == len(scores.tokens) > 0
    assert overlay.gold is not None and "topl-legend" in page


def test_a_deck_shows_the_exported_page_inline(adapters, tiny_records, tmp_path):
    documents = (tiny_records[0].document,)
    cfg = topl.DeckConfig(str(adapters["topl"]), documents, (-2.0, 2.0), top_k=2, max_new_tokens=4)
    stats = topl.prepare_deck(topl.create_deck(tmp_path / "deck", cfg))
    deck = topl.read_deck(tmp_path / "deck")
    assert stats.generated == deck.total == 4 and deck.complete
    frame = topl.show_deck(deck)._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in frame
    srcdoc = frame.split('srcdoc="', 1)[1].split('" sandbox=', 1)[0]
    assert html.unescape(srcdoc) == deck_html(deck)  # the same page as the offline export


def readme_example() -> str:
    """The README's Python example: the code block after its `<!-- python-example -->` marker."""
    after = (REPO / "README.md").read_text().split("<!-- python-example -->", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_python_example_runs(adapters, capsys):
    """The README's example as written, on the tiny TOPL adapter in place of the demo one."""
    demo = '"examples/adapters/topl-smollm2"'
    code = readme_example()
    assert demo in code
    exec(compile(code.replace(demo, repr(str(adapters["topl"]))), "README.md", "exec"), {})
    assert capsys.readouterr().out.count("λ = ") == 3


def test_the_notebook_is_committed_without_outputs():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)


def test_the_quickstart_notebook_runs_on_tiny_adapters(adapters, tmp_path, monkeypatch):
    """The notebook top to bottom, pointed at the tiny adapters by its variables' environment: a Plotly figure, the
    head's token overlay and the deck's page among its outputs, and no error."""
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (requirements.txt pins it)")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (requirements.txt pins it)")
    env = {
        "TOPL_NB_MODEL": "tiny-llama",
        "TOPL_NB_TOPL": str(adapters["topl"]),
        "TOPL_NB_SFT": str(adapters["sft"]),
        "TOPL_NB_MAX_NEW_TOKENS": "4",
        "TOPL_NB_DECK": str(tmp_path / "deck"),
        "OMP_NUM_THREADS": "1",  # the tiny model gains nothing from threads (conftest pins this process's)
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the kernel inherits this process's environment
    nb = nbformat.read(NOTEBOOK, as_version=4)
    where = {"metadata": {"path": str(REPO)}}  # the kernel's folder: this checkout's topl_core is the one imported
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources=where).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    data = [o.get("data", {}) for o in outputs]
    assert any("application/vnd.plotly.v1+json" in d for d in data), "no Plotly figure"
    pages = [d.get("text/html", "") for d in data]
    assert any('<div class="topl-tokens">' in p for p in pages), "no token overlay"
    assert any(p.startswith("<iframe srcdoc=") for p in pages), "no deck"
