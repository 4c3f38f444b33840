"""What the evaluate modules beside it share. `evaluate.load(path)` runs each module as a script of its own, copied
into its cache, so they import this by its full name (evaluate checks such an import as a library:
the package is importable wherever training runs) rather than by a relative import.
"""

from __future__ import annotations

import datasets
import evaluate
import torch


def metric_info(description: str, inputs: str, value: str = "int64", per_text: bool = False) -> evaluate.MetricInfo:
    """The MetricInfo of a module whose predictions and references are one `value` per text (`per_text`: a list
    of them per text, one per label)."""
    feature = datasets.Sequence(datasets.Value(value)) if per_text else datasets.Value(value)
    return evaluate.MetricInfo(
        description=description,
        citation="",
        inputs_description=inputs,
        features=datasets.Features({"predictions": feature, "references": feature}),
    )


def ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """numerator / denominator, 0 where the denominator is 0 (scikit-learn's `zero_division=0`)."""
    return torch.where(denominator > 0, numerator / denominator.clamp(min=1), torch.zeros_like(denominator))


def per_class(label_names: list[str], true_positives: torch.Tensor, support: torch.Tensor, predicted: torch.Tensor):
    """Each class's (or label's) precision, recall, F1 and support, by name; and the F1 of each, as a tensor."""
    precision, recall = ratio(true_positives, predicted), ratio(true_positives, support)
    f1 = ratio(2 * true_positives, support + predicted)
    report = {
        name: {
            "precision": precision[i].item(),
            "recall": recall[i].item(),
            "f1": f1[i].item(),
            "support": int(support[i].item()),
        }
        for i, name in enumerate(label_names)
    }
    return report, f1
