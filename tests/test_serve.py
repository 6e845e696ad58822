"""The OpenAI-compatible service (topl_core/serve/), driven by the official `openai` client against a running server on
a tiny model: what it generates is what the session's own decode loop generates (merged, steered per mode, gated),
p(good) is the head's reading of the merged model's states, concurrent requests share batched steps, and bad input
gets OpenAI's error JSON while the other clients go on."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import httpx2 as httpx
import pytest
import torch
from conftest import NEWS_PAIRS, needs_smollm2, serving

from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.data.encode import build_prompt, user_message
from topl_core.inference import prompt_layers
from topl_core.inference.decode import stop_tokens
from topl_core.inference.generate import GenerationConfig, prefill, stream_rows
from topl_core.models.architecture import decoder_layers, final_norm
from topl_core.models.forward import Head, head_probability
from topl_core.runtime.modes import SteerConfig, steer
from topl_core.runtime.session import SteeringSession
from topl_core.serve.prompts import PromptForwards
from topl_core.serve.row_steering import Steering

openai = pytest.importorskip("openai", reason="the openai client is installed by requirements.txt")
uvicorn = pytest.importorskip("uvicorn")

DOC = NEWS_PAIRS[0][1]
NEW = 10
MESSAGES = [{"role": "user", "content": user_message(DOC)}]


@pytest.fixture(scope="module")
def session(serve_session):
    return serve_session


@pytest.fixture(scope="module")
def served(session):
    with serving(session, max_body=20_000) as both:
        yield both


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[1].url, api_key="unused", max_retries=0)


def big(session) -> float:
    return 3.0 / min(session.vectors.norms().values())  # moves a 3-step adapter's residual stream visibly


def reference_ids(session, lam: float, how: SteerConfig, new: int = NEW) -> list[int]:
    """The tokens the session's own eager decode loop writes for DOC's prompt under this steering."""
    lm, gen = session.lm, GenerationConfig(max_new_tokens=new, precision="fp32")
    lora = session.lora() if how.spec.action.needs_lora else None
    with steer(lm.model, session.vectors, lam, how, lora):
        prefix = None if how.steers_prompt else prefill(lm, DOC, gen)
        *_, last = stream_rows(lm, DOC, 1, gen, prefix=prefix)
    return [t for t in last[0] if t not in stop_tokens(lm.tokenizer)]


def served_ids(choice) -> list[int]:
    return [t.token_id for t in choice.logprobs.content]


def chat(client, model="tiny", steering=None, **kw):
    extra = {"steering": steering} if steering is not None else None
    return client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=NEW, temperature=0, extra_body=extra, **kw
    )


def test_the_client_lists_the_models_and_completes_as_the_session_decodes(client, session):
    assert [m.id for m in client.models.list()] == ["tiny", "tiny:merged", "tiny:base"]
    assert build_prompt(session.lm.tokenizer, DOC) == session.lm.tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )  # the workbench's own prompt: the same tokens as the session's
    merged = chat(client)
    assert served_ids(merged.choices[0]) == reference_ids(session, 0.0, SteerConfig())
    assert merged.usage.completion_tokens >= len(merged.choices[0].logprobs.content)
    assert merged.usage.prompt_tokens == prefill(session.lm, DOC, GenerationConfig()).length
    for mode, units, positions in (
        ("vector", "raw", "generated"),
        ("vector", "raw", "all"),
        ("diff-mean", "raw", "all"),
    ):
        how = SteerConfig(mode, positions, units)
        lam = big(session)
        steered = chat(client, steering={"mode": mode, "lambda": lam, "units": units, "positions": positions})
        assert served_ids(steered.choices[0]) == reference_ids(session, lam, how), how
    base = chat(client, model="tiny:base")
    assert served_ids(base.choices[0]) == reference_ids(session, 0.0, SteerConfig("conditional"))
    assert served_ids(chat(client, model="tiny:merged").choices[0]) == served_ids(merged.choices[0])


def merged_reading(session, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The merged, unsteered model's reading of `ids` in one plain forward: (the head's p(good) per position, the
    log-softmax of the next-token logits per position)."""
    lm, head = session.lm, session.head()
    with torch.no_grad():
        hidden = {}
        handle = decoder_layers(lm.model)[head.layer].register_forward_hook(
            lambda _m, _i, out: hidden.__setitem__("h", out[0] if isinstance(out, tuple) else out)
        )
        try:
            logits = lm.model(input_ids=torch.tensor([ids])).logits[0]
        finally:
            handle.remove()
        return head_probability(head.linear, final_norm(lm.model)(hidden["h"]))[0], torch.log_softmax(logits, -1)


