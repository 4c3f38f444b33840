"""What a model predicts and how its logits become scores and decisions, as config.json carries it
(transformers' `problem_type` plus our `decision_thresholds`): single-label (softmax, the top label), multi-label
(a sigmoid per label against its threshold) or regression (the raw value). Training, evaluation, prediction, the
agreement guard and the service read it; what each type does is its object's (contract/problem_types.py).

A config without `problem_type` is read as transformers' pipeline reads it: one output is a one-logit classifier,
several are single-label (TEI softmaxes every multi-output model: docs/serving.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from contract.problem_types import (  # noqa: F401 - the names every reader spells as task.SINGLE, task.MULTI, ...
    FUNCTIONS,
    MULTI,
    NONE,
    PROBLEM_TYPES,
    REGRESSION,
    SIGMOID,
    SINGLE,
    SOFTMAX,
    ProblemType,
    TaskError,
    kind_of,
    scored,
)

THRESHOLDS = "decision_thresholds"  # config.json: one per label, multi-label models only
DEFAULT_THRESHOLD = 0.5
CALIBRATION = "calibration"  # config.json: {"method": "none"} or {"method": "temperature", "temperature(s)": ...}


def calibration_of(config: Any) -> dict:
    """config.json's record of the calibration folded into the weights (training/calibration.py writes it), {} when
    there is none; TaskError when it is not one training writes (a temperature that is not a positive number, which
    would be reported as applied and divided by when a run resumes)."""
    record = getattr(config, CALIBRATION, None)
    if record is None:
        return {}
    method = record.get("method") if isinstance(record, dict) else None
    if method == "none":
        return record
    temperatures = record.get("temperatures", [record.get("temperature")]) if method == "temperature" else None
    if not isinstance(temperatures, list) or not temperatures or not all(_positive(t) for t in temperatures):
        raise TaskError(
            f'config.json: {CALIBRATION} must be {{"method": "none"}} or {{"method": "temperature", '
            f'"temperature": T}} with finite T > 0 (got {record!r:.80})'
        )
    return record


def _positive(number) -> bool:
    return isinstance(number, (int, float)) and not isinstance(number, bool) and math.isfinite(number) and number > 0


@dataclass(frozen=True)
class Task:
    problem_type: str
    num_labels: int
    thresholds: tuple[float, ...] = ()  # multi-label only: one per label; DEFAULT_THRESHOLD each when not given

    def __post_init__(self) -> None:
        if self.kind.thresholded and not self.thresholds:
            object.__setattr__(self, "thresholds", (DEFAULT_THRESHOLD,) * self.num_labels)

    @property
    def kind(self) -> ProblemType:
        """Everything that differs by problem type (contract/problem_types.py)."""
        return kind_of(self.problem_type)

    @classmethod
    def of(cls, config: Any) -> Task:
        """The task a transformers config describes (see the module docstring for a config without one)."""
        num = int(config.num_labels)
        kind = kind_of(getattr(config, "problem_type", None) or (MULTI if num == 1 else SINGLE))
        kind.check_outputs(num)
        given = (getattr(config, THRESHOLDS, None) or ()) if kind.thresholded else ()
        numbers = all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 1 for t in given)
        if given and (len(given) != num or not numbers):
            raise TaskError(f"config.json: {THRESHOLDS} must hold {num} numbers in [0, 1] (got {given!r})")
        return cls(kind.name, num, tuple(float(t) for t in given))

    @property
    def function(self) -> str:
        """The default scoring function: the pipeline's rule (regression raw, multi-label sigmoid, else softmax)."""
        return self.kind.function

    def scores(self, logits: torch.Tensor, function: str | None = None) -> torch.Tensor:
        """Scores from fp32 logits (texts x outputs) by `function`, this task's default when None. A softmax over one
        output (always 1) is a sigmoid, as TEI scores it."""
        return scored(logits, function or self.function)

    def decisions(self, scores: torch.Tensor) -> torch.Tensor:
        """From this task's default scores: the class id (single-label), a boolean per label (multi-label), the
        value (regression)."""
        return self.kind.decisions(scores, self.thresholds)

    def config_fields(self) -> dict[str, Any]:
        """What a writer sets on the model config so that every reader gets this task back."""
        fields: dict[str, Any] = {"problem_type": self.problem_type}
        if self.thresholds:
            fields[THRESHOLDS] = list(self.thresholds)
        return fields
