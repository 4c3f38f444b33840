"""Accuracy: the share of predictions equal to their reference class.

An `evaluate` module shipped with distilbert-agnews and loaded from its local path (no Hub needed):
`evaluate.load("training/scoring/metric_modules/accuracy").compute(predictions=[0, 1], references=[0, 0])`.
"""

import evaluate
import torch

from training.scoring.metric_modules.common import metric_info


class Accuracy(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, "predictions and references: class ids (int).")

    def _compute(self, predictions, references):
        predictions, references = torch.as_tensor(predictions), torch.as_tensor(references)
        correct = (predictions == references).sum().double()
        return {"accuracy": (correct / len(references)).item() if len(references) else 0.0}
