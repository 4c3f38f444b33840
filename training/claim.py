"""Claiming the output folder before a run spends anything on it: writable, and no other run writing it.

The main process checks that --output_dir can be written (creating it if needed), takes an exclusive lock
on `.distilbert_agnews.lock` inside it (flock: the kernel drops it when the process ends, however it ends),
records its PID and host there, and removes staging folders that dead runs left behind (nobody else can be
writing: we hold the lock). The outcome is broadcast, so every rank stops with the same one-line error, or
goes on with the same run id (which names this run's staging folders). A run that stops before writing
anything (bad data, say) removes the folders it created: it leaves nothing behind.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import socket
from pathlib import Path

from accelerate import Accelerator

from contract import files
from contract.errors import UserError
from training.collective import decided_on_main

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; the writability check still runs
    fcntl = None


class OutputDirError(UserError, RuntimeError):
    """--output_dir cannot be used by this run."""


class Claim:
    """The lock's open file (kept open for the whole run), this run's id, and the folders it created."""

    def __init__(self, run_id: str, handle=None, created: list[Path] | None = None):
        self.run_id = run_id
        self._handle = handle
        self._created = created or []  # deepest first

    def release(self) -> None:
        """Drop the lock; folders this run created and left holding nothing but the lock file are removed."""
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


def claim_output_dir(output_dir: str | Path, accelerator: Accelerator) -> Claim:
    """On every rank: the main process's claim (its lock held there alone), or OutputDirError with its reason."""
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
        if problem:
            raise OutputDirError(problem)
        return f"{os.getpid()}-{secrets.token_hex(3)}"

    run_id = decided_on_main(accelerator, claim)
    return Claim(run_id, held[0] if held else None, created)


def unwritable(root: Path) -> str | None:
    """Why nothing can be written under `root`, or None; creates it when missing."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write_test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"--output_dir {root} is not writable: {exc.strerror or exc}. Pick a folder you can write to."
    return None


def lock(root: Path):
    """(open lock file, None) or (None, why): another process holds the folder."""
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


def remove_stale_staging(root: Path) -> None:
    """Half-written state folders of runs that died mid-save: they hold disk space and are never read."""
    state = root / files.STATE_DIR
    if state.is_dir():
        for stale in state.glob(f"{files.STAGING_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
