"""Atomic file and folder writes: a reader (the service's reload watcher, a resumed run) sees the old content
or the new, never a partial file, and a crash mid-write leaves the previous version in place."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Read once, while importing (umask can only be read by setting it): what plain open() and mkdir() would give.
UMASK = os.umask(0o022)
os.umask(UMASK)


def atomic_write(path: Path, write: Callable) -> None:
    """Call `write(fh)` on a temporary file beside `path`, flush it to disk, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    # mkstemp makes the file private (0600): a service running as another user (a container) could not read it
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
    """A new folder beside its target, with the permissions mkdir would give (mkdtemp's are private: 0700)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    folder.chmod(0o777 & ~UMASK)
    return folder


def as_plain_files(folder: Path) -> Path:
    """Give every file under `folder` the permissions open() would: libraries that write through a private temporary
    file (transformers' save_pretrained: model.safetensors at 0600) leave files another user cannot read."""
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~UMASK)
    return folder


def replace_dir(staging: Path, target: Path) -> None:
    """Swap a fully written folder into place (the old one is removed only after the new one is there)."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
