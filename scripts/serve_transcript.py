"""A transcript of a Python session with the official `openai` client against the service on the demo TOPL adapter:
a steered completion at two λ, the tokens its head flags, and a gated completion with the tokens it took back.
Written into docs/serve.md's transcript section (between its markers) from what the server answered.

    .venv/bin/python -m topl_core serve --run examples/adapters/topl-smollm2 &     (wait for "serving")
    .venv/bin/python scripts/serve_transcript.py --url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import openai

from topl_core.bench.serve import messages
from topl_core.data.records import read_jsonl
from topl_core.data.split import split_records
from topl_core.foundations.paths import PROJECT_ROOT, project_path
from topl_core.training.adapters import open_adapter

DOC = PROJECT_ROOT / "docs" / "serve.md"
BEGIN, END = "<!-- transcript: begin -->", "<!-- transcript: end -->"

SESSION = """
import openai
client = openai.OpenAI(base_url=URL, api_key="unused")
[m.id for m in client.models.list()]
def summary(lam=None, mode="vector", **settings):
    steering = None if lam is None else {"mode": mode, "lambda": lam, **settings}
    return client.chat.completions.create(model="topl-smollm2", messages=MESSAGES, max_tokens=64, temperature=0,
                                          extra_body={"steering": steering} if steering else None)
merged = summary()
merged.choices[0].message.content
steered = summary(2.0)
steered.choices[0].message.content
[(t.token, round(t.p_good, 3)) for t in merged.choices[0].logprobs.content if t.p_good < 0.95]
[(t.token, round(t.p_good, 3)) for t in steered.choices[0].logprobs.content if t.p_good < 0.95]
merged.choices[0].model_extra["verdict"]["flagged"], steered.choices[0].model_extra["verdict"]["flagged"]
gated = summary(4.0, mode="gated", tau=0.95, keep=2)
gated.choices[0].message.content
takes = gated.choices[0].model_extra["verdict"]["taken_back"]
[(t["position"], t["original"], t["replacement"], round(t["p_good"], 3)) for t in takes]
"""


def run(url: str) -> str:
    adapter = open_adapter(PROJECT_ROOT / "examples" / "adapters" / "topl-smollm2")
    records = read_jsonl(project_path(adapter.settings.data))
    document = split_records(records, seed=adapter.settings.split_seed)["test"][0].document
    scope = {"URL": url, "MESSAGES": messages(document), "openai": openai}
    out = ["```python", f">>> MESSAGES = {_short(repr(messages(document)))}  # the workbench's own summary prompt"]
    statements: list[list[str]] = []
    for line in SESSION.strip().splitlines():
        if line.startswith(" ") and statements:
            statements[-1].append(line)  # a block's or a call's continuation
        else:
            statements.append([line])
    for lines in statements:
        out.extend((">>> " if i == 0 else "... ") + line for i, line in enumerate(lines))
        source = "\n".join(lines)
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                value = eval(compile(source, "<session>", "eval"), scope)
            except SyntaxError:
                exec(compile(source, "<session>", "exec"), scope)
                value = None
        if value is not None:
            out.append(repr(value))
    out.append("```")
    return "\n".join(out)


def _short(text: str) -> str:
    return text if len(text) < 110 else text[:100] + "…'}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000/v1")
    transcript = run(p.parse_args().url)
    text = DOC.read_text()
    text = re.sub(f"{re.escape(BEGIN)}.*{re.escape(END)}", f"{BEGIN}\n{transcript}\n{END}", text, flags=re.S)
    DOC.write_text(text)
    print(transcript)


if __name__ == "__main__":
    main()
