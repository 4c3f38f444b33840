"""The project's `evaluate` metric modules agree with scikit-learn and SciPy for every problem type; extra metrics
load or fail at once; the metric that picks the best model must be one that is reported."""

from __future__ import annotations

import evaluate
import pytest
import torch
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import (
    accuracy_score,
    confusion_matrix,
    f1_score,
    mean_absolute_error,
    mean_squared_error,
    precision_recall_fscore_support,
    r2_score,
)

from contract.errors import UserError
from contract.problem_types import MULTI, REGRESSION, SINGLE, ProblemType
from training.scoring.metrics import MetricSuite, fit_thresholds, greater_is_better

NAMES = ["World", "Sports", "Business", "Sci/Tech"]
SINGLE_TASK = ProblemType.named(SINGLE, 4)


def one_hot_scores(predictions: torch.Tensor, count: int = 4) -> torch.Tensor:
    return torch.nn.functional.one_hot(predictions, count).float()


def predictions_and_labels(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (257,), generator=gen)
    predictions = torch.where(torch.rand(257, generator=gen) < 0.7, labels, torch.randint(0, 4, (257,), generator=gen))
    if seed == 0:  # class 3 never occurs: sklearn averages over the classes present in either
        labels[labels == 3], predictions[predictions == 3] = 2, 1
    return predictions, labels


@pytest.mark.parametrize("seed", range(5))
def test_single_label_metrics_match_sklearn(seed):
    predictions, labels = predictions_and_labels(seed)
    metrics, report = MetricSuite(SINGLE_TASK, NAMES).compute(one_hot_scores(predictions), labels)
    assert metrics["accuracy"] == pytest.approx(accuracy_score(labels, predictions), abs=1e-12)
    assert metrics["macro_f1"] == pytest.approx(f1_score(labels, predictions, average="macro"), abs=1e-12)
    precision, recall, f1, support = precision_recall_fscore_support(
        labels, predictions, labels=range(4), zero_division=0
    )
    for i, name in enumerate(NAMES):
        got = report["per_class"][name]
        assert (got["precision"], got["recall"], got["f1"]) == pytest.approx(
            (precision[i], recall[i], f1[i]), abs=1e-12
        )
        assert got["support"] == support[i]
        assert metrics[f"recall_{name}"] == pytest.approx(recall[i], abs=1e-12)  # a class's recall can pick the best
    assert report["confusion_matrix"] == confusion_matrix(labels, predictions, labels=range(4)).tolist()


@pytest.mark.parametrize("seed", range(3))
def test_multi_label_metrics_match_sklearn(seed):
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(300, 5, generator=gen) < 0.3).float()
    scores = (labels * 0.6 + torch.rand(300, 5, generator=gen) * 0.5).clamp(max=1)
    thresholds = (0.5, 0.4, 0.6, 0.5, 0.7)
    names = list("abcde")
    metrics, report = MetricSuite(ProblemType.named(MULTI, 5, (0.5,) * 5), names).compute(scores, labels, thresholds)
    predicted = (scores >= torch.tensor(thresholds)).int().numpy()
    actual = labels.int().numpy()
    assert metrics["micro_f1"] == pytest.approx(f1_score(actual, predicted, average="micro"), abs=1e-12)
    assert metrics["macro_f1"] == pytest.approx(f1_score(actual, predicted, average="macro"), abs=1e-12)
    assert metrics["subset_accuracy"] == pytest.approx(accuracy_score(actual, predicted), abs=1e-12)
    precision, recall, f1, support = precision_recall_fscore_support(actual, predicted, zero_division=0)
    for i, name in enumerate(names):
        got = report["per_class"][name]
        assert (got["precision"], got["recall"], got["f1"], got["support"]) == pytest.approx(
            (precision[i], recall[i], f1[i], support[i]), abs=1e-12
        )
    assert "confusion_matrix" not in report