def test_p_good_is_the_heads_reading_of_the_merged_model(client, session):
    """Every token's p_good is the adapter's head on the merged, unsteered model's states over the prompt and the
    tokens so far — also for a steered completion (read on an unsteered twin row), as the Token overlay reads it."""
    lm = session.lm
    for steering in (None, {"mode": "vector", "lambda": big(session), "units": "raw"}):
        reply = chat(client, steering=steering)
        ids, served = served_ids(reply.choices[0]), [t.p_good for t in reply.choices[0].logprobs.content]
        prompt = lm.tokenizer(build_prompt(lm.tokenizer, DOC), add_special_tokens=False).input_ids
        p = merged_reading(session, prompt + ids)[0][len(prompt) :]
        assert served == pytest.approx(p.tolist(), abs=1e-4), steering
        verdict = reply.choices[0].model_extra["verdict"]
        assert verdict["flagged"] == sum(x < verdict["threshold"] for x in served) and verdict["tokens"] == len(ids)


def test_an_echo_scores_the_prompt_as_one_plain_forward_does(client, session):
    """echo with logprobs (OpenAI's legacy completions shape, what lm-eval reads): every prompt token after the first
    with its log-probability and top alternatives from the merged model's forward over the prompt, then the
    generated tokens; p_good on the prompt's tokens too (the head reads every position of the prompt as it reads
    generated ones: its verdict on text the client wrote)."""
    prompt = session.lm.tokenizer(build_prompt(session.lm.tokenizer, DOC), add_special_tokens=False).input_ids
    reply = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=2, temperature=0, echo=True, logprobs=2
    ).choices[0]
    lp = reply.logprobs
    n = len(prompt)
    assert lp.model_extra["token_ids"][:n] == prompt and len(lp.tokens) == n + 2
    p_good, lsm = merged_reading(session, lp.model_extra["token_ids"])
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = lsm[:-1].gather(1, torch.tensor(lp.model_extra["token_ids"][1:])[:, None])[:, 0]
    assert lp.token_logprobs[1:] == pytest.approx(expected.tolist(), abs=1e-4)
    for k in range(1, n + 2):
        top = lsm[k - 1].topk(2)
        assert sorted(lp.top_logprobs[k].values(), reverse=True) == pytest.approx(top.values.tolist(), abs=1e-4)
    assert lp.model_extra["p_good"] == pytest.approx(p_good.tolist(), abs=1e-4)
    assert reply.text.startswith(session.lm.tokenizer.decode(prompt))
    chunks = list(
        client.completions.create(
            model="tiny", prompt=prompt, max_tokens=2, temperature=0, echo=True, logprobs=2, stream=True
        )
    )
    streamed = [i for c in chunks for i in c.choices[0].logprobs.model_extra["token_ids"]]
    assert streamed == lp.model_extra["token_ids"]
    assert "".join(c.choices[0].text for c in chunks) == reply.text
    only = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=1).choices[0]
    assert only.logprobs.token_logprobs == pytest.approx(lp.token_logprobs[:n]) and only.finish_reason == "length"


