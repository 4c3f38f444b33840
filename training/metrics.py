"""Classification metrics computed from the gathered predictions of all ranks.

`evaluate.load("accuracy")` fetches its metric script from the Hub, which offline machines cannot reach;
these are the same definitions (macro-F1 as scikit-learn: the unweighted mean of per-class F1 over the
classes that occur in the labels or the predictions), computed in a few tensor operations.
"""

from __future__ import annotations

import torch


def confusion_matrix(predictions: torch.Tensor, labels: torch.Tensor, num_labels: int) -> torch.Tensor:
    """counts[true class, predicted class]."""
    predictions, labels = predictions.long().cpu(), labels.long().cpu()
    if predictions.shape != labels.shape or predictions.ndim != 1:
        raise ValueError(f"predictions {tuple(predictions.shape)} and labels {tuple(labels.shape)} must be equal 1-D")
    counts = torch.bincount(labels * num_labels + predictions, minlength=num_labels * num_labels)
    return counts.reshape(num_labels, num_labels)


def per_class(confusion: torch.Tensor, label_names: list[str]) -> dict[str, dict[str, float]]:
    """Precision, recall, F1 and support of each class (0 where undefined, as scikit-learn's zero_division=0)."""
    true_pos = confusion.diag().double()
    support, predicted = confusion.sum(1).double(), confusion.sum(0).double()
    precision = torch.where(predicted > 0, true_pos / predicted.clamp(min=1), torch.zeros_like(predicted))
    recall = torch.where(support > 0, true_pos / support.clamp(min=1), torch.zeros_like(support))
    f1 = _f1(confusion)
    return {name: {"precision": precision[i].item(), "recall": recall[i].item(), "f1": f1[i].item(),
                   "support": int(support[i].item())} for i, name in enumerate(label_names)}


def _f1(confusion: torch.Tensor) -> torch.Tensor:
    denom = (confusion.sum(1) + confusion.sum(0)).double()  # 2TP + FP + FN
    return torch.where(denom > 0, 2 * confusion.diag().double() / denom.clamp(min=1), torch.zeros_like(denom))


def classification_metrics(predictions: torch.Tensor, labels: torch.Tensor, num_labels: int) -> dict[str, float]:
    confusion = confusion_matrix(predictions, labels, num_labels)
    true_pos = confusion.diag().double()
    f1 = _f1(confusion)
    present = (confusion.sum(1) + confusion.sum(0)) > 0
    total = len(labels)
    return {
        "accuracy": (true_pos.sum() / total).item() if total else 0.0,
        "macro_f1": f1[present].mean().item() if present.any() else 0.0,
        "num_examples": total,
    }
