"""Reading the data: Hub or local files, text columns joined, labels encoded, splits made: `load_splits`."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import pyarrow
import pyarrow.parquet

from contract.hub import explain_missing
from training.config import TrainConfig
from training.data.errors import DataError
from training.data.labels import LabelSpace

_LOADERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


CALIBRATION_TEXTS = 600  # the service calibrates and checks int8 on them
DEFAULT_HELD_OUT = 0.05  # of the training rows, for validation when no file or split is given
SMALL_SPLIT = 100  # validation texts: below it, picking the best model, calibrating and fitting thresholds is noisy


@dataclass
class Splits:
    train: datasets.Dataset
    validation: datasets.Dataset
    test: datasets.Dataset | None
    labels: LabelSpace
    calibration: list[str] = field(default_factory=list)  # training texts recorded for int8 serving
    sources: dict[str, dict] = field(default_factory=dict)  # where each split was read (training/output/provenance.py)

    @property
    def label_names(self) -> list[str]:
        return self.labels.names

    def named(self) -> dict[str, datasets.Dataset | None]:
        return {"train": self.train, "validation": self.validation, "test": self.test}


def load_file(path: str, as_read: bool = False) -> datasets.Dataset:
    """One local file as a Dataset, with clear errors. `as_read`: a csv's every cell as the text it holds (no numbers,
    no missing values guessed), for columns written back as they came (agnews predict)."""
    file = Path(path)
    if not file.is_file():
        raise DataError(f"{path}: file not found")
    if file.stat().st_size == 0:
        raise DataError(f"{path}: file is empty")
    check_header(file)
    options = {}
    if as_read and file.suffix.lower() == ".csv":  # pandas would read 000123 as 123 and NA as missing
        names, _ = _column_names(file)
        options = {"features": datasets.Features({n: datasets.Value("string") for n in names}), "na_filter": False}
    try:
        loaded = datasets.load_dataset(_LOADERS[file.suffix.lower()], data_files=str(file), split="train", **options)
    except (datasets.exceptions.DatasetGenerationError, ValueError, OSError) as exc:
        cause = exc.__cause__ or exc
        if "corresponds to no data" in str(cause):  # a header without rows
            raise DataError(f"{path}: no rows") from None
        raise DataError(
            f"{path}: cannot parse as {file.suffix.lower()[1:]} ({' '.join(str(cause).split())[:200]})"
        ) from None
    if len(loaded) == 0:
        raise DataError(f"{path}: no rows")
    return loaded


def check_header(file: Path) -> None:
    """A column named twice is refused: pandas would rename one silently."""
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
        raise explain_missing(f"dataset {name!r}", exc, name) from None


def hub_split(hub: datasets.DatasetDict, name: str, split: str) -> datasets.Dataset:
    if split not in hub:
        raise DataError(f"dataset {name!r}: no {split!r} split (found: {', '.join(hub)})")
    return hub[split]


def without_columns(ds: datasets.Dataset, source: str, columns: Sequence[str] | None) -> datasets.Dataset:
    """--remove_columns, dropped first; unknown names are errors."""
    if not columns:
        return ds
    require_columns(ds, source, columns, "--remove_columns names columns to drop")
    return ds.remove_columns(list(columns))


def require_columns(ds: datasets.Dataset, source: str, columns: Sequence[str], flag: str) -> None:
    """Every column there, or one line naming the flag that names them."""
    for column in columns:
        if column not in ds.column_names:
            raise DataError(f"{source}: {missing_column(column, ds.column_names, flag)}")


def missing_column(column: str, found: Sequence[str], flag: str) -> str:
    """What a file lacks, what it has, and the flag that names its columns."""
    return f"missing column {column!r} (found: {', '.join(found)}); {flag}"


def text_and_label_flags(ds: datasets.Dataset) -> str:
    """How to name a labelled file's columns, with its own as the example."""
    found = ds.column_names
    example = f" (here perhaps --text_column_names {found[0]} --label_column {found[-1]})" if len(found) > 1 else ""
    return f"name yours with --text_column_names and --label_column{example}"


TEXT_FLAG, PAIR_FLAG, LABEL_FLAG = (f"name yours with --{name}" for name in ("text_column_names", "text_pair_column",
                                                                             "label_column"))  # fmt: skip


def text_columns(cfg: TrainConfig) -> list[str]:
    return [*cfg.text_column_names, *([cfg.text_pair_column] if cfg.text_pair_column else [])]


def join_texts(parts: Sequence[str | None], delimiter: str) -> str:
    """Text columns of one row as one text."""
    return delimiter.join(part for part in parts if part)


