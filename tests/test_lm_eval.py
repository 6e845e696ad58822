"""lm-evaluation-harness (lm_eval 0.4.13, requirements.txt) scores the service unchanged (docs/serve.md, "lm-eval"):
a multiple-choice task through its `local-completions` model (token-id prompts, echo with prompt logprobs, its remote
tokenizer reading /tokenizer_info and /tokenize) gives the per-choice loglikelihoods of lm-eval's own `hf` backend
with `peft=` the same adapter; two steering aliases move them apart; a generate_until task runs through
`local-chat-completions`, its `steering` generation_kwarg reaching the service. The tasks are tests/lm_eval_tasks/."""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the tasks' data are local files; no hub is reachable here
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from conftest import serving  # noqa: E402

from topl_core.data.encode import user_message  # noqa: E402
from topl_core.models.loading import load_model  # noqa: E402

lm_eval = pytest.importorskip("lm_eval", reason="lm_eval[api] is installed by requirements.txt")
openai = pytest.importorskip("openai")

TASKS = os.path.join(os.path.dirname(__file__), "lm_eval_tasks")
MC, GEN, GEN_STEERED = "halueval_tiny_mc", "halueval_tiny_gen", "halueval_tiny_gen_steered"
ALIASES = ("tiny@vector:8", "tiny@vector:-8")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """The task files copied into a folder of their own, the working directory while lm-eval reads them (their data
    and dataset cache paths are relative)."""
    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    shutil.copytree(TASKS, folder, dirs_exist_ok=True)
    here = os.getcwd()
    os.chdir(folder)
    from lm_eval.tasks import TaskManager

    yield TaskManager(include_path=str(folder), include_defaults=False)
    os.chdir(here)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """tiny-llama's base weights and tokenizer as a Hugging Face folder: what lm-eval's hf backend loads."""
    folder = tmp_path_factory.mktemp("tiny-llama-hf")
    lm = load_model("tiny-llama")
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def served(serve_session):
    with serving(serve_session, "fp32", slots=4, waiting=16, exposed=list(ALIASES)) as (_, server):
        yield server


def evaluate(tasks, model: str, model_args: dict, names: list[str], **kw) -> dict[str, list[dict]]:
    """lm-eval's own entry point, as a user calls it: the per-document samples of each task."""
    res = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=names,
        task_manager=tasks,
        log_samples=True,
        bootstrap_iters=0,
        **kw,
    )
    return {name: sorted(samples, key=lambda s: s["doc_id"]) for name, samples in res["samples"].items()}


def completions(url: str, model: str = "tiny") -> dict:
    """local-completions as lm-eval's docs run it against a vLLM-style server: token-id prompts (its default) from
    the server's own remote tokenizer, 3 prompts a request."""
    return {
        "model": model,
        "base_url": f"{url}/completions",
        "tokenizer_backend": "remote",
        "tokenized_requests": True,
        "batch_size": 3,
        "timeout": 60,
        "max_retries": 1,
    }


def choice_loglikelihoods(samples: list[dict]) -> list[list[float]]:
    return [[resp[0][0] for resp in s["resps"]] for s in samples]


def flat(lls: list[list[float]]) -> list[float]:
    return [ll for choices in lls for ll in choices]


@pytest.fixture(scope="module")
def reference(tasks, base_dir, steering_run) -> list[list[float]]:
    """lm-eval's hf backend on the base model with peft= the adapter (unmerged), in float32 — the loglikelihoods the
    served, merged model must give."""
    args = {
        "pretrained": str(base_dir),
        "peft": str(steering_run.path),
        "dtype": "float32",
        "device": "cpu",
        "add_bos_token": False,  # as local-completions' prompts (this tokenizer has no BOS)
        "batch_size": 1,
    }
    return choice_loglikelihoods(evaluate(tasks, "hf", args, [MC])[MC])


@pytest.fixture(scope="module")
def served_mc(tasks, served) -> list[list[float]]:
    return choice_loglikelihoods(evaluate(tasks, "local-completions", completions(served.url), [MC])[MC])


