"""What a compiled step's package key depends on (inference/aot_packages.py): its code, not the words around it."""

from __future__ import annotations

from pathlib import Path

from topl_core.inference import batch_step
from topl_core.inference.aot_packages import code_only

SOURCE = '''"""A module."""

import torch


class Step:
    """A step."""

    def forward(self, x):
        """Its forward."""
        return x * 2  # doubled
'''


def test_a_package_key_ignores_docstrings_comments_and_layout_but_not_code(tmp_path):
    def code(text: str) -> str:
        path = tmp_path / "step.py"
        path.write_text(text)
        return code_only(path)

    reworded = SOURCE.replace("A step.", "A step, reworded.").replace("# doubled", "# times two")
    relaid = SOURCE.replace("\n\n\nclass", "\n\nclass").replace('"""Its forward."""', '"""Its\n        forward."""')
    undocumented = SOURCE.replace('        """Its forward."""\n', "")
    assert code(reworded) == code(relaid) == code(undocumented) == code(SOURCE)
    assert code(SOURCE.replace("x * 2", "x * 3")) != code(SOURCE)
    assert code(SOURCE.replace('"""A step."""', '"""A step."""\n    scale = 2')) != code(SOURCE)
    # a body that was its docstring alone is still a function
    assert code('def f():\n    """Nothing."""\n') == code("def f():\n    pass\n")


def test_the_step_modules_code_holds_their_code_and_not_their_docstrings():
    tree = code_only(Path(batch_step.__file__))
    assert "BatchDecodeStep" in tree and "ROW_BUCKETS" in tree
    assert batch_step.__doc__.splitlines()[0] not in tree
    assert batch_step.BatchStep.shape.__doc__.split(",")[0] not in tree