def check_texts(ds: datasets.Dataset, source: str, cfg: TrainConfig) -> None:
    """Text columns hold strings, and no row's text is empty."""
    require_columns(ds, source, cfg.text_column_names, TEXT_FLAG)
    require_columns(ds, source, [cfg.text_pair_column] if cfg.text_pair_column else [], PAIR_FLAG)
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
    """`text` (and `text_pair`), as a cached map."""
    names, delimiter, pair = list(cfg.text_column_names), cfg.text_column_delimiter, cfg.text_pair_column

    def join(batch):
        out = {"text": [join_texts(parts, delimiter) for parts in zip(*(batch[c] for c in names))]}
        if pair:
            out["text_pair"] = batch[pair]
        return out

    return ds.map(join, batched=True, remove_columns=ds.column_names, desc="Joining text columns")


QUERY = "query"  # a reranker's rows: the id of their first text, ranked together
TEACHER, HARD = "teacher", "hard"  # distillation: each row's teacher scores, and 1 where its label is a real one


def teacher_scores(ds: datasets.Dataset, source: str, column: str, width: int) -> list[list[float]]:
    """--teacher_column's cells as `width` finite numbers each (a list, or its JSON text in a csv)."""
    rows = []
    for row, cell in enumerate(ds[column], start=1):
        values = json.loads(cell) if isinstance(cell, str) else cell
        if not isinstance(values, list) or len(values) != width:
            raise DataError(f"{source}: row {row}: {column} holds {cell!r}, not a list of {width} teacher scores")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            raise DataError(f"{source}: row {row}: {column} holds a score that is not a finite number: {cell!r}")
        rows.append([float(v) for v in values])
    return rows


def with_teacher(ds: datasets.Dataset, read: datasets.Dataset, source: str, cfg: TrainConfig, width: int):
    """`teacher` (and `hard`) beside the texts and labels, for a distillation run."""
    require_columns(read, source, [cfg.teacher_column], "name it with --teacher_column")
    ds = ds.add_column(TEACHER, teacher_scores(read, source, cfg.teacher_column, width))
    if not cfg.hard_label_column:
        return ds
    require_columns(read, source, [cfg.hard_label_column], "name it with --hard_label_column")
    return ds.add_column(HARD, [float(bool(v)) for v in read[cfg.hard_label_column]])


def labelled(
    ds: datasets.Dataset, source: str, cfg: TrainConfig, labels: LabelSpace, taught: bool = False
) -> datasets.Dataset:
    """Validated `text` and `labels` columns; `query` for a reranker; the teacher's scores where `taught`."""
    require_columns(ds, source, [cfg.label_column], LABEL_FLAG)
    check_texts(ds, source, cfg)
    out = with_texts(ds, cfg).add_column("labels", labels.encode(ds, source, cfg.label_column))
    if taught and cfg.teacher_column:
        out = with_teacher(out, ds, source, cfg, len(labels.names) if labels.problem.classes else 1)
    if not labels.problem.graded:
        return out
    ids: dict[str, int] = {}
    return out.add_column(QUERY, [ids.setdefault(text, len(ids)) for text in out["text"]])


def _subsample(ds: datasets.Dataset, n: int | None, seed: int) -> datasets.Dataset:
    return ds if n is None or n >= len(ds) else ds.shuffle(seed=seed).select(range(n))


def _read_sources(cfg: TrainConfig) -> tuple[dict[str, tuple[str, datasets.Dataset]], dict[str, dict]]:
    """{split: (source, dataset)}, train first."""
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
    """Train, validation and test, validated and encoded."""
    read, sources = _read_sources(cfg)
    train_source, train = read.pop("train")
    require_columns(train, train_source, [*text_columns(cfg), cfg.label_column], text_and_label_flags(train))
    labels = LabelSpace.of_training_data(train, train_source, cfg.label_column, cfg)
    # every split checked before any is transformed
    train = labelled(train, train_source, cfg, labels, taught=True)
    others = {name: labelled(ds, source, cfg, labels) for name, (source, ds) in read.items()}
    if cfg.shuffle_train_dataset:
        train = train.shuffle(seed=cfg.seed)
    if "validation" in others:
        validation = others["validation"]
    else:  # the same on every rank and run
        held = held_out(len(train), cfg.validation_split)
        parts = train.train_test_split(test_size=held, seed=cfg.seed, shuffle=True)
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


def held_out(rows: int, fraction: float | None) -> float | int:
    """What train_test_split holds out for validation: --validation_split, or 5 % and at least SMALL_SPLIT texts while
    that is at most a fifth of the rows."""
    if fraction is not None:
        return fraction
    return max(round(DEFAULT_HELD_OUT * rows), min(SMALL_SPLIT, rows // 5), 1)


def calibration_sample(train: datasets.Dataset, seed: int, n: int = CALIBRATION_TEXTS) -> list[str]:
    """A seeded sample of training texts, recorded for the service's int8 calibration. None for pairs."""
    if "text_pair" in train.column_names:
        return []
    return list(_subsample(train, n, seed + 1)["text"])
