"""The built-in metrics in torch, one function per set, from a split's decisions and references. Called by MetricSuite;
undefined ratios are 0, as scikit-learn's `zero_division=0`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return torch.where(denominator > 0, numerator / denominator.clamp(min=1), torch.zeros_like(denominator))


def _per_class(names: Sequence[str], true_positives: torch.Tensor, support: torch.Tensor, predicted: torch.Tensor):
    """Per-class precision, recall, F1 and support; the F1s."""
    precision, recall = _ratio(true_positives, predicted), _ratio(true_positives, support)
    f1 = _ratio(2 * true_positives, support + predicted)
    report = {
        name: {"precision": p, "recall": r, "f1": f, "support": int(s)}
        for name, p, r, f, s in zip(names, precision.tolist(), recall.tolist(), f1.tolist(), support.tolist())
    }
    return report, f1


def _confusion(predictions, references, n: int) -> torch.Tensor:
    """Rows: reference class; columns: predicted class."""
    predicted, actual = torch.as_tensor(predictions).long(), torch.as_tensor(references).long()
    return torch.bincount(actual * n + predicted, minlength=n * n).reshape(n, n)


def accuracy(predictions, references, names: Sequence[str]) -> dict:
    correct = (torch.as_tensor(predictions) == torch.as_tensor(references)).sum().item()
    return {"accuracy": correct / len(references) if len(references) else 0.0}


def macro_f1(predictions, references, names: Sequence[str]) -> dict:
    """scikit-learn's macro-F1: over classes present anywhere."""
    confusion = _confusion(predictions, references, len(names)).double()
    denominator = confusion.sum(0) + confusion.sum(1)  # 2 TP + FP + FN, per class
    present = denominator > 0
    f1 = 2 * confusion.diag()[present] / denominator[present]
    return {"macro_f1": f1.mean().item() if present.any() else 0.0}


def classification_report(predictions, references, names: Sequence[str]) -> dict:
    confusion = _confusion(predictions, references, len(names))
    counts = confusion.double()
    report, _ = _per_class(names, counts.diag(), counts.sum(1), counts.sum(0))
    return {"per_class": report, "confusion_matrix": confusion.tolist()}


def multilabel(predictions, references, names: Sequence[str]) -> dict:
    """Micro- and macro-F1, subset and Hamming accuracy, per label."""
    predicted = torch.as_tensor(predictions).double().reshape(-1, len(names))
    actual = torch.as_tensor(references).double().reshape(-1, len(names))
    true_positives, support, chosen = (predicted * actual).sum(0), actual.sum(0), predicted.sum(0)
    per_label, f1 = _per_class(names, true_positives, support, chosen)
    some = len(actual) > 0
    return {
        "micro_f1": _ratio(2 * true_positives.sum(), support.sum() + chosen.sum()).item(),
        "macro_f1": f1.mean().item(),
        "subset_accuracy": (predicted == actual).all(dim=1).double().mean().item() if some else 0.0,
        "hamming_accuracy": (predicted == actual).double().mean().item() if some else 0.0,
        "per_class": per_label,
    }


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    scale = (a.square().sum() * b.square().sum()).sqrt()
    return (a * b).sum().div(scale).item() if scale > 0 else 0.0


def _ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based ranks; tied values share their mean rank (Spearman's)."""
    ranks = torch.empty_like(values)
    ranks[values.argsort(stable=True)] = torch.arange(1, len(values) + 1, dtype=values.dtype)
    unique, inverse = values.unique(return_inverse=True)
    sums = torch.zeros(len(unique), dtype=values.dtype).index_add_(0, inverse, ranks)
    counts = torch.zeros(len(unique), dtype=values.dtype).index_add_(0, inverse, torch.ones_like(values))
    return (sums / counts)[inverse]


def regression(predictions, references, names: Sequence[str]) -> dict:
    """MSE, MAE, R², Pearson, Spearman; 0 where undefined."""
    predicted, actual = torch.as_tensor(predictions).double(), torch.as_tensor(references).double()
    if not len(actual):
        return {"mse": 0.0, "mae": 0.0, "r2": 0.0, "pearson": 0.0, "spearman": 0.0}
    residual = predicted - actual
    total = (actual - actual.mean()).square().sum()
    return {
        "mse": residual.square().mean().item(),
        "mae": residual.abs().mean().item(),
        "r2": (1 - residual.square().sum() / total).item() if total > 0 else 0.0,
        "pearson": _pearson(predicted, actual),
        "spearman": _pearson(_ranks(predicted), _ranks(actual)),
    }


RANKED = 10  # NDCG@10 and MRR@10, as sentence-transformers' CrossEncoderRerankingEvaluator reports them


def _one_query(scores: torch.Tensor, grades: torch.Tensor) -> tuple[float, float, float]:
    """(NDCG@10, MRR@10, average precision) of one query's passages; gains are the grades."""
    order = grades[scores.argsort(descending=True, stable=True)]
    discounts = 1 / torch.log2(torch.arange(2, len(grades) + 2, dtype=torch.float64))
    top = min(RANKED, len(grades))
    ideal = (grades.sort(descending=True).values[:top] * discounts[:top]).sum()
    ndcg = ((order[:top] * discounts[:top]).sum() / ideal).item()
    relevant = order > 0
    first = relevant[:top].nonzero()
    mrr = 1 / (first[0, 0].item() + 1) if len(first) else 0.0
    hits = relevant.cumsum(0)[relevant].double()
    precision = hits / (relevant.nonzero()[:, 0] + 1)
    return ndcg, mrr, precision.mean().item()


def ranking(predictions, references, names: Sequence[str], groups=None) -> dict:
    """NDCG@10, MRR@10 and MAP over queries (`groups`: each row's query) with a relevant passage; 0 without one."""
    scores, grades = torch.as_tensor(predictions).double(), torch.as_tensor(references).double()
    groups = torch.zeros(len(grades), dtype=torch.long) if groups is None else torch.as_tensor(groups)
    per_query = [
        _one_query(scores[groups == query], grades[groups == query])
        for query in groups.unique().tolist()
        if (grades[groups == query] > 0).any()
    ]
    means = torch.tensor(per_query, dtype=torch.float64).mean(0).tolist() if per_query else [0.0] * 3
    return {"ndcg_at_10": means[0], "mrr_at_10": means[1], "map": means[2], "queries": len(per_query)}


BUILTIN: dict[str, Callable[..., dict]] = {
    f.__name__: f for f in (accuracy, macro_f1, classification_report, multilabel, regression, ranking)
}
GROUPED = {"ranking"}  # sets scored per query