def test_a_multiple_choice_task_scores_the_service_as_lm_evals_hf_backend_scores_the_adapter(served_mc, reference):
    assert len(served_mc) == 6 and all(len(choices) == 2 for choices in served_mc)
    assert flat(served_mc) == pytest.approx(flat(reference), abs=1e-3)
    assert all(ll < 0 for choices in served_mc for ll in choices)


def test_steering_aliases_move_the_loglikelihoods(tasks, served, served_mc):
    """The same task at λ = 8 and λ = −8 through two aliases (lm-eval sends no extra field with a loglikelihood
    request: the model's name carries λ): every choice's loglikelihood differs between them and from the merged
    model's (the prompt is steered at every position)."""
    runs = [
        choice_loglikelihoods(evaluate(tasks, "local-completions", completions(served.url, alias), [MC])[MC])
        for alias in ALIASES
    ]
    for a, b in ((runs[0], served_mc), (runs[1], served_mc), (runs[0], runs[1])):
        shifts = [abs(x - y) for x, y in zip(flat(a), flat(b))]
        assert min(shifts) > 1e-3, shifts


def test_the_loglikelihoods_in_bf16_stay_near_float32(tasks, serve_session, reference):
    """The same task on the service decoding in bf16 (forced: every CPU emulates it): the loglikelihoods of a
    bf16 forward, within bf16's rounding of float32's, and the same choice wins wherever float32's margin is clear."""
    with serving(serve_session, "bf16", slots=4, waiting=16) as (_, server):
        bf16 = choice_loglikelihoods(evaluate(tasks, "local-completions", completions(server.url), [MC])[MC])
    for low, full in zip(bf16, reference):
        assert low == pytest.approx(full, rel=0.02)
        if abs(full[0] - full[1]) > 1.0:
            assert (low[0] > low[1]) == (full[0] > full[1])
    assert bf16 != reference  # bf16 did run: not float32's numbers


def test_a_generate_until_task_runs_through_chat_completions_and_carries_steering(tasks, served):
    args = {"model": "tiny", "base_url": f"{served.url}/chat/completions", "timeout": 60, "max_retries": 1}
    samples = evaluate(tasks, "local-chat-completions", args, [GEN, GEN_STEERED], apply_chat_template=True)
    plain = [s["resps"][0][0] for s in samples[GEN]]
    steered = [s["resps"][0][0] for s in samples[GEN_STEERED]]
    assert len(plain) == len(steered) == 6
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)
    for task, texts, steering in ((GEN, plain, None), (GEN_STEERED, steered, {"mode": "vector", "lambda": 32})):
        for sample, text in zip(samples[task], texts):  # what lm-eval read is what the service writes for it
            prompt = "Summarize the following document in one sentence.\n\nDocument:\n" + sample["doc"]["document"]
            reply = client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=8,
                temperature=0,
                stop=["###"],
                extra_body={"steering": steering} if steering else None,
            )
            assert text == reply.choices[0].message.content
    assert plain != steered  # λ reached the service through generation_kwargs


def test_the_remote_tokenizer_endpoints_round_trip(served, serve_session):
    import httpx2 as httpx

    root = served.root
    tok = serve_session.lm.tokenizer
    info = httpx.get(f"{root}/tokenizer_info").json()
    assert info["eos_token"] == tok.eos_token and info["max_model_len"] == 2048
    text = user_message("The council met on Tuesday.")
    ids = httpx.post(f"{root}/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert ids["tokens"] == tok(text, add_special_tokens=False).input_ids and ids["count"] == len(ids["tokens"])
    eos = httpx.post(f"{root}/tokenize", json={"prompt": tok.eos_token, "add_special_tokens": False}).json()
    assert eos["tokens"] == [tok.eos_token_id]  # lm-eval reads the end-of-text id this way
    back = httpx.post(f"{root}/detokenize", json={"tokens": ids["tokens"]}).json()
    assert back["prompt"] == tok.decode(ids["tokens"])
    assert httpx.post(f"{root}/detokenize", json={"tokens": [10**6]}).json()["error"]["param"] == "tokens"
