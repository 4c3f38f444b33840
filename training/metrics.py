"""Classification metrics computed from the gathered predictions of all ranks.

`evaluate.load("accuracy")` fetches its metric script from the Hub, which offline machines cannot reach;
these are the same definitions (macro-F1 as scikit-learn: the unweighted mean of per-class F1 over the
classes that occur in the labels or the predictions), computed in a few tensor operations.
"""

from __future__ import annotations

import torch


def classification_metrics(predictions: torch.Tensor, labels: torch.Tensor, num_labels: int) -> dict[str, float]:
    predictions, labels = predictions.long().cpu(), labels.long().cpu()
    if predictions.shape != labels.shape or predictions.ndim != 1:
        raise ValueError(f"predictions {tuple(predictions.shape)} and labels {tuple(labels.shape)} must be equal 1-D")
    confusion = torch.bincount(labels * num_labels + predictions, minlength=num_labels * num_labels)
    confusion = confusion.reshape(num_labels, num_labels)  # rows: true class, columns: predicted class
    true_pos = confusion.diag().double()
    support, predicted = confusion.sum(1).double(), confusion.sum(0).double()
    denom = support + predicted  # 2TP + FP + FN
    f1 = torch.where(denom > 0, 2 * true_pos / denom.clamp(min=1), torch.zeros_like(denom))
    present = denom > 0
    total = len(labels)
    return {
        "accuracy": (true_pos.sum() / total).item() if total else 0.0,
        "macro_f1": f1[present].mean().item() if present.any() else 0.0,
        "num_examples": total,
    }
