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


def atomic_write(path: Path, write: Callable) -> None:
    """Call `write(fh)` on a temporary file beside `path`, flush it to disk, then rename it into place."""
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
    atomic_write(Path(path), lambda fh: fh.write(data))


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write(Path(path), lambda fh: fh.write(json.dumps(data, indent=2, default=str).encode() + b"\n"))


def replace_dir(staging: Path, target: Path) -> None:
    """Swap a fully written folder into place (the old one is removed only after the new one is there)."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
