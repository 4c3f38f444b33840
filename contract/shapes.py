"""Batch shapes, one owner for training and serving: the widths batches are padded to, and the padding itself.

A compiled or graph-captured forward pass is specialised to its shapes, so batches can be padded to the smallest of a
few fixed widths ("buckets") instead of their longest input: a handful of shapes per run for some extra padding.
Without buckets a batch is padded to its longest input rounded up to a multiple (8 on GPU). Serving pads rows too
(`serving_buckets`): a CUDA graph per (rows, width) shape, both from doublings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

GPU_MULTIPLE = 8  # tensor cores want multiples of 8
DEFAULT_BUCKETS = 4  # widths per run when static shapes are on (docs/configuration.md: --pad_buckets)
CPU_COMPILED_BUCKETS = 16  # compiled on a CPU, where a padded token costs as much as a real one: narrower steps
SMALLEST_WIDTH = 16  # serving's narrowest bucket: a short text pays for this many tokens at most


def bucket_widths(max_length: int, count: int, multiple: int = GPU_MULTIPLE) -> tuple[int, ...]:
    """`count` widths evenly spaced up to `max_length`, each rounded up to `multiple`; the widest is max_length."""
    if count < 1:
        raise ValueError(f"bucket count must be at least 1 (got {count})")
    widths = {min(max_length, round_up(-(-max_length * k // count), multiple)) for k in range(1, count + 1)}
    return tuple(sorted(widths))


def doublings(smallest: int, largest: int) -> tuple[int, ...]:
    """smallest, 2 x smallest, ... below largest, then largest itself (just largest when smallest >= largest)."""
    found, value = [], smallest
    while value < largest:
        found.append(value)
        value *= 2
    return (*found, largest)


def serving_buckets(max_rows: int, max_length: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(rows, widths): the batch sizes and widths a forward pass of the service is padded to. Every (rows, width)
    pair within the service's token budget is a shape it may run (one CUDA graph each: inference/engine.py)."""
    return doublings(1, max_rows), doublings(SMALLEST_WIDTH, max_length)


def round_up(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def width_for(longest: int, widths: Sequence[int] = (), multiple: int = 1) -> int:
    """The width for a batch whose longest input has `longest` tokens: the smallest bucket that holds it, or, without
    buckets (or past the widest: an input the caller let through untruncated), `longest` rounded up to `multiple`."""
    for width in widths:
        if width >= longest:
            return width
    return round_up(longest, multiple)


def pad(features: Sequence[dict], pad_token_id: int, width: int, left: bool = False) -> dict[str, torch.Tensor]:
    """Token ids (and token type ids) of each input padded to `width`, with the attention mask: what `tokenizer.pad`
    returns. Filled into preallocated arrays row by row (numpy converts each row's list at C speed): a Python list
    per padded row cost ~1 ms for 32 rows of 128 on the model thread, ~0.1 ms this way. `left` pads in front (a
    tokenizer whose padding side is left)."""
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
