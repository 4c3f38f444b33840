"""Data: load (Hub or local csv/jsonl/parquet) -> validate -> split -> tokenize (cached) -> batches.

The pieces, in the order train.py calls them:
- `load_splits`      train/validation/test as `text` (text columns joined; `text_pair` for pair tasks) and a
                     `labels` column (class ids, multi-hot vectors or regression targets); the label space and problem
                     type (run_classification.py's convention).
- `tokenize_splits`  `datasets.map` (cached on disk) adding input ids and each text's token count.
- `make_dataloaders` a length-grouped batch sampler for training, length-sorted batches for evaluation,
                     padding to a few fixed widths (--pad_buckets) or to the longest text in the batch.
"""

from __future__ import annotations

import csv
import functools
import json
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import pyarrow
import pyarrow.parquet
import torch
from torch.utils.data import DataLoader, Sampler
from transformers import PreTrainedTokenizerBase

from contract import shapes, task
from contract.errors import UserError
from contract.long_text import LongText, PairLeavesNoRoom
from contract.problem_types import ProblemType, kind_of
from training import capture
from training.config import TrainConfig
from training.hub import explain_missing

logger = logging.getLogger(__name__)

_LOADERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


CALIBRATION_TEXTS = 600  # the service splits them: held out for the int8 agreement check, the rest calibrate int8
GPU_LOADER_WORKERS = 2  # collation off the training thread: a captured step waits on it otherwise


class DataError(UserError, ValueError):
    """Bad input data; the message names the file (or dataset) and the row."""


@dataclass
class Splits:
    train: datasets.Dataset
    validation: datasets.Dataset
    test: datasets.Dataset | None
    labels: LabelSpace
    calibration: list[str] = field(default_factory=list)  # training texts recorded for int8 serving
    sources: dict[str, dict] = field(default_factory=dict)  # where each split was read (training/provenance.py)

    @property
    def label_names(self) -> list[str]:
        return self.labels.names

    def named(self) -> dict[str, datasets.Dataset | None]:
        return {"train": self.train, "validation": self.validation, "test": self.test}


# --------------------------------------------------------------------------------------------- loading


def load_file(path: str) -> datasets.Dataset:
    """One local csv / jsonl / parquet file as a Dataset, with clear errors for missing or unreadable files."""
    file = Path(path)
    if not file.is_file():
        raise DataError(f"{path}: file not found")
    if file.stat().st_size == 0:
        raise DataError(f"{path}: file is empty")
    check_header(file)
    try:
        loaded = datasets.load_dataset(_LOADERS[file.suffix.lower()], data_files=str(file), split="train")
    except (datasets.exceptions.DatasetGenerationError, ValueError, OSError) as exc:
        cause = exc.__cause__ or exc
        if "corresponds to no data" in str(cause):  # datasets' words for a file with a header and no rows
            raise DataError(f"{path}: no rows") from None
        raise DataError(
            f"{path}: cannot parse as {file.suffix.lower()[1:]} ({' '.join(str(cause).split())[:200]})"
        ) from None
    if len(loaded) == 0:
        raise DataError(f"{path}: no rows")
    return loaded


def check_header(file: Path) -> None:
    """A column named twice is refused: pandas would silently rename the second one (`text.1`) and the run would
    train on whichever it picked. Read from the csv header, the parquet schema, or a jsonl file's first object."""
    try:
        names, where = _column_names(file)
    except (OSError, ValueError, csv.Error, pyarrow.ArrowException):
        return  # unreadable here: load_file's parser says why, in its own words
    for name in dict.fromkeys(names):
        if names.count(name) > 1:
            raise DataError(
                f"{file}: column {name!r} is named {names.count(name)} times in its {where}; rename or drop the "
                "extra ones, so that it is clear which column to read"
            )


def _column_names(file: Path) -> tuple[list[str], str]:
    suffix = file.suffix.lower()
    if suffix == ".csv":
        with open(file, newline="", encoding="utf-8", errors="replace") as fh:
            return next(csv.reader(fh), []), "header"
    if suffix == ".parquet":
        return pyarrow.parquet.read_schema(file).names, "schema"
    with open(file, encoding="utf-8", errors="replace") as fh:  # jsonl: keys of the first object, duplicates kept
        first = fh.readline()
    pairs = json.loads(first, object_pairs_hook=list) if first.lstrip().startswith("{") else []
    return [key for key, _ in pairs], "first object"


