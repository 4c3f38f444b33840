"""`agnews predict --ray`: the shards through a Ray Data pipeline. Ray reads the files, `map_batches` runs an actor
pool of model replicas (CPU or GPU each) with the same contract as predict.py, and the results stream back in order,
written one output per input shard. Called by training/predict.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import warnings
from itertools import groupby
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.csv
import torch
from accelerate.logging import get_logger

from contract.errors import UsageError
from contract.loading import LoadedModel, load_model
from contract.long_text import LongText
from training.arguments import long_text_for
from training.batch.rows import (
    Writer,
    joined,
    max_length_for,
    prediction_columns,
    prediction_names,
    score_chunk,
    scored_table,
    text_columns,
)
from training.batch.shards import Shard, mark_done

logger = get_logger(__name__)
READERS = {".csv": "read_csv", ".jsonl": "read_json", ".json": "read_json", ".parquet": "read_parquet"}


class Replica:
    """One model copy in a Ray actor: a batch of rows in, the same rows with prediction columns out."""

    def __init__(self, checkpoint: str, dtype: str, device: str, reading: dict):
        torch.set_num_threads(max(1, int(reading["threads"])))
        self.loaded = load_model(checkpoint, device=device, dtype=dtype)
        self.reading = reading

    def __call__(self, batch: pa.Table) -> pa.Table:
        r, loaded = self.reading, self.loaded
        wanted = [*r["columns"], *([r["pair"]] if r["pair"] else [])]
        texts, pairs = joined({c: batch[c].to_pylist() for c in wanted}, r["columns"], r["delimiter"], r["pair"])
        scores, windows = score_chunk(loaded, texts, pairs, r["batch_size"], r["max_length"], r["long_text"])
        predicted = scored_table(scores, windows)
        out = batch.drop_columns([c for c in r["replaced"] if c in batch.column_names])
        for name, values in prediction_columns(predicted, loaded, r["long_text"]).items():
            out = out.append_column(name, values)
        return out


def reading_of(args: argparse.Namespace, loaded: LoadedModel) -> dict:
    """How the replicas read and score rows: predict.py's rules."""
    trained_with = (loaded.metrics or {}).get("config", {})
    columns, delimiter, pair = text_columns(args, trained_with)
    long_text: LongText = long_text_for(loaded, args)
    max_length = max_length_for(args, loaded)
    long_text.check(loaded.tokenizer, max_length, pair is not None)
    return {
        "columns": columns,
        "delimiter": delimiter,
        "pair": pair,
        "max_length": max_length,
        "long_text": long_text,
        "batch_size": args.per_device_batch_size,
        "threads": args.replica_cpus,
        "replaced": prediction_names(loaded, long_text) if args.overwrite_prediction_columns else [],
        "added": prediction_names(loaded, long_text),
    }


READ_CPUS = 0.1  # a reading task's share: replicas holding every CPU would otherwise starve the reads


def check_room(args: argparse.Namespace, cpus: float) -> None:
    """Replicas that take every CPU leave none to read the shards: Ray would wait forever."""
    wanted = args.num_replicas * args.replica_cpus
    if wanted + READ_CPUS > cpus:
        raise UsageError(
            f"--num_replicas {args.num_replicas} x --replica_cpus {args.replica_cpus:g} take {wanted:g} of the Ray "
            f"cluster's {cpus:g} CPUs, leaving too few to read the shards: lower --replica_cpus (e.g. "
            f"{max(0.1, (cpus - READ_CPUS) / args.num_replicas):.1f}) or --num_replicas"
        )


