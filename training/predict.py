"""`agnews predict`: label a file with a trained model, every row once, in input order, on any number of processes.

Each rank scores its chunks into part files; the main process joins them into the output, atomically.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import datasets
import pyarrow.csv
import pyarrow.parquet
import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from contract.errors import UsageError
from contract.loading import LoadedModel, load_model
from contract.long_text import LongText
from training import arguments
from training.arguments import OUTPUT_SUFFIXES, long_text_for
from training.batch import shards
from training.batch.rows import (
    Tally,
    Writer,
    joined,
    max_length_for,
    prediction_columns,
    prediction_names,
    score_chunk,
    scored_table,
    text_columns,
)
from training.cli import run_command, setup_logging
from training.collective import decided_on_main, main_first
from training.data.errors import DataError
from training.data.reading import PAIR_FLAG, TEXT_FLAG, load_file, require_columns
from training.output.folder import stop_together

logger = get_logger(__name__)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arguments.predict()
    args = parser.parse_args(argv)
    if args.output_file and Path(args.output_file).suffix.lower() not in OUTPUT_SUFFIXES:
        parser.error(f"--output_file must end in one of {', '.join(OUTPUT_SUFFIXES)}")
    if args.output_file and shards.many(args.input_file):
        parser.error(f"--input_file {args.input_file} names several files: write them to --output_dir")
    if args.ray and not args.output_dir:
        parser.error("--ray writes one output per input shard: give --output_dir")
    if args.ray and args.runtime != "torch":
        parser.error("--ray: the replicas score with PyTorch; leave --runtime at torch")
    if args.num_replicas < 1:
        parser.error("--num_replicas must be >= 1")
    if min(args.per_device_batch_size, args.chunk_size) < 1:
        parser.error("--per_device_batch_size and --chunk_size must be >= 1")
    return args


class Reader:
    """The input file and how its texts are read."""

    def __init__(self, ds: datasets.Dataset, args: argparse.Namespace, trained_with: dict, long_text: LongText):
        self.ds, self.source, self.long_text = ds, args.input_file, long_text
        self.columns, self.delimiter, self.pair_column = text_columns(args, trained_with)
        require_columns(ds, args.input_file, self.columns, TEXT_FLAG)
        require_columns(ds, args.input_file, [self.pair_column] if self.pair_column else [], PAIR_FLAG)
        self.chunk_size = args.chunk_size
        self.num_chunks = -(-len(ds) // self.chunk_size)

    def rows(self, chunk: int) -> range:
        return range(chunk * self.chunk_size, min(len(self.ds), (chunk + 1) * self.chunk_size))

    def texts(self, chunk: int) -> tuple[list[str], list[str] | None]:
        rows = self.rows(chunk)
        values = self.ds.select_columns(self.columns + ([self.pair_column] if self.pair_column else []))[
            rows.start : rows.stop
        ]
        return joined(values, self.columns, self.delimiter, self.pair_column)


def part_path(parts: Path, chunk: int) -> Path:
    return parts / f"part-{chunk:08d}.parquet"


def score_my_chunks(
    accelerator: Accelerator, loaded: LoadedModel, reader: Reader, parts: Path, args, max_length: int, scorer=None
) -> None:
    """This rank's chunks into its own part files; by PyTorch here, or by the service (`scorer`, --runtime)."""
    mine = range(accelerator.process_index, reader.num_chunks, accelerator.num_processes)
    bar = tqdm(
        total=sum(len(reader.rows(c)) for c in mine),
        unit="row",
        desc=f"Predicting (rank 0 of {accelerator.num_processes})",
        disable=not accelerator.is_main_process,
    )
    for chunk in mine:
        texts, pairs = reader.texts(chunk)
        if scorer is not None:
            scores, windows = scorer.scores(texts, pairs)
        else:
            scores, windows = score_chunk(
                loaded, texts, pairs, args.per_device_batch_size, max_length, reader.long_text
            )
        pyarrow.parquet.write_table(scored_table(scores, windows), part_path(parts, chunk))
        bar.update(len(texts))
    bar.close()