def load_hub(name: str, config_name: str | None = None) -> datasets.DatasetDict:
    try:
        return datasets.load_dataset(name, config_name)
    except (ConnectionError, FileNotFoundError, OSError) as exc:
        raise explain_missing(f"dataset {name!r}", exc) from None


def hub_split(hub: datasets.DatasetDict, name: str, split: str) -> datasets.Dataset:
    if split not in hub:
        raise DataError(f"dataset {name!r}: no {split!r} split (found: {', '.join(hub)})")
    return hub[split]


def without_columns(ds: datasets.Dataset, source: str, columns: Sequence[str] | None) -> datasets.Dataset:
    """--remove_columns: dropped from every split before anything reads them; a name no split has is an error."""
    if not columns:
        return ds
    require_columns(ds, source, columns)
    return ds.remove_columns(list(columns))


def require_columns(ds: datasets.Dataset, source: str, columns: Sequence[str]) -> None:
    for column in columns:
        if column not in ds.column_names:
            raise DataError(f"{source}: missing column {column!r} (found: {', '.join(ds.column_names)})")


def text_columns(cfg: TrainConfig) -> list[str]:
    return [*cfg.text_column_names, *([cfg.text_pair_column] if cfg.text_pair_column else [])]


def join_texts(parts: Sequence[str | None], delimiter: str) -> str:
    """Several text columns of one row as one text; missing (None) or empty parts are left out."""
    return delimiter.join(part for part in parts if part)


def check_texts(ds: datasets.Dataset, source: str, cfg: TrainConfig) -> None:
    """Every text column holds strings, none is empty in every row, and no row's (joined) text is empty."""
    require_columns(ds, source, text_columns(cfg))
    values = {column: ds[column] for column in text_columns(cfg)}
    for column, column_values in values.items():
        for row, value in enumerate(column_values, start=1):
            if value is not None and not isinstance(value, str):
                raise DataError(f"{source}: row {row}: {column} is {value!r}, expected a string")
        if not any(value and value.strip() for value in column_values):
            raise DataError(f"{source}: text column {column!r} is empty in every row")
    texts = zip(*(values[c] for c in cfg.text_column_names))
    for row, parts in enumerate(texts, start=1):
        if not join_texts(parts, cfg.text_column_delimiter).strip():
            raise DataError(f"{source}: row {row}: empty text")
    for row, pair in enumerate(values.get(cfg.text_pair_column, ()), start=1):
        if not (pair and pair.strip()):
            raise DataError(f"{source}: row {row}: empty {cfg.text_pair_column}")


def with_texts(ds: datasets.Dataset, cfg: TrainConfig) -> datasets.Dataset:
    """A `text` column (the text columns joined) and `text_pair` for pair tasks, as a cached `datasets.map`."""
    names, delimiter, pair = list(cfg.text_column_names), cfg.text_column_delimiter, cfg.text_pair_column

    def join(batch):
        out = {"text": [join_texts(parts, delimiter) for parts in zip(*(batch[c] for c in names))]}
        if pair:
            out["text_pair"] = batch[pair]
        return out

    return ds.map(join, batched=True, remove_columns=ds.column_names, desc="Joining text columns")


# -------------------------------------------------------------------------------------------------- labels


