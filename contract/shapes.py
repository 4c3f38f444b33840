"""Batch shapes for training and serving: the widths batches are padded to, and the padding.

Compiled or captured passes are specialised to shapes, so batches pad to a few widths ("buckets"); serving pads rows
too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

GPU_MULTIPLE = 8  # tensor cores want multiples of 8
DEFAULT_BUCKETS = 4  # widths per run when static shapes are on (docs/configuration.md: --pad_buckets)
CPU_COMPILED_BUCKETS = 16  # on a CPU a padded token costs a real one
SMALLEST_WIDTH = 16  # a short text pays at most this


def bucket_widths(max_length: int, count: int, multiple: int = GPU_MULTIPLE) -> tuple[int, ...]:
    """`count` widths up to `max_length`, rounded up to `multiple`."""
    if count < 1:
        raise ValueError(f"bucket count must be at least 1 (got {count})")
    widths = {min(max_length, round_up(-(-max_length * k // count), multiple)) for k in range(1, count + 1)}
    return tuple(sorted(widths))


def doublings(smallest: int, largest: int) -> tuple[int, ...]:
    """Doublings of smallest below largest, then largest."""
    found, value = [], smallest
    while value < largest:
        found.append(value)
        value *= 2
    return (*found, largest)


def serving_buckets(max_rows: int, max_length: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(rows, widths) the service pads forward passes to."""
    return doublings(1, max_rows), doublings(SMALLEST_WIDTH, max_length)


def round_up(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def width_for(longest: int, widths: Sequence[int] = (), multiple: int = 1) -> int:
    """The smallest bucket holding `longest`, else `longest` rounded up."""
    for width in widths:
        if width >= longest:
            return width
    return round_up(longest, multiple)


def pad(features: Sequence[dict], pad_token_id: int, width: int, left: bool = False) -> dict[str, torch.Tensor]:
    """Ids and mask padded to `width`, filled into preallocated arrays (10x faster than lists). `left` pads in front."""
    rows = len(features)
    lengths = np.fromiter((len(f["input_ids"]) for f in features), dtype=np.int64, count=rows)
    starts = width - lengths if left else np.zeros(rows, dtype=np.int64)

    def filled(name: str, fill: int) -> torch.Tensor:
        values = np.full((rows, width), fill, dtype=np.int64)
        for row, (feature, start, length) in enumerate(zip(features, starts, lengths, strict=True)):
            values[row, start : start + length] = feature[name]
        return torch.from_numpy(values)

    columns = np.arange(width)
    mask = (columns >= starts[:, None]) & (columns < (starts + lengths)[:, None])
    batch = {"input_ids": filled("input_ids", pad_token_id), "attention_mask": torch.from_numpy(mask.astype(np.int64))}
    if "token_type_ids" in features[0]:
        batch["token_type_ids"] = filled("token_type_ids", 0)
    return batch
