"""The project's `evaluate` metric modules agree with scikit-learn; extra metrics load or fail at once."""

from __future__ import annotations

import evaluate
import pytest
import torch
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support

from training.metrics import MODULES, MetricError, MetricSuite, classification_report


def predictions_and_labels(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (257,), generator=gen)
    predictions = torch.where(torch.rand(257, generator=gen) < 0.7, labels, torch.randint(0, 4, (257,), generator=gen))
    if seed == 0:  # class 3 never occurs: sklearn averages over the classes present in either
        labels[labels == 3], predictions[predictions == 3] = 2, 1
    return predictions, labels


@pytest.mark.parametrize("seed", range(5))
def test_suite_added_batch_by_batch_matches_sklearn(seed):
    predictions, labels = predictions_and_labels(seed)
    suite = MetricSuite()
    for start in range(0, 257, 64):  # as evaluation adds each gathered batch
        suite.add_batch(predictions=predictions[start : start + 64], references=labels[start : start + 64])
    metrics = suite.compute()
    assert metrics["accuracy"] == pytest.approx(accuracy_score(labels, predictions), abs=1e-12)
    assert metrics["macro_f1"] == pytest.approx(f1_score(labels, predictions, average="macro"), abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_classification_report_matches_sklearn(seed):
    predictions, labels = predictions_and_labels(seed)
    names = ["World", "Sports", "Business", "Sci/Tech"]
    report = classification_report(predictions, labels, names)
    precision, recall, f1, support = precision_recall_fscore_support(
        labels, predictions, labels=range(4), zero_division=0
    )
    for i, name in enumerate(names):
        got = report["per_class"][name]
        assert (got["precision"], got["recall"], got["f1"]) == pytest.approx(
            (precision[i], recall[i], f1[i]), abs=1e-12
        )
        assert got["support"] == support[i]
    assert report["confusion_matrix"] == confusion_matrix(labels, predictions, labels=range(4)).tolist()


def test_the_modules_load_with_evaluate_from_their_folder_offline():
    accuracy = evaluate.load(str(MODULES / "accuracy"))
    assert accuracy.compute(predictions=[0, 1, 1], references=[0, 1, 0]) == {"accuracy": pytest.approx(2 / 3)}


def test_an_extra_metric_by_local_path_is_reported(tmp_path):
    folder = tmp_path / "exact_match_rate"
    folder.mkdir()
    source = (MODULES / "accuracy" / "accuracy.py").read_text()
    (folder / "exact_match_rate.py").write_text(source.replace('return {"accuracy":', 'return {"exact_match_rate":'))
    suite = MetricSuite([str(folder)], num_labels=4)
    suite.add_batch(predictions=[0, 1, 2, 3], references=[0, 1, 2, 0])
    assert suite.compute() == {
        "accuracy": 0.75,
        "macro_f1": pytest.approx(f1_score([0, 1, 2, 0], [0, 1, 2, 3], average="macro")),
        "exact_match_rate": 0.75,
    }


def test_an_extra_metric_that_cannot_load_fails_at_once(monkeypatch):
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
    with pytest.raises(MetricError, match="extra_metrics: cannot load 'matthews_correlation'"):
        MetricSuite(["matthews_correlation"], num_labels=4)


def test_an_extra_metric_that_cannot_score_the_task_fails_at_once(tmp_path):
    binary_only = tmp_path / "binary_only"
    binary_only.mkdir()
    (binary_only / "binary_only.py").write_text(
        (MODULES / "accuracy" / "accuracy.py")
        .read_text()
        .replace(
            "        predictions, references = torch.as_tensor",
            "        if max(references) > 1:\n            raise ValueError('binary labels only')\n"
            "        predictions, references = torch.as_tensor",
        )
    )
    MetricSuite([str(binary_only)], num_labels=2)
    with pytest.raises(MetricError, match=r"cannot score 4-class predictions \(ValueError: binary labels only\)"):
        MetricSuite([str(binary_only)], num_labels=4)
