"""Gated steering (runtime/gate.py, mode "gated"): the adapter's head decides, token by token while
generating, when the LoRA-B vector acts. Exactness in fp32 and bf16 (autocast forced): τ = 0 is the merged model
token for token; τ = 1 with a long window is the always-on vector on generated positions token for token; the
KV-cache crop gives the tokens of a gate recomputed from the prompt at every forward (which reads the head from the
model's own hidden_states output, not the gate's hook); the counts match what that recomputation did."""

from __future__ import annotations

import copy
import dataclasses
import statistics
from contextlib import nullcontext

import pytest
import torch
from conftest import NEWS_PAIRS, all_hooks, tiny_config

from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.data.encode import build_prompt, truncate_document
from topl_core.foundations.errors import ModelError
from topl_core.hardware.precision import autocast
from topl_core.inference.generate import GenerationConfig, generate, load_merged, prefill, stop_tokens
from topl_core.models.architecture import final_norm
from topl_core.models.forward import head_probability
from topl_core.runtime.gate import Head
from topl_core.runtime.modes import MODES, SteerConfig, steer
from topl_core.runtime.session import SteeringSession
from topl_core.training.trainer import train

DOCS = [NEWS_PAIRS[0][1], NEWS_PAIRS[2][1]]
PRECISIONS = ("fp32", "bf16")


@pytest.fixture(scope="module")
def run(tmp_path_factory, news_records):
    cfg = tiny_config(steps=3, lr=5e-3, precision="fp32", batch_size=4, max_val_examples=4, eval_every=3)
    return train(cfg, tmp_path_factory.mktemp("runs") / "topl-gated", records=news_records)


@pytest.fixture(scope="module")
def session(run, news_records):
    vectors = build_steering_vectors(run, news_records, top_k=3, use_cache=False)
    return SteeringSession(load_merged("tiny-llama", run), vectors)


def lam(session) -> float:
    """A raw λ that moves the tiny model's residual stream by ~3 per steered site (a 3-step adapter's B is tiny)."""
    return 3.0 / min(session.vectors.norms().values())


def gated(**settings) -> SteerConfig:
    return SteerConfig("gated", units="raw", **settings)


def prompt_ids(lm, document: str, gen: GenerationConfig) -> torch.Tensor:
    tok = lm.tokenizer
    prompt = build_prompt(tok, truncate_document(tok, document, gen.max_doc_tokens), "summarization", None)
    return tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids


def hf_ids(session, document: str, gen: GenerationConfig, steering=None) -> tuple[int, ...]:
    """transformers' own generate on the prompt (greedy, or sampled from gen.seed), under `steering` (a steer()
    context) when given."""
    lm, ids = session.lm, prompt_ids(session.lm, document, gen)
    sample = gen.mode == "sample"
    torch.manual_seed(gen.seed)
    with torch.no_grad(), steering or nullcontext(), autocast(gen.precision, "cpu"):
        out = lm.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=gen.max_new_tokens,
            do_sample=sample,
            temperature=gen.temperature if sample else None,
            top_p=gen.top_p if sample else None,
            top_k=None,
            pad_token_id=lm.tokenizer.pad_token_id,
            eos_token_id=lm.tokenizer.eos_token_id,
        )
    return tuple(out[0, ids.shape[1] :].tolist())


def recomputed_gate(session, document: str, lam_: float, how: SteerConfig, gen: GenerationConfig) -> dict:
    """The gate of gate.py's docstring with no cache crop: every forward replays the prompt's cache copy and every
    forward kept so far, steered as it was, and reads p(good) from the model's hidden_states output. Returns the
    tokens, the take-backs (position, original, new), every p(good) read and the forwards the real loop makes."""
    lm, model, head = session.lm, session.lm.model, session.head()
    pre, stop = prefill(lm, document, gen), stop_tokens(lm.tokenizer)
    calls = {"forwards": 0, "steered": 0}

    def forward(seq: list[tuple[int, bool]]) -> tuple[float, torch.Tensor]:
        cache = copy.deepcopy(pre.cache)
        with torch.no_grad(), steer(model, session.vectors, lam_, how) as switch:
            for token, on in seq:
                switch.on = on
                with autocast(gen.precision, "cpu"):
                    out = model(
                        input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True,
                        output_hidden_states=True,
                    )  # fmt: skip
                    hidden = out.hidden_states[head.layer + 1][:, -1:]
                    p = float(head_probability(head.linear, final_norm(model)(hidden))[0, -1])
        calls["forwards"] += 1
        calls["steered"] += seq[-1][1]
        return p, out.logits[0, -1].float()

    ids, takes, ps, kept = [], [], [], []
    logits, logits_steered, window = pre.logits, False, 0
    while len(ids) < gen.max_new_tokens:
        token, chosen_steered = int(logits.argmax()), logits_steered
        if token not in stop:
            on = window > 0
            window -= on
            p, nxt = forward([*kept, (token, on)])
            ps.append(p)
            if p < how.tau and not chosen_steered and ids:
                kept[-1] = (kept[-1][0], True)
                new = int(forward(kept)[1].argmax())
                takes.append((len(ids), token, new))
                token, window = new, how.keep
                if new not in stop:
                    on = window > 0
                    window -= on
                    nxt = forward([*kept, (new, on)])[1]
            if token not in stop:
                kept.append((token, on))
                logits, logits_steered = nxt, on
        ids.append(token)
        if token in stop:
            break
    return {"ids": tuple(ids), "takes": takes, "ps": ps, **calls}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_tau_zero_is_the_merged_model(session, precision):
    """τ = 0 takes nothing back: transformers' greedy tokens of the merged model and generate()'s text, every
    forward unsteered, one forward per token as plain decoding (the last token's too: the gate reads it)."""
    gen = GenerationConfig(max_new_tokens=12, precision=precision)
    for document in DOCS:
        g = session.grid_generations(document, [lam(session)], gen, how=gated(tau=0.0, keep=4))[0]
        assert g.token_ids == hf_ids(session, document, gen)
        assert g.text == generate(session.lm, [document], gen)[0]
        assert g.replacements == () and g.gate.taken_back == 0 and g.gate.steered == 0
        ended = g.token_ids[-1] in stop_tokens(session.lm.tokenizer)  # the end of turn is not run
        assert g.gate.tokens == len(g.token_ids) == g.gate.forwards + ended


