"""Scores from logits as NumPy arrays: the service's per-batch host math, on one thread (a torch op on a 32x4 tensor
forks the intra-op pool, which costs milliseconds on busy cores). Called by the engine; the rule for a one-output
softmax is shared with problem_types.scored. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

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
REVIEW = "review"  # the word a withheld decision is written as (predict's `decision`, vLLM's `label`)


@dataclass(frozen=True)
class Decisions:
    """Texts x labels: `chosen` where a label is decided yes, `review` where the decision is withheld (the review
    band); a label is decided no where neither holds."""

    chosen: np.ndarray
    review: np.ndarray

    def withheld(self) -> np.ndarray:
        """Per text: any label withheld."""
        return self.review.any(axis=1)

    def tri_state(self) -> np.ndarray:
        """int8 texts x labels: 1 yes, 0 no, -1 review (KServe's `decision` tensor)."""
        return np.where(self.review, -1, self.chosen.astype(np.int8)).astype(np.int8)


def decide(rule: str, scores: np.ndarray, thresholds=(), band=()) -> Decisions:
    """The decisions of rows of scores by a problem type's rule (its `decides`): the one function the service,
    predict, evaluate, Ray's replicas and the int8 guard decide by.

    `best`: the top label (the first of equal scores, as argmax); `band` one [low, high) range of the top score in
    which the text is withheld. `thresholds`: every label at or above its threshold; `band` one [low, high) per label
    in which that label is withheld. A model without classes decides nothing (ValueError)."""
    scores = np.asarray(scores, dtype=np.float32)  # in fp32, as served: 0.7 is 0.699999988 and a score of it decides
    if rule == BEST:
        top = scores.argmax(axis=1)
        chosen = np.zeros(scores.shape, dtype=bool)
        chosen[np.arange(len(scores)), top] = True
        if not len(band):
            return Decisions(chosen, np.zeros(scores.shape, dtype=bool))
        withheld = _inside(scores[np.arange(len(scores)), top], *np.asarray(band, dtype=np.float32)[0])
        review = np.repeat(withheld[:, None], scores.shape[1], axis=1)
        return Decisions(chosen & ~review, review)
    if rule == THRESHOLDS:
        above = scores >= np.asarray(thresholds, dtype=np.float32)
        if not len(band):
            return Decisions(above, np.zeros(scores.shape, dtype=bool))
        bounds = np.asarray(band, dtype=np.float32)
        review = _inside(scores, bounds[:, 0], bounds[:, 1])
        return Decisions(above & ~review, review)
    raise ValueError(f"a model that decides by {rule!r} has no classes to decide")


def _inside(scores: np.ndarray, low, high) -> np.ndarray:
    return (scores >= low) & (scores < high)
