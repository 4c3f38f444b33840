"""What a run leaves in --output_dir, and how to find it again.

    distilbert_agnews.pt   state_dict of the best model, unwrapped (no "module."/"_orig_mod." prefixes)
    config.json            model config with id2label / label2id
    tokenizer/             tokenizer.save_pretrained
    model.safetensors      the same weights in Hugging Face format, with the tokenizer files beside config.json
                           (--export_hf_format, default on): `transformers.pipeline(model=output_dir)` loads it
    metrics.json           validation (best) and test metrics, config, versions, world size
    state/step_N/          resumable state: accelerator.save_state + progress.json

Every writer here is called on ALL ranks (so they stay in step) and writes on the main process only,
except `accelerator.save_state`, which by accelerate's design also stores each rank's RNG state. Files
and state folders are written under a temporary name and renamed into place, so a crash mid-save leaves
the previous checkpoint intact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from accelerate import Accelerator
from transformers.utils import logging as transformers_logging

from inference import files
from training import faults



@dataclass
class Progress:
    """Where training stands; saved with every resumable state."""

    epoch: int = 0
    """Epoch in progress (0-based)."""
    batches_done: int = 0
    """Batches of that epoch each rank has already trained on."""
    global_step: int = 0
    """Optimizer steps taken."""
    best_metric: Optional[float] = None
    """Best validation value of metric_for_best_model so far."""
    best_step: Optional[int] = None
    """Optimizer step at which the best model was saved."""
    best_validation: dict[str, Any] = field(default_factory=dict)
    """All validation metrics of the best model."""
    evals_since_best: int = 0
    """Evaluations without improvement (early stopping)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """Every evaluation: step, epoch and metrics."""
    train_loss: list[dict[str, Any]] = field(default_factory=list)
    """Every logged training loss (mean over ranks): step, loss, learning rate."""
    layout: dict[str, Any] = field(default_factory=dict)
    """World size, batch size, accumulation, seed: what fixes the order of the batches."""


class ResumeError(RuntimeError):
    """A resumable state that cannot continue this run exactly."""


# ----------------------------------------------------------------------------------------- file writes


def _atomic_write_bytes(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_bytes(path: Path, data: bytes) -> None:
    """Write a file atomically: a reader sees the old content or the new, never a partial file."""
    _atomic_write_bytes(Path(path), lambda fh: fh.write(data))


def write_json(path: Path, data: dict[str, Any]) -> None:
    _atomic_write_bytes(Path(path), lambda fh: fh.write(json.dumps(data, indent=2, default=str).encode() + b"\n"))


def _replace_dir(staging: Path, target: Path) -> None:
    """Swap a fully written folder into place (the old one is removed only after the new one is there)."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------ best model


def save_model(accelerator: Accelerator, model: torch.nn.Module, tokenizer, output_dir: str,
               export_hf: bool = True) -> None:
    """Write the servable model: weights, config.json, tokenizer/; with `export_hf` also model.safetensors and
    the tokenizer files beside config.json (Hugging Face format: `pipeline(model=output_dir)`). Call on all ranks."""
    accelerator.wait_for_everyone()
    # Every rank takes part: under FSDP or DeepSpeed ZeRO-3 the full state dict is gathered from all of them.
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
        weights = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state_dict.items()}

        def write_weights(fh) -> None:
            torch.save(weights, fh)
            faults.in_save_model()  # test-only, inert: a kill here leaves a partial temp file, never the target

        _atomic_write_bytes(out / files.WEIGHTS, write_weights)
        staging = Path(tempfile.mkdtemp(prefix=".hf.", dir=out))
        if export_hf:
            with _no_progress_bar():  # a one-shard "Writing model shards" bar would cut through the training bar
                unwrapped.save_pretrained(staging, state_dict=weights)  # config.json + model.safetensors
            tokenizer.save_pretrained(staging)
        else:
            unwrapped.config.save_pretrained(staging)
            (out / files.HF_WEIGHTS).unlink(missing_ok=True)  # never leave an older model's export beside this one
        for file in staging.iterdir():
            os.replace(file, out / file.name)
        shutil.rmtree(staging, ignore_errors=True)
        tok_staging = Path(tempfile.mkdtemp(prefix=f".{files.TOKENIZER_DIR}.", dir=out))
        tokenizer.save_pretrained(tok_staging)
        _replace_dir(tok_staging, out / files.TOKENIZER_DIR)
    accelerator.wait_for_everyone()


@contextlib.contextmanager
def _no_progress_bar():
    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The saved state_dict, refusing anything but plain tensors (never unpickles code)."""
    return torch.load(path, map_location="cpu", weights_only=True)


# ------------------------------------------------------------------------------------ resumable state


def state_path(output_dir: str, step: int) -> Path:
    return Path(output_dir) / files.STATE_DIR / f"{files.STATE_PREFIX}{step}"


def save_state(accelerator: Accelerator, output_dir: str, progress: Progress, keep: Optional[int] = None) -> Path:
    """accelerator.save_state into a temporary folder, then rename to state/step_N. Call on all ranks.

    With `keep`, only the newest `keep` states (by recorded step) remain afterwards.
    """
    target = state_path(output_dir, progress.global_step)
    staging = target.with_name(f".tmp_{target.name}")
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))  # model, optimizer, scheduler, grad scaler, every rank's RNG
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json(staging / files.PROGRESS, dataclasses.asdict(progress))
        faults.in_save_state(progress.global_step)  # test-only, inert: a kill here leaves only .tmp_step_N
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        if keep:
            prune_states(output_dir, keep)
    accelerator.wait_for_everyone()
    return target


def complete_states(output_dir: str) -> list[tuple[int, Path]]:
    """(recorded step, folder) of every complete state, oldest first; half-written ones have no progress.json."""
    root = Path(output_dir) / files.STATE_DIR
    folders = [f for f in root.glob(f"{files.STATE_PREFIX}*") if (f / files.PROGRESS).is_file()] if root.is_dir() else []
    return sorted((read_progress(f).global_step, f) for f in folders)


def prune_states(output_dir: str, keep: int) -> None:
    """Delete all but the newest `keep` resumable states. The best-model files live outside state/."""
    for _, folder in complete_states(output_dir)[:-keep]:
        shutil.rmtree(folder)


def read_progress(state_folder: str | Path) -> Progress:
    with open(Path(state_folder) / files.PROGRESS, encoding="utf-8") as fh:
        return Progress(**json.load(fh))


def find_latest_state(output_dir: str) -> Optional[Path]:
    """The complete state folder with the highest recorded optimizer step (not the newest mtime)."""
    states = complete_states(output_dir)
    return states[-1][1] if states else None


def load_state(accelerator: Accelerator, state_folder: str | Path, layout: dict[str, Any]) -> Progress:
    """Restore model, optimizer, scheduler and RNG states; return where training stood.

    A state saved mid-epoch can only continue with the same batch layout (the position in the epoch is
    counted in batches per rank); at an epoch boundary a different layout is allowed (e.g. more GPUs).
    """
    if not (Path(state_folder) / files.PROGRESS).is_file():
        raise ResumeError(f"{state_folder}: not a resumable state (no {files.PROGRESS})")
    progress = read_progress(state_folder)
    if progress.batches_done and progress.layout != layout:
        raise ResumeError(
            f"{state_folder} was saved mid-epoch with {progress.layout}; this run has {layout}. Resume with the "
            "same launch config and batch settings, or from a state saved at the end of an epoch."
        )
    accelerator.load_state(str(state_folder))
    progress.layout = layout
    return progress
