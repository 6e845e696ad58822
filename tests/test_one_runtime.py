"""A steered text is the same whichever door asks for it: the Steering page's stream, `steer`'s λ grid, one steered
text (evaluate's single document), and the service — all through the one decode loop — for the same document, mode
and λ, in fp32 and in forced bf16 on a tiny model (every CPU runs bf16, natively or emulated), and under `auto`,
whatever it resolves to here (the service runs prompts and steps in the page's precisions: bf16 prompts and fp32 steps
where the CPU computes bf16 natively)."""

from __future__ import annotations

import pytest
from conftest import NEWS_PAIRS, serving

from topl_core.data.encode import user_message
from topl_core.hardware.precision import resolve_precision
from topl_core.inference.generate import GenerationConfig
from topl_core.runtime.modes import SteerConfig

openai = pytest.importorskip("openai")

DOC = NEWS_PAIRS[1][1]
NEW = 12


@pytest.mark.parametrize("precision", ["fp32", "bf16", "auto"])
@pytest.mark.parametrize(
    "how",
    [SteerConfig("vector", units="raw"), SteerConfig("vector", positions="generated", units="raw")],
    ids=["prompt steered", "prompt unsteered"],
)
def test_every_door_writes_the_same_steered_text(serve_session, precision, how):
    session = serve_session
    lam = 3.0 / min(session.vectors.norms().values())  # moves a 3-step adapter's residual stream visibly
    gen = GenerationConfig.chosen(precision, max_new_tokens=NEW)
    *_, page = session.stream_steered(DOC, lam, gen, how=how)
    grid = session.grid_generations(DOC, [0.0, lam], gen, how=how)[1].text
    one = session.generations([DOC], lam, gen, how=how)[0].text
    merged = session.generate_steered(DOC, how.neutral, gen, how=how)
    with serving(session, precision, slots=4) as (engine, server):
        batcher = engine.batcher  # the page's phases: its prompt's precision and its steps'
        assert (batcher.prompt_precision, batcher.precision) == (resolve_precision(precision), gen.decode_on("cpu"))
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        steering = {"mode": how.mode, "lambda": lam, "units": how.units, "positions": how.positions}
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": user_message(DOC)}],
            max_tokens=NEW,
            temperature=0,
            extra_body={"steering": steering},
        )
    served = reply.choices[0].message.content.strip()
    assert page == grid == one == served
    assert page != merged  # the steering acts: the doors agree on a steered text, not on the merged one
