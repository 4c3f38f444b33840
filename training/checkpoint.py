"""What a run leaves in --output_dir, and how to find it again.

    distilbert_agnews.pt   state_dict of the best model, unwrapped (no "module."/"_orig_mod." prefixes)
    config.json            model config with id2label / label2id
    tokenizer/             tokenizer.save_pretrained
    model.safetensors      the same weights in Hugging Face format, with the tokenizer files beside config.json
                           (--export_hf_format, default on): `transformers.pipeline(model=output_dir)` loads it
    metrics.json           validation (best) and test metrics, config, versions, world size
    state/step_N/          resumable state: accelerator.save_state + progress.json

`OutputDir` owns that folder during a run: every path in it (names from inference/files.py), every write
(on the main process only, checked here), the resumable states and their rotation. Its `save_model` and
`save_state` are called on ALL ranks (so they stay in step); only `accelerator.save_state` writes on every
rank, by accelerate's design (each rank's RNG state). Files and state folders are written under a
temporary name and renamed into place, so a crash mid-save leaves the previous checkpoint intact.
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
from typing import Any

import torch
from accelerate import Accelerator
from transformers.utils import logging as transformers_logging

from inference import files
from training import model_card, reports
from training.atomic import atomic_write, replace_dir, write_json
from training.push import push as push_folder


@dataclass
class Progress:
    """Where training stands; saved with every resumable state."""

    epoch: int = 0
    """Epoch in progress (0-based)."""
    batches_done: int = 0
    """Batches of that epoch each rank has already trained on."""
    global_step: int = 0
    """Optimizer steps taken."""
    best_metric: float | None = None
    """Best validation value of metric_for_best_model so far."""
    best_step: int | None = None
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


# ------------------------------------------------------------------------------------------ best model


def write_weights(fh, weights: dict[str, torch.Tensor]) -> None:
    """The state_dict file's bytes (plain tensors: `torch.load(..., weights_only=True)` reads it)."""
    torch.save(weights, fh)


def _write_model_files(out: Path, unwrapped, weights: dict, tokenizer, export_hf: bool) -> None:
    """Main process: the state_dict, config.json (+ the Hugging Face export), tokenizer/; each swapped in whole."""
    atomic_write(out / files.WEIGHTS, lambda fh: write_weights(fh, weights))
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
    replace_dir(tok_staging, out / files.TOKENIZER_DIR)


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


def publish_state(staging: Path, target: Path) -> None:
    """Rename a fully written state folder into place (replacing a folder of the same step)."""
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)


def complete_states(output_dir: str | Path) -> list[tuple[int, Path]]:
    """(recorded step, folder) of every complete state, oldest first; half-written ones have no progress.json."""
    root = Path(output_dir) / files.STATE_DIR
    folders = (
        [f for f in root.glob(f"{files.STATE_PREFIX}*") if (f / files.PROGRESS).is_file()] if root.is_dir() else []
    )
    return sorted((read_progress(f).global_step, f) for f in folders)


def read_progress(state_folder: str | Path) -> Progress:
    with open(Path(state_folder) / files.PROGRESS, encoding="utf-8") as fh:
        return Progress(**json.load(fh))


def find_latest_state(output_dir: str | Path) -> Path | None:
    """The complete state folder with the highest recorded optimizer step (not the newest mtime)."""
    states = complete_states(output_dir)
    return states[-1][1] if states else None


def check_layout(state_folder: Path, progress: Progress, layout: dict[str, Any]) -> None:
    """A state saved mid-epoch continues only with the same batch layout (its position in the epoch is
    counted in batches per rank); at an epoch boundary a different layout is allowed (e.g. more GPUs)."""
    if progress.batches_done and progress.layout != layout:
        raise ResumeError(
            f"{state_folder} was saved mid-epoch with {progress.layout}; this run has {layout}. Resume with the "
            "same launch config and batch settings, or from a state saved at the end of an epoch."
        )


# ------------------------------------------------------------------------------------ the output folder


class OutputDir:
    """The run's output folder: its paths, its writes (main process only), its resumable states."""

    def __init__(self, root: str | Path, accelerator: Accelerator, keep_states: int | None = None):
        self.root = Path(root)
        self.accelerator = accelerator
        self.keep_states = keep_states

    def path(self, name: str) -> Path:
        """A file of the folder, by its name in inference/files.py."""
        return self.root / name

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            write_json(self.path(name), data)

    def save_model(self, model: torch.nn.Module, tokenizer, export_hf: bool = True) -> None:
        """The servable best model: weights, config.json, tokenizer/ (and with `export_hf` model.safetensors
        and the tokenizer files beside config.json: `pipeline(model=output_dir)`). Call on all ranks."""
        accelerator = self.accelerator
        accelerator.wait_for_everyone()
        # Every rank takes part: under FSDP or DeepSpeed ZeRO-3 the full state dict is gathered from all of them.
        state_dict = accelerator.get_state_dict(model)
        if accelerator.is_main_process:
            self.root.mkdir(parents=True, exist_ok=True)
            weights = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state_dict.items()}
            _write_model_files(
                self.root, accelerator.unwrap_model(model, keep_torch_compile=False), weights, tokenizer, export_hf
            )
        accelerator.wait_for_everyone()

    def state_path(self, step: int) -> Path:
        return self.root / files.STATE_DIR / f"{files.STATE_PREFIX}{step}"

    def save_state(self, progress: Progress) -> Path:
        """accelerator.save_state into a staging folder, renamed to state/step_N when complete; then only the
        newest `keep_states` remain. Call on all ranks."""
        accelerator = self.accelerator
        target = self.state_path(progress.global_step)
        staging = target.with_name(f".tmp_{target.name}")
        if accelerator.is_main_process:
            shutil.rmtree(staging, ignore_errors=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(staging))  # model, optimizer, scheduler, grad scaler, every rank's RNG
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            write_json(staging / files.PROGRESS, dataclasses.asdict(progress))
            publish_state(staging, target)
            if self.keep_states:
                for _, folder in complete_states(self.root)[: -self.keep_states]:
                    shutil.rmtree(folder)
        accelerator.wait_for_everyone()
        return target

    def resume(self, spec: str | None, layout: dict[str, Any]) -> tuple[Path, Progress] | None:
        """Restore model, optimizer, scheduler and RNG states from `spec` ('latest' or a state folder);
        (folder, where training stood), or None when there is nothing to resume."""
        folder = find_latest_state(self.root) if spec == "latest" else Path(spec) if spec else None
        if folder is None:
            return None
        if not (folder / files.PROGRESS).is_file():
            raise ResumeError(f"{folder}: not a resumable state (no {files.PROGRESS})")
        progress = read_progress(folder)
        check_layout(folder, progress, layout)
        self.accelerator.load_state(str(folder))
        progress.layout = layout
        return folder, progress

    def write_curves(self, progress: Progress) -> None:
        """training_curves.json and .png (training/reports.py)."""
        if self.accelerator.is_main_process:
            reports.write_training_curves(self.root, progress)

    def write_final(self, summary: dict[str, Any], progress: Progress, hub_model_id: str | None) -> None:
        """The finished run's metrics.json, training curves and model card."""
        self.write_json(files.METRICS, summary)
        self.write_curves(progress)
        if self.accelerator.is_main_process:
            model_card.write_model_card(self.root, summary, hub_model_id)

    def push(self, repo_id: str, private: bool) -> None:
        """Upload the folder (training/push.py) from the main process; the others wait for it."""
        if self.accelerator.is_main_process:
            push_folder(self.root, repo_id, private)
        self.accelerator.wait_for_everyone()
