"""The service on a model with sliding-window layers (tiny-gemma3: every layer a 16-position window, as Gemma-3's
local layers): each row's window ends at its own position, so rows of different lengths sharing a step each attend
to their own last 16 positions. What it serves — tokens and their log-probabilities — is what full forwards of the
model (no cache at all) give, alone and side by side, merged and steered."""

from __future__ import annotations

import threading
from contextlib import nullcontext

import pytest
import torch
from conftest import serving

from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.inference.decode import stop_tokens
from topl_core.inference.generate import load_merged
from topl_core.runtime.modes import SteerConfig, steer
from topl_core.runtime.session import SteeringSession
from topl_core.training.config import tiny_topl_config
from topl_core.training.trainer import train

openai = pytest.importorskip("openai")

NEW = 12


@pytest.fixture(scope="module")
def gemma(tmp_path_factory, news_records) -> SteeringSession:
    run = train(tiny_topl_config(model="tiny-gemma3"), tmp_path_factory.mktemp("runs") / "gemma", records=news_records)
    return SteeringSession(load_merged("tiny-gemma3", run), build_steering_vectors(run, news_records, top_k=3))


@pytest.fixture(scope="module")
def client(gemma):
    with serving(gemma, slots=4, name="gemma") as (_, server):
        yield openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(20, 300, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def full_forwards(session, ids: list[int], steering=None) -> tuple[list[int], list[float]]:
    """Greedy tokens and their log-probabilities from a full forward over the whole text at every step (no KV cache:
    the model's own sliding-window mask over every position), steered at every position when asked."""
    model, stop, seq, logprobs = session.lm.model, stop_tokens(session.lm.tokenizer), list(ids), []
    context = steer(model, session.vectors, steering[1], steering[0]) if steering else nullcontext()
    with torch.no_grad(), context:
        for _ in range(NEW):
            lsm = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0, -1].float(), -1)
            token = int(lsm.argmax())
            if token in stop:
                break
            seq.append(token)
            logprobs.append(float(lsm[token]))
    return seq[len(ids) :], logprobs


def served(client, ids: list[int], steering=None) -> tuple[list[int], list[float]]:
    extra = {"steering": {"mode": steering[0].mode, "lambda": steering[1], "units": "raw"}} if steering else None
    reply = client.completions.create(
        model="gemma", prompt=ids, max_tokens=NEW, temperature=0, extra_body=extra
    ).choices[0]
    return reply.logprobs.model_extra["token_ids"], reply.logprobs.token_logprobs


def test_the_window_matters_for_these_prompts(gemma):
    """The control: the same model attending to every position writes other log-probabilities, so the tests below
    see a window applied wrongly."""
    window = gemma.lm.model.config.sliding_window
    ids = prompt(40, 0)
    assert len(ids) > 2 * window
    _, windowed = full_forwards(gemma, ids)
    config = gemma.lm.model.config
    try:
        config.sliding_window = 10**6
        _, everything = full_forwards(gemma, ids)
    finally:
        config.sliding_window = window
    assert max(abs(a - b) for a, b in zip(windowed, everything)) > 1e-3


def test_a_served_row_attends_to_its_own_window(gemma, client):
    for length, seed in ((40, 0), (23, 1)):
        tokens, logprobs = served(client, prompt(length, seed))
        ref_tokens, ref_logprobs = full_forwards(gemma, prompt(length, seed))
        assert tokens == ref_tokens and logprobs == pytest.approx(ref_logprobs, abs=1e-4)


def test_rows_of_different_lengths_share_steps_each_in_its_own_window(gemma, client):
    """Three requests at once, prompts of 40, 23 and 31 tokens (one steered): each row's window ends at its own
    position in every shared step."""
    how = (SteerConfig("vector", units="raw"), 3.0 / min(gemma.vectors.norms().values()))
    asks = [(prompt(40, 0), None), (prompt(23, 1), None), (prompt(31, 2), how)]
    results: dict[int, tuple] = {}
    threads = [
        threading.Thread(target=lambda k=k, a=a: results.__setitem__(k, served(client, *a))) for k, a in enumerate(asks)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for k, (ids, steering) in enumerate(asks):
        ref_tokens, ref_logprobs = full_forwards(gemma, ids, steering)
        assert results[k][0] == ref_tokens, k
        assert results[k][1] == pytest.approx(ref_logprobs, abs=1e-4), k
