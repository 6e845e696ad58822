"""A steered prompt run again from its first steered layer (inference/prompt_layers.py): bit for bit the whole
forward, in float32 and bf16, and never from another prompt's, model's or weights' layers."""

from __future__ import annotations

import threading

import pytest
import torch

from topl_core.inference import prompt_layers
from topl_core.inference.generate import prompt_forward
from topl_core.models.loading import LoadedModel
from topl_core.models.tiny import build_tiny_model
from topl_core.runtime.hooks import edit_outputs
from topl_core.runtime.sites import Site


@pytest.fixture()
def lm():
    prompt_layers._KEPT._entries.clear()
    model, tok = build_tiny_model("tiny-llama")  # 4 decoder layers
    return LoadedModel(model, tok, "tiny-llama")


def steered_prompt(lm, ids, lam: float, precision: str = "fp32", layer: int = 2):
    """The prompt forward with lam added to the output of layer `layer`'s MLP (as a steering vector is)."""
    site = Site(layer, "down_proj", f"model.layers.{layer}.mlp.down_proj")
    with edit_outputs(lm.model, {site: lambda _x, out: out + lam}):
        return prompt_forward(lm, ids, precision)


def same(a, b) -> bool:
    (cache_a, logits_a), (cache_b, logits_b) = a, b
    layers = zip(cache_a.layers, cache_b.layers, strict=True)
    return torch.equal(logits_a, logits_b) and all(
        torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in layers
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_prompt_steered_again_is_the_whole_forward_bit_for_bit(lm, precision):
    ids = torch.randint(0, 200, (1, 40))
    steered_prompt(lm, ids, 1.0, precision)  # whole: keeps layers 0-1
    assert len(prompt_layers._KEPT._entries) == 1
    resumed = steered_prompt(lm, ids, 2.0, precision)
    prompt_layers._KEPT._entries.clear()
    whole = steered_prompt(lm, ids, 2.0, precision)
    assert same(resumed, whole)
    assert not torch.equal(resumed[1], steered_prompt(lm, ids, 1.0, precision)[1])  # λ is heard


def test_the_layers_below_run_on_one_position_when_resumed(lm):
    ids = torch.randint(0, 200, (1, 40))
    steered_prompt(lm, ids, 1.0)
    widths = []
    handle = lm.model.model.layers[0].register_forward_hook(lambda _m, _i, out: widths.append(out.shape[1]))
    try:
        steered_prompt(lm, ids, 2.0)
    finally:
        handle.remove()
    assert widths == [1]


def test_another_prompt_precision_or_first_layer_is_never_resumed_from(lm):
    ids = torch.randint(0, 200, (1, 40))
    steered_prompt(lm, ids, 1.0)
    other = ids.clone()
    other[0, 3] += 1  # one token apart
    for args, kw in [((other, 2.0), {}), ((ids, 2.0, "bf16"), {}), ((ids, 2.0), {"layer": 3})]:
        got = steered_prompt(lm, *args, **kw)
        prompt_layers._KEPT._entries.clear()
        assert same(got, steered_prompt(lm, *args, **kw))


def test_a_weight_changed_in_place_below_is_run_again(lm):
    ids = torch.randint(0, 200, (1, 40))
    steered_prompt(lm, ids, 1.0)
    with torch.no_grad():
        lm.model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    got = steered_prompt(lm, ids, 2.0)
    prompt_layers._KEPT._entries.clear()
    assert same(got, steered_prompt(lm, ids, 2.0))


def test_unsteered_prompts_and_other_threads_run_whole(lm):
    ids = torch.randint(0, 200, (1, 40))
    steered_prompt(lm, ids, 1.0)
    plain = prompt_forward(lm, ids, "fp32")  # nothing declared: no layer skipped
    prompt_layers._KEPT._entries.clear()
    assert same(plain, prompt_forward(lm, ids, "fp32"))
    declared = threading.Event()
    release = threading.Event()
    site = Site(2, "down_proj", "model.layers.2.mlp.down_proj")

    def steering_elsewhere():
        with edit_outputs(lm.model, {site: lambda _x, out: out + 1.0}):
            declared.set()
            release.wait(10)

    thread = threading.Thread(target=steering_elsewhere)
    thread.start()
    try:
        declared.wait(10)
        assert prompt_layers.plain_below_layer(lm.model) is None  # declared on that thread only
        assert same(prompt_forward(lm, ids, "fp32"), plain)
    finally:
        release.set()
        thread.join()


def grid_prompt(lm, ids, lams: list[float], precision: str = "fp32", layer: int = 2):
    """The prompt forward of len(lams) rows, row r steered with lams[r] at layer `layer`'s MLP (a λ grid)."""
    site = Site(layer, "down_proj", f"model.layers.{layer}.mlp.down_proj")
    per_row = torch.tensor(lams).reshape(-1, 1, 1)
    with edit_outputs(lm.model, {site: lambda _x, out: out + per_row}, rows=len(lams)):
        return prompt_forward(lm, ids, precision)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_grid_of_one_prompt_runs_its_layers_below_once_for_one_row(lm, precision):
    """A λ grid's rows take one row's layers below, computed as a stream of that prompt computes them (the first grid
    runs them for one row first, the next takes them as kept), and each row is its λ's stream up to a batch's last
    bits."""
    ids, lams = torch.randint(0, 200, (1, 40)), [-1.0, 0.5, 2.0]
    widths = []
    handle = lm.model.model.layers[0].register_forward_hook(lambda _m, _i, out: widths.append(out.shape[:2]))
    try:
        cache, logits = grid_prompt(lm, ids.repeat(3, 1), lams, precision)
        assert prompt_layers.last_resumed() == 2
        assert widths == [(1, 40), (3, 1)]  # one row whole, then the grid's rows on their last position
        widths.clear()
        again = grid_prompt(lm, ids.repeat(3, 1), lams, precision)
        assert widths == [(3, 1)]  # the kept layers taken: none runs the prompt again
    finally:
        handle.remove()
    assert same((cache, logits), again)
    plain, _ = prompt_forward(lm, ids, precision)
    for r, lam in enumerate(lams):
        for i, layer in enumerate(cache.layers):
            if i < 2:  # below the first steered layer: exactly the plain prompt's
                assert torch.equal(layer.keys[r], plain.layers[i].keys[0])
        prompt_layers._KEPT._entries.clear()
        alone, alone_logits = steered_prompt(lm, ids, lam, precision)
        tol = 1e-5 if precision == "fp32" else 2e-2
        assert torch.allclose(logits[r], alone_logits[0], atol=tol, rtol=tol), (r, lam)
        assert torch.allclose(cache.layers[3].keys[r], alone.layers[3].keys[0], atol=tol, rtol=tol)


def test_a_batch_of_different_prompts_runs_whole(lm):
    ids = torch.randint(0, 200, (2, 40))
    got = grid_prompt(lm, ids, [1.0, 2.0])
    assert prompt_layers.last_resumed() == 0 and not prompt_layers._KEPT._entries
    assert same(got, grid_prompt(lm, ids, [1.0, 2.0]))
