"""Claiming the output folder before a run spends anything: writable, and no other run writing it. Called by train.py;
docs/checkpoints.md tells the rules.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from accelerate import Accelerator
from accelerate.logging import get_logger

from contract import files
from contract.errors import UserError
from training.collective import decided_on_main

logger = get_logger(__name__)

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; the writability check still runs
    fcntl = None


class Claim:
    """The held lock, this run's id, the folders made."""

    def __init__(
        self,
        run_id: str,
        handle=None,
        created: list[Path] | None = None,
        previous: Previous | None = None,
        done: bool = False,
    ):
        self.run_id = run_id
        self.previous = previous  # on the main process: what this run replaces as it saves
        self.done = done  # resuming a run that finished and kept no state: nothing to do
        self._handle = handle
        self._created = created or []  # deepest first

    def release(self) -> None:
        """Drop the lock and the empty folders made."""
        if self._handle is None:
            return
        self._handle.close()
        self._handle = None
        if self._created and [p.name for p in self._created[0].iterdir()] == [files.LOCK]:
            (self._created[0] / files.LOCK).unlink()
            for folder in self._created:
                if any(folder.iterdir()):
                    break
                folder.rmdir()


def claim_output_dir(
    output_dir: str | Path,
    accelerator: Accelerator,
    resuming: bool = False,
    overwrite: bool = False,
    base: str | None = None,
) -> Claim:
    """The main process's claim on every rank, or UserError: an unfinished run's folder needs resume or `overwrite`,
    another model's files `overwrite`; the folder of `base` (the model fine-tuned) is never written."""
    root = Path(output_dir)
    created = [folder for folder in (root, *root.parents) if not folder.exists()] if accelerator.is_main_process else []
    held: list = []  # the lock's handle, on the main process
    previous: list = []

    def claim() -> str:
        if base is not None and Path(base).is_dir() and Path(base).resolve() == root.resolve():
            raise UserError(
                f"--output_dir {root} is the model this run fine-tunes (--model_name_or_path): its files would be "
                "replaced while they are the base. Pick another --output_dir."
            )
        problem = unwritable(root)
        if problem is None:
            handle, problem = lock(root)
            held.append(handle)
        if problem:
            raise UserError(problem)
        remove_stale_staging(root)
        previous.append(None if resuming else previous_run(root, overwrite))
        done = resuming and finished(root) and not own_states(root)
        return f"{os.getpid()}-{secrets.token_hex(3)}", done

    run_id, done = decided_on_main(accelerator, claim)
    return Claim(run_id, held[0] if held else None, created, previous[0] if previous else None, done)


def unwritable(root: Path) -> str | None:
    """Why `root` cannot be written, or None."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write_test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"--output_dir {root} is not writable: {exc.strerror or exc}. Pick a folder you can write to."
    return None


def lock(root: Path):
    """(lock file, None) or (None, why)."""
    path = root / files.LOCK
    handle = open(path, "a+", encoding="utf-8")
    if fcntl is None:
        return handle, None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        return None, (
            f"--output_dir {root} is in use by another training run ({holder}). Wait for it to finish, stop it, "
            "or pick another --output_dir."
        )
    handle.seek(0)
    handle.truncate()
    handle.write(f"PID {os.getpid()} on {socket.gethostname()}")
    handle.flush()
    return handle, None


STATE_NAME = re.compile(rf"{files.STATE_PREFIX}\d+")  # what a run's states are called; anything else is not one


@dataclass
class Previous:
    """What another run (or model) left where this run writes: retired once this run has saved its own. Each entry
    is kept with its identity, so one this run has rewritten since is never removed."""

    root: Path
    states: dict[Path, tuple[int, int]]
    entries: dict[Path, tuple[int, int]]

    def retire(self, with_files: bool) -> None:
        """Remove the states (and with `with_files` the files) as found at the claim; log what was removed."""
        states = sum(_remove(path, ident) for path, ident in self.states.items())
        self.states = {}
        names = [path.name for path, ident in self.entries.items() if with_files and _remove(path, ident)]
        self.entries = self.entries if not with_files else {}
        if states or names:
            what = [f"{states} resumable states"] if states else []
            logger.info("Removed what the run before left in %s: %s", self.root, ", ".join(what + names))


def _identity(path: Path) -> tuple[int, int]:
    found = path.lstat()
    return found.st_ino, found.st_mtime_ns


def _remove(path: Path, ident: tuple[int, int]) -> bool:
    """Remove `path` if it is still what was found (a link itself, never what it points to)."""
    try:
        if _identity(path) != ident:
            return False
    except FileNotFoundError:
        return False
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    return True


def own_states(root: Path) -> list[Path]:
    """The run's states in `root`/state: `step_N` folders; a link there is refused, anything else left alone."""
    folder = state_folder(root)
    if not folder.is_dir():
        return []
    found = sorted(p for p in folder.iterdir() if STATE_NAME.fullmatch(p.name))
    links = [p for p in found if p.is_symlink() or not p.is_dir()]
    if links:
        raise UserError(
            f"{links[0]} is not a state this project wrote (a link or a file): remove it, or pick another --output_dir."
        )
    return found


