"""The model card of a run: README.md in every finished run folder (where PEFT's save_pretrained leaves an empty
template), so an adapter folder copied or pushed elsewhere says what it is and how it was made.

    card_text(run) -> str       method, base model, data and its fingerprint, LoRA, head layer, precision, steps, the
                                final validation figures, the command that reproduces it, loading it with plain PEFT
    write_card(run) -> Path     run.card_path (the trainer writes it when a run finishes; the demo adapters' cards
                                come from the same code: scripts/demo_adapters.py --cards)
    check_card(path) -> ModelCard   the card as the hub reads it; RunError when its metadata does not parse or is
                                not what the workbench writes (sharing.push_to_hub checks it before any upload)

The metadata header is written by huggingface_hub's ModelCardData (YAML it quotes itself: a base model whose path
holds ": " or "#" stays one string), and names the base model only when it is a hub id (a local path means nothing
on the hub, which refuses it there); the card's text names it either way. Nothing here changes what identifies an
adapter: fingerprints and checksums cover the weight and config files only.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from ..data.records import read_jsonl, records_fingerprint
from ..foundations.errors import RunError
from ..models.loading import EMBEDDED, hub_id
from .config import TrainConfig, command_args
from .run_dirs import RunDir

LIBRARY_TAG = "topl-workbench"


def base_checkpoint(name: str) -> str:
    """The id `from_pretrained` loads for a base model the workbench names: an embedded model's source checkpoint, a
    preset's hub id, else the name (a hub id or a path)."""
    return EMBEDDED[name].hub_id if name in EMBEDDED else hub_id(name)


def is_hub_id(name: str) -> bool:
    """Whether `name` reads as a hub repository id (not a local path: one that exists here, or starts as a path)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name.startswith((".", "/", "~")) or Path(name).exists():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def card_data(cfg: TrainConfig) -> ModelCardData:
    """The card's metadata: PEFT's library name, the tags, and the base model where it is a hub id."""
    checkpoint = base_checkpoint(cfg.model)
    return ModelCardData(
        base_model=checkpoint if is_hub_id(checkpoint) else None,
        library_name="peft",
        tags=["lora", LIBRARY_TAG, cfg.method],
    )


def _cell(text: str) -> str:
    """Text for a Markdown table cell (a `|` in a path would end the cell)."""
    return text.replace("|", "\\|")


def train_command(cfg: TrainConfig, out: str | Path) -> str:
    """The command line that trains `cfg` into `out` (parsed back by the train CLI, it gives `cfg`)."""
    return shlex.join(["python", "-m", "topl_core", "train", *command_args(cfg), "--out", str(out)])


def _data_line(cfg: TrainConfig, meta: dict) -> str:
    fingerprint = meta.get("data_fingerprint")
    how = "recorded by the run"
    if fingerprint is None and Path(cfg.data).is_file():  # runs from before the fingerprint was recorded
        fingerprint, how = records_fingerprint(read_jsonl(cfg.data)), f"of {cfg.data} when this card was written"
    examples = f"{meta.get('n_train_examples', '?')} training / {meta.get('n_val_examples', '?')} validation examples"
    identity = f"records fingerprint `{fingerprint}` ({how})" if fingerprint else "no fingerprint recorded"
    return f"`{cfg.data}`, {examples} (split seed {cfg.split_seed}); {identity}"


def _validation(run: RunDir) -> tuple[int | None, dict]:
    """The last validation row's figures (step, {name: value})."""
    rows = [r for r in run.read_metrics() if any(k.startswith("val_") for k in r)]
    if not rows:
        return None, {}
    last = rows[-1]
    return last["step"], {k: v for k, v in last.items() if k.startswith("val_")}


