"""Run directories: everything a training run leaves behind, and loading it back.

runs/<name>/
  adapter_config.json, adapter_model.safetensors   PEFT save_pretrained output (PeftModel.from_pretrained loads it)
  head.safetensors                                  the linear head (weight (1, d), bias (1,)), for head methods
  topl_config.json                                  {"config": TrainConfig, "meta": {base fingerprint, head layer,
                                                    sha256 of the adapter and head files when the run finished, ...}}
  metrics.jsonl                                     one JSON object per logged step / validation
  README.md                                         the model card of a finished run (topl_core.training.card)
  events.out.tfevents.*                             TensorBoard's, with report_to tensorboard (training/tracking.py)
  status.json, STOP                                 state and step / steps; a stop request (foundations/status.py)
  checkpoint/                                       latest resumable state (adapter, head, optimizer, RNG, step)
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..foundations.errors import ModelError, RunError
from ..foundations.io import atomic_open, checksum_problem, read_log_rows, sha256_file, write_json
from ..foundations.status import LOCK_FILE, STATUS_FILE, STOP_FILE, State, read_status, write_status
from ..models.loading import LoadedModel
from .config import TrainConfig

# the files of a run folder (PEFT's two first: plain PeftModel.from_pretrained loads them)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
HEAD_FILE = "head.safetensors"
PROBES_FILE = "probes.safetensors"  # side probes' weights (TrainConfig.side_probes)
CONFIG_FILE = "topl_config.json"
METRICS_FILE = "metrics.jsonl"
CARD_FILE = "README.md"  # the model card, as on a hub


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    config_path = property(lambda self: self.path / CONFIG_FILE)
    metrics_path = property(lambda self: self.path / METRICS_FILE)
    status_path = property(lambda self: self.path / STATUS_FILE)
    head_path = property(lambda self: self.path / HEAD_FILE)
    probes_path = property(lambda self: self.path / PROBES_FILE)
    checkpoint_dir = property(lambda self: self.path / "checkpoint")
    adapter_config_path = property(lambda self: self.path / ADAPTER_CONFIG)
    adapter_path = property(lambda self: self.path / ADAPTER_WEIGHTS)
    card_path = property(lambda self: self.path / CARD_FILE)

    @classmethod
    def of(cls, run: "RunDir | str | os.PathLike") -> "RunDir":
        """A RunDir for a path, or the RunDir itself: what every function taking "a run" accepts."""
        return run if isinstance(run, RunDir) else cls(run)

    @property
    def name(self) -> str:
        return self.path.name

    # --- config and meta -----------------------------------------------------------------------------------
    def write_config(self, cfg: TrainConfig, meta: dict) -> None:
        write_json(self.config_path, {"config": cfg.to_json(), "meta": meta})

    def read_config(self) -> tuple[TrainConfig, dict]:
        if not self.config_path.exists():
            raise RunError(
                f"{self.path}: no topl_config.json — not a run directory (train one with python -m topl_core train)."
            )
        try:
            d = json.loads(self.config_path.read_text())
            return TrainConfig.from_json(d["config"]), d.get("meta", {})
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise RunError(f"{self.config_path}: corrupt ({e}); delete the run directory and train again.") from e

    # --- progress --------------------------------------------------------------------------------------------
    def append_metrics(self, row: dict) -> None:
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def step_times(self) -> list[tuple[float, int]]:
        """(seconds, tokens) of each logged training step; validation and checkpoint time are not in it."""
        return [(r["step_s"], r["step_tokens"]) for r in self.read_metrics() if "step_s" in r]

    def read_metrics(self) -> list[dict]:
        return read_log_rows(self.metrics_path)

    def truncate_metrics(self, after_step: int) -> None:
        """On resume, drop rows logged after the checkpoint's step (they will be logged again)."""
        keep = [r for r in self.read_metrics() if r.get("step", 0) <= after_step]
        with atomic_open(self.metrics_path) as f:
            f.writelines(json.dumps(r) + "\n" for r in keep)

    def write_status(self, state: State, step: int, steps: int, **extra) -> None:
        write_status(self.path, state, step=step, steps=steps, **extra)

    def read_status(self) -> dict:
        return {"state": "unknown", "step": 0, "steps": 0, **read_status(self.path)}

    @property
    def is_foreign(self) -> bool:
        """The folder holds something other than a run: files, but no run config (a writer lock or a stop request
        alone do not count)."""
        return (
            not self.config_path.exists()
            and self.path.is_dir()
            and any(p.name not in (LOCK_FILE, STOP_FILE) for p in self.path.iterdir())
        )

    def checkpoint_step(self) -> int:
        """The step a resume starts after: the last checkpoint's (0 when there is none or it cannot be read)."""
        try:
            return int(json.loads((self.checkpoint_dir / "state.json").read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def shared_files(self) -> list[Path]:
        """What a run exported for sharing holds (sharing.py): the adapter, head and side probes, the card,
        config, metrics and state; never the checkpoint, tracker files, writer lock or a stop request."""
        wanted = [self.adapter_config_path, self.adapter_path, self.head_path, self.probes_path, self.card_path]
        return [p for p in wanted + [self.config_path, self.metrics_path, self.status_path] if p.exists()]

    @property
    def is_complete(self) -> bool:
        return self.read_status().get("state") == "finished" and self.adapter_path.exists()

    def fingerprint(self) -> str:
        """Changes whenever the adapter or head weights change (cache keys for analysis results)."""
        return fingerprint_files([self.adapter_path, self.head_path, self.adapter_config_path])

    # --- integrity ---------------------------------------------------------------------------------------------
    def record_checksums(self) -> None:
        """Write the sha256 of the finished adapter and head files into the run's meta (verified at every load)."""
        cfg, meta = self.read_config()
        files = [p for p in (self.adapter_path, self.head_path) if p.exists()]
        self.write_config(cfg, meta | {"checksums": {p.name: sha256_file(p) for p in files}})

    def _verify_files(self, meta: dict) -> None:
        """Refuse an adapter or head file whose content changed since the run recorded its checksum in `meta`."""
        match checksum_problem(self.path, meta.get("checksums", {})):
            case (path, "missing"):
                raise RunError(f"{path}: missing (the run finished with it). Restore the file or retrain the run.")
            case (path, _):
                raise RunError(
                    f"{path}: its content does not match the checksum recorded when the run finished — the file "
                    "was changed or corrupted. Restore it from a copy or retrain the run."
                )

    # --- loading ---------------------------------------------------------------------------------------------
    def check_base(self, base: LoadedModel) -> dict:
        """Refuse an adapter trained on another base model, naming both; a run that records no base fingerprint
        loads only onto the model it names (never blind); files must match their recorded checksums."""
        _, meta = self.read_config()
        want, named = meta.get("base_fingerprint"), meta.get("base_model")
        if want and want != base.fingerprint:
            raise ModelError(
                f"Adapter {self.path} was trained on base model {named!r} (fingerprint {want}), "
                f"but the loaded model is {base.spec.name!r} (fingerprint {base.fingerprint}). Load "
                f"{named!r} or pick an adapter trained on {base.spec.name!r}."
            )
        if not want and named != base.spec.name:
            raise ModelError(
                f"{self.config_path} records no base-model fingerprint, and it names {named!r}, not the loaded "
                f"{base.spec.name!r}: it cannot be checked, so it is not loaded. Load {named!r}, or set meta."
                f"base_fingerprint in that file to {base.fingerprint!r} if you know the run was trained on this model."
            )
        self._verify_files(meta)
        return meta

    def load_head(self, device: str | torch.device = "cpu") -> torch.nn.Linear:
        from safetensors.torch import load_file

        if not self.head_path.exists():
            raise RunError(
                f"{self.path}: no head.safetensors; this method ({self.read_config()[0].method}) trains no head."
            )
        try:
            t = load_file(self.head_path, device=str(device))
        except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
            raise RunError(f"{self.head_path}: corrupt or truncated ({e}); retrain the run or restore the file.") from e
        head = torch.nn.Linear(t["weight"].shape[1], 1).to(device)
        head.load_state_dict(t)
        return head.eval()


def fingerprint_files(paths: list[Path]) -> str:
    """sha256 (16 hex) over the contents of those of `paths` that exist, in the given order."""
    h = hashlib.sha256()
    for p in paths:
        if p.exists():
            h.update(p.read_bytes())
    return h.hexdigest()[:16]
