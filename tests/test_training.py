"""The TOPL objective and the training loop: head features, loss, parameter updates, resume, run directories,
adapter round trip, merge, and clear errors before training."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config

from topl_core.data.encode import collate, encode_record
from topl_core.data.records import Record, write_jsonl
from topl_core.foundations.errors import ConfigError, DataError, ModelError, RunError
from topl_core.foundations.status import request_stop, stop_requested
from topl_core.models.architecture import compile_layers, decoder_layers
from topl_core.models.forward import head_features
from topl_core.models.loading import load_model
from topl_core.training.adapters import load_adapter
from topl_core.training.config import LoraSettings
from topl_core.training.lora import FastDropout, apply_lora
from topl_core.training.methods.topl import token_bce_loss
from topl_core.training.run_dirs import RunDir
from topl_core.training.trainer import train


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen3", "tiny-gemma3"])
@pytest.mark.parametrize("layer", [0, 2, 3])
def test_head_features_equal_final_norm_of_hidden_states(family, layer):
    lm = load_model(family)
    ids = torch.tensor([[3, 17, 42, 99, 7, 250, 31]])
    mask = torch.ones_like(ids)
    full = lm.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    hooks_before = sum(len(m._forward_hooks) for m in lm.model.modules())  # transformers keeps its own capture hooks
    # hidden_states[i + 1] is layer i's output, except the last entry, which already has the final norm applied
    raw = full.hidden_states[layer + 1]
    expected = raw if layer == lm.num_layers - 1 else lm.model.model.norm(raw)
    assert torch.allclose(head_features(lm.model, ids, mask, layer), expected, atol=1e-5)
    assert sum(len(m._forward_hooks) for m in lm.model.modules()) == hooks_before


def test_token_bce_loss_matches_formula_and_ignores_unlabelled():
    logits = torch.tensor([[2.0, -1.0, 0.5, 9.0]])
    labels = torch.tensor([[1, 0, 1, -1]])
    p = torch.sigmoid(logits[0, :3])
    manual = -(torch.log(p[0]) + torch.log(1 - p[1]) + torch.log(p[2])) / 3
    x = logits.clone().requires_grad_()
    value = token_bce_loss(x, labels)
    value.backward()
    assert torch.allclose(value, manual)
    # the gradient of the mean over the three labelled tokens, none for the unlabelled one
    expected = torch.cat([torch.sigmoid(logits[0, :3]) - torch.tensor([1.0, 0.0, 1.0]), torch.zeros(1)]) / 3
    assert torch.allclose(x.grad[0], expected) and x.grad[0, 3] == 0
    assert token_bce_loss(logits, torch.full_like(labels, -1)).item() == 0.0


def test_training_updates_lora_and_head_only(tmp_path, tiny_records):
    base = load_model("tiny-llama")
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    run = train(tiny_config(steps=3), tmp_path / "r", records=tiny_records, base=base)
    after = base.model.state_dict()  # LoRA was injected into base.model in place
    lora_b = [v for k, v in after.items() if "lora_B" in k]
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b)  # B starts at zero; training moved it
    for k, v in before.items():
        key = k.replace(".weight", ".base_layer.weight") if k.replace(".weight", ".base_layer.weight") in after else k
        assert torch.equal(v, after[key]), f"base weight {k} changed"
    head = run.load_head()
    assert head.weight.abs().sum() > 0  # the head started at zero


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_fast_dropout_is_inverted_dropout(p):
    torch.manual_seed(0)
    drop = FastDropout(p).train()
    x = torch.rand(400, 500) + 0.5
    y = drop(x)
    kept = y != 0
    n = kept.numel()
    assert abs((1 - kept.float().mean().item()) - p) < 5 * (p * (1 - p) / n) ** 0.5  # drop rate p, 5 sigma
    assert torch.allclose(y[kept], x[kept] / (1 - p))  # kept entries scaled to keep the expectation
    rows = kept.float().mean(1)
    assert rows.std() > 0  # not one mask pattern repeated: entries vary
    assert not torch.equal(drop(x) != 0, kept)  # a fresh mask per call
    assert torch.equal(drop.eval()(x), x)
    assert torch.equal(FastDropout(0.0).train()(x), x)


def test_masks_drawn_together_are_those_drawn_one_by_one():
    """keep_masks cuts each mask from its own whole random words, in order: on the CPU's generator the masks of a
    layer drawn in one go are those its modules drew one after another (a run trains as it did when each drew its
    own), each at the rate 1 − p."""
    from topl_core.training.lora import keep_mask, keep_masks

    shapes = [torch.Size([2, 5, 64])] * 3 + [torch.Size([2, 5, 7]), torch.Size([1]), torch.Size([3, 172])]
    torch.manual_seed(0)
    alone = [keep_mask(s, 0.1) for s in shapes]
    torch.manual_seed(0)
    together = keep_masks(shapes, 0.1)
    assert all(a.shape == s and torch.equal(a, b) for a, b, s in zip(alone, together, shapes))
    assert not torch.equal(together[0], together[1])
    kept = torch.cat([m.reshape(-1) for m in together]).float().mean().item()
    assert abs(kept - 0.9) < 0.05


def test_lora_dropouts_are_fast_and_parameter_free():
    from peft import get_peft_model_state_dict

    model = apply_lora(load_model("tiny-llama").model, tiny_config())
    drops = [m for m in model.modules() if isinstance(m, FastDropout)]
    assert len(drops) == 3 * 7 and all(d.p == tiny_config().lora.dropout for d in drops)  # layers 0–2 × 7 modules
    assert not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    assert all("dropout" not in k for k in get_peft_model_state_dict(model))


def test_run_directory_layout_and_metrics(tiny_run):
    names = {p.name for p in tiny_run.path.iterdir()}
    assert {
        "adapter_config.json",
        "adapter_model.safetensors",
        "head.safetensors",
        "topl_config.json",
        "metrics.jsonl",
        "status.json",
    } <= names
    assert "checkpoint" not in names  # a finished run keeps only its final state
    cfg, meta = tiny_run.read_config()
    assert cfg.method == "topl" and meta["head_layer"] == 2 and meta["num_layers"] == 4
    rows = tiny_run.read_metrics()
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert "val_token_auroc" in rows[-1] and 0 <= rows[-1]["val_token_auroc"] <= 1
    assert tiny_run.read_status()["state"] == "finished"


def test_saving_a_run_never_asks_a_hub(tmp_path, tiny_records):
    """PEFT's save asks a hub by default whether the base model's embeddings were resized: a warning at every
    checkpoint and at the end, and on a network that drops packets a time-out each time. The workbench's LoRA never
    trains the embeddings, so no save asks. The hub here takes connections and never answers (a request would hang):
    a run trained in a fresh process (the hub endpoint is read at import) with a checkpoint at every step finishes
    without one connection to it and prints nothing about fetching."""
    data = write_jsonl(tiny_records, tmp_path / "d.jsonl")
    with socket.create_server(("127.0.0.1", 0)) as hub:
        env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{hub.getsockname()[1]}"}
        argv = ["train", "--model", "tiny-llama", "--data", str(data), "--out", str(tmp_path / "run"), "--steps", "2"]
        argv += ["--lora-layer-end", "2", "--checkpoint-every", "1", "--eval-every", "2", "--precision", "fp32"]
        repo = Path(__file__).resolve().parents[1]
        done = subprocess.run(
            [sys.executable, "-m", "topl_core", *argv], cwd=repo, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0 and "finished" in done.stdout, done.stderr
        assert "fetch" not in done.stderr and "config file" not in done.stderr, done.stderr
        hub.setblocking(False)
        with pytest.raises(BlockingIOError):
            hub.accept()  # nothing connected


def test_adapter_round_trips_through_plain_peft(tiny_run, tiny_records):
    from peft import PeftModel

    trained = load_model("tiny-llama")
    via_workbench = load_adapter(trained, tiny_run)
    plain = PeftModel.from_pretrained(load_model("tiny-llama").model, str(tiny_run.path)).eval()
    b = collate([encode_record(trained.tokenizer, r) for r in tiny_records[:2]], trained.tokenizer.pad_token_id)
    with torch.no_grad():
        a = via_workbench(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        c = plain(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        base = load_model("tiny-llama").model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
    assert torch.equal(a, c)
    assert not torch.allclose(a, base)  # the adapter does something


@pytest.mark.parametrize("dtype, tol", [("fp32", 1e-4), ("bf16", 0.25)])
def test_merged_and_unmerged_logits_agree(tiny_run, tiny_records, dtype, tol):
    from topl_core.models.loading import ModelSpec

    spec = ModelSpec("tiny-llama", dtype=dtype)
    unmerged = load_adapter(load_model(spec), tiny_run)
    merged = load_adapter(load_model(spec), tiny_run, merge=True)
    assert not any("lora" in n for n, _ in merged.named_modules())
    tok = load_model(spec).tokenizer
    b = collate([encode_record(tok, r) for r in tiny_records[:4]], tok.pad_token_id)
    with torch.no_grad():
        x = unmerged(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
        y = merged(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
    assert (x - y).abs().max().item() < tol


def _weights(run: RunDir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {**load_file(run.adapter_path), **{f"head.{k}": v for k, v in load_file(run.head_path).items()}}


@pytest.mark.parametrize("interrupt", ["cancel", "stop_request", "exception"])
def test_resume_after_interruption_continues_the_same_run(tmp_path, tiny_records, interrupt):
    """Stopped at step 3 — by the progress callback, by a STOP request in the run directory (status protocol: how
    the app and `jobs.cancel` stop a run, also one started from the command line), or by an exception — the run
    keeps a checkpoint of step 3, and training the same directory again continues at step 4 to the same weights."""
    cfg = tiny_config(steps=6, checkpoint_every=4)
    straight = train(cfg, tmp_path / "straight", records=tiny_records)

    def stop_at_3(p):
        if p.step == 3:
            if interrupt == "cancel":
                return False
            if interrupt == "stop_request":
                return request_stop(tmp_path / "resumed")
            raise KeyboardInterrupt

    if interrupt != "exception":
        run = train(cfg, tmp_path / "resumed", records=tiny_records, progress=stop_at_3)
    else:
        with pytest.raises(KeyboardInterrupt):
            train(cfg, tmp_path / "resumed", records=tiny_records, progress=stop_at_3)
        run = RunDir(tmp_path / "resumed")
    status = run.read_status()
    assert status["state"] == "cancelled" and status["step"] == 3
    assert json.loads((run.checkpoint_dir / "state.json").read_text())["step"] == 3  # nothing lost
    seen = []
    train(cfg, run.path, records=tiny_records, progress=lambda p: seen.append(p.step))
    assert seen == [4, 5, 6] and not stop_requested(run.path)  # a new start clears an old stop request
    assert [r["step"] for r in run.read_metrics()] == list(range(1, 7))
    times = run.step_times()  # per-step clocks, whole across the restart
    assert len(times) == 6 and all(s > 0 and tok > 0 for s, tok in times)
    assert sum(tok for _, tok in times) == sum(tok for _, tok in straight.step_times())  # same batches
    a, b = _weights(straight), _weights(run)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def test_finished_run_is_not_retrained(tiny_run, tiny_records):
    cfg, _ = tiny_run.read_config()
    before = tiny_run.adapter_path.stat().st_mtime_ns
    train(cfg, tiny_run.path, records=tiny_records)
    assert tiny_run.adapter_path.stat().st_mtime_ns == before


def test_different_config_in_same_directory_is_refused(tiny_run, tiny_records):
    with pytest.raises(RunError, match="different config"):
        train(tiny_config(steps=7), tiny_run.path, records=tiny_records)


def test_layer_range_outside_model_fails_before_training(tmp_path, tiny_records):
    from topl_core.training.config import LoraSettings

    with pytest.raises(ModelError, match="outside the model"):
        train(tiny_config(lora=LoraSettings(layer_start=0, layer_end=4)), tmp_path / "r", records=tiny_records)
    assert not (tmp_path / "r").exists()


def test_sequence_only_data_fails_before_training(tmp_path):
    recs = [
        Record(id=f"r{i}", document="A document.", response="A summary.", token_labels_known=False, doc_id=f"d{i}")
        for i in range(30)
    ]
    with pytest.raises(DataError, match="token-level labels"):
        train(tiny_config(), tmp_path / "r", records=recs)


def test_adapter_for_another_base_model_is_refused(tiny_run):
    with pytest.raises(ModelError, match="tiny-llama") as e:
        load_adapter(load_model("tiny-qwen3"), tiny_run)
    assert "tiny-qwen3" in str(e.value)


def test_changed_weights_and_a_missing_base_fingerprint_are_caught(tiny_run, tmp_path):
    """A finished run records sha256 of its adapter and head; a flipped byte (the file still parses) is refused
    at load, naming the file. A run without a base fingerprint loads only onto the model it names."""
    import json
    import shutil

    assert set(tiny_run.read_config()[1]["checksums"]) == {"adapter_model.safetensors", "head.safetensors"}
    for name in ("adapter_model.safetensors", "head.safetensors"):
        run = RunDir(tmp_path / name)
        shutil.copytree(tiny_run.path, run.path)
        data = bytearray((run.path / name).read_bytes())
        data[-3] ^= 0x01  # inside the last tensor's bytes: still a valid safetensors file
        (run.path / name).write_bytes(bytes(data))
        with pytest.raises(RunError, match=f"{name}: its content does not match the checksum"):
            load_adapter(load_model("tiny-llama"), run)
    blind = RunDir(tmp_path / "blind")
    shutil.copytree(tiny_run.path, blind.path)
    config = json.loads(blind.config_path.read_text())
    del config["meta"]["base_fingerprint"]
    blind.config_path.write_text(json.dumps(config))
    load_adapter(load_model("tiny-llama"), blind)  # the model it names: loads
    with pytest.raises(ModelError, match="records no base-model fingerprint"):
        load_adapter(load_model("tiny-qwen3"), blind)


def test_corrupt_or_missing_files_give_clear_errors(tiny_run, tmp_path):
    import shutil

    broken = RunDir(tmp_path / "broken")
    shutil.copytree(tiny_run.path, broken.path)
    broken.head_path.write_bytes(b"not a safetensors file")
    with pytest.raises(RunError, match="corrupt"):
        broken.load_head()
    broken.adapter_path.unlink()
    with pytest.raises(RunError, match="no finished adapter"):
        load_adapter(load_model("tiny-llama"), broken)
    (broken.path / "topl_config.json").write_text("{oops")
    with pytest.raises(RunError, match="corrupt"):
        broken.read_config()
    with pytest.raises(RunError, match="not a run directory"):
        RunDir(tmp_path / "empty").read_config()


def test_gradient_checkpointing_trains_the_same_weights(tmp_path, tiny_records):
    """Recomputing activations in backward changes memory, not the gradients: the same losses and LoRA/head after
    a few steps (float rounding apart)."""
    plain = train(tiny_config(steps=3), tmp_path / "plain", records=tiny_records)
    ckpt = train(tiny_config(steps=3, gradient_checkpointing=True), tmp_path / "ckpt", records=tiny_records)
    assert [r["loss"] for r in ckpt.read_metrics()] == pytest.approx([r["loss"] for r in plain.read_metrics()])
    a, b = _weights(plain), _weights(ckpt)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    # ... and it is on: a decoder layer's MLP starts twice per micro-batch, in forward and again in backward (counted
    # by a pre-hook: the layer's own hooks stay outside the checkpoint, and the recompute stops at the last tensor
    # backward needs, before the MLP's forward hook would fire)
    from topl_core.models.architecture import decoder_layers
    from topl_core.training.methods import METHODS
    from topl_core.training.run_inputs import prepare_inputs
    from topl_core.training.trainer import _train_step, _trainable

    for checkpointing, runs_per_micro_batch in ((False, 1), (True, 2)):
        cfg = tiny_config(steps=1, gradient_checkpointing=checkpointing)
        base, batches = prepare_inputs(cfg, METHODS["topl"], tiny_records, None)
        t = _trainable(cfg, METHODS["topl"], base, 2)
        calls = []
        decoder_layers(t.model)[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
        _train_step(cfg, METHODS["topl"], t, batches.train, 1)
        micro_batches = len(batches.train[0])  # (the first step's batch: an order permutation of equal sizes)
        assert len(calls) == runs_per_micro_batch * micro_batches


def test_a_changed_checkpoint_is_refused_not_resumed(tmp_path, tiny_records):
    """A byte flipped inside a checkpoint file still parses; its checksum in state.json catches it before resuming,
    and nothing of the run is touched."""
    cfg = tiny_config(steps=6, checkpoint_every=4)
    run = train(cfg, tmp_path / "r", records=tiny_records, progress=lambda p: p.step != 3)  # cancelled at step 3
    ck = run.checkpoint_dir / "adapter.safetensors"
    data = bytearray(ck.read_bytes())
    data[-1] ^= 1  # the last byte of tensor data: the file still loads
    ck.write_bytes(bytes(data))
    metrics = run.metrics_path.read_text()
    with pytest.raises(RunError, match="adapter.safetensors: changed since the checkpoint was written"):
        train(cfg, run.path, records=tiny_records)
    assert run.read_status()["step"] == 3 and run.metrics_path.read_text() == metrics


@pytest.mark.parametrize("multiplier", [1.0, 30.0])
def test_the_head_learns_at_lr_times_its_multiplier(tmp_path, tiny_records, multiplier):
    """Adam's first step moves every parameter with a clear gradient by ≈ its learning rate; the zero-initialised
    head starts at 0, so after one step its largest weight is ≈ lr × head_lr_multiplier."""
    lr = 1e-3
    run = train(tiny_config(steps=1, lr=lr, head_lr_multiplier=multiplier), tmp_path / "r", records=tiny_records)
    step = run.load_head().weight.abs().max().item()
    assert step == pytest.approx(lr * multiplier, rel=0.05)


def test_side_probes_learn_beside_the_run_without_changing_it_and_resume(tmp_path, tiny_records):
    """Probes at layers 0 and 1 below the head (layer 2) learn in the same forward — their losses fall, validation
    reports each one's AUROC, probes.safetensors is written — while the run's losses, LoRA and head are those of
    the same config without probes; stopped at step 3 and resumed, the probes equal the uninterrupted ones."""
    from safetensors.torch import load_file

    plain = train(tiny_config(steps=6, lr=0.002, eval_every=3), tmp_path / "plain", records=tiny_records)
    cfg = tiny_config(steps=6, lr=0.002, eval_every=3, probe_layers=(1, 0))
    assert cfg.probe_layers == (0, 1)
    probed = train(cfg, tmp_path / "probed", records=tiny_records)
    rows = probed.read_metrics()
    assert [r["loss"] for r in rows] == [r["loss"] for r in plain.read_metrics()]
    a, b = _weights(plain), _weights(probed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    val = [r for r in rows if "val_token_auroc" in r]
    assert len(val) == 2 and all(0 <= r[f"val_token_auroc_L{k}"] <= 1 for r in val for k in (0, 1))
    assert all(rows[-1][f"probe_loss_L{k}"] < rows[0][f"probe_loss_L{k}"] for k in (0, 1))  # they learn
    probes = load_file(probed.path / "probes.safetensors")
    assert set(probes) == {"0.weight", "0.bias", "1.weight", "1.bias"} and probes["0.weight"].abs().sum() > 0

    resumed = train(cfg, tmp_path / "resumed", records=tiny_records, progress=lambda p: p.step != 3)
    assert resumed.read_status()["step"] == 3
    train(cfg, resumed.path, records=tiny_records)
    again = load_file(resumed.path / "probes.safetensors")
    assert all(torch.allclose(again[k], probes[k], atol=1e-6) for k in probes)


def test_side_probes_are_checked_against_the_method_and_the_head_layer():
    from topl_core.foundations.errors import ConfigError

    with pytest.raises(ConfigError, match="probe_layers"):
        tiny_config(method="sft", probe_layers=(0,))  # no token head to learn beside
    with pytest.raises(ConfigError, match="below the head layer"):
        tiny_config(probe_layers=(2,))  # the head itself reads layer 2
    assert tiny_config(method="tldr", probe_layers=(3,)).probe_layers == (3,)


def _loss_and_grads(t, objective, batches):
    """The unit-weighted loss and gradients of one step over `batches`, as the trainer sums them."""
    t.optimizer.zero_grad(set_to_none=True)
    total_loss, units = 0.0, 0
    for b in batches:
        loss, info = objective.loss(t.ctx, b)
        (loss * info[objective.units_key]).backward()
        total_loss += float(loss) * info[objective.units_key]
        units += info[objective.units_key]
    grads = {i: p.grad.clone() / units for i, p in enumerate(t.params) if p.grad is not None}
    return total_loss / units, grads


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen3", "tiny-gemma3"])
@pytest.mark.parametrize("method", ["topl", "sft"])
def test_packed_rows_give_the_loss_and_gradients_of_padded_ones(family, method, tiny_records):
    """Several examples a row, each restarting its positions (transformers masks each to itself): the same loss and
    gradients as the padded batch of the same examples, with fewer positions computed."""
    from topl_core.training.batching import make_packed_batches
    from topl_core.training.methods import METHODS
    from topl_core.training.trainer import _trainable

    objective = METHODS[method]
    cfg = tiny_config(model=family, method=method, lora=LoraSettings(layer_start=0, layer_end=2, dropout=0.0))
    base = load_model(family)
    recs = [r for r in tiny_records if r.token_labels_known and (method == "topl" or r.sequence_label == 1)][:6]
    # documents cut to 2, 40 or 100 tokens: examples of ~60 to ~160 tokens, so that short ones share a row
    examples = [encode_record(base.tokenizer, r, (2, 100, 40)[i % 3], 24) for i, r in enumerate(recs)]
    pad = base.tokenizer.pad_token_id
    t = _trainable(cfg, objective, base, 2)
    t.model.train()
    padded = [collate(examples[k : k + 2], pad) for k in range(0, len(examples), 2)]
    packed = make_packed_batches(examples, 2, pad)
    assert sum(b.input_ids.shape[0] for b in packed) < len(examples)  # short examples share rows
    assert sum(b.input_ids.numel() for b in packed) < sum(b.input_ids.numel() for b in padded)
    loss_pad, grads_pad = _loss_and_grads(t, objective, padded)
    loss_pack, grads_pack = _loss_and_grads(t, objective, packed)
    assert loss_pack == pytest.approx(loss_pad, rel=1e-5)
    assert grads_pad.keys() == grads_pack.keys() and grads_pad
    for k in grads_pad:
        assert torch.allclose(grads_pack[k], grads_pad[k], rtol=1e-4, atol=1e-7), k


def test_packing_trains_the_same_run(tmp_path, tiny_records):
    """A run trained on packed batches is the run trained on padded ones (no dropout: its masks follow the shapes)."""
    from dataclasses import replace

    from topl_core.training.methods import METHODS
    from topl_core.training.run_inputs import prepare_inputs

    # a third of the documents cut to 10 characters: the shortest batch mixes short and long examples, and its short
    # ones share rows
    records = [replace(r, document=r.document[:10]) if i % 3 == 0 else r for i, r in enumerate(tiny_records)]
    lora = LoraSettings(layer_start=0, layer_end=2, dropout=0.0)
    cfg = tiny_config(steps=3, lora=lora, batch_size=32, micro_batch_size=4)
    _, batches = prepare_inputs(replace(cfg, packing=True), METHODS["topl"], records, None)
    rows = sum(b.input_ids.shape[0] for step in batches.train for b in step)
    assert rows < batches.n_train  # packing happened
    plain = train(cfg, tmp_path / "plain", records=records)
    packed = train(replace(cfg, packing=True), tmp_path / "packed", records=records)
    assert [r["loss"] for r in packed.read_metrics()] == pytest.approx([r["loss"] for r in plain.read_metrics()])
    a, b = _weights(plain), _weights(packed)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    with pytest.raises(ConfigError, match="packing"):
        tiny_config(method="dpo", packing=True)


def test_fused_adamw_takes_the_steps_of_the_plain_one():
    """The trainer's fused AdamW (one kernel for every parameter) moves the weights as the per-parameter loop does."""
    torch.manual_seed(0)
    shapes = [(4, 64), (64, 4), (1, 64), (1,)]
    start = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(4)]
    moved = {}
    for fused in (True, False):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01, fused=fused, foreach=None if fused else False)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        moved[fused] = params
    for a, b, s in zip(moved[True], moved[False], start):
        assert not torch.equal(a, s) and torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def test_compiled_layers_train_the_same_run(tmp_path, tiny_records):
    """Each decoder layer's forward compiled (torch.compile; the aot_eager backend runs the captured graph as it is,
    so the test checks the capture without waiting for code generation): the losses and weights of the eager run,
    the LoRA dropout's masks included (one operator: no graph break, the same draws), also with gradient checkpointing;
    the model is given back eager and casting its LoRA inputs as PEFT does."""
    import torch._dynamo

    lora = LoraSettings(layer_start=0, layer_end=2)  # dropout 0.1, as the paper's
    eager = train(tiny_config(steps=2, lora=lora), tmp_path / "eager", records=tiny_records)
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    compiled = train(tiny_config(steps=2, lora=lora, compile_backend="aot_eager"), tmp_path / "c", records=tiny_records)
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == breaks
    assert [r["loss"] for r in compiled.read_metrics()] == pytest.approx([r["loss"] for r in eager.read_metrics()])
    a, b = _weights(eager), _weights(compiled)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    # compiled and recomputing its activations in backward: the recompute draws the forward's masks again
    both = tiny_config(steps=2, lora=lora, compile_backend="aot_eager", gradient_checkpointing=True)
    c = _weights(train(both, tmp_path / "cc", records=tiny_records))
    assert all(torch.allclose(a[k], c[k], atol=1e-6) for k in a)
    base = load_model("tiny-llama")
    one_step = tiny_config(steps=1, lora=lora, compile_backend="aot_eager")
    train(one_step, tmp_path / "c1", records=tiny_records, base=base)
    assert not [layer for layer in decoder_layers(base.model) if "forward" in vars(layer)]  # returned eager
    lora_layers = [m for m in base.model.modules() if hasattr(m, "cast_input_dtype_enabled")]
    assert lora_layers and all(m.cast_input_dtype_enabled for m in lora_layers)


