"""Regression metrics: mean squared error, mean absolute error, R² (1 - residual / total sum of squares), Pearson's
correlation and Spearman's rank correlation (Pearson's of the ranks, ties sharing their mean rank). A correlation or
R² that is undefined (constant predictions or targets) is 0.

An `evaluate` module shipped with distilbert-agnews and loaded from its local path (no Hub needed):
`.compute(predictions=[2.5, ...], references=[3.0, ...])`.
"""

import evaluate
import torch

from training.scoring.metric_modules.common import metric_info


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    scale = (a.square().sum() * b.square().sum()).sqrt()
    return (a * b).sum().div(scale).item() if scale > 0 else 0.0


def _ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based ranks; tied values share the mean of their ranks."""
    order = values.argsort(stable=True)
    ranks = torch.empty_like(values)
    ranks[order] = torch.arange(1, len(values) + 1, dtype=values.dtype)
    unique, inverse = values.unique(return_inverse=True)
    sums = torch.zeros(len(unique), dtype=values.dtype).index_add_(0, inverse, ranks)
    counts = torch.zeros(len(unique), dtype=values.dtype).index_add_(0, inverse, torch.ones_like(values))
    return (sums / counts)[inverse]


class Regression(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, "predictions and references: one number per text.", value="float64")

    def _compute(self, predictions, references):
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
