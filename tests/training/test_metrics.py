"""Accuracy and macro-F1 agree with scikit-learn's definitions."""

from __future__ import annotations

import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score

from training.metrics import classification_metrics


@pytest.mark.parametrize("seed", range(5))
def test_matches_sklearn(seed):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (257,), generator=gen)
    predictions = torch.where(torch.rand(257, generator=gen) < 0.7, labels, torch.randint(0, 4, (257,), generator=gen))
    if seed == 0:  # class 3 never occurs: sklearn averages over the classes present in either
        labels[labels == 3], predictions[predictions == 3] = 2, 1
    metrics = classification_metrics(predictions, labels, num_labels=4)
    assert metrics["num_examples"] == 257
    assert metrics["accuracy"] == pytest.approx(accuracy_score(labels, predictions), abs=1e-12)
    assert metrics["macro_f1"] == pytest.approx(f1_score(labels, predictions, average="macro"), abs=1e-12)


def test_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        classification_metrics(torch.zeros(3), torch.zeros(4), num_labels=2)
