"""Which saved state a run may resume from, and why not: complete, undamaged, safe to unpickle, the same layout and
run. Called by folder.py (OutputDir.resume)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import torch
from accelerate.logging import get_logger
from accelerate.utils.constants import RNG_STATE_NAME
from safetensors import SafetensorError, safe_open

from contract import files
from contract.errors import UserError
from training.output import provenance
from training.output.progress import Progress
from training.output.state_files import PICKLED, unsafe_file
from training.speed.cpu_speed import keep_saved_threads


class ResumeError(UserError, RuntimeError):
    """A resumable state that cannot continue this run exactly."""


logger = get_logger(__name__)
RNG_FILE = f"{RNG_STATE_NAME}_{{}}.pkl"  # accelerate's name for a rank's RNG state
SCHEDULE_FILE = "lr_scheduler.pt"  # the schedule's state, written by us: accelerate unpickles registered objects


def complete_states(output_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete state, oldest first."""
    root = Path(output_dir) / files.STATE_DIR
    folders = (
        [f for f in root.glob(f"{files.STATE_PREFIX}*") if (f / files.PROGRESS).is_file()] if root.is_dir() else []
    )
    states = []
    for folder in folders:
        try:
            states.append((read_progress(folder).global_step, folder))
        except ResumeError as exc:
            logger.warning("Skipping a damaged state: %s", exc)
    return sorted(states)


def read_progress(state_folder: str | Path) -> Progress:
    path = Path(state_folder) / files.PROGRESS
    try:
        with open(path, encoding="utf-8") as fh:
            return Progress(**json.load(fh))
    except (OSError, ValueError, TypeError) as exc:  # unreadable, not JSON, or not the fields of Progress
        raise ResumeError(f"{path} is unreadable: {exc}") from exc


def damaged_file(folder: Path) -> tuple[Path, str] | None:
    """The first state file that cannot be read whole, and why; nothing unpickled."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        try:
            if path.suffix in PICKLED:
                with zipfile.ZipFile(path) as archive:
                    bad = archive.testzip()
                if bad:
                    return path, f"member {bad} fails its checksum"
            elif path.suffix == ".safetensors":
                with safe_open(str(path), "pt") as fh:
                    fh.keys()
        except (OSError, zipfile.BadZipFile, SafetensorError) as exc:
            return path, str(exc)
    return None


def read_schedule(folder: Path) -> dict:
    """The schedule's state (checked by pick_state)."""
    return torch.load(folder / SCHEDULE_FILE, map_location="cpu", weights_only=True)


def missing_rng(folder: Path, num_processes: int) -> str | None:
    """Why some rank's RNG cannot be restored, or None."""
    missing = [RNG_FILE.format(i) for i in range(num_processes) if not (folder / RNG_FILE.format(i)).is_file()]
    if missing:
        return f"{folder} has no {', '.join(missing)}: the random number generators cannot be restored"
    return None


def unusable(folder: Path, num_processes: int, allow_inexact: bool) -> str | None:
    """Why this state cannot be resumed from."""
    if not (folder / SCHEDULE_FILE).is_file():
        return f"{folder / SCHEDULE_FILE}: missing (the learning-rate schedule cannot continue)"
    damaged = damaged_file(folder)
    rng_only = damaged is not None and damaged[0].name.startswith(f"{RNG_STATE_NAME}_")
    if damaged and not rng_only:
        return f"{damaged[0]}: {damaged[1]}"
    problem = f"{damaged[0]}: {damaged[1]}" if damaged else missing_rng(folder, num_processes)
    if problem is None:
        return None
    if not allow_inexact:
        return f"{problem}; pass --allow_inexact_resume to continue anyway, not bitwise as if never stopped"
    logger.warning("%s; resuming anyway (--allow_inexact_resume): not bitwise as if never stopped", problem)
    return None


def refuse_unsafe(folder: Path) -> None:
    if problem := unsafe_file(folder):
        raise ResumeError(f"cannot resume from {folder}: {problem}")


def pick_state(output_dir: Path, spec: str, num_processes: int, allow_inexact: bool) -> Path | None:
    """The folder to resume from; 'latest' skips damaged states, named."""
    if spec != "latest":
        folder = Path(spec)
        if not (folder / files.PROGRESS).is_file():
            raise ResumeError(f"{folder}: not a resumable state (no {files.PROGRESS})")
        refuse_unsafe(folder)
        if problem := unusable(folder, num_processes, allow_inexact):
            raise ResumeError(f"cannot resume from {folder}: {problem}")
        return folder
    states = complete_states(output_dir)
    for _, folder in reversed(states):
        refuse_unsafe(folder)  # tampered with: no fallback
        problem = unusable(folder, num_processes, allow_inexact)
        if problem is None:
            return folder
        logger.warning("Not resuming from %s: %s. Trying the previous state.", folder.name, problem)
    if states:
        raise ResumeError(f"no usable state under {Path(output_dir) / files.STATE_DIR} (see the warnings above)")
    return None


def check_layout(state_folder: Path, progress: Progress, layout: dict[str, Any]) -> None:
    """A state continues only with its layout: positions and schedule depend on it."""
    saved = progress.layout or {}
    keep_saved_threads(saved, layout)
    # unrecorded keys are not compared
    changed = ", ".join(f"{k} {saved[k]} -> {v}" for k, v in layout.items() if k in saved and saved[k] != v)
    if changed:
        raise ResumeError(
            f"{state_folder} was saved with a different layout ({changed}): its steps per epoch and learning-rate "
            "schedule (for cpu_threads, its sums; for optim, its optimizer state) would not continue. Resume with the "
            "same launch config, batch settings, --optim and OMP_NUM_THREADS, or start a new "
            f"run from its best model: --model_name_or_path {state_folder.parent.parent}"
        )


def check_provenance(state_folder: Path, progress: Progress, current: dict[str, Any], allow_inexact: bool) -> None:
    """A state continues only its run: changes refused, unless `allow_inexact`."""
    changed = provenance.changes(progress.provenance, current)
    if not changed:
        return
    if not allow_inexact:
        raise ResumeError(
            f"{state_folder} was saved by a run with other data or settings ({provenance.describe(changed)}): "
            "resuming would mix two runs. Resume with the same ones, pass --allow_inexact_resume to continue anyway "
            f"(metrics.json then records both), or start a new run from its best model: --model_name_or_path "
            f"{state_folder.parent.parent}"
        )
    logger.warning(
        "Resuming from %s although %s (--allow_inexact_resume); metrics.json records both",
        state_folder,
        provenance.describe(changed),
    )
    progress.inexact_resumes.append({"step": progress.global_step, "changed": changed})