def assemble(reader: Reader, parts: Path, loaded: LoadedModel, output: Path, staged: Path) -> Tally:
    """Input columns plus predictions, staged, renamed when complete; what they hold."""
    writer, tally = Writer(staged, output.suffix), Tally()
    replaced = [name for name in prediction_names(loaded, reader.long_text) if name in reader.ds.column_names]
    blank = 0
    try:
        arrow = reader.ds.with_format("arrow")
        for chunk in range(reader.num_chunks):
            rows = reader.rows(chunk)
            table = arrow[rows.start : rows.stop].drop_columns(replaced)
            predicted = pyarrow.parquet.read_table(part_path(parts, chunk))
            columns = prediction_columns(predicted, loaded, reader.long_text)
            decided = columns.get("decision", next(iter(columns.values())))
            blank += decided.null_count
            tally.add(table.column(reader.columns[0]), decided)
            for name, column in columns.items():
                table = table.append_column(name, column)
            writer.write(table)
    finally:
        writer.close()
    os.replace(staged, output)
    if blank:
        logger.warning("%d rows have no tokens once tokenized (only characters the tokenizer drops): no prediction, "
                       "their prediction cells are empty", blank)  # fmt: skip
    return tally


def check_paths(args: argparse.Namespace) -> None:
    """The output is not the input, and its folder exists."""
    output = Path(args.output_file)
    shards.check_outputs_apart([output], [Path(args.input_file)], "--output_file")
    if not output.parent.is_dir():
        raise DataError(f"{output.parent}: output folder not found")


def check_columns(reader: Reader, loaded: LoadedModel, overwrite: bool) -> None:
    taken = [] if overwrite else prediction_names(loaded, reader.long_text)
    if why := shards.columns_taken(reader.ds.column_names, taken):
        raise DataError(f"{reader.source}: {why}")


def on_main(accelerator: Accelerator, action: Callable[[], None], what: str) -> None:
    """`action` on the main process; its DataError on every rank."""

    def act() -> None:
        try:
            action()
        except OSError as exc:
            raise DataError(
                f"cannot write {what}: {exc.strerror or exc} ({getattr(exc, 'filename', None) or what})"
            ) from None

    decided_on_main(accelerator, act)


def load_for(args: argparse.Namespace, accelerator: Accelerator) -> LoadedModel:
    return load_model(args.checkpoint_dir, device=str(accelerator.device), dtype=args.mixed_precision)


def predict_file(args: argparse.Namespace, accelerator: Accelerator, loaded: LoadedModel, scorer=None) -> None:
    """--input_file labelled into --output_file, every rank scoring its chunks (or the service: --runtime)."""
    check_paths(args)
    output = Path(args.output_file)
    trained_with = (loaded.metrics or {}).get("config", {})
    reader = main_first(  # the main process converts to Arrow; the others reuse it
        accelerator,
        lambda: Reader(load_file(args.input_file, as_read=True), args, trained_with, long_text_for(loaded, args)),
    )
    check_columns(reader, loaded, args.overwrite_prediction_columns)
    max_length = max_length_for(args, loaded)
    reader.long_text.check(loaded.tokenizer, max_length, reader.pair_column is not None)
    run_id = decided_on_main(accelerator, lambda: f"{os.getpid()}-{secrets.token_hex(3)}")  # the staging names
    parts, staged = (output.with_name(f".{output.name}.{kind}.{run_id}") for kind in ("parts", "tmp"))
    on_main(accelerator, parts.mkdir, str(output.parent))
    try:
        problem = None
        try:  # local writes only: every rank learns of any failure below, and all stop on the same line
            score_my_chunks(accelerator, loaded, reader, parts, args, max_length, scorer)
        except OSError as exc:  # pyarrow's IO errors are OSErrors; a full disk is the common one
            cause = "no space left on device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc).splitlines()[0]
            problem = f"cannot write {output}'s parts in {parts.parent}: {cause}"
        stop_together(accelerator, problem)  # also the barrier before assembling
        tally = []  # the main process's
        on_main(accelerator, lambda: tally.append(assemble(reader, parts, loaded, output, staged)), str(output))
    finally:  # a failed run leaves nothing behind
        if accelerator.is_main_process:
            shutil.rmtree(parts, ignore_errors=True)
            staged.unlink(missing_ok=True)
    logger.info(
        "Wrote %d rows to %s (%s, %d process(es)); %s",
        len(reader.ds),
        output,
        scorer.runtime if scorer is not None else loaded.precision,
        accelerator.num_processes,
        tally[0].say() if tally else "",
        main_process_only=True,
    )


