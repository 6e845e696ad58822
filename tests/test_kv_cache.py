"""The decode loops' KV cache with room for the new tokens (inference/kv_cache.py): decoding from it is decoding from a
copy of transformers' own cache, logits bit for bit — one row or several, past its room, after taking tokens back,
beside sliding-window layers (Gemma 3's, copied as they are), in fp32 and under bf16 autocast — and the prompt's
cache it was made from is left as it was."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from topl_core.inference.kv_cache import RoomyLayer, with_room
from topl_core.models.loading import load_model

CASES = [(1, 8, None), (3, 8, None), (1, 2, None)]  # rows, room, the step after which two positions are cropped
PRECISIONS = ("fp32", "bf16")


@pytest.fixture(scope="module")
def prompts() -> dict:
    """A 12-token prompt's model and cache per family and precision (tiny Gemma 3: every layer a sliding window of
    16; bf16: autocast, as a GPU or an AMX CPU decodes)."""
    found = {}
    for family in ("tiny-llama", "tiny-gemma3"):
        lm = load_model(family)
        torch.manual_seed(0)
        ids = torch.randint(3, lm.model.config.vocab_size, (1, 12))
        for precision in PRECISIONS:
            with torch.no_grad(), autocast(precision):
                found[family, precision] = lm.model, lm.model(input_ids=ids, use_cache=True).past_key_values
    return found


def autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def _decode(model, cache, tokens: list[list[int]], crop_after: int | None, precision: str) -> list[torch.Tensor]:
    """The logits of decoding `tokens` (a step's ids per row) one step at a time; crop_after: after that step, take
    the last two positions back and run that step's tokens again (as the gated decoder does)."""
    found = []
    with torch.no_grad(), autocast(precision):
        for n, step in enumerate(tokens):
            ids = torch.tensor(step)[:, None]
            found.append(model(input_ids=ids, past_key_values=cache, use_cache=True).logits)
            if n == crop_after:
                cache.crop(-2)
                found.append(model(input_ids=torch.tensor(tokens[n - 1])[:, None], past_key_values=cache).logits)
    return found


# a sliding-window layer cannot be cropped once past its window (transformers'), so the crop is tried on Llama alone
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(
    ("family", "rows", "room", "crop_after"),
    [("tiny-llama", *case) for case in [*CASES, (1, 8, 3)]] + [("tiny-gemma3", *case) for case in CASES],
)
def test_decoding_with_room_is_decoding_a_copy(prompts, family, rows, room, crop_after, precision):
    model, cache = prompts[family, precision]
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    tokens = [[5 + r + 7 * n for r in range(rows)] for n in range(6)]
    plain = copy.deepcopy(cache)
    plain.batch_repeat_interleave(rows)
    roomy = with_room(cache, room, rows)
    assert [isinstance(layer, RoomyLayer) for layer in roomy.layers] == [
        type(layer) is DynamicLayer for layer in cache.layers
    ]  # the plain layers get room; sliding windows are copied as they are
    expected = _decode(model, plain, tokens, crop_after, precision)
    found = _decode(model, roomy, tokens, crop_after, precision)
    assert all(torch.equal(a, b) for a, b in zip(expected, found)) and len(found) == len(expected)
    assert roomy.get_seq_length() == plain.get_seq_length()
    assert all(
        torch.equal(k, layer.keys) and torch.equal(v, layer.values) for (k, v), layer in zip(before, cache.layers)
    )
