"""Per-class precision, recall, F1 and support, and the confusion matrix (rows: reference class, columns:
predicted class). Undefined ratios are 0, as scikit-learn's `zero_division=0`.

An `evaluate` module shipped with distilbert-agnews and loaded from its local path (no Hub needed):
`.compute(predictions=..., references=..., label_names=["World", "Sports", ...])`.
"""

import datasets
import evaluate
import torch


class ClassificationReport(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description="predictions and references: class ids (int); label_names: the name of each id.",
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references, label_names):
        predictions, references = torch.as_tensor(predictions).long(), torch.as_tensor(references).long()
        n = len(label_names)
        confusion = torch.bincount(references * n + predictions, minlength=n * n).reshape(n, n)
        true_positives, counts = confusion.diag().double(), confusion.double()
        support, predicted = counts.sum(1), counts.sum(0)
        precision = torch.where(predicted > 0, true_positives / predicted.clamp(min=1), torch.zeros_like(predicted))
        recall = torch.where(support > 0, true_positives / support.clamp(min=1), torch.zeros_like(support))
        denominator = support + predicted
        f1 = torch.where(denominator > 0, 2 * true_positives / denominator.clamp(min=1), torch.zeros_like(denominator))
        per_class = {
            name: {
                "precision": precision[i].item(),
                "recall": recall[i].item(),
                "f1": f1[i].item(),
                "support": int(support[i].item()),
            }
            for i, name in enumerate(label_names)
        }
        return {"per_class": per_class, "confusion_matrix": confusion.tolist()}
