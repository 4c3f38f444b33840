"""A micro-batch's length-sorted inputs planned into forward passes: by length ratio within a token budget
(dynamic shapes, the CPU default), or into the fewest (rows, width) buckets of contract/shapes.py (static shapes,
which CUDA graphs replay)."""

from __future__ import annotations

from contract import shapes
from contract.model_call import PAD_MULTIPLE


def _padded(length: int) -> int:
    return shapes.round_up(length, PAD_MULTIPLE)


def forward_buckets(items: list, max_inputs: int, max_tokens: int, ratio: float = 1.5, slack: int = 16) -> list[list]:
    """Split length-sorted (job, input, features) items into forward passes: a new pass starts where the length
    grows past ratio x the pass's shortest (+ slack tokens), or the pass would exceed max_inputs inputs or
    max_tokens padded tokens."""
    buckets: list[list] = []
    for item in items:
        length = len(item[2]["input_ids"])
        if buckets:
            bucket = buckets[-1]
            shortest = len(bucket[0][2]["input_ids"])
            if (
                length <= ratio * shortest + slack
                and len(bucket) < max_inputs
                and (len(bucket) + 1) * _padded(length) <= max_tokens
            ):
                bucket.append(item)
                continue
        buckets.append([item])
    return buckets


def static_passes(items: list, rows: tuple[int, ...], widths: tuple[int, ...], max_tokens: int) -> list[tuple]:
    """Length-sorted (job, input, features) items in as few forward passes as fit, each padded to the smallest
    (rows, width) bucket that holds it (contract/shapes.py: `serving_buckets`) within max_tokens padded tokens:
    (items, rows, width) per pass."""
    passes: list[list] = []
    for item in items:
        width = shapes.width_for(len(item[2]["input_ids"]), widths)  # the longest so far: items are sorted
        if passes and len(passes[-1]) < rows[-1] and shapes.width_for(len(passes[-1]) + 1, rows) * width <= max_tokens:
            passes[-1].append(item)
        else:
            passes.append([item])
    return [
        (part, shapes.width_for(len(part), rows), shapes.width_for(len(part[-1][2]["input_ids"]), widths))
        for part in passes
    ]
