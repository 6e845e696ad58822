"""A decode step's attention on a CPU (models/one_query_attention.py): one query per row as grouped float32 products,
what sdpa computes (float32's last bits; under bf16 autocast, sdpa's bf16 kernel's, to bf16's), with boolean and
additive masks and key heads shared by several query heads; everything else is the model's own attention, bit for
bit; every CPU model loaded decodes through it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from topl_core.models.loading import load_model
from topl_core.models.one_query_attention import PREFIX, one_query_attention, own_attention


class _Module(torch.nn.Module):
    """What transformers' attention functions read off the module: its query heads per key head."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


def _attend(name: str, *args, **kwargs) -> torch.Tensor:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[name](*args, **kwargs)[0]


def _inputs(rows: int, queries: int, positions: int = 50, dtype=torch.float32):
    torch.manual_seed(0)
    q = torch.randn(rows, 6, queries, 16, dtype=dtype)
    k, v = (torch.randn(rows, 2, positions, 16, dtype=dtype) for _ in range(2))
    allowed = torch.rand(rows, 1, queries, positions) > 0.3
    allowed[..., 0] = True
    return q, k, v, allowed


@pytest.mark.parametrize("boolean", [True, False])
def test_one_query_is_sdpa_within_float32s_last_bits(boolean):
    name = one_query_attention("sdpa")
    q, k, v, allowed = _inputs(3, 1)
    mask = allowed if boolean else torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    ours = _attend(name, _Module(3), q, k, v, mask, scaling=0.3)
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), attn_mask=mask, scale=0.3
    ).transpose(1, 2)
    assert ours.shape == (3, 1, 6, 16) and ours.is_contiguous()
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)
    unmasked = _attend(name, _Module(3), q, k, v, None)
    torch.testing.assert_close(unmasked, _attend("sdpa", _Module(3), q, k, v, None), rtol=1e-5, atol=1e-6)


def test_under_bf16_autocast_one_query_sums_in_float32_and_answers_in_bf16():
    name = one_query_attention("sdpa")
    q, k, v, allowed = _inputs(4, 1, positions=300, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = _attend(name, _Module(3), q, k, v, allowed)
        theirs = _attend("sdpa", _Module(3), q, k, v, allowed)
    exact = F.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(3, 1), v.float().repeat_interleave(3, 1), attn_mask=allowed
    ).transpose(1, 2)
    assert ours.dtype == torch.bfloat16
    assert torch.equal(ours, exact.to(torch.bfloat16))  # float32 sums, rounded once
    torch.testing.assert_close(ours, theirs, rtol=1.6e-2, atol=1e-2)  # bf16 sdpa's own rounding


def test_many_queries_and_uncovered_settings_are_the_models_own_attention():
    name = one_query_attention("sdpa")
    q, k, v, allowed = _inputs(2, 5)
    assert torch.equal(_attend(name, _Module(3), q, k, v, allowed), _attend("sdpa", _Module(3), q, k, v, allowed))
    one = _inputs(2, 1)
    with pytest.raises(ValueError, match="softcap"):  # sdpa's own refusal: the products leave softcap to it
        _attend(name, _Module(3), *one, softcap=30.0)
    assert one_query_attention(name) == name and own_attention(name) == "sdpa" and own_attention("eager") == "eager"


def test_a_cpu_model_decodes_through_it_as_the_whole_forward_reads():
    lm = load_model("tiny-llama")
    assert lm.model.config._attn_implementation == PREFIX + "sdpa"
    ids = torch.randint(3, 300, (2, 30))
    with torch.no_grad():
        cache = lm.model(input_ids=ids[:, :-1], use_cache=True).past_key_values
        step = lm.model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True).logits[:, -1]
        whole = lm.model(input_ids=ids).logits[:, -1]
    torch.testing.assert_close(step, whole, rtol=1e-5, atol=1e-5)
