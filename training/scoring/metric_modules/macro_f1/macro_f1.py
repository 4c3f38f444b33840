"""Macro-F1 as scikit-learn defines it: the unweighted mean of each class's F1 over the classes that occur in
the references or the predictions (F1 = 2 TP / (2 TP + FP + FN)).

An `evaluate` module shipped with distilbert-agnews and loaded from its local path (no Hub needed).
"""

import evaluate
import torch

from training.scoring.metric_modules.common import metric_info


class MacroF1(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, "predictions and references: class ids (int).")

    def _compute(self, predictions, references):
        predictions, references = torch.as_tensor(predictions).long(), torch.as_tensor(references).long()
        if not len(references):
            return {"macro_f1": 0.0}
        n = int(max(predictions.max(), references.max())) + 1
        confusion = torch.bincount(references * n + predictions, minlength=n * n).reshape(n, n).double()
        denominator = confusion.sum(0) + confusion.sum(1)  # 2 TP + FP + FN, per class
        present = denominator > 0
        f1 = 2 * confusion.diag()[present] / denominator[present]
        return {"macro_f1": f1.mean().item()}
