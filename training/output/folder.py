"""The run's output folder (docs/checkpoints.md): its paths, the best model and resumable states written by every
rank together, and the final reports. Called by set_up.py, loop.py and finish.py."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import shutil
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from safetensors import SafetensorError

from contract import files
from contract.errors import UserError
from training import lora
from training.collective import decided_on_main
from training.output.atomic import replace_dir, write_json
from training.output.best_model import load_weights, write_adapter, write_model_files
from training.output.claim import Previous
from training.output.progress import Progress
from training.output.resume import (
    SCHEDULE_FILE,
    check_layout,
    check_provenance,
    complete_states,
    pick_state,
    read_progress,
    read_schedule,
)
from training.output.state_files import restricted_reading
from training.weights import edit_weights


def attempt(write, path: Path) -> str | None:
    """Run `write()`; a full disk or refused permission is one line naming `path`."""
    try:
        write()
    except (OSError, RuntimeError, SafetensorError) as exc:
        message = str(exc).lower()  # torch.save: "enforce fail at inline_container.cc ... file write failed"
        full = isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "write failed" in message
        full = full or "inline_container" in message
        cause = "no space left on device" if full else (getattr(exc, "strerror", None) or str(exc).splitlines()[0])
        return f"could not save {path}: {cause}"
    return None


def stop_together(accelerator: Accelerator, problem: str | None, staging: Path | None = None) -> None:
    """Every rank learns whether any write failed, and all raise the same line; the staging folder removed last."""
    problems = [p for p in gather_object([problem]) if p]
    if problems:
        if staging is not None and accelerator.is_local_main_process:
            shutil.rmtree(staging, ignore_errors=True)
        raise UserError(problems[0])


class OutputDir:
    """The run's output folder: paths, writes, states."""

    def __init__(
        self,
        root: str | Path,
        accelerator: Accelerator,
        keep_states: int | None = None,
        run_id: str = "run",
        previous: Previous | None = None,
    ):
        self.root = Path(root)
        self.accelerator = accelerator
        self.keep_states = keep_states
        self.run_id = run_id  # names this run's staging folders (training/output/claim.py)
        self.previous = previous  # what the run before left: retired once this run has saved its own

    def path(self, name: str) -> Path:
        """A file of the folder, by its name in contract/files.py."""
        return self.root / name

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            write_json(self.path(name), data)

    def save_model(self, model: torch.nn.Module, tokenizer, export_hf: bool = True) -> None:
        """The servable best model: weights, config.json, tokenizer, export; LoRA merged, adapter/ beside. All ranks."""
        accelerator = self.accelerator
        accelerator.wait_for_everyone()
        unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
        adapters = lora.is_lora(unwrapped)
        # all ranks: FSDP gathers the full state dict from each
        state_dict = None if adapters else accelerator.get_state_dict(model)
        problem = None
        if accelerator.is_main_process:
            self.root.mkdir(parents=True, exist_ok=True)
            plain = lora.merged_copy(unwrapped) if adapters else unwrapped
            state_dict = plain.state_dict() if adapters else state_dict
            weights = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state_dict.items()}
            if adapters:
                problem = attempt(lambda: write_adapter(self.root, unwrapped, plain.config, tokenizer), self.root)
            problem = problem or attempt(
                lambda: write_model_files(self.root, plain, weights, tokenizer, export_hf), self.root
            )
            if problem is None and self.previous is not None:  # this run's model is in place: the old one goes
                self.previous.retire(with_files=True)
        stop_together(accelerator, problem)  # also the barrier after the write

    def restore_best(self, model: torch.nn.Module) -> None:
        """The saved best weights put back into `model`."""
        unwrapped = self.accelerator.unwrap_model(model, keep_torch_compile=False)
        if lora.is_lora(unwrapped):
            lora.restore_adapter(unwrapped, self.path(files.ADAPTER_DIR))
        else:  # FSDP's parameters are shards
            edit_weights(self.accelerator, model, lambda w: w.update(load_weights(self.path(files.WEIGHTS))))

    def state_path(self, step: int) -> Path:
        return self.root / files.STATE_DIR / f"{files.STATE_PREFIX}{step}"

    def save_state(self, progress: Progress, scheduler) -> Path:
        """Save a state to staging, rename when complete, keep the newest. All ranks."""
        accelerator = self.accelerator
        target = self.state_path(progress.global_step)
        staging = target.with_name(f"{files.STAGING_PREFIX}{target.name}.{self.run_id}")
        accelerator.wait_for_everyone()
        # each rank writes its RNG, the main process the rest
        problem = attempt(lambda: accelerator.save_state(str(staging)), staging)
        stop_together(accelerator, problem, staging)
        if accelerator.is_main_process:
            problem = attempt(lambda: self._publish(staging, target, progress, scheduler), staging)
        stop_together(accelerator, problem, staging)
        return target

    def remove_states(self) -> None:
        """A finished run's resumable states removed (main process); other files in state/ stay."""
        for _, folder in complete_states(self.root):
            shutil.rmtree(folder)
        with contextlib.suppress(OSError):  # not empty: what others put there stays
            (self.root / files.STATE_DIR).rmdir()

    def _publish(self, staging: Path, target: Path, progress: Progress, scheduler) -> None:
        """Main process: schedule state, progress.json last, swap, rotate."""
        torch.save(scheduler.state_dict(), staging / SCHEDULE_FILE)  # numbers and lists: read with weights_only
        write_json(staging / files.PROGRESS, dataclasses.asdict(progress))
        replace_dir(staging, target)
        if self.previous is not None:  # `latest` finds only this run's states from now on
            self.previous.retire(with_files=False)
        if self.keep_states:
            for _, folder in complete_states(self.root)[: -self.keep_states]:
                shutil.rmtree(folder)

    def resume(
        self, spec: str | None, current: Progress, scheduler, allow_inexact: bool = False
    ) -> tuple[Path, Progress] | None:
        """Restore every state from `spec` if this run saved it; (folder, progress) or None."""
        if not spec:
            return None
        folder = self._pick_on_main(spec, allow_inexact)
        if folder is None:
            return None
        progress = read_progress(folder)
        check_layout(folder, progress, current.layout)
        check_provenance(folder, progress, current.provenance, allow_inexact)
        with restricted_reading():  # checked above, and read again under the same rules: a swapped file runs nothing
            self.accelerator.load_state(str(folder))
        scheduler.load_state_dict(read_schedule(folder))
        progress.layout, progress.provenance = current.layout, current.provenance
        return folder, progress

    def _pick_on_main(self, spec: str, allow_inexact: bool) -> Path | None:
        """pick_state on the main process, its answer on every rank."""
        accelerator = self.accelerator
        return decided_on_main(
            accelerator, lambda: pick_state(self.root, spec, accelerator.num_processes, allow_inexact)
        )
