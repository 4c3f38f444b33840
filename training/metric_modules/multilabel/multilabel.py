"""Multi-label classification metrics from multi-hot decisions: micro-F1 (every label decision pooled), macro-F1 (the
mean of each label's F1), subset accuracy (every label of a text right), Hamming accuracy, and per-label precision,
recall, F1 and support. Undefined ratios are 0, as scikit-learn's `zero_division=0`.

An `evaluate` module shipped with distilbert-agnews and loaded from its local path (no Hub needed):
`.compute(predictions=[[0, 1, 1], ...], references=[[0, 1, 0], ...], label_names=["a", "b", "c"])`.
"""

import datasets
import evaluate
import torch


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return torch.where(denominator > 0, numerator / denominator.clamp(min=1), torch.zeros_like(denominator))


class MultiLabel(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description="predictions and references: one 0/1 list per text, one entry per label.",
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("int64")),
                    "references": datasets.Sequence(datasets.Value("int64")),
                }
            ),
        )

    def _compute(self, predictions, references, label_names):
        predicted = torch.as_tensor(predictions).double().reshape(-1, len(label_names))
        actual = torch.as_tensor(references).double().reshape(-1, len(label_names))
        true_positives = (predicted * actual).sum(0)
        support, chosen = actual.sum(0), predicted.sum(0)
        precision, recall = _ratio(true_positives, chosen), _ratio(true_positives, support)
        f1 = _ratio(2 * true_positives, support + chosen)
        pooled = _ratio(2 * true_positives.sum(), support.sum() + chosen.sum())
        results = {
            "micro_f1": pooled.item(),
            "macro_f1": f1.mean().item(),
            "subset_accuracy": (predicted == actual).all(dim=1).double().mean().item() if len(actual) else 0.0,
            "hamming_accuracy": (predicted == actual).double().mean().item() if len(actual) else 0.0,
        }
        per_label = {
            name: {
                "precision": precision[i].item(),
                "recall": recall[i].item(),
                "f1": f1[i].item(),
                "support": int(support[i].item()),
            }
            for i, name in enumerate(label_names)
        }
        return {**results, "per_class": per_label}
