"""Every computing path in both precisions, on any CPU: the tiny models run each path with bf16 forced
(autocast; PyTorch emulates it where the CPU has no bf16, slowly but in seconds at this size), and each result is
compared with its reference under the bounds of conftest.TOLERANCE — the same computation on a float64 copy of the
model where one can be made, else the fp32 result. Nothing here depends on what "auto" resolves to, except
test_auto_end_to_end, which runs it whatever it is."""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import pytest
import torch
from conftest import NEWS_PAIRS, TOLERANCE, cache_sharing_the_costly_parts, tiny_config

from topl_core.analysis.lora_a.capture import collect_projections
from topl_core.analysis.lora_a.probe import ProbeSettings, probe_run, run_projections
from topl_core.analysis.lora_a.probe_head import ProbeHeadSettings, fit_probe_head
from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.analysis.steering.slider import Slider
from topl_core.cli import build_parser, main
from topl_core.hardware import precision as prec
from topl_core.inference.compiled_decode import CompiledDecoder
from topl_core.inference.generate import GenerationConfig, generate, load_merged
from topl_core.inference.token_scores import TokenScorer
from topl_core.models.loading import LoadedModel, ModelSpec, load_model
from topl_core.models.tiny import build_tiny_model
from topl_core.runtime.modes import MODES, POSITIONS, SteerConfig
from topl_core.runtime.session import SteeringSession
from topl_core.training.config import LoraSettings, TrainConfig
from topl_core.training.lora import apply_lora
from topl_core.training.trainer import train

BOTH = ("fp32", "bf16")
FAMILIES = ("tiny-llama", "tiny-qwen3", "tiny-gemma3")


