"""A finished run made ready to share: its folder without what only this machine needs, and optionally on a hub.

    export_run(run, dest) -> RunDir        copies RunDir.shared_files() (adapter, head, card, config, metrics,
                                           state); no checkpoint, tracker files, writer lock or stop request; a card
                                           whose metadata the hub would misread (card.check_card) is written anew
    push_to_hub(folder, repo_id)           uploads an exported folder (huggingface_hub) once its card is valid: checked
                                           here (card.check_card, offline too) and by the hub's own validation before
                                           any upload; offline: a ServiceError at once

The export is itself a run folder: the workbench opens it as a run (checksums verified), PEFT as an adapter folder.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from ..foundations.errors import RunError, ServiceError
from ..foundations.io import copy_file
from ..models.loading import hub_reachable
from .card import check_card, write_card
from .run_dirs import RunDir


def export_run(run: RunDir | str | Path, dest: str | Path) -> RunDir:
    run, out = RunDir.of(run), RunDir(dest)
    if not run.is_complete:
        state = run.read_status().get("state", "unknown") if run.path.is_dir() else "no such folder"
        raise RunError(f"{run.path}: not a finished run ({state}); export a run whose training finished.")
    if out.path.exists() and any(out.path.iterdir()):
        raise RunError(f"{out.path}: exists and is not empty; export into a new or empty folder.")
    out.path.mkdir(parents=True, exist_ok=True)
    for f in run.shared_files():
        copy_file(f, out.path / f.name)  # the user's permissions, whatever the run's files have
    if not run.card_path.exists():  # a run finished before runs carried cards
        write_card(out)
    try:
        check_card(out.card_path)
    except RunError as e:  # a card written before its header was quoted (a base path with ": " or "#")
        warnings.warn(f"{e} Wrote a new one in the export.", RuntimeWarning, stacklevel=2)
        write_card(out)
    return out


def push_to_hub(folder: str | Path, repo_id: str, private: bool = False) -> str:
    """Upload an exported folder to the hub repository `repo_id` (created if needed); returns its URL. Its card is
    checked first (RunError before anything is sent), then by the hub's own validation before the upload."""
    card = check_card(Path(folder) / "README.md")
    if not hub_reachable():
        raise ServiceError(
            f"--push-to-hub {repo_id}: the hub is not reachable from here (offline, HF_HUB_OFFLINE set, or no "
            f"network). The export in {folder} is complete: upload it later with "
            f"`hf upload {repo_id} {folder}`."
        )
    from huggingface_hub import HfApi

    try:
        card.validate()  # the hub's own validation of the metadata, before the repository is made
    except ValueError as e:
        raise RunError(
            f"--push-to-hub {repo_id}: the hub refuses {folder}/README.md ({e}); nothing was uploaded."
        ) from e
    except Exception as e:  # the validation request itself failed
        raise ServiceError(
            f"--push-to-hub {repo_id}: the hub's card validation failed ({str(e).splitlines()[0]})."
        ) from e
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        return str(api.upload_folder(repo_id=repo_id, folder_path=str(folder)))
    except Exception as e:  # auth, permissions, a network that fails halfway
        raise ServiceError(f"--push-to-hub {repo_id}: the upload failed ({str(e).splitlines()[0]}).") from e
