"""Batches: length-grouped for training, length-sorted for evaluation, padded to fixed or dynamic widths; the loaders.
Called by set_up.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import datasets
import torch
from torch.utils.data import DataLoader, Sampler
from transformers import PreTrainedTokenizerBase

from contract import shapes
from training.config import TrainConfig
from training.data.errors import DataError
from training.data.reading import HARD, QUERY, TEACHER, Splits
from training.speed import capture, packing

GPU_LOADER_WORKERS = 2  # a captured step must not wait on collation


class LengthGroupedBatchSampler(Sampler[list[int]]):
    """Training batches for all ranks, in the order accelerate deals them (batch i to rank i % world).

    Texts of similar length are grouped into mega-batches, shuffled by a seeded generator per epoch."""

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
    """Whole optimizer steps per epoch; DataError when none."""
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


NOT_MODEL_INPUTS = ("labels", "document", QUERY, TEACHER, HARD)  # batch keys the model is not called with


def model_inputs(batch: dict) -> dict:
    return {key: value for key, value in batch.items() if key not in NOT_MODEL_INPUTS}


def pad_multiple(cfg: TrainConfig, device_type: str) -> int:
    """--pad_to_multiple_of, else 8 on GPU, 1 on CPU."""
    return cfg.pad_to_multiple_of or (shapes.GPU_MULTIPLE if device_type == "cuda" else 1)


def pad_widths(cfg: TrainConfig, device_type: str, compile_mode: str = capture.NONE) -> tuple[int, ...]:
    """Fixed widths (--pad_buckets), or () for dynamic."""
    count = capture.bucket_count(cfg.pad_buckets, compile_mode, device_type)
    return shapes.bucket_widths(cfg.max_length, count) if count else ()


PACKED_ROWS_PER_WIDTH = 2  # as many row lengths as graphs allow


def packed_widths(cfg: TrainConfig, device_type: str, compile_mode: str = capture.NONE) -> tuple[int, ...]:
    """Fixed lengths for packed rows, or ()."""
    count = capture.bucket_count(cfg.pad_buckets, compile_mode, device_type)
    longest = cfg.per_device_train_batch_size * cfg.max_length
    return shapes.bucket_widths(longest, count * PACKED_ROWS_PER_WIDTH) if count else ()


def train_widths(cfg: TrainConfig, device_type: str, compile_mode: str = capture.NONE) -> tuple[int, ...]:
    """The widths a training batch takes: packed row lengths with --packing, else the pad widths; each one compiles."""
    return (packed_widths if cfg.packing else pad_widths)(cfg, device_type, compile_mode)


def loader_workers(cfg: TrainConfig, device_type: str) -> int:
    """--dataloader_num_workers, else GPU_LOADER_WORKERS on GPU and 0 on CPU."""
    if cfg.dataloader_num_workers is not None:
        return cfg.dataloader_num_workers
    return GPU_LOADER_WORKERS if device_type == "cuda" else 0


@dataclass(frozen=True)
class Collator:
    """A batch of windows padded to the smallest width holding it, with labels and text rows."""

    pad_token_id: int
    left: bool = False
    widths: tuple[int, ...] = ()
    multiple: int = 1
    packed: bool = False  # texts end to end in one row
    longest: int | None = None  # every text mask max_length wide

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase, widths: tuple[int, ...] = (), multiple: int = 1) -> Collator:
        return cls(tokenizer.pad_token_id, tokenizer.padding_side == "left", widths, multiple)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if self.packed:
            batch = packing.pack(features, self.pad_token_id, self.widths, self.multiple, self.longest)
        else:
            longest = max(len(f["input_ids"]) for f in features)
            width = shapes.width_for(longest, self.widths, self.multiple)
            batch = shapes.pad(features, self.pad_token_id, width, self.left)
        for key in NOT_MODEL_INPUTS:
            if key in features[0]:
                batch[key] = torch.tensor([f[key] for f in features])  # ints: int64; floats, multi-hot: float32
        return batch


def num_texts(split: datasets.Dataset | None) -> int:
    """Texts in a split; len() counts windows."""
    return 0 if split is None else len(set(split["document"]))


def make_dataloaders(
    splits: Splits,
    tokenizer: PreTrainedTokenizerBase,
    cfg: TrainConfig,
    num_processes: int,
    device_type: str = "cpu",
    compile_mode: str = capture.NONE,
) -> tuple[DataLoader, LengthGroupedBatchSampler, DataLoader, DataLoader | None]:
    """Train loader (with its sampler) and evaluation loaders, not yet prepared."""
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
    if cfg.packing:
        widths = packed_widths(cfg, device_type, compile_mode)
        multiple, fixed = pad_multiple(cfg, device_type), cfg.max_length if widths else None
        packed = Collator(tokenizer.pad_token_id, False, widths, multiple, packed=True, longest=fixed)
    common = dict(
        collate_fn=collate, num_workers=workers, persistent_workers=workers > 0, pin_memory=device_type == "cuda"
    )
    # its own generator: a resumed run draws the same dropout
    train_loader = DataLoader(
        _model_columns(splits.train, tokenizer, TEACHER, HARD),
        batch_sampler=sampler,
        generator=torch.Generator().manual_seed(cfg.seed),
        **{**common, **({"collate_fn": packed} if cfg.packing else {})},
    )

    def eval_loader(ds: datasets.Dataset) -> DataLoader:
        return make_eval_loader(ds, tokenizer, cfg.per_device_eval_batch_size, common)

    test_loader = eval_loader(splits.test) if splits.test is not None else None
    return train_loader, sampler, eval_loader(splits.validation), test_loader


def make_eval_loader(
    ds: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, batch_size: int, loader_kwargs: dict | None = None
) -> DataLoader:
    """Windows shortest first, each keeping its text's row."""
    loader_kwargs = loader_kwargs or {"collate_fn": Collator.of(tokenizer)}
    lengths = list(ds["length"])
    by_length = ds.select(sorted(range(len(ds)), key=lengths.__getitem__))
    return DataLoader(
        _model_columns(by_length, tokenizer, "document", QUERY), batch_size=batch_size, shuffle=False, **loader_kwargs
    )
