"""The training loss per problem type, with class weights and label smoothing, and the problem type's defaults. Called
by train.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from contract import problem_types
from contract.problem_types import ProblemType
from training.config import TrainConfig, class_weight_values
from training.data.errors import DataError
from training.data.labels import LabelSpace
from training.data.reading import HARD, TEACHER


@dataclass
class Objective:
    problem: ProblemType
    weights: torch.Tensor | None = None  # per class (single-label) or per label (multi-label pos_weight)
    label_smoothing: float = 0.0
    distillation: tuple[float, float] | None = None  # (alpha, temperature) when the rows carry teacher scores

    def to(self, device: torch.device) -> Objective:
        return replace(self, weights=self.weights.to(device) if self.weights is not None else None)

    def per_example(self, logits: torch.Tensor, labels: torch.Tensor, weighted: bool = False) -> torch.Tensor:
        """Each example's fp32 loss, unweighted unless asked."""
        return self.problem.loss(logits, labels, self.weights if weighted else None, self.label_smoothing)

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, batch: dict | None = None) -> torch.Tensor:
        """The batch's training loss; with the teacher's scores in `batch`, the distillation mix."""
        if self.distillation is None or batch is None or TEACHER not in batch:
            return self.problem.batch_loss(logits, labels, self.weights, self.label_smoothing)
        alpha, temperature = self.distillation
        taught = self.problem.teacher_loss(logits, batch[TEACHER], temperature)
        if not alpha:
            return taught.mean()
        hard = batch.get(HARD, torch.ones_like(taught))
        return ((1 - alpha) * taught + alpha * hard * self.per_example(logits, labels, weighted=True)).mean()


def class_weights(spec: str, labels: LabelSpace, targets: list) -> torch.Tensor | None:
    """--class_weights: None, balanced, or given numbers."""
    if spec == "none":
        return None
    if not labels.problem.classes:
        raise DataError(f"class_weights: a {labels.problem.name} model has no classes; leave it at 'none'")
    count = len(labels.names)
    if spec == "balanced":
        return labels.problem.balanced_weights(targets, count)
    values = class_weight_values(spec) or []
    if len(values) != count:
        raise DataError(f"class_weights: {len(values)} weights for {count} classes ({', '.join(labels.names)})")
    return torch.tensor(values)


def problem_type_defaults(cfg: TrainConfig, problem: ProblemType) -> TrainConfig:
    """The settings left to the problem type (None or 'auto'), decided by it."""
    chosen = {
        "group_by_length": problem.groups_by_length,
        "calibration": "none" if problem.temperatures == problem_types.NONE else "auto",
        "class_weights": problem.class_weights,
        "threshold_strategy": problem.threshold_strategy,
    }
    return cfg.model_copy(update={k: v for k, v in chosen.items() if getattr(cfg, k) in (None, "auto")})


def objective_for(cfg: TrainConfig, labels: LabelSpace, targets: list) -> Objective:
    if not labels.problem.classes and cfg.label_smoothing_factor:
        raise DataError(f"label_smoothing_factor: a {labels.problem.name} target cannot be smoothed; leave it at 0")
    distillation = (cfg.distill_alpha, cfg.distill_temperature) if cfg.teacher_column else None
    weights = class_weights(cfg.class_weights, labels, targets)
    return Objective(labels.problem, weights, cfg.label_smoothing_factor, distillation)
