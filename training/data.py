"""Data: load (Hub or local csv/jsonl/parquet) -> validate -> split -> tokenize (cached) -> batches.

The pieces, in the order train.py calls them:
- `load_splits`      raw train/validation/test with an integer `labels` column and the class names.
- `tokenize_splits`  `datasets.map` (cached on disk) adding input ids and each text's token count.
- `make_dataloaders` a length-grouped batch sampler for training, length-sorted batches for evaluation,
                     dynamic padding to the longest text in the batch (multiple of 8).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import datasets
import torch
from torch.utils.data import DataLoader, Sampler
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from training.config import TrainConfig
from training.hub import explain_missing

logger = logging.getLogger(__name__)

AG_NEWS_LABELS = ["World", "Sports", "Business", "Sci/Tech"]
_LOADERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


class DataError(ValueError):
    """Bad input data; the message names the file (or dataset) and the row."""


@dataclass
class Splits:
    train: datasets.Dataset
    validation: datasets.Dataset
    test: Optional[datasets.Dataset]
    label_names: list[str]


# --------------------------------------------------------------------------------------------- loading


def load_file(path: str) -> datasets.Dataset:
    """One local csv / jsonl / parquet file as a Dataset, with clear errors for missing or unreadable files."""
    file = Path(path)
    if not file.is_file():
        raise DataError(f"{path}: file not found")
    if file.stat().st_size == 0:
        raise DataError(f"{path}: file is empty")
    try:
        loaded = datasets.load_dataset(_LOADERS[file.suffix.lower()], data_files=str(file), split="train")
    except (datasets.exceptions.DatasetGenerationError, ValueError, OSError) as exc:
        cause = exc.__cause__ or exc
        if "corresponds to no data" in str(cause):  # datasets' words for a file with a header and no rows
            raise DataError(f"{path}: no rows") from None
        raise DataError(f"{path}: cannot parse as {file.suffix.lower()[1:]} ({' '.join(str(cause).split())[:200]})") from None
    if len(loaded) == 0:
        raise DataError(f"{path}: no rows")
    return loaded


def load_hub(name: str) -> datasets.DatasetDict:
    try:
        return datasets.load_dataset(name)
    except (ConnectionError, FileNotFoundError, OSError) as exc:
        raise explain_missing(f"dataset {name!r}", exc) from None


def require_columns(ds: datasets.Dataset, source: str, text_column: str, label_column: str) -> None:
    for column in (text_column, label_column):
        if column not in ds.column_names:
            raise DataError(f"{source}: missing column {column!r} (found: {', '.join(ds.column_names)})")


def check_texts(ds: datasets.Dataset, source: str, text_column: str) -> None:
    for row, text in enumerate(ds[text_column], start=1):
        if not isinstance(text, str):
            raise DataError(f"{source}: row {row}: text is {text!r}, expected a string")
        if not text.strip():
            raise DataError(f"{source}: row {row}: empty text")


def infer_label_names(ds: datasets.Dataset, label_column: str) -> list[str]:
    """Class names for a dataset whose config gives none (see TrainConfig.label_names)."""
    feature = ds.features[label_column]
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names)
    values = [v for v in ds[label_column] if v is not None]
    if values and all(isinstance(v, str) for v in values):
        found = sorted(set(values))
        return AG_NEWS_LABELS if set(found) <= set(AG_NEWS_LABELS) else found
    ids = [int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer()]
    top = max(ids, default=0)
    return AG_NEWS_LABELS if top < len(AG_NEWS_LABELS) else [f"LABEL_{i}" for i in range(top + 1)]


def label_ids(ds: datasets.Dataset, source: str, label_column: str, label_names: Sequence[str]) -> list[int]:
    """Map every label (an id or a class name) to an id in [0, len(label_names)), or raise naming the row."""
    by_name = {name: i for i, name in enumerate(label_names)}
    ids = []
    for row, value in enumerate(ds[label_column], start=1):
        if isinstance(value, str) and value in by_name:
            ids.append(by_name[value])
        elif (isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer()
              and 0 <= int(value) < len(label_names)):
            ids.append(int(value))
        else:
            raise DataError(
                f"{source}: row {row}: label {value!r} is not one of the {len(label_names)} classes "
                f"(ids 0..{len(label_names) - 1} or names {', '.join(label_names)})"
            )
    return ids


def with_labels(ds: datasets.Dataset, source: str, cfg: TrainConfig, label_names: Sequence[str]) -> datasets.Dataset:
    """Validate text and labels, keep only the text column plus an integer `labels` column."""
    require_columns(ds, source, cfg.text_column, cfg.label_column)
    check_texts(ds, source, cfg.text_column)
    ids = label_ids(ds, source, cfg.label_column, label_names)
    ds = ds.select_columns([cfg.text_column])
    return ds.add_column("labels", ids)


def _subsample(ds: datasets.Dataset, n: Optional[int], seed: int) -> datasets.Dataset:
    return ds if n is None or n >= len(ds) else ds.shuffle(seed=seed).select(range(n))


def load_splits(cfg: TrainConfig) -> Splits:
    """Train / validation / test from the Hub or local files, validated, labels as ids."""
    if cfg.train_file:
        train_source, train = cfg.train_file, load_file(cfg.train_file)
        hub_test = None
    else:
        hub = load_hub(cfg.dataset_name)
        if "train" not in hub:
            raise DataError(f"dataset {cfg.dataset_name!r}: no 'train' split (found: {', '.join(hub)})")
        train_source, train = f"{cfg.dataset_name}[train]", hub["train"]
        hub_test = ("test", hub["test"]) if "test" in hub else None
    require_columns(train, train_source, cfg.text_column, cfg.label_column)
    label_names = list(cfg.label_names or infer_label_names(train, cfg.label_column))
    train = with_labels(train, train_source, cfg, label_names)

    if cfg.validation_file:
        validation = with_labels(load_file(cfg.validation_file), cfg.validation_file, cfg, label_names)
    else:  # a seeded slice of train, identical on every rank and every run with the same seed
        parts = train.train_test_split(test_size=cfg.validation_split, seed=cfg.seed, shuffle=True)
        train, validation = parts["train"], parts["test"]

    test = None
    if cfg.test_file:
        test = with_labels(load_file(cfg.test_file), cfg.test_file, cfg, label_names)
    elif hub_test is not None:
        test = with_labels(hub_test[1], f"{cfg.dataset_name}[test]", cfg, label_names)

    train = _subsample(train, cfg.num_samples, cfg.seed)
    validation = _subsample(validation, cfg.num_samples, cfg.seed)
    test = _subsample(test, cfg.num_samples, cfg.seed) if test is not None else None
    return Splits(train=train, validation=validation, test=test, label_names=label_names)


# ------------------------------------------------------------------------------------------ tokenizing


def tokenize_splits(splits: Splits, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig) -> Splits:
    """Tokenize without padding (the collator pads per batch); store each text's token count as `length`.

    `datasets.map` caches the result next to the source data, keyed by the data and this function, so
    a second run (or the other ranks, which wait under `main_process_first`) reads it from disk.
    """
    return Splits(
        train=tokenize(splits.train, tokenizer, cfg, "train"),
        validation=tokenize(splits.validation, tokenizer, cfg, "validation"),
        test=tokenize(splits.test, tokenizer, cfg, "test") if splits.test is not None else None,
        label_names=splits.label_names,
    )


def tokenize(ds: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig, name: str) -> datasets.Dataset:
    """One split: input_ids/attention_mask (unpadded) plus `length`, cached by `datasets.map`."""
    text_column, max_length = cfg.text_column, cfg.max_length

    def encode(batch):
        encoded = tokenizer(batch[text_column], truncation=True, max_length=max_length)
        encoded["length"] = [len(ids) for ids in encoded["input_ids"]]
        return encoded

    return ds.map(encode, batched=True, remove_columns=[text_column], desc=f"Tokenizing {name}")


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

    def __init__(self, lengths: Sequence[int], batch_size: int, num_replicas: int = 1, seed: int = 0,
                 group_by_length: bool = True, megabatch: int = 50, accumulation: int = 1):
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
        self.num_steps = len(self.lengths) // (batch_size * self.batches_per_step)
        if self.num_steps == 0:
            raise DataError(f"only {len(self.lengths)} training examples, fewer than one optimizer step "
                            f"({batch_size} per device x {num_replicas} processes x {accumulation} accumulation)")

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
            order = [i for start in range(0, len(order), chunk)
                     for i in sorted(order[start:start + chunk], key=self.lengths.__getitem__, reverse=True)]
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        steps = [batches[i:i + self.batches_per_step] for i in range(0, len(batches), self.batches_per_step)]
        steps = [steps[i] for i in torch.randperm(len(steps), generator=generator).tolist()]
        longest = max(range(len(steps)), key=lambda s: max(self.lengths[i] for batch in steps[s] for i in batch))
        steps.insert(0, steps.pop(longest))
        for step in steps:
            yield from step


def _model_columns(ds: datasets.Dataset, tokenizer: PreTrainedTokenizerBase) -> datasets.Dataset:
    keep = [c for c in (*tokenizer.model_input_names, "labels") if c in ds.column_names]
    return ds.select_columns(keep)


def pad_multiple(cfg: TrainConfig, device_type: str) -> int:
    """--pad_to_multiple_of, else 8 on GPU (tensor cores want multiples of 8) and 1 on CPU (measured faster)."""
    return cfg.pad_to_multiple_of or (8 if device_type == "cuda" else 1)


def make_dataloaders(splits: Splits, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig, num_processes: int,
                     device_type: str = "cpu") -> tuple[DataLoader, LengthGroupedBatchSampler, DataLoader, Optional[DataLoader]]:
    """Train loader (+ its sampler, whose epoch train.py sets) and evaluation loaders, not yet prepared."""
    multiple = pad_multiple(cfg, device_type)
    collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple if multiple > 1 else None)
    sampler = LengthGroupedBatchSampler(list(splits.train["length"]), cfg.per_device_train_batch_size, num_processes,
                                        seed=cfg.seed, group_by_length=cfg.group_by_length,
                                        accumulation=cfg.gradient_accumulation_steps)
    common = dict(collate_fn=collate, num_workers=cfg.dataloader_num_workers, pin_memory=device_type == "cuda")
    # Its own generator, so creating the loader iterator never draws from the global RNG (dropout): a
    # resumed run then sees exactly the random numbers the uninterrupted one saw.
    train_loader = DataLoader(_model_columns(splits.train, tokenizer), batch_sampler=sampler,
                              generator=torch.Generator().manual_seed(cfg.seed), **common)

    def eval_loader(ds: datasets.Dataset) -> DataLoader:
        return make_eval_loader(ds, tokenizer, cfg.per_device_eval_batch_size, common)

    test_loader = eval_loader(splits.test) if splits.test is not None else None
    return train_loader, sampler, eval_loader(splits.validation), test_loader


def eval_order(ds: datasets.Dataset) -> list[int]:
    """The row order of make_eval_loader: shortest texts first, ties in row order."""
    lengths = list(ds["length"])
    return sorted(range(len(ds)), key=lengths.__getitem__)


def make_eval_loader(ds: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, batch_size: int,
                     loader_kwargs: Optional[dict] = None) -> DataLoader:
    """Rows in eval_order (by length), so consecutive batches need little padding."""
    loader_kwargs = loader_kwargs or {"collate_fn": DataCollatorWithPadding(tokenizer)}
    by_length = ds.select(eval_order(ds))
    return DataLoader(_model_columns(by_length, tokenizer), batch_size=batch_size, shuffle=False, **loader_kwargs)


def steps_per_epoch(train_loader_len: int, accumulation: int) -> int:
    """Optimizer steps in one epoch of a prepared (per-rank) train loader (the sampler makes it exact)."""
    return math.ceil(train_loader_len / accumulation)