@pytest.mark.parametrize("precision", PRECISIONS)
def test_tau_one_with_a_long_window_is_always_on_on_generated_positions(session, precision):
    """τ = 1 flags every p(good) < 1: the second token is taken back (the first is chosen from the prompt's forward,
    which the gate never steers) and, with keep ≥ max_new_tokens, every forward from the first token's on is steered
    and no later token is judged — the always-on vector on generated positions, token for token (transformers'
    generate under steer, and the session's own stream)."""
    gen = GenerationConfig(max_new_tokens=12, precision=precision)
    always_on = SteerConfig("vector", "generated", "raw")
    replaced = []
    for document in DOCS:
        g = session.grid_generations(document, [lam(session)], gen, how=gated(tau=1.0, keep=12))[0]
        expected = hf_ids(session, document, gen, steer(session.lm.model, session.vectors, lam(session), always_on))
        assert g.token_ids == expected
        assert g.text == [*session.stream_steered(document, lam(session), gen, how=always_on)][-1]
        assert g.gate.taken_back == 1 and all(r.position == 1 for r in g.replacements)
        assert g.gate.forwards == g.gate.tokens + 2 - (g.token_ids[-1] in stop_tokens(session.lm.tokenizer))
        assert g.gate.steered == g.gate.forwards - 2  # all but the first token's first forward and the one taken back
        replaced += g.replacements
    assert replaced, "the steered λ changes a second token, so the equality is not the merged text's"


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("keep", [0, 2])
def test_cropping_the_cache_equals_recomputing_from_the_prompt(session, precision, keep):
    """At a τ that flags some tokens and not others (the median p(good) of the ungated text), the gate's tokens and
    take-backs are those of the gate recomputed from the prompt at every forward, and its counts are what that
    recomputation did: forwards, steered forwards, take-backs; each replacement is a take-back whose token changed,
    its characters in the text are its replacement's."""
    gen = GenerationConfig(max_new_tokens=14, precision=precision)
    hooks = None
    for document in DOCS:
        ps = recomputed_gate(session, document, lam(session), gated(tau=0.0), gen)["ps"]
        hooks = hooks or all_hooks(session.lm.model)  # after transformers' own hidden-state recorders are in
        how = gated(tau=statistics.median(ps[1:]), keep=keep)
        ref = recomputed_gate(session, document, lam(session), how, gen)
        g = session.grid_generations(document, [lam(session)], gen, how=how)[0]
        assert 0 < len(ref["takes"]) < len(ref["ids"]) - 1, "the median τ gates some tokens, not all"
        assert g.token_ids == ref["ids"]
        counts = (g.gate.forwards, g.gate.steered, g.gate.taken_back)
        assert counts == (ref["forwards"], ref["steered"], len(ref["takes"]))
        changed = [(pos, old, new) for pos, old, new in ref["takes"] if old != new]
        assert [r.position for r in g.replacements] == [pos for pos, _, _ in changed]
        tok = session.lm.tokenizer
        for r, (pos, old, new) in zip(g.replacements, changed):
            assert g.text[r.start : r.end] == r.replacement.strip() or g.text[r.start : r.end] == r.replacement
            assert r.original == tok.decode([*g.token_ids[:pos], old])[len(tok.decode(list(g.token_ids[:pos]))) :]
            assert r.p_good < how.tau and 0.0 <= (r.p_good_after or 0.0) <= 1.0
    assert all_hooks(session.lm.model) == hooks  # neither the gate's head reader nor a steering hook is left