def label(args: argparse.Namespace, loaded: LoadedModel, todo: list[Shard], headers: dict[str, list[str]]) -> None:
    """Every shard of `todo` (checked by shards.refused, which read `headers`) through one Ray Data pipeline per file
    format; outputs written as their rows arrive, each with its own columns in its own order."""
    import ray

    reading = reading_of(args, loaded)
    if clash := next((shard.url for shard in todo if PATH_COLUMN in headers[shard.url]), None):
        raise UsageError(
            f"{clash} has a column named {PATH_COLUMN!r}, the name Ray Data gives each row's file: rename it, or run "
            "without --ray"
        )
    ray.init(
        address=args.ray_address,
        ignore_reinit_error=True,
        log_to_driver=False,
        include_dashboard=False,
        logging_level=logging.ERROR,
    )
    ray.data.DataContext.get_current().execution_options.preserve_order = True  # rows keep their order
    for handler in logging.getLogger("ray.data").handlers:  # its INFO lines stay in the session's log file
        if handler.name == "console":
            handler.setLevel(logging.WARNING)
    check_room(args, ray.cluster_resources().get("CPU", 0.0))
    device = "cuda" if args.replica_gpus > 0 else "cpu"
    try:
        for suffix, group in groupby(todo, key=lambda shard: Path(shard.url).suffix.lower()):
            shards = list(group)
            ds = read(suffix, [shard.url for shard in shards], {n for s in shards for n in headers[s.url]})
            scored = map_replicas(ds, args, device, reading)
            write_in_order(scored, shards, {s.url: kept_columns(headers[s.url], reading) for s in shards})
    finally:
        ray.shutdown()  # the workers end here, not in the interpreter's exit after the success line


PATH_COLUMN = "path"  # include_paths: each row's file


def map_replicas(ds, args: argparse.Namespace, device: str, reading: dict):
    """`ds` through an actor pool of replicas. Not restarted when one dies (the run stops; a rerun skips the shards
    done): Ray cannot restart an actor whose arguments live in the object store, and says so on stderr otherwise."""
    import ray

    with warnings.catch_warnings():  # max_restarts is passed the one way Ray Data takes it before 2.64
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        return ds.map_batches(
            Replica,
            fn_constructor_kwargs={
                "checkpoint": str(Path(args.checkpoint_dir).resolve()),
                "dtype": args.mixed_precision,
                "device": device,
                "reading": reading,
            },
            batch_size=args.chunk_size,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=args.num_replicas),
            num_gpus=args.replica_gpus,
            num_cpus=args.replica_cpus,
            max_restarts=0,
        )


def read(suffix: str, urls: list[str], names: set[str]):
    """Ray Data's reader for one format; a csv's every column as text, as predict.py reads it."""
    import ray

    if suffix == ".csv":
        text = {name: pa.string() for name in names}
        options = pyarrow.csv.ConvertOptions(
            column_types=text, strings_can_be_null=False, quoted_strings_can_be_null=False
        )
        return ray.data.read_csv(urls, include_paths=True, partitioning=None, num_cpus=READ_CPUS,
                                 convert_options=options)  # fmt: skip
    reader = getattr(ray.data, READERS[suffix])
    return reader(urls, include_paths=True, partitioning=None, num_cpus=READ_CPUS)


def kept_columns(names: list[str], reading: dict) -> list[str]:
    """A shard's output columns: its own, in its order (Ray's one table for many files holds every file's), then the
    predictions."""
    return [*(n for n in names if n not in reading["replaced"]), *reading["added"]]


def write_in_order(scored, shards: list[Shard], columns: dict[str, list[str]]) -> None:
    """Batches arrive in input order: each shard's rows are contiguous, so a shard is complete when the next starts."""
    by_path = {by_path_key(shard): shard for shard in shards}
    current, writer, staged = None, None, None
    try:
        for batch in scored.iter_batches(batch_format="pyarrow", batch_size=None):
            for path, rows in _runs(batch):
                if current is None or path != by_path_key(current):
                    if writer is not None:
                        _finish(writer, staged, current)
                    current = by_path[path]
                    staged = current.output.with_name(f".{current.output.name}.tmp.{os.getpid()}")
                    writer = Writer(staged, current.output.suffix)
                writer.write(rows.select(columns[current.url]))
        if writer is not None:
            _finish(writer, staged, current)
            writer = None
    finally:  # a failed pipeline leaves the finished shards and no torn one
        if writer is not None:
            writer.close()
            staged.unlink(missing_ok=True)


def by_path_key(shard: Shard) -> str:
    """The shard's path as Ray's include_paths writes it: without the protocol."""
    return fsspec.core.url_to_fs(shard.url)[1]


def _runs(batch: pa.Table):
    """(path, rows) for each run of rows from one file."""
    paths = batch.column("path").to_pylist()
    start = 0
    for path, same in groupby(paths):
        count = len(list(same))
        yield path, batch.slice(start, count)
        start += count


def _finish(writer: Writer, staged: Path, shard: Shard) -> None:
    writer.close()
    os.replace(staged, shard.output)
    mark_done(shard)
