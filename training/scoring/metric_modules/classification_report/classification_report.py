"""Per-class precision, recall, F1 and support, and the confusion matrix (rows: reference class, columns:
predicted class). Undefined ratios are 0, as scikit-learn's `zero_division=0`.

An `evaluate` module shipped with distilbert-agnews and loaded from its local path (no Hub needed):
`.compute(predictions=..., references=..., label_names=["World", "Sports", ...])`.
"""

import evaluate
import torch

from training.scoring.metric_modules.common import metric_info, per_class


class ClassificationReport(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, "predictions and references: class ids (int); label_names: the name of each id.")

    def _compute(self, predictions, references, label_names):
        predictions, references = torch.as_tensor(predictions).long(), torch.as_tensor(references).long()
        n = len(label_names)
        confusion = torch.bincount(references * n + predictions, minlength=n * n).reshape(n, n)
        counts = confusion.double()
        report, _ = per_class(label_names, confusion.diag().double(), counts.sum(1), counts.sum(0))
        return {"per_class": report, "confusion_matrix": confusion.tolist()}
