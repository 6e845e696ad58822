"""Baselines in the one training loop: each loss equals its formula on tiny hand-computed examples, every method
trains through `train(...)` (LoRA changes, base weights do not), round-trips through PeftModel.from_pretrained,
and data lacking what a method needs fails before training. Tiny random models only: offline, seconds."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from topl_core.data.encode import IGNORE, EncodedPair, collate, collate_pairs, encode_record
from topl_core.data.records import Record, Span
from topl_core.data.split import split_records
from topl_core.foundations.errors import ConfigError, DataError
from topl_core.models.forward import head_features, next_token_logprobs
from topl_core.models.loading import load_model
from topl_core.models.tiny import build_tiny_model
from topl_core.training import run_inputs
from topl_core.training.batching import EncodeSettings, encode_pairs, faithful_records, make_pair_batches
from topl_core.training.config import LoraSettings, TrainConfig, preset_config
from topl_core.training.lora import apply_lora
from topl_core.training.methods import METHODS
from topl_core.training.methods.dpo import dpo_loss, dpo_loss_step
from topl_core.training.methods.sft import nll_loss, sft_loss_step
from topl_core.training.methods.sopl import pooled_response_logits, sequence_bce_loss, sopl_loss_step
from topl_core.training.methods.tdpo import sequential_kl, tdpo_loss, tdpo_loss_step
from topl_core.training.methods.unlikelihood import (
    log1m_exp,
    log_one_minus_p,
    unlikelihood_loss,
    unlikelihood_loss_step,
)
from topl_core.training.steps import StepContext, pair_halves, target_logprobs
from topl_core.training.trainer import train

HEAD_METHODS = {"topl", "sopl", "tldr"}
ENC = EncodeSettings(max_doc_tokens=48, max_response_tokens=24)

# --- tiny data ------------------------------------------------------------------------------------------------

_DOCS = [
    (
        "The council approved the new budget on Monday after a long debate.",
        "The council approved the budget on Monday.",
        "Monday",
        "Friday",
    ),
    (
        "Police arrested two men in London and released a third without charge.",
        "Police arrested two men in London.",
        "London",
        "March",
    ),
    (
        "The company said profits increased by 12 percent in 2023.",
        "Profits increased by 12 percent in 2023.",
        "increased",
        "fell",
    ),
    (
        "She won the election with 54 percent of the vote, the commission said.",
        "She won the election with 54 percent.",
        "won",
        "lost",
    ),
    (
        "The match ended 3-1 and the manager praised his team.",
        "The match ended 3-1, the manager said.",
        "praised",
        "said",
    ),
]


def _records(n_docs: int = 20) -> list[Record]:
    """Per document: a faithful record and a perturbed one (one swapped word, its span bad, paired)."""
    out = []
    for i in range(n_docs):
        doc, summary, old, new = _DOCS[i % len(_DOCS)]
        doc_id = f"d{i}"
        if old not in summary:
            summary = f"{summary} {old}."
        k = summary.index(old)
        perturbed = summary[:k] + new + summary[k + len(old) :]
        out.append(Record(id=f"{doc_id}:f", document=f"{doc} ({i})", response=summary, doc_id=doc_id, source="t"))
        out.append(
            Record(
                id=f"{doc_id}:p",
                document=f"{doc} ({i})",
                response=perturbed,
                bad_spans=(Span(k, k + len(new), "entity"),),
                sequence_label=0,
                faithful_response=summary,
                doc_id=doc_id,
                source="t",
            )
        )
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and on a busy 2-core machine extra threads make steps many times
    slower (docs/models.md, "The probe")."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def records() -> list[Record]:
    recs = _records()
    splits = split_records(recs, seed=0)
    assert splits["train"] and splits["val"], "the tiny data needs train and val documents"
    return recs


def _peft(model, layers=(0, 3)):
    cfg = TrainConfig(model="tiny-llama", lora=LoraSettings(layer_start=layers[0], layer_end=layers[1]))
    return apply_lora(model, cfg)


def _randomize_lora(model, scale=0.3, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


# --- pure losses by hand --------------------------------------------------------------------------------------


def test_sopl_pooling_and_bce_by_hand():
    logits = torch.tensor([[1.0, 2.0, 3.0, 9.0], [-1.0, -3.0, 5.0, 5.0]])
    mask = torch.tensor([[False, True, True, False], [True, True, False, False]])
    pooled = pooled_response_logits(logits, mask)
    assert pooled.tolist() == [2.5, -2.0]
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want = -(math.log(sig(2.5)) + math.log(1 - sig(-2.0))) / 2  # labels: faithful 1, perturbed 0
    got = sequence_bce_loss(logits, mask, torch.tensor([1, 0]))
    assert got.item() == pytest.approx(want, rel=1e-6)


def test_nll_and_unlikelihood_by_hand():
    p = torch.tensor([0.5, 0.2, 0.9, 0.6])
    lp = p.log()
    assert nll_loss(lp).item() == pytest.approx(-sum(math.log(x) for x in p.tolist()) / 4, rel=1e-6)
    labels = torch.tensor([1, 0, IGNORE, 0])
    want = (-math.log(0.5) - math.log(1 - 0.2) - math.log(1 - 0.6)) / 3
    assert unlikelihood_loss(lp, labels).item() == pytest.approx(want, rel=1e-5)
    assert unlikelihood_loss(lp, torch.full((4,), IGNORE)).item() == 0.0


def test_log_one_minus_p_is_exact_and_keeps_a_gradient_near_one():
    vocab = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]]).log()
    got = log_one_minus_p(vocab, torch.tensor([0, 2]))
    assert torch.allclose(got, torch.tensor([0.3, 0.7]).log(), atol=1e-6)
    assert torch.allclose(log1m_exp(torch.tensor([0.7, 0.3]).log()), torch.tensor([0.3, 0.7]).log(), atol=1e-6)
    # p(target) = 1 - 1e-12 rounds to 1 in float32: the exact form still gives a finite loss and a gradient.
    logits = torch.tensor([[30.0, 2.0, 0.0]], requires_grad=True)
    out = log_one_minus_p(torch.log_softmax(logits, -1), torch.tensor([0]))
    out.sum().backward()
    assert torch.isfinite(out).all() and logits.grad.abs().sum() > 0
    assert out.item() == pytest.approx(math.log(math.exp(2) + 1) - 30, abs=1e-4)


def test_dpo_loss_by_hand():
    beta = 0.5
    got = dpo_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]), torch.tensor([-1.5]), beta)
    margin = (-1.0 + 1.5) - (-2.0 + 1.5)  # = 1
    assert got.item() == pytest.approx(-math.log(1 / (1 + math.exp(-beta * margin))), rel=1e-6)
    zero = torch.zeros(3)
    assert dpo_loss(zero, zero, zero, zero, 0.1).item() == pytest.approx(math.log(2))


def test_sequential_kl_and_tdpo_by_hand():
    ref = torch.tensor([[0.5, 0.5], [0.9, 0.1]]).log()
    pol = torch.tensor([[0.25, 0.75], [0.9, 0.1]]).log()
    kl = sequential_kl(ref, pol)
    assert kl[0].item() == pytest.approx(0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75), rel=1e-5)
    assert kl[1].item() == pytest.approx(0.0, abs=1e-7)

    beta, alpha = 0.1, 0.5
    mw, ml, kw, kl_ = 2.0, -1.0, 0.3, 0.8
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    t1 = tdpo_loss(
        torch.tensor([mw]), torch.tensor([ml]), torch.tensor([kw]), torch.tensor([kl_]), beta, variant="tdpo1"
    )
    assert t1.item() == pytest.approx(-math.log(sig(beta * ((mw - ml) - (kl_ - kw)))), rel=1e-6)
    chosen_kl = torch.tensor([kw], requires_grad=True)
    rejected_kl = torch.tensor([kl_], requires_grad=True)
    t2 = tdpo_loss(torch.tensor([mw]), torch.tensor([ml]), chosen_kl, rejected_kl, beta, alpha, "tdpo2")
    assert t2.item() == pytest.approx(-math.log(sig(beta * ((mw - ml) - alpha * (kl_ - kw)))), rel=1e-6)
    t2.backward()
    assert chosen_kl.grad is None or chosen_kl.grad.abs().sum() == 0  # TDPO2: stop-gradient on the chosen KL
    assert rejected_kl.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="tdpo1"):
        tdpo_loss(chosen_kl, chosen_kl, chosen_kl, chosen_kl, beta, variant="tdpo3")


# --- step functions on a tiny model ----------------------------------------------------------------------------


def _lm_batch(tok, records):
    return collate(
        [encode_record(tok, r, ENC.max_doc_tokens, ENC.max_response_tokens) for r in records], tok.pad_token_id
    )


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen3", "tiny-gemma3"])
def test_target_logprobs_match_the_full_forward(family, records):
    model, tok = build_tiny_model(family)
    if family == "tiny-gemma3":  # exercise the soft-capping path too
        model.config.final_logit_softcapping = 5.0
    peft = _peft(model)
    _randomize_lora(peft)
    peft.eval()
    batch = _lm_batch(tok, records[:5])
    assert bool((batch.lm_mask & ~batch.attention_mask.bool()).sum() == 0)
    # lm_mask = response tokens + the one end-of-turn token after each response
    assert (batch.lm_mask.sum(1) == batch.response_mask.sum(1) + 1).all()
    with torch.no_grad():
        lp = target_logprobs(peft, batch)
        full = next_token_logprobs(peft, batch.input_ids, batch.attention_mask)
    assert torch.allclose(lp.token_logp, full[batch.lm_mask], atol=1e-5)
    assert (lp.targets == batch.input_ids[batch.lm_mask]).all()


def test_sft_step_equals_transformers_causal_lm_loss(records):
    model, tok = build_tiny_model("tiny-llama")
    peft = _peft(model)
    _randomize_lora(peft)
    peft.eval()
    batch = _lm_batch(tok, faithful_records(records)[:4])
    labels = torch.where(batch.lm_mask, batch.input_ids, torch.full_like(batch.input_ids, -100))
    with torch.no_grad():
        ours, info = sft_loss_step(StepContext(peft, None, None, 0.1), batch)
        hf = peft(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
    assert ours.item() == pytest.approx(hf.item(), rel=1e-5)
    assert info["supervised_tokens"] == int(batch.lm_mask.sum())


class _HostWaits(TorchDispatchMode):
    """Counts the operations that, on a GPU, make the host wait for the device: reading a value back (item, bool)
    and those whose output shape depends on the data (nonzero, masked_select, indexing by a mask)."""

    WAITING = {torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default,
               torch.ops.aten._local_scalar_dense.default}  # fmt: skip

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        by_mask = func is torch.ops.aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1])
        self.count += func in self.WAITING or by_mask
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_step_waits_for_the_device_no_more_than_its_model_forwards(records, name):
    """No method's step (loss and backward) makes a GPU's host wait beyond its model forwards (two for the preference
    methods: the policy and the reference): the counts a loss averages over come from where the batch was built or
    stay on the device with the rest of its info, which the trainer reads back once per optimizer step."""
    method = METHODS[name]
    model, tok = build_tiny_model("tiny-llama")
    peft = _peft(model)
    batch = method.batches(method.prepare(tok, records, ENC), 4, tok.pad_token_id)[0]
    head = torch.nn.Linear(model.config.hidden_size, 1) if method.uses_head else None
    ctx = StepContext(peft, head, 2 if method.uses_head else None, 0.1)
    with _HostWaits() as step:
        loss, info = method.loss(ctx, batch)
        (loss * info[method.units_key]).backward()
    with _HostWaits() as forward:
        peft(**batch.forward_inputs()).logits.sum().backward()
    assert step.count == forward.count * (2 if method.pairs else 1), (step.count, forward.count)
    # the LM targets' positions, found where the batch was built, travel with it
    assert (batch.lm_positions == batch.lm_mask.nonzero()).all() and batch.to("cpu").lm_positions is not None


def test_unlikelihood_step_by_hand(records):
    model, tok = build_tiny_model("tiny-llama")
    peft = _peft(model)
    _randomize_lora(peft)
    peft.eval()
    batch = _lm_batch(tok, records[:6])  # faithful and perturbed records
    with torch.no_grad():
        ours, info = unlikelihood_loss_step(StepContext(peft, None, None, 0.1), batch)
        lp = next_token_logprobs(peft, batch.input_ids, batch.attention_mask)
    terms = []
    for i in range(batch.input_ids.shape[0]):
        for t in batch.lm_mask[i].nonzero()[:, 0].tolist():
            label = int(batch.labels[i, t])
            if not batch.response_mask[i, t]:  # end of turn: good after a faithful response, else unsupervised
                label = 1 if int(batch.sequence_labels[i]) == 1 else IGNORE
            p = math.exp(lp[i, t].item())
            if label == 1:
                terms.append(-math.log(p))
            elif label == 0:
                terms.append(-math.log(1 - p))
    assert info["bad_tokens"] > 0 and info["good_tokens"] > 0
    assert ours.item() == pytest.approx(sum(terms) / len(terms), rel=1e-4)


def _pair_batch(tok, records, n=3):
    pairs = encode_pairs(tok, records, ENC)[:n]
    return make_pair_batches(pairs, n, tok.pad_token_id)[0]


def test_pair_batches_hold_chosen_then_rejected_for_the_same_prompt(records):
    _, tok = build_tiny_model("tiny-llama")
    pairs = encode_pairs(tok, records, ENC)
    assert len(pairs) == sum(r.sequence_label == 0 for r in records)
    p = pairs[0]
    assert (p.chosen.input_ids[: p.chosen.response_start] == p.rejected.input_ids[: p.rejected.response_start]).all()
    assert p.chosen.sequence_label == 1 and p.rejected.sequence_label == 0
    b = _pair_batch(tok, records)
    assert b.sequence_labels.tolist() == [1, 1, 1, 0, 0, 0] and pair_halves(b) == b.n_pairs == 3
    with pytest.raises(ValueError, match="chosen response must be labelled 1"):
        collate_pairs([EncodedPair(p.rejected, p.chosen)], tok.pad_token_id)
    with pytest.raises(ValueError, match="build it with collate_pairs"):
        pair_halves(collate([p.chosen, p.rejected], tok.pad_token_id))  # the right rows, but not built as pairs


@pytest.mark.parametrize("step", [dpo_loss_step, tdpo_loss_step], ids=["dpo", "tdpo"])
def test_preference_losses_at_initialisation_equal_log2(step, records):
    """With LoRA B = 0 the policy equals the reference (adapter disabled): margin 0, KL 0 → −log σ(0) = log 2."""
    model, tok = build_tiny_model("tiny-llama")
    peft = _peft(model)
    peft.train()  # dropout on: B = 0 still makes the policy equal the reference
    loss, info = step(StepContext(peft, None, None, 0.1), _pair_batch(tok, records))
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)
    assert info["reward_margin"] == 0.0


def test_dpo_and_tdpo_steps_by_hand_with_a_trained_adapter(records):
    model, tok = build_tiny_model("tiny-llama")
    peft = _peft(model)
    _randomize_lora(peft)
    peft.eval()
    batch = _pair_batch(tok, records)
    ctx = StepContext(peft, None, None, beta=0.5, tdpo_alpha=0.5)
    with torch.no_grad():
        dpo, _ = dpo_loss_step(ctx, batch)
        tdpo, info = tdpo_loss_step(ctx, batch)
        pol_logits = peft(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
        with peft.disable_adapter():
            ref_logits = peft(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    pol, ref = pol_logits.log_softmax(-1), ref_logits.log_softmax(-1)
    ratio, kl = [], []
    for i in range(batch.input_ids.shape[0]):
        t = batch.lm_mask[i].nonzero()[:, 0]
        ids = batch.input_ids[i, t]
        ratio.append((pol[i, t - 1].gather(-1, ids[:, None]) - ref[i, t - 1].gather(-1, ids[:, None])).sum().item())
        kl.append((ref[i, t - 1].exp() * (ref[i, t - 1] - pol[i, t - 1])).sum().item())
    B = len(ratio) // 2
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want_dpo = sum(-math.log(sig(0.5 * (ratio[j] - ratio[B + j]))) for j in range(B)) / B
    want_tdpo = sum(-math.log(sig(0.5 * ((ratio[j] - ratio[B + j]) - 0.5 * (kl[B + j] - kl[j])))) for j in range(B)) / B
    assert dpo.item() == pytest.approx(want_dpo, rel=1e-4)
    assert tdpo.item() == pytest.approx(want_tdpo, rel=1e-4)
    assert info["seq_kl_rejected"] > 0


def test_sopl_step_is_pooled_bce_of_the_head(records):
    model, tok = build_tiny_model("tiny-llama")
    peft = _peft(model, (0, 2))
    peft.eval()
    head = torch.nn.Linear(64, 1)
    torch.manual_seed(0)
    batch = _lm_batch(tok, records[:6])
    with torch.no_grad():
        loss, _ = sopl_loss_step(StepContext(peft, head, 2, 0.1), batch)
        logits = head(head_features(peft, batch.input_ids, batch.attention_mask, 2)).squeeze(-1)
    terms = []
    for i in range(6):
        pooled = logits[i, batch.response_mask[i]].mean()
        terms.append(F.binary_cross_entropy_with_logits(pooled, batch.sequence_labels[i].float()).item())
    assert loss.item() == pytest.approx(sum(terms) / 6, rel=1e-5)
    assert batch.sequence_labels.tolist() == [1, 0, 1, 0, 1, 0]


# --- through the one training loop -----------------------------------------------------------------------------


def _cfg(method: str, **kw) -> TrainConfig:
    end = 3 if method == "tldr" else 2  # TLDR: LoRA on all 4 layers of the tiny model
    return TrainConfig(
        method=method,
        model="tiny-llama",
        lora=kw.pop("lora", LoraSettings(layer_start=0, layer_end=end)),
        lr=1e-2,
        batch_size=4,
        steps=kw.pop("steps", 1),
        eval_every=1,
        checkpoint_every=50,
        precision="fp32",
        max_doc_tokens=ENC.max_doc_tokens,
        max_response_tokens=ENC.max_response_tokens,
        **kw,
    )


def _base_name(name: str) -> str:
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


@pytest.mark.parametrize("method", METHODS)
def test_training_changes_lora_only_and_the_adapter_round_trips(method, records, tmp_path):
    from peft import PeftModel

    base = load_model("tiny-llama")
    original = {k: v.clone() for k, v in base.model.state_dict().items()}
    # A head starts at zero (p = 1/2), so its first step moves only the head; the LoRA moves from the second.
    steps = 2 if method in HEAD_METHODS else 1
    run = train(_cfg(method, steps=steps), tmp_path / method, records=records, base=base)
    trained = base.model.eval()

    lora = {n: p for n, p in trained.named_parameters() if "lora_" in n}
    assert lora and any(bool(p.abs().sum() > 0) for n, p in lora.items() if "lora_B" in n), "LoRA B never moved"
    for name, p in trained.state_dict().items():
        if "lora_" not in name:
            assert torch.equal(p, original[_base_name(name)]), f"base weight {name} changed"

    files = {p.name for p in run.path.iterdir()}
    assert {
        "adapter_config.json",
        "adapter_model.safetensors",
        "topl_config.json",
        "metrics.jsonl",
        "status.json",
    } <= files
    assert ("head.safetensors" in files) == (method in HEAD_METHODS)
    assert "checkpoint" not in files and run.read_status()["state"] == "finished"
    cfg, meta = run.read_config()
    assert cfg.method == method and meta["validation_metric"] == METHODS[method].validation_metric
    last = run.read_metrics()[-1]
    assert last["step"] == steps and math.isfinite(last["loss"]) and meta["validation_metric"] in last

    fresh, _ = build_tiny_model("tiny-llama")
    x = torch.tensor([[5, 17, 42, 99, 3, 250, 7]])
    with torch.no_grad():
        untouched = fresh(x).logits
        loaded = PeftModel.from_pretrained(fresh, run.path).eval()
        want, got = trained(x).logits, loaded(x).logits
    assert torch.allclose(want, got, atol=1e-6)
    assert not torch.allclose(want, untouched, atol=1e-7), "the adapter should change the model"
    if method in HEAD_METHODS:
        assert run.load_head().weight.shape == (1, 64)


@pytest.mark.parametrize("method", METHODS)
def test_micro_batches_give_the_whole_batch_step(method, records, tmp_path):
    """Splitting each batch of 4 into micro-batches of 1 changes memory, not the step: the same loss and gradient
    norm at both steps (fp32, no LoRA dropout, whose masks depend on the split); step 2 starts from step 1's update.
    Micro-batches hold different numbers of supervised tokens, so an unweighted mean of their losses fails this."""
    end = 3 if method == "tldr" else 2
    runs = [
        train(
            _cfg(method, steps=2, micro_batch_size=micro, lora=LoraSettings(layer_start=0, layer_end=end, dropout=0.0)),
            tmp_path / f"micro{micro}",
            records=records,
        )
        for micro in (4, 1)
    ]
    whole, split = (r.read_metrics() for r in runs)
    for w, s in zip(whole, split, strict=True):
        assert s["loss"] == pytest.approx(w["loss"], rel=1e-5)
        assert s["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-4)


def test_tldr_head_on_last_layer_and_warns_without_all_layers(records, tmp_path):
    base = load_model("tiny-llama")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = train(
            _cfg("tldr", lora=LoraSettings(layer_start=0, layer_end=1)), tmp_path / "t", records=records, base=base
        )
    assert any("all layers" in str(w.message) for w in caught)
    meta = json.loads(run.config_path.read_text())["meta"]
    assert meta["head_layer"] == 3 and meta["lora_all_layers"] is False
    assert METHODS["topl"].head_layer(2, 4) == 2 and METHODS["sopl"].head_layer(2, 4) == 2


# --- data checks before training ---------------------------------------------------------------------------------


def _sequence_only(records):
    """HaluEval-style data: faithful records and hallucinated rewrites with only a sequence label."""
    import dataclasses

    return [
        dataclasses.replace(r, bad_spans=(), token_labels_known=False) if r.sequence_label == 0 else r for r in records
    ]


def _unpaired(records):
    import dataclasses

    return [dataclasses.replace(r, faithful_response=None) for r in records]


@pytest.mark.parametrize(
    "method, make, message",
    [
        ("dpo", _unpaired, "needs (faithful, unfaithful) pairs"),
        ("tdpo", _unpaired, "needs (faithful, unfaithful) pairs"),
        ("topl", lambda rs: [r for r in _sequence_only(rs) if r.sequence_label == 0], "needs token-level labels"),
        ("tldr", lambda rs: [r for r in _sequence_only(rs) if r.sequence_label == 0], "needs token-level labels"),
        (
            "unlikelihood",
            lambda rs: [r for r in _sequence_only(rs) if r.sequence_label == 0],
            "needs token-level labels",
        ),
        ("sopl", lambda rs: [r for r in rs if r.sequence_label == 1], "needs both faithful"),
        ("sft", lambda rs: [r for r in _unpaired(rs) if r.sequence_label == 0], "trains on faithful responses"),
    ],
)
def test_data_lacking_what_a_method_needs_fails_before_the_model_loads(
    method, make, message, records, tmp_path, monkeypatch
):
    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the data check")

    monkeypatch.setattr(run_inputs, "load_model", no_model)  # where a run loads its base model
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        train(_cfg(method), tmp_path / "run", records=make(records))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_sequence_only_pairs_still_train_sequence_methods(records, tmp_path):
    """HaluEval-style pairs (no token labels) are enough for DPO, TDPO, SOPL and SFT."""
    data = _sequence_only(records)
    for m in ("dpo", "tdpo", "sopl", "sft"):
        METHODS[m].check_data(data)
    run = train(_cfg("sopl"), tmp_path / "sopl", records=data, base=load_model("tiny-llama"))
    last = run.read_metrics()[-1]
    # only the faithful records have (all-good) token labels: no token AUROC to report, no crash
    assert math.isfinite(last["val_seq_auroc"]) and not math.isfinite(last.get("val_token_auroc", float("nan")))
    import dataclasses

    no_tokens = [dataclasses.replace(r, bad_spans=(), token_labels_known=False) for r in records]
    run = train(_cfg("sopl"), tmp_path / "sopl2", records=no_tokens, base=load_model("tiny-llama"))
    last = run.read_metrics()[-1]
    assert math.isfinite(last["val_seq_auroc"]) and "val_token_auroc" not in last
    _, tok = build_tiny_model("tiny-llama")
    assert len(encode_pairs(tok, data, ENC)) == len(data) // 2
    # SFT uses each faithful text once per document, also when it only appears as a faithful_response
    only_pairs = [r for r in records if r.sequence_label == 0]
    assert sorted(r.response for r in faithful_records(only_pairs)) == sorted(r.faithful_response for r in only_pairs)
    assert len(faithful_records(records)) == len(records) // 2


# --- configuration --------------------------------------------------------------------------------------------


def test_presets_match_the_papers_tables():
    """The paper's appendix tables, written out: any drift in a preset fails here."""
    paper = {  # docs/design.md §2: (lr per family qwen3-8b, llama3.1-8b, gemma3-4b), batch, grad_accum
        "topl": ((5e-5, 1e-4, 1e-4), 16, 1),
        "sft": ((1e-4, 1e-4, 5e-5), 4, 4),
        "dpo": ((1e-5, 2e-5, 5e-6), 1, 8),
        "sopl": ((1e-4, 1e-4, 1e-4), 8, 1),
        "tldr": ((1e-4, 1e-4, 1e-4), 16, 1),
        "unlikelihood": ((1e-4, 1e-4, 1e-4), 4, 2),
        "tdpo": ((5e-6, 5e-6, 5e-6), 4, 4),
    }
    families = ("qwen3-8b", "llama3.1-8b", "gemma3-4b")
    for method, (lrs, bs, ga) in paper.items():
        for fam, lr in zip(families, lrs):
            c = preset_config(fam, method)
            assert (c.lr, c.batch_size, c.grad_accum, c.lora.r, c.lora.alpha, c.lora.dropout) == (
                lr,
                bs,
                ga,
                4,
                8.0,
                0.1,
            )
            assert c.head_lr_multiplier == 1.0  # the paper's one lr, not the CPU default's faster head
            # LoRA layers: TOPL 0–29 / 0–27 / 0–27; every baseline (TLDR's head on the last) all 36 / 32 / 34 layers
            layers = dict(
                zip(families, [(0, 29), (0, 27), (0, 27)] if method == "topl" else [(0, 35), (0, 31), (0, 33)])
            )
            assert (c.lora.layer_start, c.lora.layer_end) == layers[fam], (fam, method)
    assert preset_config("qwen3-8b", "dpo", beta=0.2, lr=3e-6).beta == 0.2
    assert preset_config("qwen3-8b", "topl", head_lr_multiplier=5.0).head_lr_multiplier == 5.0