def run_entries(root: Path) -> list[Path]:
    """What a run writes that `root` holds: its files, tokenizer, adapter and export folders (not its states)."""
    names = (*files.RUN_FILES, *files.TOKENIZER_FILES, files.TOKENIZER_DIR, files.ADAPTER_DIR, files.ONNX_DIR)
    found = [root / name for name in names if (root / name).exists() or (root / name).is_symlink()]
    return found + sorted(root.glob(files.HF_WEIGHT_SHARD))


def finished(root: Path) -> bool:
    """A run of this project ended here: its final metrics.json (written after the test split) is there."""
    try:
        summary = json.loads((root / files.METRICS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("train_runtime_s") is not None and (root / files.WEIGHTS).is_file()


def previous_run(root: Path, overwrite: bool) -> Previous | None:
    """What a new run in `root` replaces as it saves, or None; UserError for what it may not replace: an unfinished
    run (resume it) or another model's files, unless `overwrite`."""
    states, entries = own_states(root), run_entries(root)
    if not states and not entries:
        return None
    found = Previous(root, {p: _identity(p) for p in states}, {p: _identity(p) for p in entries})
    held = ([f"{len(states)} states in {files.STATE_DIR}/"] if states else []) + [p.name for p in entries[:6]]
    held += ["..."] if len(entries) > 6 else []
    ours = (root / files.METRICS).is_file() or (root / files.WEIGHTS).is_file()
    if overwrite or finished(root):
        logger.warning(
            "%s holds %s (%s): this run replaces them as it saves (--overwrite_output_dir or a finished run); until "
            "then they stay",
            root,
            "a finished run" if finished(root) else "another run" if ours or states else "another model's files",
            ", ".join(held),
        )
        return found
    if ours or states:
        raise UserError(
            f"--output_dir {root} holds an unfinished run ({', '.join(held)}): continue it with "
            "--resume_from_checkpoint latest, replace it with --overwrite_output_dir, or pick another --output_dir."
        )
    raise UserError(
        f"--output_dir {root} holds files this run would replace ({', '.join(held)}): pick another --output_dir, "
        "or pass --overwrite_output_dir to replace them."
    )


def state_folder(root: Path) -> Path:
    """`root`/state, or UserError when it is a link: what a run removes there must be its own."""
    folder = root / files.STATE_DIR
    if folder.is_symlink():
        raise UserError(
            f"{folder} is a symbolic link: a run keeps its states in a folder of its own. Remove the link, or pick "
            "another --output_dir."
        )
    return folder


def remove_stale_staging(root: Path) -> None:
    """Half-written states of dead runs; nothing is removed through a link (a linked state/ is refused first)."""
    state = state_folder(root)
    if not state.is_dir():
        return
    for stale in state.glob(f"{files.STAGING_PREFIX}*"):
        if stale.is_symlink() or not stale.is_dir():
            stale.unlink(missing_ok=True)  # the link itself, never what it points to
        else:
            shutil.rmtree(stale, ignore_errors=True)  # rmtree removes links inside without following them
