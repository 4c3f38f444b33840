"""The review band (--review_precision): the scores at which a model's decisions do not reach a precision on
validation, fitted once the model is calibrated and recorded in config.json (contract/scoring.decide applies it);
measured on a split by evaluate and at the end of training. Called by finish.py and evaluate.py.
"""

from __future__ import annotations

import numpy as np
import torch

from contract import scoring
from contract.problem_types import ProblemType

Z = 1.645  # a one-sided 95 % Wilson bound: the precision must hold past the rows it was fitted on
ABOVE_EVERY_SCORE = 2.0  # a range's high end where no cutoff reaches the precision: every such decision withheld
FEWEST_TEXTS = 100  # fewer validation texts: nothing is fitted


def lower_bound(right: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Wilson's lower bound on a share of `right` out of `count`, at Z."""
    share = right / count
    centre = share + Z**2 / (2 * count)
    spread = Z * np.sqrt(share * (1 - share) / count + Z**2 / (4 * count**2))
    return (centre - spread) / (1 + Z**2 / count)


def cutoff(scores: np.ndarray, right: np.ndarray, precision: float) -> float:
    """The lowest score t whose decisions at scores >= t are right at `precision` (lower bound); ABOVE_EVERY_SCORE
    where none are."""
    order = np.argsort(-scores, kind="stable")
    ordered, hits = scores[order], np.cumsum(right[order])
    ends = np.r_[ordered[1:] != ordered[:-1], True]  # a cutoff keeps or drops equal scores together
    held = ends & (lower_bound(hits, np.arange(1, len(ordered) + 1)) >= precision)
    return float(ordered[np.flatnonzero(held)[-1]]) if held.any() else ABOVE_EVERY_SCORE


def fit(problem: ProblemType, scores: torch.Tensor, labels: torch.Tensor, precision: float) -> list[list[float]]:
    """The band's ranges: [0, t) on the top score (single-label), or [low, high) around each label's threshold
    (multi-label), outside which validation's decisions are right at `precision`."""
    values = scores.detach().float().numpy()
    chosen = problem.decided(scores, band=False).chosen
    if problem.decides == scoring.BEST:
        top = chosen.argmax(axis=1)
        right = top == labels.numpy()
        return [[0.0, cutoff(values[np.arange(len(values)), top], right, precision)]]
    actual = labels.numpy().astype(bool)
    return [
        label_range(values[:, j], chosen[:, j], actual[:, j], threshold, precision)
        for j, threshold in enumerate(problem.thresholds)
    ]


def label_range(values: np.ndarray, yes: np.ndarray, actual: np.ndarray, threshold: float, precision: float) -> list:
    """One label's [low, high) around its threshold: yes decisions at high or above, and no decisions below low, are
    right at `precision`; a side without decisions on validation is withheld whole."""
    high = cutoff(values[yes], actual[yes], precision) if yes.any() else ABOVE_EVERY_SCORE
    no_scores, no_right = values[~yes], ~actual[~yes]
    deepest = -cutoff(-no_scores, no_right, precision) if len(no_scores) else -ABOVE_EVERY_SCORE
    if deepest == -ABOVE_EVERY_SCORE:
        return [0.0, high]
    above = no_scores[no_scores > deepest]  # the lowest no score withheld: below it, all are right enough
    return [float(above.min()) if len(above) else threshold, high]


def record(precision: float, ranges: list[list[float]]) -> dict:
    """config.json's review_band."""
    return {"precision": precision, "ranges": ranges}


def measured(problem: ProblemType, scores: torch.Tensor, labels: torch.Tensor) -> dict:
    """On a split: the share decided (coverage) and the precision of those decisions, beside the decisions without
    the band. Single-label: per text; multi-label: per label cell, yes and no decisions apart."""
    banded, plain = problem.decided(scores), problem.decided(scores, band=False)
    if problem.decides == scoring.BEST:
        right = plain.chosen.argmax(axis=1) == labels.numpy()
        kept = ~banded.withheld()
        return {
            "coverage": float(kept.mean()),
            "precision": _share(right[kept]),
            "without_band": {"precision": _share(right)},
        }
    actual = labels.numpy().astype(bool)
    yes, no = banded.chosen, ~banded.chosen & ~banded.review
    return {
        "coverage": float((yes | no).mean()),
        "texts_decided": float((~banded.withheld()).mean()),
        "precision": _share(actual[yes]),
        "negative_precision": _share(~actual[no]),
        "without_band": {
            "precision": _share(actual[plain.chosen]),
            "negative_precision": _share(~actual[~plain.chosen]),
        },
    }


def _share(right: np.ndarray) -> float | None:
    return float(right.mean()) if right.size else None


def curve(problem: ProblemType, scores: torch.Tensor, labels: torch.Tensor) -> list[tuple[float, float]]:
    """(coverage, precision) of the yes decisions kept as their lowest kept score rises: the band's trade-off (the
    top label's decisions for single-label; every label's yes decisions together for multi-label)."""
    plain = problem.decided(scores, band=False).chosen
    values = scores.detach().float().numpy()
    if problem.decides == scoring.BEST:
        top = plain.argmax(axis=1)
        kept, right = values[np.arange(len(values)), top], top == labels.numpy()
    else:
        kept, right = values[plain], labels.numpy().astype(bool)[plain]
    order = np.argsort(-kept, kind="stable")
    hits, count = np.cumsum(right[order]), np.arange(1, len(order) + 1)
    return list(zip((count / max(len(order), 1)).tolist(), (hits / count).tolist(), strict=True))


def said(measured: dict) -> str:
    """One line of what `measured` found."""
    line = f"coverage {measured['coverage']:.3f}, precision of the decided {_shown(measured['precision'])}"
    if "negative_precision" in measured:
        line += f" (no decisions {_shown(measured['negative_precision'])})"
    plain = measured["without_band"]["precision"]
    return f"{line}; without the band {_shown(plain)} on every text"


def _shown(share: float | None) -> str:
    return "n/a (none decided)" if share is None else f"{share:.4f}"
