"""Scores from logits as NumPy arrays: the service's per-batch host math, on one thread (a torch op on a 32x4 tensor
forks the intra-op pool, which costs milliseconds on busy cores). Called by the engine; the rule for a one-output
softmax is shared with problem_types.scored. Imports no torch.
"""

from __future__ import annotations

import numpy as np

SOFTMAX, SIGMOID, NONE = "softmax", "sigmoid", "none"


def applied(function: str, outputs: int) -> str:
    """The function a scoring asks for: a one-output softmax is a sigmoid, as in TEI."""
    return SIGMOID if function == SOFTMAX and outputs == 1 else function


def scored(logits: np.ndarray, function: str) -> np.ndarray:
    """fp32 scores of rows of fp32 logits by `function` (softmax, sigmoid or none)."""
    function = applied(function, logits.shape[-1])
    if function == SIGMOID:
        return sigmoid(logits)
    if function == SOFTMAX:
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)
    return logits


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) without overflow at either end."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def pooled(rows: np.ndarray, owner: np.ndarray, inputs: int, pooling: str) -> np.ndarray:
    """Each input's row: the mean (`pooling` "mean") or the maximum of the rows it owns; rows in owner order stay."""
    if len(owner) == inputs and (owner == np.arange(inputs)).all():
        return rows  # one window each, in order: nothing to pool
    order = np.argsort(owner, kind="stable")
    rows, owner = rows[order], owner[order]
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    if pooling == "mean":
        return np.add.reduceat(rows, starts, axis=0) / np.diff(np.r_[starts, len(owner)])[:, None].astype(rows.dtype)
    return np.maximum.reduceat(rows, starts, axis=0)


def ranked(scores: list[list[float]], labels: list[str]) -> list[list[dict]]:
    """Each row's labels, best first, with their scores; equal scores keep the labels' order (a stable sort: plain
    Python, 6x cheaper than NumPy on rows of a few labels)."""
    return [
        [{"score": row[i], "label": labels[i]} for i in sorted(range(len(row)), key=row.__getitem__, reverse=True)]
        for row in scores
    ]


BEST, THRESHOLDS = "best", "thresholds"  # problem_types' `decides`: the rule of its decisions


def decided(rule: str, row: list[float], thresholds: list[float]) -> list[bool]:
    """One input's decision per label by a problem type's rule (its `decides`), as its torch `decisions` make it:
    the best label (the first of equal scores, as argmax), or every label at or above its threshold; a model without
    classes decides nothing (ValueError)."""
    if rule == BEST:
        best = max(range(len(row)), key=row.__getitem__)
        return [i == best for i in range(len(row))]
    if rule == THRESHOLDS:  # in fp32, as the scores are: 0.7 is 0.699999988 to the model, and a score of it decides
        above = np.asarray(row, dtype=np.float32) >= np.asarray(thresholds, dtype=np.float32)
        return above.tolist()
    raise ValueError(f"a model that decides by {rule!r} has no classes to decide")
