"""Reading a resumable state folder that someone else may have written: nothing in it runs code, no link leads out.
Called by resume.py (the check before a resume) and folder.py (the reader a resume loads sharded states through).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from accelerate.utils import load as accelerate_load
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import StorageMeta

from contract.errors import UserError

PICKLED = (".bin", ".pkl", ".pt")  # torch.save archives: a pickle beside the tensors
CUSTOM_STATE = re.compile(r"custom_checkpoint_\d+\.pkl")  # accelerate reads these with weights_only=False
DCP_INDEX = ".metadata"  # torch.distributed.checkpoint's index: `.metadata`, or a rank's `__N.metadata`
DCP_GLOBALS = {  # layout, sizes, dtypes and a path
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "ChunkStorageMetadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
}


class StateRefused(UserError, RuntimeError):
    """A state file that could run code or leads outside its folder."""


class _LayoutOnly(pickle.Unpickler):
    """Unpickles only DCP_GLOBALS and torch dtypes."""

    def find_class(self, module: str, name: str):
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) in DCP_GLOBALS or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")


def read_index(stream, path: Path):
    """A DCP index through _LayoutOnly; its data files must be plain names beside it."""
    try:
        index = _LayoutOnly(stream).load()
    except pickle.UnpicklingError as exc:
        what = forbidden_global(str(exc))
        raise StateRefused(f"{path}: holds more than a checkpoint's layout ({what}); refused") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise StateRefused(f"{path}: unreadable ({exc})") from None
    for info in (getattr(index, "storage_data", None) or {}).values():
        name = str(getattr(info, "relative_path", ""))
        if not name or Path(name).name != name or name in (".", ".."):
            raise StateRefused(f"{path}: names a data file outside its folder ({name!r}); refused")
    return index


def forbidden_global(message: str) -> str:
    """torch's refusal, down to the object named."""
    found = re.search(r"GLOBAL ([\w.]+)", message)
    return f"it would import {found.group(1)}" if found else "an object torch refuses to load"


def unsafe_file(folder: Path) -> str | None:
    """Why a state folder must not be read at all, or None: no links, every pickle only data, every DCP index only a
    layout. The readers below enforce the same while loading, so a file swapped after this check runs nothing."""
    if folder.is_symlink():
        return f"{folder}: a symbolic link; a state is read only from its own folder"
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            return f"{path}: a symbolic link (to {os.readlink(path)}); a state is read only from its own files"
        if path.name.endswith(DCP_INDEX) and path.is_file():
            try:
                with open(path, "rb") as fh:
                    read_index(fh, path)
            except StateRefused as exc:
                return str(exc)
            continue
        if CUSTOM_STATE.fullmatch(path.name):
            return (
                f"{path}: a registered object's pickle, which this project never writes and accelerate would unpickle "
                "without restriction (it could run code); refused"
            )
        if path.suffix in PICKLED and (problem := _unsafe_pickle(path)):
            return problem
    return None


def _unsafe_pickle(path: Path) -> str | None:
    try:
        accelerate_load(path, map_location="cpu", mmap=True)  # weights_only, as accelerate loads it; mmap: no tensors
    except pickle.UnpicklingError as exc:
        what = str(exc).splitlines()[-1] if "GLOBAL" not in str(exc) else forbidden_global(str(exc))
        return f"{path}: holds more than tensors and numbers ({what}); refused (unpickling it could run code)"
    except (OSError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile):
        return None  # damaged, not unsafe: checkpoint.damaged_file names it
    return None


class _NoLinks(FileSystem):
    """torch's file system for one folder: reads its own plain files only, never through a link."""

    def __init__(self, root: Path):
        self.root = root

    @contextlib.contextmanager
    def create_stream(self, path, mode: str) -> Iterator[io.IOBase]:
        path = Path(path)
        if mode != "rb" or path.parent != self.root:
            raise StateRefused(f"{path}: not a file of {self.root} to read; refused")
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
        try:
            folder = os.open(self.root, flags | os.O_DIRECTORY)
        except OSError as exc:
            raise StateRefused(f"{self.root}: {exc.strerror} (a symbolic link is refused)") from None
        try:
            fd = os.open(path.name, flags, dir_fd=folder)
        except OSError as exc:
            raise StateRefused(f"{path}: {exc.strerror} (a symbolic link is refused)") from None
        finally:
            os.close(folder)
        with os.fdopen(fd, "rb") as stream:
            yield stream


class _CheckedBytes:
    """A load planner whose byte items are unpickled only when they hold data (torch's planner unpickles them
    unrestricted)."""

    def __init__(self, planner):
        self._planner = planner

    def __getattr__(self, name: str):
        return getattr(self._planner, name)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            torch.load(io.BytesIO(value.getbuffer()), map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
            raise StateRefused(
                f"a state item ({read_item.dest_index.fqn}) is not plain data ({exc}); refused"
            ) from None
        value.seek(0)
        self._planner.load_bytes(read_item, value)


class LayoutOnlyReader(dcp.FileSystemReader):
    """torch's FileSystemReader with both of its unpicklings restricted and links refused."""

    def __init__(self, path, *args, **kwargs):
        super().__init__(path, *args, **kwargs)
        self.fs = _NoLinks(Path(path))

    def read_metadata(self, *args, **kwargs):
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        with self.fs.create_stream(path, "rb") as stream:
            index = read_index(stream, path)
        if getattr(index, "storage_meta", None) is None:
            index.storage_meta = StorageMeta()
        index.storage_meta.load_id = self.load_id
        return index

    def read_data(self, plan, planner):
        return super().read_data(plan, _CheckedBytes(planner))


@contextlib.contextmanager
def restricted_reading() -> Iterator[None]:
    """While a state loads, accelerate's FSDP path builds LayoutOnlyReader: it names torch's reader at call time.
    A refusal inside DCP's load comes back as the one line it is, on every rank (DCP gathers every rank's failure)."""
    original = dcp.FileSystemReader
    dcp.FileSystemReader = LayoutOnlyReader
    try:
        yield
    except CheckpointException as exc:  # a BaseException: it would pass every `except Exception` above
        refused = [failure for failure, _ in exc.failures.values() if isinstance(failure, StateRefused)]
        if refused:
            raise refused[0] from None
        raise
    finally:
        dcp.FileSystemReader = original