def test_regression_metrics_match_sklearn_and_scipy():
    gen = torch.Generator().manual_seed(0)
    targets = torch.randn(400, generator=gen) * 2 + 3
    predicted = targets + torch.randn(400, generator=gen) * 0.7
    predicted[:20] = predicted[20]  # ties: Spearman's mean ranks
    metrics, report = MetricSuite(ProblemType.named(REGRESSION, 1), ["score"]).compute(predicted[:, None], targets)
    expected = {
        "mse": mean_squared_error(targets, predicted),
        "mae": mean_absolute_error(targets, predicted),
        "r2": r2_score(targets, predicted),
        "pearson": pearsonr(predicted, targets).statistic,
        "spearman": spearmanr(predicted, targets).statistic,
    }
    assert {k: metrics[k] for k in expected} == pytest.approx(expected, abs=1e-6)
    assert report == {}


def test_fitted_thresholds_maximise_each_labels_f1_on_the_grid():
    scores = torch.tensor([[0.9, 0.2], [0.8, 0.35], [0.3, 0.3], [0.1, 0.05]])
    labels = torch.tensor([[1, 1], [1, 1], [0, 1], [0, 0]]).float()
    assert fit_thresholds(scores, labels) == [0.35, 0.1]  # lowest threshold of the best F1: 1.0 for both labels


def test_the_direction_of_a_metric_follows_its_nature_unless_given():
    assert greater_is_better("accuracy") and greater_is_better("recall_World") and greater_is_better("pearson")
    assert not greater_is_better("mse") and not greater_is_better("loss") and not greater_is_better("eval_loss")
    assert not greater_is_better("accuracy", given=False) and greater_is_better("mae", given=True)


def test_the_selection_metric_must_be_reported():
    suite = MetricSuite(ProblemType.named(MULTI, 3, (0.5,) * 3), ["a", "b", "c"])
    suite.check_selection("micro_f1")
    suite.check_selection("recall_b")
    with pytest.raises(UserError, match=r"metric_for_best_model: 'accuracy' is not reported for multi_label"):
        suite.check_selection("accuracy")


# an `evaluate` metric as a user writes one (evaluate's own template: templates/new_metric_script.py)
METRIC_SCRIPT = """
import datasets
import evaluate


class Metric(evaluate.Metric):
    def _info(self):
        feature = datasets.Value("int64")
        return evaluate.MetricInfo(
            description="", citation="", features=datasets.Features({"predictions": feature, "references": feature})
        )

    def _compute(self, predictions, references):
        CHECK
        return {"NAME": sum(p == r for p, r in zip(predictions, references)) / len(references)}
"""


def metric_folder(root, name: str, check: str = "pass"):
    folder = root / name
    folder.mkdir()
    (folder / f"{name}.py").write_text(METRIC_SCRIPT.replace("NAME", name).replace("CHECK", check))
    return folder


def test_an_extra_metric_by_local_path_is_reported(tmp_path):
    folder = metric_folder(tmp_path, "exact_match_rate")
    suite = MetricSuite(SINGLE_TASK, NAMES, [str(folder)])
    metrics, _ = suite.compute(one_hot_scores(torch.tensor([0, 1, 2, 3])), torch.tensor([0, 1, 2, 0]))
    assert metrics["exact_match_rate"] == metrics["accuracy"] == 0.75
    assert metrics["macro_f1"] == pytest.approx(f1_score([0, 1, 2, 0], [0, 1, 2, 3], average="macro"))
    assert "exact_match_rate" in suite.names()


def test_an_extra_metric_that_cannot_load_fails_at_once(monkeypatch):
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
    with pytest.raises(UserError, match="extra_metrics: cannot load 'matthews_correlation'"):
        MetricSuite(SINGLE_TASK, NAMES, ["matthews_correlation"])


def test_an_extra_metric_that_cannot_score_the_problem_type_fails_at_once(tmp_path):
    check = "if max(references) > 1: raise ValueError('binary labels only')"
    binary_only = metric_folder(tmp_path, "binary_only", check)
    MetricSuite(ProblemType.named(SINGLE, 2), ["a", "b"], [str(binary_only)])
    with pytest.raises(UserError, match=r"cannot score single_label_classification predictions \(ValueError: binary"):
        MetricSuite(SINGLE_TASK, NAMES, [str(binary_only)])
