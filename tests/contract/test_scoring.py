"""The service's NumPy scoring (contract/scoring.py) against the torch functions training and evaluation use."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contract import scoring
from contract.long_text import LongText
from contract.problem_types import scored


@pytest.mark.parametrize("function", ["softmax", "sigmoid", "none"])
@pytest.mark.parametrize("outputs", [1, 4])
def test_numpy_scores_equal_torchs(function, outputs):
    logits = torch.randn(64, outputs, generator=torch.Generator().manual_seed(outputs)) * 30  # both tails of exp
    expected = scored(logits, function).numpy()
    got = scoring.scored(logits.numpy(), function)
    assert got.dtype == np.float32 and np.abs(got - expected).max() <= 1e-6
    assert np.isfinite(got).all()


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_numpy_pooling_equals_the_long_text_pool(pooling):
    rng = np.random.default_rng(0)
    owner = rng.permutation(np.repeat(np.arange(7), rng.integers(1, 4, 7)))  # windows in any order
    rows = rng.standard_normal((len(owner), 4)).astype(np.float32)
    expected = LongText(pooling=pooling).pool(torch.from_numpy(rows), owner.tolist(), 7).numpy()
    assert np.abs(scoring.pooled(rows, owner, 7, pooling) - expected).max() <= 1e-6
    one_each = rows[:7]
    assert scoring.pooled(one_each, np.arange(7), 7, pooling) is one_each  # one window each: untouched


def test_ranking_is_best_first_and_ties_keep_the_labels_order():
    labels = ["World", "Sports", "Business", "Sci/Tech"]
    rows = scoring.ranked([[0.1, 0.4, 0.4, 0.1], [0.7, 0.1, 0.1, 0.1]], labels)
    assert [entry["label"] for entry in rows[0]] == ["Sports", "Business", "World", "Sci/Tech"]
    assert [entry["label"] for entry in rows[1]] == labels
    assert rows[1][0] == {"score": pytest.approx(0.7), "label": "World"}


def test_decided_is_the_problem_types_decision():
    """The service's torch-free decision (moderation) against problem_types' torch one, on random scores with ties and
    scores equal to a threshold in fp32."""
    from contract.problem_types import MULTI, REGRESSION, SINGLE, ProblemType
    from contract.scoring import decide

    def decided(rule, row, thresholds):
        return decide(rule, np.asarray([row]), thresholds).chosen[0].tolist()

    generator = torch.Generator().manual_seed(0)
    scores = torch.rand(200, 5, generator=generator).round(decimals=1)  # ties, and 0.7 itself
    thresholds = [0.3, 0.5, 0.5, 0.7, 0.9]
    single, multi = ProblemType.named(SINGLE, 5), ProblemType.named(MULTI, 5, tuple(thresholds))
    best, above = single.decisions(scores), multi.decisions(scores)
    for i, row in enumerate(scores.tolist()):
        assert decided(single.decides, row, []) == [j == best[i].item() for j in range(5)]
        assert decided(multi.decides, row, thresholds) == above[i].tolist()
    with pytest.raises(ValueError, match="no classes"):
        decided(ProblemType.named(REGRESSION).decides, [0.3], [])


def test_decide_withholds_inside_the_review_band_and_nowhere_else():
    """The band is [low, high): single-label on the top score (the whole text withheld), multi-label per label."""
    from contract.scoring import BEST, THRESHOLDS, decide

    scores = np.array([[0.9, 0.1], [0.55, 0.45], [0.5, 0.5], [0.2, 0.8]], dtype=np.float32)
    single = decide(BEST, scores, band=[[0.0, 0.6]])
    assert single.chosen.tolist() == [[True, False], [False, False], [False, False], [False, True]]
    assert single.withheld().tolist() == [False, True, True, False]
    assert single.tri_state().tolist() == [[1, 0], [-1, -1], [-1, -1], [0, 1]]
    multi = decide(THRESHOLDS, scores, [0.5, 0.5], band=[[0.4, 0.6], [0.0, 0.0]])
    assert multi.review[:, 0].tolist() == [False, True, True, False]  # 0.55 and 0.5 inside [0.4, 0.6)
    assert multi.chosen.tolist() == [[True, False], [False, False], [False, True], [False, True]]
    assert not multi.review[:, 1].any()  # an empty range withholds nothing
    plain = decide(THRESHOLDS, scores, [0.5, 0.5])
    assert plain.chosen.tolist() == (scores >= 0.5).tolist() and not plain.review.any()
