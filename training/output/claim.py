"""Claiming the output folder before a run spends anything: writable, and no other run writing it. Called by train.py;
docs/checkpoints.md tells the rules.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import socket
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

    def __init__(self, run_id: str, handle=None, created: list[Path] | None = None):
        self.run_id = run_id
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
    output_dir: str | Path, accelerator: Accelerator, resuming: bool = False, overwrite: bool = False
) -> Claim:
    """The main process's claim on every rank, or UserError: another run's folder needs resume or `overwrite`."""
    root = Path(output_dir)
    created = [folder for folder in (root, *root.parents) if not folder.exists()] if accelerator.is_main_process else []
    held: list = []  # the lock's handle, on the main process

    def claim() -> str:
        problem = unwritable(root)
        if problem is None:
            handle, problem = lock(root)
            held.append(handle)
        if problem is None:
            remove_stale_staging(root)
            problem = None if resuming else previous_run(root, overwrite)
        if problem:
            raise UserError(problem)
        return f"{os.getpid()}-{secrets.token_hex(3)}"

    run_id = decided_on_main(accelerator, claim)
    return Claim(run_id, held[0] if held else None, created)


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


def previous_run(root: Path, overwrite: bool) -> str | None:
    """Why a new run may not start in `root`, or None; `overwrite` removes the other run's states."""
    states = sorted((root / files.STATE_DIR).glob(f"{files.STATE_PREFIX}*"))
    found = [p.name for p in (root / files.WEIGHTS, root / files.METRICS) if p.exists()]
    if not states and not found:
        return None
    if overwrite:
        shutil.rmtree(root / files.STATE_DIR, ignore_errors=True)
        logger.warning(
            "--overwrite_output_dir: removed the %d resumable states of the run before in %s", len(states), root
        )
        return None
    held = ", ".join(([f"{len(states)} states in {files.STATE_DIR}/"] if states else []) + found)
    return (
        f"--output_dir {root} holds another run ({held}): continue it with --resume_from_checkpoint latest, start "
        "over there with --overwrite_output_dir (its states are removed first), or pick another --output_dir."
    )


def remove_stale_staging(root: Path) -> None:
    """Half-written states of dead runs."""
    state = root / files.STATE_DIR
    if state.is_dir():
        for stale in state.glob(f"{files.STAGING_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