def test_streamed_generation_grows_and_ends_on_the_generation(session):
    """The stream yields the text after every accepted token (a take-back never shows), ending on the generation."""
    gen = GenerationConfig(max_new_tokens=14, precision="fp32")
    how = gated(tau=0.6, keep=1)
    parts = list(session.stream_generations(DOCS[0], lam(session), gen, how=how))
    assert parts[-1] == session.grid_generations(DOCS[0], [lam(session)], gen, how=how)[0]
    assert [len(p.token_ids) for p in parts] == list(range(1, len(parts) + 1))
    assert all(b.token_ids[: len(a.token_ids)] == a.token_ids for a, b in zip(parts, parts[1:]))


def test_neutral_lambda_and_sampling(session):
    """The neutral λ steers nothing, so the gate stays off: the merged model's tokens, greedy and sampled. Sampling
    with τ = 0 draws what transformers' generate draws (the same warpers, the same generator); with the gate on, a
    seed gives one text."""
    for mode in ("greedy", "sample"):
        gen = GenerationConfig(max_new_tokens=12, precision="fp32", mode=mode, seed=3)
        merged = hf_ids(session, DOCS[0], gen)
        g = session.grid_generations(DOCS[0], [0.0], gen, how=gated(tau=1.0, keep=3))[0]
        assert g.token_ids == merged and g.gate.taken_back == 0, mode
        g = session.grid_generations(DOCS[0], [lam(session)], gen, how=gated(tau=0.0))[0]
        assert g.token_ids == merged, mode
        assert g.text == generate(session.lm, [DOCS[0]], gen)[0], mode
    gen = GenerationConfig(max_new_tokens=12, precision="fp32", mode="sample", seed=5)
    texts = [session.grid_generations(DOCS[1], [lam(session)], gen, how=gated(tau=0.7, keep=1))[0] for _ in "ab"]
    assert texts[0] == texts[1] and texts[0].gate.taken_back > 0


def test_every_mode_streams_sampled_text(session):
    """Sampling streams in every mode through the one loop: a sampled stream's last text is the sampled generation
    (a gated one with what it took back; an always-on one is transformers' generate with the same seed), and the
    stream grows a token at a time."""
    gen = GenerationConfig(max_new_tokens=12, precision="fp32", mode="sample", seed=5)
    how = gated(tau=0.7, keep=1)
    parts = list(session.stream_generations(DOCS[1], lam(session), gen, how=how))
    assert parts[-1] == session.grid_generations(DOCS[1], [lam(session)], gen, how=how)[0]
    assert parts[-1].gate.taken_back > 0 and [len(p.token_ids) for p in parts] == list(range(1, len(parts) + 1))
    for mode in ("vector", "conditional"):
        always = SteerConfig(mode, "generated")
        streamed = list(session.stream_steered(DOCS[1], 1.0, gen, how=always))
        assert streamed[-1] == session.generate_steered(DOCS[1], 1.0, gen, how=always), mode
    greedy = dataclasses.replace(gen, mode="greedy")
    assert streamed[-1] != session.generate_steered(DOCS[1], 1.0, greedy, how=always)  # it did sample


def test_head_given_or_missing(session):
    """A session whose vectors name no adapter (or an adapter without a head) says what to do; a head given
    explicitly (a probe head's layer and linear) is the one read."""
    gen = GenerationConfig(max_new_tokens=10, precision="fp32")
    anonymous = dataclasses.replace(session.vectors, adapter_path=None)
    with pytest.raises(ModelError, match="probe head"):
        SteeringSession(session.lm, anonymous).generate_steered(DOCS[0], lam(session), gen, how=gated(tau=1.0))
    head = session.head()
    doubtful = torch.nn.Linear(head.linear.in_features, 1)  # the run's head, shifted to p(good) ≈ 0 everywhere
    doubtful.load_state_dict({"weight": head.linear.weight, "bias": head.linear.bias - 100.0})
    how = gated(tau=0.01, keep=0)
    assert session.grid_generations(DOCS[0], [lam(session)], gen, how=how)[0].gate.taken_back == 0
    g = SteeringSession(session.lm, anonymous, head=Head(head.layer, doubtful)).grid_generations(
        DOCS[0], [lam(session)], gen, how=how
    )[0]
    assert len(g.token_ids) - 2 <= g.gate.taken_back <= len(g.token_ids) - 1  # every token after the first
    assert all(r.p_good < 0.01 for r in g.replacements)


def test_the_mode_and_its_settings():
    """The gated mode is an entry of the registry on the LoRA-B vector's λ axis and units; τ and k are checked."""
    spec = MODES["gated"]
    assert spec.family == MODES["vector"].family and spec.neutral == 0.0 and spec.action.units_apply
    assert not spec.steers_positions and not spec.batches_rows and spec.needs_head and spec.settings == ("tau", "keep")
    assert spec.action is MODES["vector"].action and spec.direction is MODES["vector"].direction  # the vector + a judge
    key = {"mode": "gated", "positions": "all", "units": "normalised", "tau": 0.3, "keep": 2}
    assert SteerConfig("gated", tau=0.3, keep=2).key() == key
    assert "tau" not in SteerConfig("vector").key()  # the other modes' cache keys are what they were
    with pytest.raises(ValueError, match="tau"):
        SteerConfig("gated", tau=1.5)
    with pytest.raises(ValueError, match="keep"):
        SteerConfig("gated", keep=-1)
