"""Many input files in, one output each: the shards a glob, folder or fsspec URL names, the record beside each output
that lets a rerun skip it, and the loop labelling the rest on every process. Called by training/predict.py; Ray's
pipeline (ray_data.py) takes the same shards.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import glob
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet
from accelerate import Accelerator
from accelerate.logging import get_logger

from contract.errors import UserError
from training.arguments import OUTPUT_SUFFIXES
from training.collective import decided_on_main
from training.data.errors import DataError
from training.data.reading import TEXT_FLAG, missing_column
from training.output.atomic import write_json

logger = get_logger(__name__)
DONE = ".done.json"  # beside each output: the input and model it was computed from


@dataclass(frozen=True)
class Shard:
    """One input file and the output it gets."""

    url: str  # a local path, or a URL fsspec opens
    output: Path
    record: dict[str, Any]  # what the output was computed from: input size and time, model, settings

    @property
    def done_file(self) -> Path:
        return self.output.with_name(self.output.name + DONE)

    def is_done(self) -> bool:
        """The output exists and was computed from this input, model and settings."""
        if not (self.output.is_file() and self.done_file.is_file()):
            return False
        try:
            return json.loads(self.done_file.read_text()) == self.record
        except (OSError, ValueError):
            return False


def many(pattern: str) -> bool:
    """Whether --input_file names several files: a glob, a folder, or a URL."""
    return glob.has_magic(pattern) or "://" in pattern or Path(pattern).is_dir()


def expand(pattern: str) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    """The filesystem and the sorted csv / jsonl / parquet files a glob, folder or file names."""
    fs, path = fsspec.core.url_to_fs(pattern)
    if glob.has_magic(path):
        found = fs.glob(path)
    elif fs.isdir(path):
        found = fs.find(path)
    else:
        found = [path] if fs.exists(path) else []
    found = sorted(p for p in found if Path(p).suffix.lower() in OUTPUT_SUFFIXES)
    if not found:
        raise DataError(f"--input_file {pattern}: no csv, jsonl or parquet file found")
    return fs, found


def shards(args: argparse.Namespace, model_sha256: str, settings: dict) -> list[Shard]:
    """Every input with its output in --output_dir (same stem, --output_format or the input's suffix); DataError before
    anything is written when an output would replace an input."""
    fs, paths = expand(args.input_file)
    outputs: dict[Path, str] = {}
    found = []
    for path in paths:
        suffix = f".{args.output_format}" if args.output_format else Path(path).suffix.lower()
        output = Path(args.output_dir) / f"{Path(path).stem}{suffix}"
        if output in outputs:
            raise DataError(f"{outputs[output]} and {path} would both write {output}: give the shards distinct names")
        outputs[output] = path
        info = fs.info(path)
        changed = info.get("mtime") or info.get("LastModified") or info.get("ETag") or info.get("md5Hash")
        source = {"input": fs.unstrip_protocol(path), "size": info.get("size"), "modified": str(changed)}
        url = path if _local(fs) else fs.unstrip_protocol(path)
        found.append(Shard(url, output, {**source, **settings, "model": model_sha256}))
    if _local(fs):
        check_outputs_apart(list(outputs), [Path(p) for p in paths], "--output_dir")
    return found


def check_outputs_apart(outputs: list[Path], inputs: list[Path], flag: str) -> None:
    """DataError when writing an output (or its record) would replace an input: the same path once links are
    followed anywhere on it, or the same file under another name (a hard link)."""
    resolved = {path.resolve(): path for path in inputs}
    inodes = {(st.st_dev, st.st_ino): path for path in inputs if (st := _stat(path))}
    for output in outputs:
        for written in (output, output.with_name(output.name + DONE)):
            st = _stat(written)
            replaced = resolved.get(written.resolve()) or (inodes.get((st.st_dev, st.st_ino)) if st else None)
            if replaced is not None:
                raise DataError(
                    f"{flag} {output.parent}: writing {written} would replace the input {replaced}; nothing was "
                    "written. Write the outputs to another folder."
                )


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def _local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def pending(accelerator: Accelerator, found: list[Shard]) -> list[Shard]:
    """The shards not done yet, decided on the main process; says how many are skipped."""
    done = decided_on_main(accelerator, lambda: [shard.is_done() for shard in found])
    skipped = sum(done)
    if skipped:
        logger.info(
            "Skipped %d of %d shards: done before with this model and these settings (%s beside each output)",
            skipped,
            len(found),
            DONE,
            main_process_only=True,
        )
    return [shard for shard, finished in zip(found, done) if not finished]


def mark_done(shard: Shard) -> None:
    write_json(shard.done_file, shard.record)


def label_shards(accelerator: Accelerator, label_file, todo: list[Shard]) -> list[str]:
    """Each shard labelled by `label_file(input, output)` on every process; a shard that cannot be read is one line
    and the others still finish. The lines of those not labelled."""
    failed: list[str] = []
    for number, shard in enumerate(todo, start=1):
        logger.info("Shard %d of %d: %s", number, len(todo), shard.url, main_process_only=True)
        try:
            with local_copy(shard.url) as path:
                label_file(path, shard.output)
        except UserError as exc:  # every rank raised the same line (main_first, stop_together)
            logger.warning("%s: not labelled: %s", shard.url, exc, main_process_only=True)
            failed.append(f"{shard.url}: {exc}")
            continue
        if accelerator.is_main_process:
            mark_done(shard)
        accelerator.wait_for_everyone()
    return failed


def not_labelled(failed: list[str], total: int) -> None:
    """DataError naming how many shards failed and the first, once the others are written; nothing if none did."""
    if failed:
        raise DataError(f"{len(failed)} of {total} shards not labelled (the others are written); first: {failed[0]}")


@contextlib.contextmanager
def local_copy(url: str) -> Iterator[str]:
    """A local path for a shard: itself, or a temporary download of a remote one."""
    if "://" not in url:
        yield url
        return
    folder = tempfile.mkdtemp(prefix="agnews-shard-")
    try:
        target = str(Path(folder) / Path(url).name)
        fs, path = fsspec.core.url_to_fs(url)
        fs.get(path, target)
        yield target
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def columns_taken(names: list[str], taken: list[str]) -> str | None:
    """Why prediction columns cannot be added to `names`, or None."""
    present = [name for name in taken if name in names]
    if not present:
        return None
    return (
        f"already has prediction columns ({', '.join(present)}); pass --overwrite_prediction_columns to replace "
        "them, or rename them in the input"
    )


def refused(
    todo: list[Shard], needed: list[str], taken: list[str]
) -> tuple[list[Shard], list[str], dict[str, list[str]]]:
    """The shards that can be labelled, a line for each that cannot (unreadable, no rows, a needed column missing,
    prediction columns already there: `taken`), and the columns of each, read from its header alone: one check,
    whichever path labels them."""
    ready, failed, columns = [], [], {}
    for shard in todo:
        try:
            names = header(shard.url)
        except (OSError, ValueError, UnicodeDecodeError, csv.Error, pa.ArrowException) as exc:
            why = f"cannot be read ({' '.join(str(exc).split())[:160]})"
        else:
            missing = [c for c in needed if c not in (names or [])]
            why = "no rows" if names is None else None
            why = why or (missing_column(missing[0], names, TEXT_FLAG) if missing else None)
            why = why or columns_taken(names, taken)
        if why is None:
            ready.append(shard)
            columns[shard.url] = names
        else:
            logger.warning("%s: not labelled: %s", shard.url, why, main_process_only=True)
            failed.append(f"{shard.url}: {why}")
    return ready, failed, columns


HEADER_BYTES = 1 << 20  # how far a header and a first row are looked for


def header(url: str) -> list[str] | None:
    """A shard's column names, or None when it holds no rows; only its start is read."""
    suffix = Path(url).suffix.lower()
    with fsspec.open(url, "rb") as fh:
        if suffix == ".parquet":
            found = pyarrow.parquet.ParquetFile(fh)
            return found.schema_arrow.names if found.metadata.num_rows else None
        text = io.TextIOWrapper(fh, encoding="utf-8")
        lines = [line for line in text.readlines(HEADER_BYTES) if line.strip()]
        if suffix != ".csv" and lines and lines[0].lstrip().startswith("["):  # a JSON array of objects, read whole
            rows = json.loads("".join(lines) + text.read())
            lines = [json.dumps(rows[0])] if isinstance(rows, list) and rows else []
    if suffix == ".csv":
        names = next(csv.reader(lines[:1]), [])
        return names if len(lines) > 1 else None
    first = json.loads(lines[0]) if lines else None
    if first is not None and not isinstance(first, dict):
        raise ValueError(f"its first row is {type(first).__name__}, not a JSON object")
    return list(first) if lines else None