def test_streams_carry_the_same_tokens_and_verdicts(client, session):
    lam = big(session)
    whole = chat(client, steering={"mode": "vector", "lambda": lam, "units": "raw"})
    stream = chat(client, steering={"mode": "vector", "lambda": lam, "units": "raw"}, stream=True)
    chunks = list(stream)
    tokens = [t for c in chunks for t in (c.choices[0].logprobs.content if c.choices[0].logprobs else [])]
    assert [t.token_id for t in tokens] == served_ids(whole.choices[0])
    assert [t.p_good for t in tokens] == pytest.approx([t.p_good for t in whole.choices[0].logprobs.content])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "length"
    completion = client.completions.create(
        model="tiny", prompt=build_prompt(session.lm.tokenizer, DOC), max_tokens=NEW, temperature=0
    )
    assert completion.choices[0].logprobs.model_extra["token_ids"] == reference_ids(session, 0.0, SteerConfig())


def test_the_gated_mode_reports_what_it_took_back(client, session):
    """τ = 1 with a long window takes back the second token and steers every forward after: the always-on text on
    generated positions (the gate's exact property), with the replacement reported."""
    lam = big(session)
    reply = chat(client, steering={"mode": "gated", "lambda": lam, "units": "raw", "tau": 1.0, "keep": 64})
    always = reference_ids(session, lam, SteerConfig("vector", "generated", "raw"))
    assert served_ids(reply.choices[0]) == always
    how = SteerConfig("gated", units="raw", tau=1.0, keep=64)
    gated = session.grid_generations(DOC, [lam], GenerationConfig(max_new_tokens=NEW), how=how)[0]
    verdict = reply.choices[0].model_extra["verdict"]
    assert verdict["threshold"] == 1.0 and len(verdict["taken_back"]) == gated.gate.taken_back == 1
    assert len(verdict["replacements"]) == len(gated.replacements)
    assert [r["position"] for r in verdict["replacements"]] == [r.position for r in gated.replacements]


def test_sampling_is_seeded_per_request(client):
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=NEW, temperature=1.5, seed=7)
    a, b = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    assert served_ids(a.choices[0]) == served_ids(b.choices[0])
    two = client.chat.completions.create(**{**kw, "n": 2})
    assert len(two.choices) == 2 and served_ids(two.choices[0]) == served_ids(a.choices[0])


def test_a_short_request_is_not_kept_waiting_by_a_long_one(served, client):
    """Requests share the batch: a short one sent while a long one streams gets its first token (and its end) before
    the long one ends."""
    engine, _ = served
    long_done, short_first = {}, {}

    def long_request():
        stream = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=300,
            temperature=0,
            stream=True,
            extra_body={"steering": {"mode": "vector", "lambda": 1}},
        )
        for _ in stream:
            pass
        long_done["t"] = time.perf_counter()

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.3)
    for chunk in client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=3, temperature=0, stream=True
    ):
        short_first.setdefault("t", time.perf_counter())
    short_end = time.perf_counter()
    t.join(120)
    assert short_first["t"] < short_end < long_done["t"]