@contextlib.contextmanager
def scoring(args: argparse.Namespace, accelerator: Accelerator, loaded: LoadedModel) -> Iterator:
    """None: PyTorch scores here; else the service on this machine, with the runtime it chooses (--runtime)."""
    if args.runtime == "torch":
        yield None
        return
    if accelerator.num_processes > 1 or args.max_length or long_text_for(loaded, args).chunked:
        raise UsageError(
            "--runtime: the service scores in one process, at the model's own maximum length, truncating; run it "
            "without accelerate launch, --max_length and chunking (or use --runtime torch)"
        )
    from training.batch.service_scorer import ServiceScorer  # only with --runtime

    scorer = ServiceScorer(args.checkpoint_dir, args.runtime, long_text_for(loaded, args), loaded)
    logger.info("Scoring with the service's runtime: %s", scorer.runtime)
    try:
        yield scorer
    finally:
        scorer.close()


def settings_of(args: argparse.Namespace, loaded: LoadedModel) -> dict:
    """What an output depends on beside its input and the model: a rerun with other settings recomputes."""
    named = (
        "text_column_names",
        "text_column_delimiter",
        "text_pair_column",
        "max_length",
        "long_text",
        "chunk_stride",
    )
    return {
        **{name: getattr(args, name) for name in named},
        "precision": loaded.precision,
        "runtime": args.runtime,
        "output_format": args.output_format,
    }


def predict_many(args: argparse.Namespace, accelerator: Accelerator) -> None:
    """Every shard of --input_file into --output_dir; shards done before with this model skipped."""
    on_main(accelerator, lambda: Path(args.output_dir).mkdir(parents=True, exist_ok=True), args.output_dir)
    loaded = load_for(args, accelerator)
    found = decided_on_main(accelerator, lambda: shards.shards(args, loaded.sha256, settings_of(args, loaded)))
    pending = shards.pending(accelerator, found)
    columns, _, pair = text_columns(args, (loaded.metrics or {}).get("config", {}))
    needed = [*columns, *([pair] if pair else [])]
    taken = [] if args.overwrite_prediction_columns else prediction_names(loaded, long_text_for(loaded, args))
    todo, failed, headers = decided_on_main(accelerator, lambda: shards.refused(pending, needed, taken))
    if args.ray:
        from training.batch import ray_data  # only with --ray: importing ray costs seconds

        if accelerator.num_processes > 1:
            raise UsageError("--ray: Ray places the replicas; run it in one process, not under accelerate launch")
        ray_data.label(args, loaded, todo, headers)
    else:
        with scoring(args, accelerator, loaded) as scorer:

            def label_file(path: str, output: Path) -> None:
                named = argparse.Namespace(**{**vars(args), "input_file": path, "output_file": str(output)})
                predict_file(named, accelerator, loaded, scorer)

            failed += shards.label_shards(accelerator, label_file, todo)
    shards.not_labelled(failed, len(pending))
    how = f"with Ray Data ({args.num_replicas} replicas) " if args.ray else ""
    logger.info("%d shards labelled %sinto %s", len(todo), how, args.output_dir, main_process_only=True)


def cli(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    if args.output_dir:
        return run_command(lambda: predict_many(args, accelerator), accelerator)

    def one_file() -> None:
        loaded = load_for(args, accelerator)
        with scoring(args, accelerator, loaded) as scorer:
            predict_file(args, accelerator, loaded, scorer)

    return run_command(one_file, accelerator)


if __name__ == "__main__":
    sys.exit(cli())
