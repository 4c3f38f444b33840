"""Atomic file and folder writes: readers see the old content or the new, never a partial file. Called by every writer
of the output folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# umask can only be read by setting it: once, at import
UMASK = os.umask(0o022)
os.umask(UMASK)


def atomic_write(path: Path, write: Callable) -> None:
    """Write beside `path`, flush, then rename into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    # mkstemp's 0600 would hide the file from another user's service
    os.chmod(tmp, 0o666 & ~UMASK)
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
    atomic_write(Path(path), lambda fh: fh.write(data))


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write(Path(path), lambda fh: fh.write(json.dumps(data, indent=2, default=str).encode() + b"\n"))


def staging_dir(prefix: str, parent: Path) -> Path:
    """A new folder beside its target, with mkdir's permissions."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    folder.chmod(0o777 & ~UMASK)
    return folder


def as_plain_files(folder: Path) -> Path:
    """Give files under `folder` open()'s permissions: some libraries write private files."""
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~UMASK)
    return folder


def replace_dir(staging: Path, target: Path) -> None:
    """Swap a written folder into place; the old goes after."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
