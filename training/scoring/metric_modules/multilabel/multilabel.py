"""Multi-label classification metrics from multi-hot decisions: micro-F1 (every label decision pooled), macro-F1 (the
mean of each label's F1), subset accuracy (every label of a text right), Hamming accuracy, and per-label precision,
recall, F1 and support. Undefined ratios are 0, as scikit-learn's `zero_division=0`.

An `evaluate` module shipped with distilbert-agnews and loaded from its local path (no Hub needed):
`.compute(predictions=[[0, 1, 1], ...], references=[[0, 1, 0], ...], label_names=["a", "b", "c"])`.
"""

import evaluate
import torch

from training.scoring.metric_modules.common import metric_info, per_class, ratio


class MultiLabel(evaluate.Metric):
    def _info(self):
        inputs = "predictions and references: one 0/1 list per text, one entry per label."
        return metric_info(__doc__, inputs, per_text=True)

    def _compute(self, predictions, references, label_names):
        predicted = torch.as_tensor(predictions).double().reshape(-1, len(label_names))
        actual = torch.as_tensor(references).double().reshape(-1, len(label_names))
        true_positives = (predicted * actual).sum(0)
        support, chosen = actual.sum(0), predicted.sum(0)
        per_label, f1 = per_class(label_names, true_positives, support, chosen)
        pooled = ratio(2 * true_positives.sum(), support.sum() + chosen.sum())
        results = {
            "micro_f1": pooled.item(),
            "macro_f1": f1.mean().item(),
            "subset_accuracy": (predicted == actual).all(dim=1).double().mean().item() if len(actual) else 0.0,
            "hamming_accuracy": (predicted == actual).double().mean().item() if len(actual) else 0.0,
        }
        return {**results, "per_class": per_label}