def test_config_rejects_label_settings_for_methods_without_token_labels():
    with pytest.raises(ConfigError, match="label_setting"):
        TrainConfig(method="dpo", label_setting="random")
    assert TrainConfig(method="unlikelihood", label_setting="random").label_setting == "random"
    with pytest.raises(ConfigError, match="beta"):
        TrainConfig(method="dpo", beta=0.0)
    with pytest.raises(ConfigError, match="tdpo_alpha"):
        TrainConfig(method="tdpo", tdpo_alpha=-1.0)


@pytest.mark.parametrize("method", ["dpo", "unlikelihood"])
def test_non_head_methods_resume_exactly(method, records, tmp_path):
    """The loop's checkpoint/resume works unchanged for pair batches and LM objectives (no head file)."""
    from safetensors.torch import load_file

    cfg = _cfg(method, steps=4)
    straight = train(cfg, tmp_path / "straight", records=records, base=load_model("tiny-llama"))
    run = train(
        cfg, tmp_path / "resumed", records=records, base=load_model("tiny-llama"), progress=lambda p: p.step != 2
    )
    assert run.read_status()["state"] == "cancelled" and not run.head_path.exists()
    seen = []
    train(cfg, run.path, records=records, base=load_model("tiny-llama"), progress=lambda p: seen.append(p.step))
    assert seen == [3, 4]
    a, b = load_file(straight.adapter_path), load_file(run.adapter_path)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