def rel_err(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(x, np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """A test's own analysis cache; the parts that do not depend on the precision asked for (the compiled decode
    steps: keyed by their dtype) shared, so the slider's steps are not built again at every run of this file."""
    monkeypatch.setenv("TOPL_CACHE_DIR", str(cache_sharing_the_costly_parts(tmp_path / "cache")))


@pytest.fixture(scope="module")
def run(tmp_path_factory, news_records):
    """A tiny-llama TOPL run (LoRA on layers 0–3), trained in fp32; analysed below in each precision."""
    cfg = tiny_config(lora=LoraSettings(layer_start=0, layer_end=3), steps=3, lr=5e-3, max_val_examples=4)
    return train(cfg, tmp_path_factory.mktemp("runs") / "topl", records=news_records)


def peft_with_random_b(family: str):
    model, tok = build_tiny_model(family)
    peft = apply_lora(model, TrainConfig(model=family, lora=LoraSettings(layer_start=0, layer_end=2))).eval()
    g = torch.Generator().manual_seed(1)
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            p.data = torch.randn(p.shape, generator=g) * 0.2
    return peft, tok


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("precision", BOTH)
def test_lora_a_capture_agrees_with_float64(family, precision, news_records):
    """LoRA-A projections leave torch as float32 in both precisions and lie within the precision's bound of the same
    capture on a float64 copy of the model."""
    peft, tok = peft_with_random_b(family)
    ref = collect_projections(copy.deepcopy(peft).double(), tok, news_records, precision="fp32")
    got = collect_projections(peft, tok, news_records, precision=precision)
    assert np.array_equal(got.labels, ref.labels) and got.n_tokens > 20
    for key, values in got.values.items():
        assert values.dtype == np.float32
        assert rel_err(values, ref.values[key]) <= TOLERANCE[precision].rel, (key, rel_err(values, ref.values[key]))


@pytest.mark.parametrize("precision", BOTH)
def test_token_scores_and_surprisal_agree_with_float64(precision, run, news_records):
    """Head p(good) and base-model surprisal on the same tokens, against a float64 copy of the base model."""
    lm = load_model("tiny-llama")
    ref_lm = LoadedModel(copy.deepcopy(lm.model).double(), lm.tokenizer, lm.spec)
    ref = TokenScorer(ref_lm, run, precision="fp32").score(news_records)
    got = TokenScorer(lm, run, precision=precision).score(news_records)
    tol = TOLERANCE[precision]
    for g, r in zip(got, ref):
        assert g.p_good.dtype == np.float32 and g.surprisal.dtype == np.float32
        assert np.abs(g.p_good - r.p_good).max() <= tol.prob
        assert np.abs(g.surprisal - r.surprisal).max() <= tol.nats


def test_probe_and_umap_in_bf16(run, news_records):
    """The LoRA-A page's path: projections (cached per precision), per-site AUROC within the bf16 bound of fp32's,
    and a UMAP of bf16 projections."""
    from topl_core.analysis.lora_a.umap_view import umap_embedding

    f32 = probe_run(run, news_records, ProbeSettings(precision="fp32", n_boot=50))
    b16 = probe_run(run, news_records, ProbeSettings(precision="bf16", n_boot=50))
    assert f32.settings["precision"] == "fp32" and b16.settings["precision"] == "bf16"  # two cache entries
    a32 = {s.site.key: s.cv_auroc for s in f32.lora.scores}
    a16 = {s.site.key: s.cv_auroc for s in b16.lora.scores}
    assert a32.keys() == a16.keys()
    assert max(abs(a32[k] - a16[k]) for k in a32) <= TOLERANCE["bf16"].auroc
    proj = run_projections(run, news_records, ProbeSettings(precision="bf16", random_control=False))["lora"]
    emb = umap_embedding(proj.labelled(), proj.sites[0].key, n_neighbors=5)
    assert len(emb) == proj.labelled().n_tokens and np.isfinite(emb[["x", "y"]].to_numpy()).all()


def test_probe_head_in_bf16(run, news_records):
    records = news_records * 3  # the probe head fits on the training split: enough labelled tokens
    f32 = fit_probe_head(run, records, ProbeHeadSettings(precision="fp32", layer=2))
    b16 = fit_probe_head(run, records, ProbeHeadSettings(precision="bf16", layer=2))
    assert b16.settings["precision"] == "bf16" and f32.settings["precision"] == "fp32"
    w32, w16 = np.asarray(f32.weight), np.asarray(b16.weight)
    assert rel_err(w16, w32) <= 10 * TOLERANCE["bf16"].rel  # a refit: the features' rounding moves the optimum
    assert abs(f32.train_auroc - b16.train_auroc) <= TOLERANCE["bf16"].auroc


def assert_grid_keeps_the_neutral_row(session: SteeringSession, doc: str, how: SteerConfig, gen: GenerationConfig):
    """A λ grid as one batch gives a text per λ, and its neutral row is the unsteered batch's text: rows of one batch
    shape are computed alike, and the neutral row adds exactly nothing. (A row need not equal its λ generated alone:
    in bf16 the batch's matmul shapes can move the last bits and flip a near-tie.)"""
    grid = [how.neutral + k for k in (-2.0, -1.0, 0.0, 1.0, 2.0)]
    texts = session.generate_grid(doc, grid, gen, how=how)
    unsteered = generate(session.lm, [doc] * len(grid), replace(gen, batch_size=len(grid)))
    assert len(texts) == len(grid) and all(isinstance(t, str) for t in texts)
    assert texts[grid.index(how.neutral)] == unsteered[0], how


def test_steering_vectors_and_every_mode_in_bf16(run, news_records):
    """Vectors from bf16 projections within the bound of fp32's; every mode, on every position and on generated
    tokens only, generates under bf16 autocast; the neutral λ reproduces the merged model's bf16 text exactly, alone
    and as the neutral row of a λ grid generated as one batch."""
    v32 = build_steering_vectors(run, news_records, ProbeSettings(precision="fp32", random_control=False), top_k=3)
    v16 = build_steering_vectors(run, news_records, ProbeSettings(precision="bf16", random_control=False), top_k=3)
    assert [s.key for s in v16.sites] == [s.key for s in v32.sites]
    for k in v32.vectors:
        assert v16.vectors[k].dtype == np.float32
        assert rel_err(v16.vectors[k], v32.vectors[k]) <= TOLERANCE["bf16"].rel
    session = SteeringSession(load_merged("tiny-llama", run), v16)
    gen = GenerationConfig(max_new_tokens=8, precision="bf16")
    doc = NEWS_PAIRS[0][1]
    merged_text = generate(session.lm, [doc], gen)[0]
    for mode in MODES:
        for positions in POSITIONS:
            how = SteerConfig(mode, positions)
            assert session.generate_steered(doc, how.neutral, gen, how=how) == merged_text, how
            assert [*session.stream_steered(doc, how.neutral, gen, how=how)][-1] == merged_text, how  # streamed
            assert isinstance(session.generate_steered(doc, how.neutral + 2.0, gen, how=how), str)
            assert_grid_keeps_the_neutral_row(session, doc, how, gen)


def test_the_sliders_streamed_grid_and_compiled_decode_in_bf16(run, news_records):
    """The slider's paths with the prompt in bf16: a λ grid streamed as one batch (what the slider writes ahead,
    analysis/steering/slider.py) keeps its neutral row the unsteered batch's text with both phases in bf16; the compiled
    decode step, decoding in fp32 from a bf16 prompt's KV cache (what `auto` does on an AMX CPU), writes the eager
    stream's text, and so does the bf16 step over the weights' kept bf16 copies (autocast's step written out)."""
    vectors = build_steering_vectors(run, news_records, ProbeSettings(precision="bf16", random_control=False), top_k=2)
    session, doc = SteeringSession(load_merged("tiny-llama", run), vectors), NEWS_PAIRS[0][1]
    both = GenerationConfig.chosen("bf16", max_new_tokens=8)
    engine = Slider(compiled=False)
    try:
        for positions in POSITIONS:
            how = SteerConfig("vector", positions)
            grid = [-2.0, how.neutral, 2.0]
            view = engine.view(positions, session, doc, both, how, merged=positions)
            view.ahead(grid)
            while engine.busy():
                time.sleep(0.02)
            unsteered = generate(session.lm, [doc] * len(grid), replace(both, batch_size=len(grid)))
            assert all(view.text(lam) is not None for lam in grid), how
            assert view.text(how.neutral).text == unsteered[0], how
    finally:
        engine.close()
    prompt_bf16 = GenerationConfig(max_new_tokens=8, precision="bf16", decode_precision="fp32")
    eager = {
        (gen, p, lam): [*session.stream_steered(doc, lam, gen, how=SteerConfig("vector", p))]
        for gen in (prompt_bf16, both)
        for p in POSITIONS
        for lam in (0.0, 2.0)
    }
    session.compile_decode()
    for (gen, positions, lam), texts in eager.items():
        assert [*session.stream_steered(doc, lam, gen, how=SteerConfig("vector", positions))] == texts
    # both steps were built and taken: fp32's, and bf16 autocast's over the weights' kept bf16 copies
    assert {dtype for _, dtype in session.decoder._built} == {torch.float32, torch.bfloat16}
    model = session.lm.model  # the bf16 step's module tree is its own: the model keeps its float32 weights, tied
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == model.config.tie_word_embeddings


def test_steering_on_bf16_weights(run, news_records):
    """What a GPU runs: the merged model in bfloat16 weights (ModelSpec dtype), steered in each mode; a GPU's compiled
    decode step (torch.compile's) on those weights (bf16 steps, no autocast) writes the eager stream's text."""
    vectors = build_steering_vectors(run, news_records, ProbeSettings(random_control=False), top_k=2)
    lm = load_merged(ModelSpec("tiny-llama", "bf16"), run)
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    session = SteeringSession(lm, vectors)
    for mode in MODES:
        how = SteerConfig(mode)
        text = session.generate_steered(
            NEWS_PAIRS[1][1], how.neutral + 1.0, GenerationConfig(max_new_tokens=6), how=how
        )
        assert isinstance(text, str)
        assert_grid_keeps_the_neutral_row(session, NEWS_PAIRS[1][1], how, GenerationConfig(max_new_tokens=6))
    bf16 = GenerationConfig.chosen("bf16", max_new_tokens=8)
    eager = {(p, lam): [*session.stream_steered(NEWS_PAIRS[1][1], lam, bf16, how=SteerConfig("vector", p))]
             for p in POSITIONS for lam in (0.0, 2.0)}  # fmt: skip
    session.compile_decode(decoder=CompiledDecoder)
    assert session._compiled.supports(bf16) and not session._compiled.supports(replace(bf16, decode_precision="fp32"))
    for (positions, lam), texts in eager.items():
        assert [*session.stream_steered(NEWS_PAIRS[1][1], lam, bf16, how=SteerConfig("vector", positions))] == texts


def test_deck_in_bf16(run, news_records, tmp_path):
    """A talk deck prepared in bf16: every summary generated and judged by the head, finite p(good) in [0, 1]."""
    from topl_core.analysis.studies.deck import DeckConfig, create_deck, read_deck
    from topl_core.analysis.studies.deck_prepare import prepare_deck
    from topl_core.data.records import write_jsonl

    data = tmp_path / "news.jsonl"
    write_jsonl(news_records, data)
    cfg = DeckConfig(
        str(run.path), (NEWS_PAIRS[0][1],), (-2.0, 2.0), top_k=2, max_new_tokens=6, data=str(data), precision="bf16"
    )
    folder = create_deck(tmp_path / "deck", cfg)
    assert prepare_deck(folder).state == "finished"
    deck = read_deck(folder)
    assert deck.complete and deck.has_head
    for s in (deck.documents[0].base, *deck.documents[0].positions.values()):
        assert len(s.p_good) == len(s.tokens) and all(0.0 <= p <= 1.0 for p in s.p_good), s


def test_training_in_bf16_changes_the_adapter_and_logs_finite_metrics(tmp_path, news_records):
    cfg = tiny_config(precision="bf16", steps=2, eval_every=2, max_val_examples=4)
    rd = train(cfg, tmp_path / "bf16", records=news_records)
    assert rd.read_config()[0].precision == "bf16"
    rows = rd.read_metrics()
    losses = [r["loss"] for r in rows if "loss" in r]
    assert (
        losses
        and np.isfinite(losses).all()
        and np.isfinite([r["val_token_auroc"] for r in rows if "val_token_auroc" in r]).all()
    )
    from safetensors.torch import load_file

    saved = load_file(rd.adapter_path)
    moved = [k for k, v in saved.items() if "lora_B" in k and v.abs().max() > 0]
    assert moved, "two bf16 steps left every LoRA-B at its zero init (PEFT starts B at zero)"


def test_evaluation_and_lambda_study_in_bf16(tmp_path, tiny_records):
    """The Evaluation page's path (generate, score) and the λ study, with EvalConfig(precision="bf16")."""
    from topl_core.analysis.evaluation.config import EvalConfig, Variant
    from topl_core.analysis.evaluation.evaluate import evaluate
    from topl_core.analysis.evaluation.lambda_study import lambda_sweep
    from topl_core.data.records import write_jsonl

    data = write_jsonl(tiny_records, tmp_path / "data.jsonl")
    gemma = train(tiny_config(model="tiny-gemma3", steps=2, data=str(data)), tmp_path / "run", records=tiny_records)
    cfg = EvalConfig(data=str(data), n_id=2, n_ood=0, max_new_tokens=5, max_doc_tokens=64, precision="bf16")
    assert cfg.generation.precision == "bf16"
    variants = [Variant.merged(gemma.path), Variant.steered(gemma.path, 0.0)]
    res = evaluate(variants, cfg)
    texts = {v.name: res.per_doc[res.per_doc["variant"] == v.name]["text"].tolist() for v in variants}
    assert texts[variants[0].name] == texts[variants[1].name]  # λ = 0 is the merged model, in bf16 too
    df = lambda_sweep(gemma.path, [-1.0, 1.0], cfg)
    assert set(df["lambda"]) >= {-1.0, 1.0} and df["score_sentence"].between(0, 1).all()


def test_sweep_with_frozen_prefix_reuse_in_bf16(tiny_records, tmp_path):
    """Reusing the frozen prefix trains what the plain trainer trains, in bf16 as in fp32."""
    from topl_core.analysis.studies.sweeps import SweepConfig, run_sweep

    loader = lambda: load_model("tiny-llama")  # noqa: E731
    train_cfg = tiny_config(precision="bf16", steps=2, eval_every=2)
    windows = ((0, 2), (2, 2))
    a = run_sweep(
        SweepConfig(train=train_cfg, windows=windows, reuse_prefix=True), tmp_path / "a", None, loader, tiny_records
    )
    b = run_sweep(
        SweepConfig(train=train_cfg, windows=windows, reuse_prefix=False), tmp_path / "b", None, loader, tiny_records
    )
    x, y = a.sort_values("window")["val_token_auroc"].to_numpy(), b.sort_values("window")["val_token_auroc"].to_numpy()
    assert np.isfinite(x).all() and np.abs(x - y).max() <= TOLERANCE["bf16"].auroc


def test_label_study_in_bf16(tiny_records, tmp_path):
    from topl_core.analysis.studies.label_sensitivity import LabelStudyConfig, run_label_study

    cfg = LabelStudyConfig(train=tiny_config(precision="bf16", steps=2, eval_every=2), settings=("original", "random"))
    df = run_label_study(cfg, tmp_path / "study", records=tiny_records)
    assert list(df["setting"]) == ["original", "random"] and np.isfinite(df["val_token_auroc"]).all()


def test_transfer_and_layer_scan_in_bf16(run, tiny_records):
    from topl_core.analysis.studies.layer_scan import layer_scan
    from topl_core.analysis.studies.transfer import TransferSettings, transfer_table

    small = TransferSettings(stage="dev", max_records_per_set=4, probe_records=16, bootstrap=20)
    t32 = transfer_table([run], replace(small, precision="fp32"), None, tiny_records)
    t16 = transfer_table([run], replace(small, precision="bf16"), None, tiny_records)
    assert (t16["tokens"].to_numpy() == t32["tokens"].to_numpy()).all()
    a16, a32 = t16["auroc"].to_numpy(), t32["auroc"].to_numpy()
    assert (np.isnan(a16) == np.isnan(a32)).all() and np.isfinite(a16).any()  # NaN: a set without bad tokens
    assert np.nanmax(np.abs(a16 - a32)) <= TOLERANCE["bf16"].auroc
    scan = layer_scan(run, replace(small, precision="bf16"), records=tiny_records)
    assert len(scan) > 0 and np.isfinite(scan.select_dtypes("number").to_numpy(float)).any()


class CliRun(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def cli(capsys, monkeypatch, *args: str, env_precision: str | None = "fp32") -> CliRun:
    """`python -m topl_core *args` run in this process (the CLI's main, as tests/test_cli.py runs it: a subprocess would
    pay the core's imports: docs/reliability.md, "Figures behind the tests' choices"), with TOPL_PRECISION set to
    `env_precision` (None: unset, as a user has it)."""
    if env_precision is None:
        monkeypatch.delenv(prec.PRECISION_ENV, raising=False)
    else:
        monkeypatch.setenv(prec.PRECISION_ENV, env_precision)
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return CliRun(code, out.out, out.err)


def test_commands_take_precision_and_say_what_they_resolved(run, capsys, monkeypatch):
    """generate, steer and merge-check with --precision bf16 (each prints the precision it resolved)."""
    doc = NEWS_PAIRS[0][1]
    out = cli(capsys, monkeypatch, "generate", "--run", str(run.path), "--document", doc, "--max-new-tokens", "4",
              "--precision", "bf16")  # fmt: skip
    assert out.returncode == 0 and "precision: bf16 (chosen" in out.stderr, out.stderr[-2000:]
    out = cli(capsys, monkeypatch, "steer", "--run", str(run.path), "--document", doc, "--max-new-tokens", "4",
              "--lambdas", "0", "2", "--mode", "conditional", "--precision", "bf16", "--no-base")  # fmt: skip
    assert out.returncode == 0 and "precision: bf16" in out.stderr and "λ = 2" in out.stdout, out.stderr[-2000:]
    out = cli(capsys, monkeypatch, "merge-check", "--run", str(run.path), "--n", "2", "--precision", "bf16")
    assert out.returncode == 0 and "precision: bf16" in out.stderr, out.stderr[-2000:]
    assert "fp32 weights" in out.stdout and "bf16 weights" in out.stdout
    for command in ("evaluate", "evaluate-mt", "bench", "generate", "steer", "merge-check", "probe", "score-tokens"):
        needs_run = [] if command in ("evaluate", "evaluate-mt", "bench", "generate") else ["--run", str(run.path)]
        args = build_parser([command]).parse_args([command, "--precision", "bf16", *needs_run])
        assert args.precision == "bf16", command


def test_auto_end_to_end(run, tmp_path, capsys, monkeypatch):
    """ "auto" as a user gets it, whatever it resolves to here: the command names the precision it chose and the
    probe records that same one."""
    report = tmp_path / "probe.json"
    out = cli(capsys, monkeypatch, "probe", "--run", str(run.path), "--precision", "auto", "--n-boot", "20",
              "--json", str(report), env_precision=None)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    resolved = out.stderr.split("precision: ", 1)[1].split()[0]
    assert resolved == prec.resolve_precision("auto") if prec.chosen_default() is None else resolved in ("fp32", "bf16")
    assert f'"precision": "{resolved}"' in report.read_text()


def test_a_bf16_native_cpu_takes_the_bf16_path_from_auto(monkeypatch, run, news_records):
    """The kind of CPU this machine may not be: faked AVX-512-BF16 makes "auto" bf16 all the way into a probe."""
    monkeypatch.delenv(prec.PRECISION_ENV, raising=False)
    fake = prec.Bf16Probe(capability="AVX512", amx=False, avx512_bf16=True, fp32_s=0.001, bf16_s=0.0002)
    monkeypatch.setattr(prec, "cpu_bf16_probe", lambda: fake)
    result = probe_run(run, news_records, ProbeSettings(n_boot=20))
    assert result.settings["precision"] == "bf16"
    assert all(np.isfinite(s.cv_auroc) for s in result.lora.scores)
