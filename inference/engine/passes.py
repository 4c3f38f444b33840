"""A micro-batch's inputs planned into forward passes: by length within a token budget (dynamic shapes), or into the
fewest (rows, width) buckets (static shapes). Called by the engine.
"""

from __future__ import annotations

from contract import shapes
from contract.model_call import PAD_MULTIPLE


def _padded(length: int) -> int:
    return shapes.round_up(length, PAD_MULTIPLE)


def forward_buckets(items: list, max_inputs: int, max_tokens: int, ratio: float = 1.5, slack: int = 16) -> list[list]:
    """Passes split where lengths grow past `ratio`, or inputs or tokens overflow."""
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
    """The fewest passes, each padded to its smallest bucket within max_tokens."""
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
