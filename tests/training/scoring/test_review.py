"""training/scoring/review.py: the review band fitted on known scores holds its precision where it decides, and
withholds what cannot reach it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contract.problem_types import MULTI, SINGLE, ProblemType
from training.scoring import review


def test_the_cutoff_is_the_lowest_score_whose_decisions_hold_the_precision():
    """Sorted high to low: 200 right, then a mix; the lowest cutoff whose Wilson bound reaches 0.95 is found, equal
    scores are kept or dropped together, and a split that never reaches it gets ABOVE_EVERY_SCORE."""
    scores = np.linspace(1.0, 0.0, 400, dtype=np.float32)
    right = np.r_[np.ones(200, bool), np.arange(200) % 2 == 0]
    found = review.cutoff(scores, right, 0.95)
    kept = scores >= found
    n, hits = kept.sum(), right[kept].sum()
    assert review.lower_bound(np.array([hits]), np.array([n]))[0] >= 0.95
    one_more = kept | (scores == scores[~kept].max())
    assert review.lower_bound(np.array([right[one_more].sum()]), np.array([one_more.sum()]))[0] < 0.95
    assert review.cutoff(np.full(300, 0.7, np.float32), np.r_[np.ones(290, bool), np.zeros(10, bool)], 0.99) == 2.0
    assert review.cutoff(scores, np.zeros(400, bool), 0.95) == review.ABOVE_EVERY_SCORE


def synthetic(texts: int, seed: int, noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-label scores whose errors sit near 0.5: a label is on with probability 0.3; its score is its truth
    pushed by noise."""
    generator = torch.Generator().manual_seed(seed)
    truth = (torch.rand(texts, 3, generator=generator) < 0.3).float()
    scores = (truth * 2 - 1 + noise * torch.randn(texts, 3, generator=generator)).mul(2).sigmoid()
    return scores, truth


@pytest.mark.parametrize(("precision", "noise"), [(0.9, 1.0), (0.95, 0.8), (0.99, 0.5)])  # each short of it alone
def test_a_multi_label_band_fitted_on_one_split_holds_on_another(precision, noise):
    problem = ProblemType.named(MULTI, 3, (0.5, 0.5, 0.5))
    ranges = review.fit(problem, *synthetic(3000, 0, noise), precision)
    assert all(low <= 0.5 <= high for low, high in ranges)
    banded = type(problem)(3, (0.5, 0.5, 0.5), tuple(map(tuple, ranges)), precision)
    measured = review.measured(banded, *synthetic(3000, 1, noise))
    assert measured["precision"] >= precision and measured["negative_precision"] >= precision, measured
    assert 0 < measured["coverage"] < 1 and measured["without_band"]["precision"] < precision


def test_a_single_label_band_withholds_low_top_scores():
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (2000,), generator=generator)
    logits = torch.randn(2000, 4, generator=generator) + 2.5 * torch.nn.functional.one_hot(labels, 4)
    scores = logits.softmax(-1)
    problem = ProblemType.named(SINGLE, 4)
    [[low, high]] = review.fit(problem, scores, labels, 0.95)
    assert low == 0.0 and 0.25 < high < 1
    banded = type(problem)(4, (), ((low, high),), 0.95)
    measured = review.measured(banded, scores, labels)
    assert measured["precision"] >= 0.95 > measured["without_band"]["precision"]
    assert measured["coverage"] == pytest.approx(float((scores.max(1).values >= high).float().mean()))
    assert banded.config_fields()["problem_type"] == SINGLE and banded.band_record() == {
        "precision": 0.95,
        "ranges": [[low, high]],
    }