HOSTILE = [
    ({"model": "tiny", "messages": "hello"}, 400, "messages"),
    ({"model": "tiny", "messages": []}, 400, "messages"),
    ({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages"),
    ({"model": "nope", "messages": MESSAGES}, 404, "model"),
    ({"model": "tiny", "messages": MESSAGES, "max_tokens": -1}, 400, "max_tokens"),
    ({"model": "tiny", "messages": MESSAGES, "max_tokens": 10**9}, 400, "max_tokens"),
    ({"model": "tiny", "messages": MESSAGES, "temperature": "hot"}, 400, "temperature"),
    ({"model": "tiny", "messages": MESSAGES, "n": 99}, 400, "n"),
    ({"model": "tiny", "messages": MESSAGES, "frobnicate": 1}, 400, "frobnicate"),
    ({"model": "tiny", "messages": MESSAGES, "steering": {"mode": "teleport", "lambda": 1}}, 400, "steering.mode"),
    ({"model": "tiny", "messages": MESSAGES, "steering": {"mode": "vector", "lambda": 1e9}}, 400, "steering.lambda"),
    ({"model": "tiny", "messages": MESSAGES, "steering": {"mode": "vector"}}, 400, "steering.lambda"),
    (
        {"model": "tiny", "messages": MESSAGES, "steering": {"mode": "vector", "lambda": 1, "tau": 0.5}},
        400,
        "steering.tau",
    ),
    (
        {"model": "tiny", "messages": MESSAGES, "steering": {"mode": "gated", "lambda": 1, "tau": 7}},
        400,
        "steering.tau",
    ),
    (
        {"model": "tiny", "messages": MESSAGES, "steering": {"mode": "vector", "lambda": 1, "units": "km"}},
        400,
        "steering.units",
    ),
    ({"model": "tiny:merged", "messages": MESSAGES, "steering": {"mode": "vector", "lambda": 1}}, 400, "steering"),
    ({"model": "tiny", "messages": MESSAGES, "stop": list("abcdefghijklmnopq")}, 400, "stop"),
    ({"model": "tiny", "messages": MESSAGES, "frequency_penalty": 1.0}, 400, "frequency_penalty"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x" * 30_000}]}, 413, None),
]


def test_hostile_requests_get_openai_errors_and_the_server_goes_on(served, client):
    url = served[1].url
    for body, status, param in HOSTILE:
        r = httpx.post(f"{url}/chat/completions", json=body, timeout=30)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        named = error["param"] == param or (param and str(error["param"]).startswith(param + "."))
        assert error["message"] and named, (body, error)  # the field, or the item in it
    r = httpx.post(f"{url}/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"]
    with httpx.stream(
        "POST",
        f"{url}/chat/completions",
        timeout=30,
        json={"model": "tiny", "messages": MESSAGES, "max_tokens": 400, "stream": True},
    ) as dropped:  # a client that drops mid-stream
        next(dropped.iter_lines())
    deadline = time.time() + 20
    while served[0].live and time.time() < deadline:
        time.sleep(0.05)
    assert served[0].live == 0  # its generation stopped and left its slot
    assert served_ids(chat(client).choices[0])  # and the server still serves


def test_a_full_queue_answers_429_and_a_wrong_key_401(session):
    with serving(session, slots=2, waiting=0, api_key="sesame") as (_, server):
        good = openai.OpenAI(base_url=server.url, api_key="sesame", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0).models.list()
        # both slots held for as long as the test needs them: 200 tokens were once written (the compiled step) before
        # the next request came, in a loaded suite; the stream is closed (its generations cancelled) after
        stream = good.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1000, stream=True, n=2)
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as busy:
            good.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
        assert busy.value.response.headers["retry-after"] == "1"
        stream.close()


def test_serve_refuses_a_public_address_without_a_key(tmp_path):
    from topl_core.cli import main

    with pytest.raises(SystemExit, match="api-key"):
        main(["serve", "--run", str(tmp_path), "--host", "0.0.0.0"])


def test_the_pages_request_runs_as_pasted(served, session, capsys):
    """The request the Steering page shows for its settings (Python with the openai client, and curl's body) is
    answered by the service with the steering it names."""
    import shlex

    from topl_core.serve.protocol import client_code

    lam = 1.5
    code = client_code("tiny", SteerConfig("gated", tau=0.9, keep=2), lam, MESSAGES[0]["content"], served[1].url)
    exec(compile(code["python"], "<pasted>", "exec"), {})
    printed = capsys.readouterr().out.strip().splitlines()[-1]  # its last line: (token, p(good)) per token
    assert printed.startswith("[(") and ", 0." in printed  # each token with its p(good), a probability
    words = shlex.split(code["curl"])
    body = json.loads(words[words.index("-d") + 1])
    assert body["steering"] == {"mode": "gated", "lambda": lam, "tau": 0.9, "keep": 2}
    r = httpx.post(words[1], json=body, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["verdict"]["threshold"] == 0.9


@needs_smollm2
def test_the_demo_adapter_served_steers_and_its_neutral_lambda_is_the_merged_text():
    """On the demo TOPL adapter (SmolLM2), through the official client: λ = 0 gives the merged model's text token for
    token (the session's own decode loop), and λ = 2 (normalised) changes the text."""
    from topl_core.analysis.lora_a.probe import labelled_split
    from topl_core.foundations.paths import PROJECT_ROOT

    adapter = PROJECT_ROOT / "examples" / "adapters" / "topl-smollm2"
    records = labelled_split(adapter, limit=4)
    demo = SteeringSession.from_run(adapter, build_steering_vectors(adapter, records, top_k=4))
    document = records[0].document
    with serving(demo, slots=4, name="topl-smollm2") as (_, server):
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": user_message(document)}]

        def served(lam: float) -> list[int]:
            reply = client.chat.completions.create(
                model="topl-smollm2",
                messages=messages,
                max_tokens=24,
                temperature=0,
                extra_body={"steering": {"mode": "vector", "lambda": lam}},
            )
            return served_ids(reply.choices[0])

        gen = GenerationConfig(max_new_tokens=24, precision="fp32")
        *_, merged = stream_rows(demo.lm, document, 1, gen)
        assert served(0.0) == [t for t in merged[0] if t not in stop_tokens(demo.lm.tokenizer)]
        assert served(2.0) != served(0.0)


def test_the_service_decodes_in_bf16_as_the_session_does(session):
    """bf16 forced on the tiny model (every CPU emulates or runs it): a merged completion is the session's own bf16
    decode loop token for token, and a steered one decodes with finite p(good) on its unsteered twin row."""
    with serving(session, "bf16", slots=4) as (_, server):
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        merged = chat(client)
        gen = GenerationConfig.chosen("bf16", max_new_tokens=NEW)
        *_, ref = stream_rows(session.lm, DOC, 1, gen, prefix=prefill(session.lm, DOC, gen))
        assert served_ids(merged.choices[0]) == [t for t in ref[0] if t not in stop_tokens(session.lm.tokenizer)]
        steered = chat(client, steering={"mode": "vector", "lambda": big(session), "units": "raw"})
        assert all(0.0 <= t.p_good <= 1.0 for t in steered.choices[0].logprobs.content)


def test_langchain_chat_openai_as_it_is(served, client, session):
    """LangChain's ChatOpenAI pointed at the service by base_url: plain, streamed, multi-part content (what it sends
    for a list of content blocks), steering through extra_body, and top log-probabilities in its metadata."""
    langchain_openai = pytest.importorskip(
        "langchain_openai", reason="langchain-openai is installed by requirements.txt"
    )
    from langchain_core.messages import HumanMessage

    kw = dict(base_url=served[1].url, api_key="unused", model="tiny", temperature=0, max_tokens=NEW, max_retries=0)
    llm = langchain_openai.ChatOpenAI(**kw)
    text = MESSAGES[0]["content"]
    merged = chat(client).choices[0].message.content
    assert llm.invoke(text).content == merged
    assert "".join(chunk.content for chunk in llm.stream(text)) == merged
    parts = [{"type": "text", "text": text[:20]}, {"type": "text", "text": text[20:]}]
    assert llm.invoke([HumanMessage(content=parts)]).content == merged
    lam = big(session)
    steering = {"mode": "vector", "lambda": lam, "units": "raw"}
    steered = langchain_openai.ChatOpenAI(**kw, extra_body={"steering": steering}).invoke(text)
    assert steered.content == chat(client, steering=steering).choices[0].message.content != merged
    scored = llm.bind(logprobs=True, top_logprobs=3).invoke(text)
    tokens = scored.response_metadata["logprobs"]["content"]
    assert all(len(t["top_logprobs"]) == 3 and t["top_logprobs"][0]["logprob"] >= t["logprob"] - 1e-6 for t in tokens)


def test_a_prompt_asked_again_decodes_from_the_prompt_cache_as_a_miss_does(served, client, session):
    """The service keeps recent prompts' forwards: the same request again is a cache hit with the same tokens; a
    request whose mode steers the prompt never reads the unsteered prompt's entry (a cache keyed by the tokens alone
    would answer it with a plain request's forward), and one that leaves the prompt alone shares it."""
    prompts = served[0].batcher.prompts
    lam = big(session)
    messages = [{"role": "user", "content": user_message(DOC + " Again.")}]  # a prompt no other test sent

    def ask(steering=None) -> list[int]:
        extra = {"steering": steering} if steering is not None else None
        reply = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=NEW, temperature=0, extra_body=extra
        )
        return served_ids(reply.choices[0])

    hits = prompts.stats.hits
    merged = ask()
    assert prompts.stats.hits == hits  # a miss, now kept
    assert ask() == merged and prompts.stats.hits == hits + 1
    for positions in ("all", "generated"):
        steering = {"mode": "vector", "lambda": lam, "units": "raw", "positions": positions}
        how = SteerConfig("vector", positions, "raw")
        lm, gen = session.lm, GenerationConfig(max_new_tokens=NEW, precision="fp32")
        with steer(lm.model, session.vectors, lam, how):
            prefix = None if how.steers_prompt else prefill(lm, DOC + " Again.", gen)
            *_, last = stream_rows(lm, DOC + " Again.", 1, gen, prefix=prefix)
        expected = [t for t in last[0] if t not in stop_tokens(lm.tokenizer)]
        first, again = ask(steering), ask(steering)
        assert first == again == expected != merged, positions


def test_a_twins_prompt_stops_at_the_heads_layer_and_never_answers_a_whole_prompt(session):
    """The twin of a request whose prompt is steered runs the plain prompt only through the head's layer (all it is
    read at; here a head read at layer 1 of 4) and keeps it so: a merged request for the same prompt afterwards runs
    the whole prompt (a miss) and writes the merged model's own tokens; the steered request again reads both
    entries, the whole one for its twin, with the same tokens and p(good) as the first time."""
    low = SteeringSession(session.lm, session.vectors, head=Head(1, session.head().linear))
    steering = {"mode": "vector", "lambda": big(session), "units": "raw", "positions": "all"}  # a steered prompt
    with serving(low) as (engine, server):
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        prompts = engine.batcher.prompts

        def ask(steering=None):
            extra = {"steering": steering} if steering is not None else None
            reply = client.chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=NEW, temperature=0, logprobs=True, extra_body=extra
            )
            return [(t.token_id, t.p_good) for t in reply.choices[0].logprobs.content]

        first = ask(steering)
        hits = prompts.stats.hits
        merged = ask()
        assert prompts.stats.hits == hits  # the twin's shorter forward did not answer it
        assert [t for t, _ in merged] == reference_ids(session, 0.0, SteerConfig())
        assert ask(steering) == first and prompts.stats.hits == hits + 2  # its steered prompt, its twin's whole one


def test_a_steered_prompt_replays_its_twins_layers_below_the_lowest_site(session):
    """Steering sites at layer 1 and above: a steered prompt and its twin's plain one are one forward below them, so
    the twin's runs first and the steered one replays its layers there (PromptForwards.run_with_twin). The steered
    request writes the page's own steered tokens (its prompt run whole); a merged request afterwards is answered by
    the twin's cached forward and writes the merged model's own tokens, as a prompt run on its own would."""
    upper = dataclasses.replace(session.vectors, sites=tuple(s for s in session.vectors.sites if s.layer >= 1))
    assert upper.sites, [s.key for s in session.vectors.sites]
    high = SteeringSession(session.lm, upper, head=session.head())
    how = SteerConfig("vector", units="raw", positions="all")  # the prompt steered
    steering = {"mode": how.mode, "lambda": big(high), "units": how.units, "positions": how.positions}
    with serving(high) as (engine, server):
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        forwards = engine.batcher._prompts
        steered = chat(client, steering=steering, logprobs=True)
        assert forwards.replayed == min(s.layer for s in upper.sites)
        assert served_ids(steered.choices[0]) == reference_ids(high, big(high), how)
        hits = forwards.cache.stats.hits
        merged = chat(client, logprobs=True)
        assert forwards.cache.stats.hits == hits + 1 and forwards.replayed == min(s.layer for s in upper.sites)
        assert served_ids(merged.choices[0]) == reference_ids(high, 0.0, SteerConfig())
    # bit for bit what each prompt's own forward gives, with nothing shared (another PromptForwards, its cache empty),
    # in both precisions (bf16 forced: autocast over the tiny model's float32 weights)
    ids = torch.randint(5, 200, (1, 30), generator=torch.Generator().manual_seed(0))
    steered, first_logits = Steering(how, big(high)), {}
    for precision in ("fp32", "bf16"):
        sharing, alone = (PromptForwards(high.lm, upper, high.lora, high.head(), precision, 2**26) for _ in range(2))
        held, logits, plain = sharing.run_with_twin(ids, steered, None)
        prompt_layers._KEPT._entries.clear()  # what the twin kept: `alone` shares nothing
        (held_alone, logits_alone), plain_alone = alone.run(ids, steered), alone.run(ids, None)[0]
        assert sharing.replayed > 0 and alone.replayed == 0 and torch.equal(logits, logits_alone), precision
        pairs = [(a, b) for x, y in zip(held + plain, held_alone + plain_alone, strict=True) for a, b in zip(x, y)]
        assert all(torch.equal(a, b) for a, b in pairs), precision
        first_logits[precision] = logits
    assert not torch.equal(first_logits["fp32"], first_logits["bf16"])  # bf16 did run


def test_a_new_lambda_on_a_document_asked_about_runs_its_prompt_from_the_lowest_site(session):
    """Every position steered: a request at another λ on the same document takes the layers below the steering's
    lowest site from the last forward of that prompt (inference/prompt_layers.py: the first request from its twin's,
    the second from those kept) and writes the page's own tokens at each λ."""
    upper = dataclasses.replace(session.vectors, sites=tuple(s for s in session.vectors.sites if s.layer >= 1))
    high = SteeringSession(session.lm, upper, head=session.head())
    how = SteerConfig("vector", units="raw", positions="all")  # the prompt steered
    prompt_layers._KEPT._entries.clear()
    answers = {}
    with serving(high) as (engine, server):
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        for lam in (big(high), -big(high)):
            steering = {"mode": how.mode, "lambda": lam, "units": how.units, "positions": how.positions}
            answers[lam] = served_ids(chat(client, steering=steering, logprobs=True).choices[0])
        assert engine.batcher._prompts.replayed == 2 * min(s.layer for s in upper.sites)
    assert all(ids == reference_ids(high, lam, how) for lam, ids in answers.items())
    assert answers[big(high)] != answers[-big(high)]


def test_the_prompt_cache_keeps_the_most_recent_within_its_limits():
    from topl_core.inference.prompt_cache import PromptCache

    cache = PromptCache(max_bytes=100, max_entries=3)
    for key, size in (("a", 40), ("b", 40), ("c", 10)):
        cache.put(key, key.upper(), size)
    assert cache.get("a") == "A"  # a is now the most recent: b goes first
    cache.put("d", "D", 30)
    assert cache.get("b") is None and [cache.get(k) for k in "acd"] == ["A", "C", "D"] and cache.nbytes == 80
    cache.put("e", "E", 5)  # a fourth entry: the least recent (a) goes
    assert cache.get("a") is None and len(cache) == 3
    cache.put("huge", "H", 101)  # over the limit alone: not kept, nothing dropped for it
    assert cache.get("huge") is None and len(cache) == 3
    assert (cache.stats.hits, cache.stats.misses) == (4, 3)