def test_every_variant_of_a_compiled_layer_is_compiled():
    """The decoder layers share one code object: more variants than torch's default recompile limit (8) all get a
    graph (grad on and off, an input needing grad or not, one row or more, one position or more: 10), none falls back to
    eager as it did on an H200 training TOPL then SFT on Llama-3.1-8B."""
    import itertools

    from torch._dynamo.utils import counters

    model = load_model("tiny-llama").model
    compile_layers(model, "eager")  # the graph captured and run as it is: the guards, not code generation
    embed = model.get_input_embeddings()
    total, ok = counters["frames"]["total"], counters["frames"]["ok"]
    variants = [
        *itertools.product((True, False), (True, False), (1, 2), (5,)),
        (True, True, 2, 1),
        (False, False, 2, 1),
    ]
    for grad, needs_grad, rows, length in variants:
        x = embed(torch.randint(0, 100, (rows, length))).detach().requires_grad_(needs_grad)
        with torch.set_grad_enabled(grad):
            model(inputs_embeds=x, use_cache=False)
    compiled = counters["frames"]["ok"] - ok
    assert compiled > 8 and compiled == counters["frames"]["total"] - total
    compile_layers(model, "")


def test_a_layer_draws_its_lora_masks_at_once_each_its_own_and_compiled_as_eager():
    """A decoder layer draws the masks of its 7 LoRA dropouts in one go (one random draw a layer, not one a module:
    on a GPU each draw was a launch the GPU waited for), every module gets its own mask (q, k and v drop out the same
    input differently) at the rate p, and a compiled layer, which draws them as one operator in its graph, gets the
    eager layer's masks: the same gradients, with no graph break and no recompile per call."""
    import torch._dynamo
    from torch.utils._python_dispatch import TorchDispatchMode

    class RandomDraws(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func is torch.ops.aten.random_.default
            return func(*args, **(kwargs or {}))

    model = apply_lora(load_model("tiny-llama").model, tiny_config()).train()
    lora_layers = [layer for layer in decoder_layers(model) if any(isinstance(m, FastDropout) for m in layer.modules())]
    attention = lora_layers[0].self_attn
    seen = {}
    for name in ("q_proj", "k_proj", "v_proj"):
        dropout = getattr(attention, name).lora_dropout["default"]
        dropout.register_forward_pre_hook(lambda d, args, name=name: seen.setdefault(name, d.drawn.clone()))
    ids = torch.randint(0, 100, (2, 24))
    with RandomDraws() as draws:
        model(input_ids=ids, labels=ids).loss.backward()
    assert draws.count == len(lora_layers) >= 2
    q, k, v = seen["q_proj"], seen["k_proj"], seen["v_proj"]
    assert q.shape == (2, 24, model.config.hidden_size) and not (torch.equal(q, k) or torch.equal(q, v))
    p = tiny_config().lora.dropout
    assert abs((1 - torch.cat([q, k, v]).float().mean().item()) - p) < 5 * (p * (1 - p) / (3 * q.numel())) ** 0.5
    assert all(d.drawn is None for d in model.modules() if isinstance(d, FastDropout))  # used, then let go

    grads = []
    for backend in ("", "aot_eager"):
        compile_layers(model, backend)
        breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
        frames = torch._dynamo.utils.counters["frames"]["total"]
        torch.manual_seed(0)
        model.zero_grad()
        for _ in range(2):  # the second call finds the first call's graphs
            model(input_ids=ids, labels=ids).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
        assert sum(torch._dynamo.utils.counters["graph_break"].values()) == breaks
    assert torch._dynamo.utils.counters["frames"]["total"] - frames <= 4  # one call's variants, not one per call
    compile_layers(model, "")
    assert all(torch.equal(a, b) for a, b in zip(*grads)) and any(g.abs().sum() > 0 for g in grads[0])


def test_compiled_dropouts_drawing_their_own_masks_draw_the_eager_ones():
    """Three FastDropouts outside a layer (no LayerMasks) on one input, compiled: each draws its own mask, the eager
    one (drawn eagerly: the compiler would merge three equal draws into one)."""
    dropouts = [FastDropout(0.1).train() for _ in range(3)]
    x = torch.randn(4, 8, 16, requires_grad=True)

    def loss(x):
        return sum((i + 1) * d(x).pow(2).sum() for i, d in enumerate(dropouts))

    found = []
    for run in (loss, torch.compile(loss, backend="aot_eager")):
        torch.manual_seed(0)
        (grad,) = torch.autograd.grad(value := run(x), x)
        found.append((value.detach(), grad))
    (eager, eager_grad), (compiled, compiled_grad) = found
    assert torch.equal(eager, compiled) and torch.equal(eager_grad, compiled_grad)


def test_lora_inputs_left_uncast_under_autocast_change_no_value(tiny_records):
    """Training's LoRA modules take their input as it comes (cast_lora_inputs False): under bf16 autocast the loss
    and every LoRA gradient are those of PEFT's float32 copy of the input, bit for bit."""
    from topl_core.training.lora import cast_lora_inputs

    lm = load_model("tiny-llama")
    model = apply_lora(lm.model, tiny_config())
    model.train()
    ids = torch.tensor([encode_record(lm.tokenizer, tiny_records[0], 64, 32).input_ids])
    found = []
    for cast in (False, True):
        cast_lora_inputs(model, cast)
        torch.manual_seed(0)  # the same dropout masks
        with torch.autocast("cpu", torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        found.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
        model.zero_grad()
    (uncast, g_uncast), (cast, g_cast) = found
    assert torch.equal(uncast, cast) and all(torch.equal(g_uncast[n], g_cast[n]) for n in g_cast)
    with pytest.raises(ConfigError, match="compile_backend"):
        tiny_config(compile_backend="no-such-backend")
