"""What a run leaves in --output_dir (docs/checkpoints.md), and how to find it again. Called by train.py and loop.py."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import gather_object
from accelerate.utils.constants import RNG_STATE_NAME
from safetensors import SafetensorError, safe_open
from transformers.utils import logging as transformers_logging

from contract import files, problem_types
from contract.adapters import adapter_digests
from contract.errors import UserError
from training import calibration, lora
from training.collective import decided_on_main
from training.output import model_card, provenance, reports
from training.output.atomic import as_plain_files, atomic_write, replace_dir, staging_dir, write_json
from training.output.claim import Previous
from training.output.progress import Progress
from training.output.state_files import PICKLED, restricted_reading, unsafe_file
from training.push import push as push_folder
from training.speed.cpu_speed import keep_saved_threads
from training.weights import edit_weights


class ResumeError(UserError, RuntimeError):
    """A resumable state that cannot continue this run exactly."""


logger = get_logger(__name__)
RNG_FILE = f"{RNG_STATE_NAME}_{{}}.pkl"  # accelerate's name for a rank's RNG state
SCHEDULE_FILE = "lr_scheduler.pt"  # the schedule's state, written by us: accelerate unpickles registered objects


# ------------------------------------------------------------------------------------------ best model


def write_weights(fh, weights: dict[str, torch.Tensor]) -> None:
    """The state_dict file's bytes (plain tensors: `torch.load(..., weights_only=True)` reads it)."""
    torch.save(weights, fh)


def _write_model_files(out: Path, unwrapped, weights: dict, tokenizer, export_hf: bool) -> None:
    """Main process: state_dict, config.json, export and tokenizer, each swapped in whole; config.json last, with the
    weights' sha256."""
    atomic_write(out / files.WEIGHTS, lambda fh: write_weights(fh, weights))
    digests = {files.WEIGHTS: files.tensors_sha256(weights)}  # before save_pretrained, which empties `weights`
    staging = staging_dir(".hf.", out)
    if export_hf:
        with _no_progress_bar():  # its one-shard bar would cut the training bar
            unwrapped.save_pretrained(staging, state_dict=weights)  # config.json + model.safetensors
        tokenizer.save_pretrained(staging)
    else:
        unwrapped.config.save_pretrained(staging)
        (out / files.HF_WEIGHTS).unlink(missing_ok=True)  # never leave an older model's export beside this one
    as_plain_files(staging)
    if (staging / files.HF_WEIGHTS).is_file():  # save_pretrained may leave out tied weights: hashed as written
        digests[files.HF_WEIGHTS] = files.tensors_sha256(safetensors.torch.load_file(staging / files.HF_WEIGHTS))
    config = json.loads((staging / files.CONFIG).read_text())
    (staging / files.CONFIG).write_text(json.dumps({**config, files.WEIGHTS_SHA256: digests}, indent=2) + "\n")
    for file in sorted(staging.iterdir(), key=lambda f: f.name == files.CONFIG):  # config.json last
        os.replace(file, out / file.name)
    shutil.rmtree(staging, ignore_errors=True)
    tok_staging = staging_dir(f".{files.TOKENIZER_DIR}.", out)
    tokenizer.save_pretrained(tok_staging)
    replace_dir(as_plain_files(tok_staging), out / files.TOKENIZER_DIR)


def _write_adapter(out: Path, model, config, tokenizer) -> None:
    """Main process: adapter/, swapped in whole."""
    staging = staging_dir(f".{files.ADAPTER_DIR}.", out)
    with _no_progress_bar():
        lora.save_adapter(model, staging)
    config.save_pretrained(staging)
    recorded = json.loads((staging / files.CONFIG).read_text())
    recorded[files.ADAPTER_SHA256] = adapter_digests(staging)
    (staging / files.CONFIG).write_text(json.dumps(recorded, indent=2) + "\n")
    tokenizer.save_pretrained(staging)
    replace_dir(as_plain_files(staging), out / files.ADAPTER_DIR)


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
    """The saved state_dict: plain tensors only."""
    return torch.load(path, map_location="cpu", weights_only=True)


# ------------------------------------------------------------------------------------ resumable state


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


# ------------------------------------------------------------------------------------ the output folder


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
                problem = attempt(lambda: _write_adapter(self.root, unwrapped, plain.config, tokenizer), self.root)
            problem = problem or attempt(
                lambda: _write_model_files(self.root, plain, weights, tokenizer, export_hf), self.root
            )
            if problem is None and self.previous is not None:  # this run's model is in place: the old one goes
                self.previous.retire(with_files=True)
        stop_together(accelerator, problem)  # also the barrier after the write

    def saved_calibration(self) -> dict:
        """config.json's calibration record, or {}."""
        path = self.path(files.CONFIG)
        if not path.is_file():
            return {}
        record = json.loads(path.read_text()).get(calibration.CONFIG_FIELD)
        try:
            return problem_types.calibration_of(types.SimpleNamespace(**{calibration.CONFIG_FIELD: record}))
        except problem_types.ProblemTypeError as exc:
            raise ResumeError(f"{path}: {exc}") from None

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

    def write_curves(self, progress: Progress, plot: bool = True) -> None:
        """training_curves.json, and with `plot` training_curves.png (training/output/reports.py)."""
        if self.accelerator.is_main_process:
            reports.write_training_curves(self.root, progress, plot)

    def write_final(self, summary: dict[str, Any], progress: Progress, hub_model_id: str | None) -> None:
        """The finished run's metrics.json, training curves and model card."""
        self.write_json(files.METRICS, summary)
        self.write_curves(progress)
        if self.accelerator.is_main_process:
            model_card.write_model_card(self.root, summary, hub_model_id)

    def export_runtime(self, runtime: str) -> None:
        """The best model converted by the service's own command, in its own process; a failure is one line."""

        def convert() -> None:
            command = [sys.executable, "-m", "inference.export", str(self.root), "--runtime", runtime]
            root = str(Path(__file__).resolve().parents[2])  # inference/ importable without installing
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
            code = subprocess.run(command, env=env, check=False).returncode
            if code != 0:
                raise UserError(f"export_runtime: {' '.join(command[1:])} failed (exit {code}; its log is above)")

        decided_on_main(self.accelerator, convert)

    def push(self, repo_id: str, private: bool) -> None:
        """Upload from the main process; the others wait."""
        if self.accelerator.is_main_process:
            push_folder(self.root, repo_id, private)
        self.accelerator.wait_for_everyone()
