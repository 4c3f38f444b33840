"""`agnews predict --ray`: the shards through a Ray Data pipeline. Ray reads the files, `map_batches` runs an actor
pool of model replicas (CPU or GPU each) with the same contract as predict.py, and the results stream back in order,
written one output per input shard. Called by training/predict.py.
"""

from __future__ import annotations

import argparse
import json
import os
from itertools import groupby
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet
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
from training.batch.shards import Shard, mark_done, not_labelled

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


def readable(shard: Shard, needed: list[str]) -> str | None:
    """Why a shard cannot be labelled, from its schema or first line; None when it can."""
    suffix = Path(shard.url).suffix.lower()
    try:
        with fsspec.open(shard.url, "rb") as fh:
            if suffix == ".parquet":
                names = pyarrow.parquet.read_schema(fh).names
            elif suffix == ".csv":
                names = [n.strip().strip('"') for n in fh.readline().decode("utf-8").split(",")]
            else:
                names = list(json.loads(fh.readline() or b"{}"))
    except (OSError, ValueError, pa.ArrowException) as exc:
        return f"cannot be read ({' '.join(str(exc).split())[:160]})"
    missing = [c for c in needed if c not in names]
    return f"missing column(s) {', '.join(missing)} (found: {', '.join(names)})" if missing else None


def label(args: argparse.Namespace, loaded: LoadedModel, todo: list[Shard]) -> None:
    """Every shard of `todo` through one Ray Data pipeline per file format; outputs written as their rows arrive."""
    import ray

    reading = reading_of(args, loaded)
    needed = [*reading["columns"], *([reading["pair"]] if reading["pair"] else [])]
    failed = {shard.url: why for shard in todo if (why := readable(shard, needed))}
    for url, why in failed.items():
        logger.warning("%s: not labelled: %s", url, why)
    ready = [shard for shard in todo if shard.url not in failed]
    ray.init(address=args.ray_address, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
    ray.data.DataContext.get_current().execution_options.preserve_order = True  # rows keep their order
    check_room(args, ray.cluster_resources().get("CPU", 0.0))
    device = "cuda" if args.replica_gpus > 0 else "cpu"
    for suffix, group in groupby(ready, key=lambda shard: READERS[Path(shard.url).suffix.lower()]):
        shards = list(group)
        read = getattr(ray.data, suffix)
        ds = read([shard.url for shard in shards], include_paths=True, partitioning=None, num_cpus=READ_CPUS)
        scored = ds.map_batches(
            Replica,
            fn_constructor_kwargs={
                "checkpoint": str(Path(args.checkpoint_dir).resolve()),
                "dtype": args.mixed_precision,
                "device": device,
                "reading": reading,
            },
            batch_size=args.chunk_size,
            batch_format="pyarrow",
            concurrency=args.num_replicas,
            num_gpus=args.replica_gpus,
            num_cpus=args.replica_cpus,
        )
        write_in_order(scored, shards)
    not_labelled([f"{url}: {why}" for url, why in failed.items()], len(todo))
    logger.info(
        "%d shards labelled with Ray Data (%d replicas) into %s", len(ready), args.num_replicas, args.output_dir
    )


def write_in_order(scored, shards: list[Shard]) -> None:
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
                writer.write(rows.drop_columns(["path"]))
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