def card_text(run: RunDir | str | Path) -> str:
    run = RunDir.of(run)
    cfg, meta = run.read_config()
    status = run.read_status()
    checkpoint = base_checkpoint(cfg.model)
    head_layer = meta.get("head_layer")
    step, val = _validation(run)
    headline = meta.get("validation_metric")
    probes = ", ".join(map(str, cfg.probe_layers))
    head_lr = f" (head × {cfg.head_lr_multiplier:g})" if run.head_path.exists() else ""
    rows = [
        ("method", f"`{cfg.method}` — {meta.get('objective', '')}".rstrip(" —")),
        ("base model", f"`{cfg.model}` (`{checkpoint}`), fingerprint `{meta.get('base_fingerprint', '?')}`"),
        ("data", _data_line(cfg, meta)),
        (
            "LoRA",
            f"r {cfg.lora.r}, α {cfg.lora.alpha:g}, dropout {cfg.lora.dropout:g} on {', '.join(cfg.lora.modules)} of "
            f"layers {cfg.lora.layer_start}–{cfg.lora.layer_end} (of {meta.get('num_layers', '?')})",
        ),
        (
            "head",
            f"linear head on the final norm of layer {head_layer}'s output (`{run.head_path.name}`)"
            if run.head_path.exists()
            else "none",
        ),
        *([("side probes", f"linear probes on layers {probes} (`{run.probes_path.name}`)")] if probes else []),
        ("precision", f"{cfg.precision} on {cfg.device}"),
        (
            "steps",
            f"{status.get('step', '?')} of {cfg.steps} ({status.get('state', 'unknown')}), batch {cfg.batch_size} × "
            f"accumulation {cfg.grad_accum}, lr {cfg.lr:g}{head_lr}, seed {cfg.seed}, label setting "
            f"{cfg.label_setting}",
        ),
    ]
    table = "\n".join(f"| {k} | {_cell(v)} |" for k, v in rows)
    if val:
        figures = "\n".join(f"| {'**' + k + '**' if k == headline else k} | {v:.4g} |" for k, v in val.items())
        validation = f"At step {step}:\n\n| metric | value |\n|---|---:|\n{figures}"
    else:
        validation = "No validation ran."
    head = ""
    if run.head_path.exists():
        head = f"""
# the TOPL head: p(good) of a token = sigmoid(head(FinalNorm(hidden state after layer {head_layer})))
from safetensors.torch import load_file
head = load_file({json.dumps(f"{run.name}/{run.head_path.name}")})  # weight (1, hidden), bias (1,)"""
    embedded = (
        f"\nThe run's base is the workbench's embedded `{cfg.model}` "
        f"(`topl_core.models.loading.load_model({cfg.model!r})`: its GGUF weights dequantized), converted from "
        f"`{checkpoint}`; on that checkpoint it loads the same way.\n"
        if cfg.model in EMBEDDED
        else ""
    )
    body = f"""
# {run.name}: {cfg.method.upper()} LoRA adapter on {cfg.model}

Trained with the TOPL Workbench (Token-Level Off-Policy Labeling and its baselines).

| | |
|---|---|
{table}

## Validation

{validation}

## Reproduce

```bash
{train_command(cfg, run.path)}
```

## Load with PEFT

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM

base = AutoModelForCausalLM.from_pretrained({json.dumps(checkpoint)})
model = PeftModel.from_pretrained(base, {json.dumps(run.name)})  # this folder
merged = model.merge_and_unload()  # generation uses the model's own LM head{head}
```
{embedded}"""
    return str(ModelCard(f"---\n{card_data(cfg).to_yaml()}\n---\n{body}"))  # the header parsed back: a mapping


def write_card(run: RunDir | str | Path) -> Path:
    run = RunDir.of(run)
    run.card_path.write_text(card_text(run), encoding="utf-8")
    return run.card_path


def check_card(path: str | Path) -> ModelCard:
    """The model card at `path` as the hub will read it; RunError naming the problem when its metadata header does
    not parse, is not a mapping, or is not what the workbench writes (PEFT's library name, the workbench's tag, a
    base model only as a hub id)."""
    path = Path(path)
    fix = "write it again from the run (python -m topl_core export writes a new one where it finds this)"
    if not path.exists():
        raise RunError(f"{path}: no model card; {fix}.")
    try:
        card = ModelCard.load(path)
    except Exception as e:  # YAML that does not parse, or parses to something other than a mapping
        raise RunError(f"{path}: the model card's metadata does not parse ({str(e).splitlines()[0]}); {fix}.") from e
    data = card.data.to_dict()
    problems = []
    if data.get("library_name") != "peft":
        problems.append(f"library_name is {data.get('library_name')!r}, not 'peft'")
    if LIBRARY_TAG not in (data.get("tags") or []):
        problems.append(f"the tags {data.get('tags')!r} lack {LIBRARY_TAG!r}")
    base = data.get("base_model")
    if base is not None and not (isinstance(base, str) and is_hub_id(base)):
        problems.append(f"base_model {base!r} is not a hub id")
    if problems:
        listed = "; ".join(problems)
        raise RunError(f"{path}: the model card's metadata is not what the workbench writes ({listed}); {fix}.")
    return card
