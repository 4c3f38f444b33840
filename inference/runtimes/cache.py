"""Where converted models are kept, what runtime.json records, and whether a converted file can be trusted. Called by
the runtime choice.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from contract import files
from contract.loading import file_sha256
from inference.runtimes.report import Report
from inference.settings import SettingsError

logger = logging.getLogger(__name__)


def staging_name(name: str) -> str:
    """`.<name>.<pid>@<host>`: a file or folder being written by this process."""
    return f".{name}.{os.getpid()}@{socket.gethostname()}"


def _stale(entry: str) -> bool:
    """A staging name of a dead process of this host (or of this PID's previous life)."""
    if not entry.startswith("."):
        return False
    stem, _, host = entry.rpartition("@") if "@" in entry else (entry, "", socket.gethostname())
    pid = stem.rpartition(".")[2]
    if not pid.isdigit() or host != socket.gethostname():
        return False
    if int(pid) == os.getpid():
        return True  # one conversion at a time, none now
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


@dataclass
class Cache:
    """One location of the cache for one weights hash."""

    folder: Path
    converted: set[str] = field(default_factory=set)  # model folders this process converted (not yet recorded)

    @property
    def report_file(self) -> Path:
        return self.folder / files.RUNTIME_CHOICE

    def _contents(self) -> dict:
        try:
            data = json.loads(self.report_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def reports(self) -> list[dict]:
        reports = self._contents().get("reports", [])
        return [r for r in reports if isinstance(r, dict)] if isinstance(reports, list) else []

    def digests(self) -> dict[str, str]:
        recorded = self._contents().get("files", {})
        return recorded if isinstance(recorded, dict) else {}

    def report_for(self, key: dict) -> Report | None:
        """The recorded report for `key`, or None."""
        return next((Report.from_json(r) for r in self.reports() if r.get("key") == key), None)

    def damage(self, model_folder: str) -> str | None:
        """Why a converted model cannot be served, or None when its digests match."""
        recorded = {name: d for name, d in self.digests().items() if name.split("/")[0] == model_folder}
        folder = self.folder / model_folder
        if not recorded:
            return f"{folder}: no digest recorded in {self.report_file}"
        for name, expected in sorted(recorded.items()):
            path = self.folder / name
            if not path.is_file():
                return f"{path}: missing"
            try:
                actual = file_sha256(path)
            except OSError as exc:
                return f"{path}: unreadable ({exc.strerror or exc})"
            if actual != expected:
                return f"{path}: altered (sha256 {actual[:12]}, runtime.json recorded {expected[:12]})"
        present = {f"{model_folder}/{p.relative_to(folder).as_posix()}" for p in folder.rglob("*") if p.is_file()}
        extra = sorted(present - set(recorded))
        return f"{self.folder / extra[0]}: not recorded in runtime.json" if extra else None

    def save(self, report: Report) -> None:
        """Record `report` and its files' digests, atomically. Call under `lock()`."""
        model_folders = report.folders()
        options = report.key["options"]
        reports = [r for r in self.reports() if r.get("key", {}).get("options") != options] + [report.as_json()]
        used = {m for r in reports for m in _model_folders(r)}
        recorded = {name: d for name, d in self.digests().items() if name.split("/")[0] in used - set(model_folders)}
        for model_folder in model_folders:
            for path in sorted((self.folder / model_folder).rglob("*")):
                if path.is_file():
                    recorded[path.relative_to(self.folder).as_posix()] = file_sha256(path)
        staging = self.folder / staging_name(files.RUNTIME_CHOICE)
        staging.write_text(json.dumps({"reports": reports, "files": recorded}, indent=2))
        os.replace(staging, self.report_file)

    def discard(self, model_folder: str) -> None:
        shutil.rmtree(self.folder / model_folder, ignore_errors=True)

    def lock(self) -> FileLock:
        """With --workers N one process converts; the others read."""
        return FileLock(str(self.folder.parent / f"{self.folder.name}.lock"))

    def remove_leftovers(self) -> None:
        """Staging files of dead processes of this host."""
        try:
            entries = list(self.folder.iterdir())
        except OSError:
            return
        for entry in filter(lambda e: _stale(e.name), entries):
            logger.info("Runtime: removing %s, left by a process that stopped while writing it", entry)
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):  # a read-only folder keeps it; it is never read
                    entry.unlink()


def _model_folders(report: dict) -> set[str]:
    return {c["ir"] for c in report.get("candidates", []) if isinstance(c, dict) and c.get("ir")}


def locations(folder: Path, sha256: str, hub_model: bool, cache_root: str) -> list[Cache]:
    """Beside the checkpoint, then RUNTIME_CACHE."""
    name = sha256[:16]
    found = [] if hub_model else [Cache(folder / files.RUNTIME_DIR / name)]
    return [*found, Cache(Path(cache_root).expanduser() / name)]


def writable(candidates: list[Cache], settings: str) -> Cache:
    """The first writable location, else SettingsError."""
    problems = []
    for cache in candidates:
        try:
            cache.folder.mkdir(parents=True, exist_ok=True)
            probe = cache.folder / staging_name("probe")
            probe.write_bytes(b"")
            probe.unlink()
            return cache
        except OSError as exc:
            problems.append(f"{cache.folder} ({exc.strerror or exc})")
    raise SettingsError(
        f"RUNTIME_CACHE: cannot write {' nor '.join(problems)}, where the model must first be converted and measured "
        f"({settings}); "
        "set RUNTIME_CACHE to a writable folder, convert beforehand (train.py --export_runtime), or set BACKEND=torch"
    )


def prune_siblings(cache: Cache, checkpoint_folder: Path) -> None:
    """Older weights' conversions would fill the disk."""
    runtime_dir = checkpoint_folder / files.RUNTIME_DIR
    if cache.folder.parent != runtime_dir:
        return
    for other in runtime_dir.iterdir():
        if other.is_dir() and other.name != cache.folder.name:
            shutil.rmtree(other, ignore_errors=True)
            (runtime_dir / f"{other.name}.lock").unlink(missing_ok=True)
