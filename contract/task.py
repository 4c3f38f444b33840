"""What a model predicts and how its logits become scores and decisions: the one contract that training,
evaluation, batch prediction, the agreement guard and the service share. `config.json` carries it, in
transformers' own field (`problem_type`) plus one of ours (THRESHOLDS):

    single_label_classification   one class per text: softmax over the labels; the decision is the top label
    multi_label_classification    any number of labels per text: a sigmoid per label; a label is predicted when its
                                  score reaches its threshold (config.json `decision_thresholds`: 0.5 each, unless
                                  training fitted one per label on validation)
    regression                    one output: the raw value, no squashing

A config without `problem_type` (a model not trained here) is read the way transformers' text-classification
pipeline reads it: one output is a one-logit classifier (sigmoid, threshold 0.5), several are single-label.
TEI instead softmaxes every model with more than one label; docs/serving.md says where we follow the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from contract.errors import UserError

SINGLE = "single_label_classification"
MULTI = "multi_label_classification"
REGRESSION = "regression"
PROBLEM_TYPES = (SINGLE, MULTI, REGRESSION)

SOFTMAX, SIGMOID, NONE = "softmax", "sigmoid", "none"
FUNCTIONS = (SOFTMAX, SIGMOID, NONE)

THRESHOLDS = "decision_thresholds"  # config.json: one per label, multi-label models only
DEFAULT_THRESHOLD = 0.5


class TaskError(UserError, ValueError):
    """A config whose problem type or thresholds cannot be served; the message names the field."""


@dataclass(frozen=True)
class Task:
    problem_type: str
    num_labels: int
    thresholds: tuple[float, ...] = ()  # multi-label only: one per label; DEFAULT_THRESHOLD each when not given

    def __post_init__(self) -> None:
        if self.problem_type == MULTI and not self.thresholds:
            object.__setattr__(self, "thresholds", (DEFAULT_THRESHOLD,) * self.num_labels)

    @classmethod
    def of(cls, config: Any) -> Task:
        """The task a transformers config describes (see the module docstring for a config without one)."""
        num = int(config.num_labels)
        kind = getattr(config, "problem_type", None) or (MULTI if num == 1 else SINGLE)
        if kind not in PROBLEM_TYPES:
            raise TaskError(f"config.json: problem_type {kind!r} is not one of {', '.join(PROBLEM_TYPES)}")
        if kind == SINGLE and num < 2:
            raise TaskError(f"config.json: a {SINGLE} model needs two or more labels (has {num})")
        if kind == REGRESSION and num != 1:  # what would 4 raw values ranked as label scores mean?
            raise TaskError(f"config.json: a {REGRESSION} model has one output here (has {num} in id2label)")
        given = (getattr(config, THRESHOLDS, None) or ()) if kind == MULTI else ()
        numbers = all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 1 for t in given)
        if given and (len(given) != num or not numbers):
            raise TaskError(f"config.json: {THRESHOLDS} must hold {num} numbers in [0, 1] (got {given!r})")
        return cls(kind, num, tuple(float(t) for t in given))

    @property
    def function(self) -> str:
        """The default scoring function: the pipeline's rule (regression raw, multi-label sigmoid, else softmax)."""
        return {REGRESSION: NONE, MULTI: SIGMOID}.get(self.problem_type, SOFTMAX)

    def scores(self, logits: torch.Tensor, function: str | None = None) -> torch.Tensor:
        """Scores from fp32 logits (texts x outputs) by `function`, this task's default when None. A softmax over one
        output (always 1) is a sigmoid, as TEI scores it."""
        function = function or self.function
        if function == SIGMOID or (function == SOFTMAX and logits.shape[-1] == 1):
            return logits.sigmoid()
        if function == SOFTMAX:
            return logits.softmax(dim=-1)
        return logits

    def decisions(self, scores: torch.Tensor) -> torch.Tensor:
        """From this task's default scores: the class id (single-label), a boolean per label (multi-label), the
        value (regression)."""
        if self.problem_type == SINGLE:
            return scores.argmax(dim=-1)
        if self.problem_type == MULTI:
            return scores >= torch.tensor(self.thresholds, dtype=scores.dtype)
        return scores[..., 0]

    def config_fields(self) -> dict[str, Any]:
        """What a writer sets on the model config so that every reader gets this task back."""
        fields: dict[str, Any] = {"problem_type": self.problem_type}
        if self.thresholds:
            fields[THRESHOLDS] = list(self.thresholds)
        return fields