def _label_value(value, source: str, row: int):
    """A label as the key it is compared by: an int (integer-valued floats too), a bool, or a str."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (bool, int, str)) and value != "":
        return value
    raise DataError(f"{source}: row {row}: label {value!r} is not a class (expected an integer or a string)")


LARGEST_TARGET = math.sqrt(torch.finfo(torch.float32).max)  # targets are fp32, and the MSE loss squares them


def _target(value, source: str, row: int) -> float:
    """A regression target: a finite number whose square (the MSE loss) is finite in float32, the dtype regression
    trains in (a larger one would overflow the loss to inf and the evaluation to NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DataError(f"{source}: row {row}: target {value!r} is not a finite number (regression)")
    if abs(value) > LARGEST_TARGET:
        raise DataError(
            f"{source}: row {row}: target {value!r} is too large for float32 training (its square overflows the MSE "
            f"loss; |target| must be at most {LARGEST_TARGET:.3g}): rescale the targets"
        )
    return float(value)


def _is_list_feature(feature) -> bool:
    return isinstance(feature, (datasets.Sequence, datasets.List, datasets.LargeList))


def _problem_type(feature, values: list, delimiter: str | None, regression: bool | None) -> str:
    """run_classification.py's rule: list labels (or --label_delimiter) are multi-label, a float column (or
    --do_regression) is regression, anything else is single-label; --do_regression false keeps floats as classes. A
    column of whole numbers with missing values (pandas reads it as floats) stays classes, so the gap is reported."""
    if regression:
        return task.REGRESSION
    if delimiter is not None or _is_list_feature(feature) or any(isinstance(v, list) for v in values):
        return task.MULTI
    if regression is False:
        return task.SINGLE
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    fractions = any(isinstance(v, float) and not v.is_integer() for v in present)
    floats = isinstance(feature, datasets.Value) and feature.dtype.startswith("float")
    # a float column of whole numbers with gaps is an integer column with missing labels (pandas reads it as float)
    return task.REGRESSION if fractions or (floats and len(present) == len(values)) else task.SINGLE


def _check_one_label_type(feature, values: list, source: str, column: str) -> None:
    """A label column read with one meaning: not numbers and strings mixed in a JSON file (datasets reads such a
    column as JSON values), and not fractional numbers with a stray word in a csv (pandas then reads every value as
    text, which would make each distinct number a class)."""
    if type(feature).__name__ == "Json" and not any(isinstance(v, (list, dict)) for v in values):
        raise DataError(
            f"{source}: column {column!r} mixes label types (numbers and strings): write every label as a number "
            "(regression) or every label as a string (classes)"
        )
    if not (isinstance(feature, datasets.Value) and "string" in feature.dtype):
        return
    numbers = [_as_number(v) for v in values]
    fractions = [v for v in numbers if v is not None and not v.is_integer()]
    if not fractions or 2 * sum(v is not None for v in numbers) < len(values):
        return
    words = [(row, v) for row, (v, n) in enumerate(zip(values, numbers), start=1) if n is None]
    where = f"row {words[0][0]} holds {words[0][1]!r}, which is not a number" if words else "all are written as text"
    raise DataError(
        f"{source}: column {column!r} holds fractional numbers ({fractions[0]:g}, ...) but {where}: fix the row for "
        f"regression, or pass --do_regression false to train {len(set(values))} classes named by these values"
    )


def _check_label_names(names: list[str], source: str) -> None:
    """Label names become csv column names (`score_<label>`) and are joined with `|` in list cells: none may hold a
    control character or `|`."""
    for name in names:
        if "|" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise DataError(
                f"{source}: label {name!r} holds '|' or a control character (prediction files join labels with '|' "
                "and name columns after them): pass --label_delimiter '|' if it lists several labels, or rename the "
                "labels with --label_names"
            )


def _as_number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@dataclass
class LabelSpace:
    """Labels as `run_classification.py` reads them. Classes (single- and multi-label): the training data's distinct
    label values, sorted (integers numerically, strings as strings), are ids 0..N-1; names are those values as strings
    unless --label_names renames them in that order; a Hub ClassLabel keeps its names (and its ids). A multi-label row
    becomes a multi-hot vector over those ids; a regression target stays a number (one output, named by
    --label_names or after the label column)."""

    values: list  # the label value of each id, as found in the data ([] for regression)
    names: list[str]
    source: str  # where the values were found, for error messages
    problem_type: str = task.SINGLE
    delimiter: str | None = None  # --label_delimiter: a multi-label string column's separator

    @classmethod
    def of_training_data(cls, ds: datasets.Dataset, source: str, column: str, cfg: TrainConfig) -> LabelSpace:
        feature, raw = ds.features[column], ds[column]
        kind = kind_of(_problem_type(feature, raw, cfg.label_delimiter, cfg.do_regression))
        if not kind.label_lists and cfg.do_regression is None:
            _check_one_label_type(feature, raw, source, column)
        if cfg.threshold_strategy == "per_label" and not kind.thresholded:
            raise DataError(
                f"--threshold_strategy per_label fits a threshold per label of multi-label data; {source} column "
                f"{column!r} is {kind.name}"
            )
        names = cfg.label_names
        space = cls(values=[], names=[], source=source, problem_type=kind.name, delimiter=cfg.label_delimiter)
        seen = {value for row, cell in enumerate(raw, start=1) for value in kind.cell_values(cell, row, source, space)}
        if not kind.classes:
            if names and len(names) != 1:
                raise DataError(f"label_names: a regression model has one output; give one name (got {len(names)})")
            return cls(values=[], names=list(names or [column]), source=source, problem_type=kind.name)
        inner = getattr(feature, "feature", feature)
        if isinstance(inner, datasets.ClassLabel):
            values, found = list(range(inner.num_classes)), list(inner.names)
        else:
            if len({type(v) for v in seen}) > 1:
                raise DataError(f"{source}: column {column!r} mixes label types ({sorted(map(repr, seen))[:6]})")
            values = sorted(seen)
            found = [str(v) for v in values]
        if len(values) < 2:
            raise DataError(
                f"{source}: column {column!r} has {len(values)} distinct label(s); a classifier needs two or more"
            )
        if names and len(names) != len(values):
            raise DataError(
                f"label_names: {len(names)} names for the {len(values)} label values of {source} "
                f"({', '.join(map(str, values))}, in id order)"
            )
        space.values, space.names = values, list(names or found)
        _check_label_names(space.names, source if not names else "--label_names")
        return space

    @property
    def task(self) -> task.Task:
        """The model's task (contract/task.py); multi-label starts at the default threshold for every label."""
        return task.Task(self.problem_type, len(self.names))

    @property
    def kind(self) -> ProblemType:
        return kind_of(self.problem_type)

    @property
    def count(self) -> int:
        return len(self.values)

    def label_value(self, value, row: int, source: str):
        return _label_value(value, source, row)

    def target(self, value, row: int, source: str) -> float:
        return _target(value, source, row)

    def row_values(self, labels, row: int, source: str | None = None) -> list:
        """A multi-label row's label values (a list, or a delimited string); an empty one is an error."""
        source = source or self.source
        if self.delimiter is not None and isinstance(labels, str):
            labels = [part.strip() for part in labels.split(self.delimiter) if part.strip()]
        if not isinstance(labels, list):
            raise DataError(f"{source}: row {row}: labels {labels!r} are not a list (multi-label)")
        if not labels:
            raise DataError(f"{source}: row {row}: no labels; every multi-label example needs one or more")
        return [_label_value(value, source, row) for value in labels]

    def class_id(self, value, row: int, source: str) -> int:
        """The id of a class the training data had; one it never had is an error naming it and the row."""
        key = _label_value(value, source, row)
        index = self._ids.get(key)
        if index is None or isinstance(key, bool) != isinstance(self.values[0], bool):
            raise DataError(
                f"{source}: row {row}: label {value!r} never appears in the training data "
                f"({self.source}: {', '.join(map(str, self.values))})"
            )
        return index

    @functools.cached_property
    def _ids(self) -> dict:
        return {v: i for i, v in enumerate(self.values)}

    def encode(self, ds: datasets.Dataset, source: str, column: str) -> list:
        """Every row's label as the model's target (contract/problem_types.py `encode`): a class id, a multi-hot
        list, or a float."""
        return [self.kind.encode(value, row, source, self) for row, value in enumerate(ds[column], start=1)]


def labelled(ds: datasets.Dataset, source: str, cfg: TrainConfig, labels: LabelSpace) -> datasets.Dataset:
    """Validated texts and labels: `text` (+ `text_pair`) and an integer `labels` column."""
    require_columns(ds, source, [cfg.label_column])
    check_texts(ds, source, cfg)
    return with_texts(ds, cfg).add_column("labels", labels.encode(ds, source, cfg.label_column))


def _subsample(ds: datasets.Dataset, n: int | None, seed: int) -> datasets.Dataset:
    return ds if n is None or n >= len(ds) else ds.shuffle(seed=seed).select(range(n))


def _read_sources(cfg: TrainConfig) -> tuple[dict[str, tuple[str, datasets.Dataset]], dict[str, dict]]:
    """{split: (source, dataset)} from local files or the Hub (train first), and where each was read."""
    files = {"train": cfg.train_file, "validation": cfg.validation_file, "test": cfg.test_file}
    sources = {split: {"file": path} for split, path in files.items() if path}
    read = {split: (path, load_file(path)) for split, path in files.items() if path}
    if not cfg.train_file:
        name, hub = cfg.dataset_name, load_hub(cfg.dataset_name, cfg.dataset_config_name)
        wanted = {"train": cfg.train_split_name, "validation": cfg.validation_split_name, "test": cfg.test_split_name}
        for split, hub_name in wanted.items():
            if split in read or hub_name is None or (split == "test" and hub_name not in hub):
                continue  # a local file wins; the Hub test split is optional
            read[split] = (f"{name}[{hub_name}]", hub_split(hub, name, hub_name))
            sources[split] = {"dataset": name, "config": cfg.dataset_config_name, "split": hub_name}
            sources[split]["fingerprint"] = read[split][1]._fingerprint
    read = {split: (source, without_columns(ds, source, cfg.remove_columns)) for split, (source, ds) in read.items()}
    return {split: read[split] for split in ("train", "validation", "test") if split in read}, sources


def load_splits(cfg: TrainConfig) -> Splits:
    """Train / validation / test from the Hub or local files, validated, labels encoded for the problem type."""
    read, sources = _read_sources(cfg)
    train_source, train = read.pop("train")
    require_columns(train, train_source, [*text_columns(cfg), cfg.label_column])
    labels = LabelSpace.of_training_data(train, train_source, cfg.label_column, cfg)
    # every split is checked before any is transformed: a bad test file fails in seconds, not after training
    train = labelled(train, train_source, cfg, labels)
    others = {name: labelled(ds, source, cfg, labels) for name, (source, ds) in read.items()}
    if cfg.shuffle_train_dataset:
        train = train.shuffle(seed=cfg.seed)
    if "validation" in others:
        validation = others["validation"]
    else:  # a seeded slice of train, identical on every rank and every run with the same seed
        parts = train.train_test_split(test_size=cfg.validation_split, seed=cfg.seed, shuffle=True)
        train, validation = parts["train"], parts["test"]
    test = others.get("test")
    return Splits(
        train=_subsample(train, cfg.num_samples, cfg.seed),
        validation=_subsample(validation, cfg.num_samples, cfg.seed),
        test=_subsample(test, cfg.num_samples, cfg.seed) if test is not None else None,
        labels=labels,
        calibration=calibration_sample(train, cfg.seed),
        sources=sources,
    )


def calibration_sample(train: datasets.Dataset, seed: int, n: int = CALIBRATION_TEXTS) -> list[str]:
    """A seeded sample of training texts, recorded beside the model: the service calibrates int8 on it and checks
    the agreement with fp32 (inference/runtimes.py). None for text-pair tasks."""
    if "text_pair" in train.column_names:
        return []
    return list(_subsample(train, n, seed + 1)["text"])


# ------------------------------------------------------------------------------------------ tokenizing


def tokenize_splits(splits: Splits, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig) -> Splits:
    """Tokenize without padding (the collator pads per batch): one row per window (contract/long_text.py; one per
    text unless --long_text chunk), with its token count (`length`) and its text's row (`document`).

    `datasets.map` caches the result next to the source data, keyed by the data and this function, so
    a second run (or the other ranks, which wait under `main_process_first`) reads it from disk.
    """
    windowing, workers = cfg.windowing(), cfg.preprocessing_num_workers

    def split(ds: datasets.Dataset | None, name: str) -> datasets.Dataset | None:
        return None if ds is None else tokenize(ds, tokenizer, cfg.max_length, name, workers, windowing)

    return Splits(
        train=split(splits.train, "train"),
        validation=split(splits.validation, "validation"),
        test=split(splits.test, "test"),
        labels=splits.labels,
        calibration=splits.calibration,
        sources=splits.sources,
    )


def tokenize(
    ds: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    name: str,
    num_proc: int | None = None,
    windowing: LongText | None = None,
) -> datasets.Dataset:
    """One split's `text` (and `text_pair`) as windows (unpadded input ids), each with its text's other columns
    (labels), its `length` and its text's row number, `document`; cached by `datasets.map`."""
    windowing = windowing or LongText()
    pairs = "text_pair" in ds.column_names
    windowing.check(tokenizer, max_length, pairs)  # before the tokenizer could abort the process on a bad stride

    def encode(batch, rows):
        try:
            windows = windowing.encode(tokenizer, batch["text"], batch["text_pair"] if pairs else None, max_length)
        except PairLeavesNoRoom as exc:  # its index is within this batch: name the split's row
            raise DataError(f"{name}: row {rows[exc.index] + 1}: {exc.detail}") from None
        out = {key: [feature[key] for feature in windows.features] for key in windows.features[0]}
        out["length"] = [len(feature["input_ids"]) for feature in windows.features]
        out["document"] = [rows[i] for i in windows.owner]
        for column in kept:
            out[column] = [batch[column][i] for i in windows.owner]
        return out

    raw = [c for c in ("text", "text_pair") if c in ds.column_names]
    kept = [c for c in ds.column_names if c not in raw]
    return ds.map(
        encode,
        batched=True,
        with_indices=True,
        remove_columns=ds.column_names,
        desc=f"Tokenizing {name}",
        num_proc=num_proc,
    )


# ------------------------------------------------------------------------------------------- batching


class LengthGroupedBatchSampler(Sampler[list[int]]):
    """Training batches for ALL ranks, in the order accelerate deals them out (batch i -> rank i % world).

    One optimizer step consumes `num_replicas x accumulation` batches (one per rank per accumulation
    micro-step); call that group a step. Each epoch (seeded by seed + epoch, so it reshuffles and is
    reproducible):
    1. shuffle all indices and drop the remainder that would not fill one whole step, so each rank gets the
       same number of full batches and no example is seen twice;
    2. if group_by_length: sort chunks of `megabatch` steps by length, so a batch holds texts of similar
       length (little padding) and the ranks of one step get similar lengths (little waiting);
    3. cut into batches, group them into steps, shuffle the steps, and put the step with the longest texts
       first (an out-of-memory error shows up at once, not hours in).
    The examples of each optimizer step depend only on (per-device batch x processes x accumulation), so
    1 x 16, 2 x 8, 1 x 8 x accumulation 2 and 2 x 4 x accumulation 2 train on the same global batches.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        num_replicas: int = 1,
        seed: int = 0,
        group_by_length: bool = True,
        megabatch: int = 50,
        accumulation: int = 1,
    ):
        super().__init__()
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.num_replicas = num_replicas
        self.accumulation = accumulation
        self.seed = seed
        self.group_by_length = group_by_length
        self.megabatch = megabatch
        self.drop_last = True
        self.epoch = 0
        self.batches_per_step = num_replicas * accumulation
        self.num_steps = steps_in_epoch(len(self.lengths), batch_size, num_replicas, accumulation)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_steps * self.batches_per_step

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        step_size = self.batch_size * self.batches_per_step
        order = torch.randperm(len(self.lengths), generator=generator)[: self.num_steps * step_size].tolist()
        if self.group_by_length:
            chunk = step_size * self.megabatch
            order = [
                i
                for start in range(0, len(order), chunk)
                for i in sorted(order[start : start + chunk], key=self.lengths.__getitem__, reverse=True)
            ]
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        steps = [batches[i : i + self.batches_per_step] for i in range(0, len(batches), self.batches_per_step)]
        steps = [steps[i] for i in torch.randperm(len(steps), generator=generator).tolist()]
        longest = max(range(len(steps)), key=lambda s: max(self.lengths[i] for batch in steps[s] for i in batch))
        steps.insert(0, steps.pop(longest))
        for step in steps:
            yield from step


def steps_in_epoch(examples: int, batch_size: int, num_replicas: int, accumulation: int) -> int:
    """Optimizer steps in one epoch, as the sampler deals them (whole steps only); DataError when not even one."""
    steps = examples // (batch_size * num_replicas * accumulation)
    if steps == 0:
        raise DataError(
            f"only {examples} training examples, fewer than one optimizer step "
            f"({batch_size} per device x {num_replicas} processes x {accumulation} accumulation)"
        )
    return steps


def _model_columns(ds: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *extra: str) -> datasets.Dataset:
    keep = [c for c in (*tokenizer.model_input_names, "labels", *extra) if c in ds.column_names]
    return ds.select_columns(keep)


NOT_MODEL_INPUTS = ("labels", "document")  # batch keys the model is not called with


def model_inputs(batch: dict) -> dict:
    return {key: value for key, value in batch.items() if key not in NOT_MODEL_INPUTS}


def pad_multiple(cfg: TrainConfig, device_type: str) -> int:
    """--pad_to_multiple_of, else 8 on GPU (tensor cores want multiples of 8) and 1 on CPU (measured faster)."""
    return cfg.pad_to_multiple_of or (shapes.GPU_MULTIPLE if device_type == "cuda" else 1)


def pad_widths(cfg: TrainConfig, device_type: str, compile_mode: str = capture.NONE) -> tuple[int, ...]:
    """The fixed widths batches are padded to (--pad_buckets; training/capture.py decides the default from the
    resolved compile mode), or (): dynamic widths."""
    count = capture.bucket_count(cfg.pad_buckets, compile_mode, device_type)
    return shapes.bucket_widths(cfg.max_length, count) if count else ()


def loader_workers(cfg: TrainConfig, device_type: str) -> int:
    """--dataloader_num_workers, else GPU_LOADER_WORKERS on GPU and 0 on CPU."""
    if cfg.dataloader_num_workers is not None:
        return cfg.dataloader_num_workers
    return GPU_LOADER_WORKERS if device_type == "cuda" else 0


@dataclass(frozen=True)
class Collator:
    """A batch of tokenized windows: padded (contract/shapes.py) to the smallest of `widths` that holds the longest,
    or without widths to the longest rounded up to `multiple`; with its labels and text rows as tensors."""

    pad_token_id: int
    left: bool = False
    widths: tuple[int, ...] = ()
    multiple: int = 1

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase, widths: tuple[int, ...] = (), multiple: int = 1) -> Collator:
        return cls(tokenizer.pad_token_id, tokenizer.padding_side == "left", widths, multiple)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        batch = shapes.pad(
            features, self.pad_token_id, shapes.width_for(longest, self.widths, self.multiple), self.left
        )
        for key in NOT_MODEL_INPUTS:
            if key in features[0]:
                batch[key] = torch.tensor([f[key] for f in features])  # ints: int64; floats, multi-hot: float32
        return batch


def num_texts(split: datasets.Dataset | None) -> int:
    """Texts (rows of the data) in a tokenized split; len(split) counts windows."""
    return 0 if split is None else len(set(split["document"]))


def make_dataloaders(
    splits: Splits,
    tokenizer: PreTrainedTokenizerBase,
    cfg: TrainConfig,
    num_processes: int,
    device_type: str = "cpu",
    compile_mode: str = capture.NONE,
) -> tuple[DataLoader, LengthGroupedBatchSampler, DataLoader, DataLoader | None]:
    """Train loader (+ its sampler, whose epoch train.py sets) and evaluation loaders, not yet prepared; batches in
    fixed widths where the (resolved) compile mode needs them; grouped by length as cfg.group_by_length says once
    train.py resolved it by the problem type (None: not grouped)."""
    collate = Collator.of(tokenizer, pad_widths(cfg, device_type, compile_mode), pad_multiple(cfg, device_type))
    sampler = LengthGroupedBatchSampler(
        list(splits.train["length"]),
        cfg.per_device_train_batch_size,
        num_processes,
        seed=cfg.seed,
        group_by_length=bool(cfg.group_by_length),
        accumulation=cfg.gradient_accumulation_steps,
    )
    workers = loader_workers(cfg, device_type)
    common = dict(
        collate_fn=collate, num_workers=workers, persistent_workers=workers > 0, pin_memory=device_type == "cuda"
    )
    # Its own generator, so creating the loader iterator never draws from the global RNG (dropout): a
    # resumed run then sees exactly the random numbers the uninterrupted one saw.
    train_loader = DataLoader(
        _model_columns(splits.train, tokenizer),
        batch_sampler=sampler,
        generator=torch.Generator().manual_seed(cfg.seed),
        **common,
    )

    def eval_loader(ds: datasets.Dataset) -> DataLoader:
        return make_eval_loader(ds, tokenizer, cfg.per_device_eval_batch_size, common)

    test_loader = eval_loader(splits.test) if splits.test is not None else None
    return train_loader, sampler, eval_loader(splits.validation), test_loader


def make_eval_loader(
    ds: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, batch_size: int, loader_kwargs: dict | None = None
) -> DataLoader:
    """Windows shortest first (ties in row order), so consecutive batches need little padding; each keeps its text's
    row (`document`), by which evaluation puts the results back in row order and pools a text's windows."""
    loader_kwargs = loader_kwargs or {"collate_fn": Collator.of(tokenizer)}
    lengths = list(ds["length"])
    by_length = ds.select(sorted(range(len(ds)), key=lengths.__getitem__))
    return DataLoader(
        _model_columns(by_length, tokenizer, "document"), batch_size=batch_size, shuffle=False, **loader_kwargs
    )
