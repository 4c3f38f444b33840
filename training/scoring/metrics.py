"""A split's metrics, the same numbers on every rank: the built-in sets (builtin.py) and any `evaluate` metric named by
`--extra_metrics`, tried at start. Called by the loop, train.py and evaluate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from accelerate.logging import get_logger

from contract.errors import UserError
from contract.problem_types import ProblemType
from training.data.reading import SMALL_SPLIT
from training.scoring.builtin import BUILTIN, GROUPED

logger = get_logger(__name__)  # the main process says it

if TYPE_CHECKING:
    import evaluate


@dataclass
class Scored:
    """Per-text results in row order, gathered from every rank: targets, scores, losses, windows per text, pooled
    logits."""

    labels: torch.Tensor
    scores: torch.Tensor
    losses: torch.Tensor
    windows: torch.Tensor
    logits: torch.Tensor


def _load_extra(name: str) -> evaluate.EvaluationModule:
    import evaluate  # only for --extra_metrics: importing it costs seconds

    try:
        return evaluate.load(name, keep_in_memory=True)
    except (FileNotFoundError, ConnectionError, ImportError, OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UserError(
            f"extra_metrics: cannot load {name!r} ({reason}); without the Hub only a local metric folder loads"
        ) from None


def _scalar(value):
    return value.item() if hasattr(value, "item") else value


def greater_is_better(metric: str, given: bool | None = None) -> bool:
    """--greater_is_better, else lower for losses and errors."""
    if given is not None:
        return given
    lower = metric in ("loss", "mse", "mae", "rmse") or metric.endswith(("_loss", "error", "_mse", "_mae"))
    return not lower


THRESHOLD_GRID = [round(0.05 * i, 2) for i in range(1, 20)]  # per-label thresholds are fitted on these


def fit_thresholds(scores: torch.Tensor, references: torch.Tensor) -> list[float]:
    """Each label's F1-best threshold from THRESHOLD_GRID."""
    grid = torch.tensor(THRESHOLD_GRID, dtype=scores.dtype)
    predicted = (scores[None] >= grid[:, None, None]).double()  # grid x texts x labels
    actual = references.double()[None]
    f1 = 2 * (predicted * actual).sum(1) / (predicted.sum(1) + actual.sum(1)).clamp(min=1)
    return [THRESHOLD_GRID[i] for i in f1.argmax(dim=0).tolist()]


class MetricSuite:
    """Built-in and extra metrics, the same on every rank."""

    def __init__(self, problem: ProblemType, label_names: Sequence[str], extra: Sequence[str] = ()):
        self.problem, self.label_names = problem, list(label_names)
        self.extra = {name: _load_extra(name) for name in extra}
        for name in self.extra:
            self._try(name)

    def _example(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A tiny split with every kind of answer."""
        return self.problem.example(len(self.label_names))

    def _try(self, name: str) -> None:
        predictions, references = self._inputs(*self._example(), self.problem.thresholds)
        try:
            self.extra[name].compute(predictions=predictions, references=references)
        except Exception as exc:  # noqa: BLE001 - any failure of a third-party metric is reported the same way
            raise UserError(
                f"extra_metrics: {name!r} cannot score {self.problem.name} predictions "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
            ) from None

    def _inputs(self, scores: torch.Tensor, references: torch.Tensor, thresholds) -> tuple[list, list]:
        """The metrics' inputs."""
        decided = replace(self.problem, thresholds=tuple(thresholds)).decisions(scores)
        return self.problem.metric_inputs(decided, references)

    def compute(self, scores: torch.Tensor, references: torch.Tensor, thresholds=(), groups=None) -> tuple[dict, dict]:
        """(flat metrics with per-class figures, per-class report); `groups`: each text's query, for rerankers."""
        predictions, refs = self._inputs(scores, references, thresholds or self.problem.thresholds)
        results: dict = {}
        report: dict = {}
        for name in self.problem.metric_sets:
            grouped = {"groups": groups} if name in GROUPED else {}
            for key, value in BUILTIN[name](predictions, refs, self.label_names, **grouped).items():
                if key in ("per_class", "confusion_matrix"):
                    report[key] = value
                else:
                    results[key] = _scalar(value)
        for label, row in report.get("per_class", {}).items():
            results.update({f"{measure}_{label}": row[measure] for measure in ("precision", "recall", "f1")})
        for module in self.extra.values():  # our names win over an extra's
            for key, value in module.compute(predictions=predictions, references=refs).items():
                results.setdefault(key, _scalar(value))
        return results, report

    def names(self) -> list[str]:
        """Every reported metric name, plus the loss."""
        return [*self.compute(*self._example())[0], "loss"]

    def check_selection(self, metric: str) -> None:
        reported = self.names()
        if metric not in reported:
            raise UserError(
                f"metric_for_best_model: {metric!r} is not reported for {self.problem.name} "
                f"(reported: {', '.join(reported)})"
            )


SMALL_CLASS = 10  # below this (and SMALL_SPLIT texts), picking is noisy


def thin_validation(problem: ProblemType, references: torch.Tensor, names: Sequence[str]) -> str | None:
    """Why validation is too small to pick, calibrate or fit thresholds on, or None."""
    matrix = problem.label_matrix(references, len(names))
    counts = matrix.sum(0).tolist() if matrix is not None else []
    rare = [f"{name} {count}" for name, count in zip(names, counts) if count < SMALL_CLASS]
    if len(references) >= SMALL_SPLIT and not rare:
        return None
    also = f" ({', '.join(rare[:5])}{', ...' if len(rare) > 5 else ''} of its labels)" if rare else ""
    return f"the validation split has {len(references)} texts{also}"


def one_sided(
    problem: ProblemType, decided: torch.Tensor, references: torch.Tensor, names: Sequence[str]
) -> dict[str, list[str]]:
    """Labels predicted for every text ('always') or for none that has them ('never')."""
    predicted, actual = problem.label_matrix(decided, len(names)), problem.label_matrix(references, len(names))
    if predicted is None or not len(predicted):
        return {}
    found = {
        "always": [name for j, name in enumerate(names) if predicted[:, j].all() and not actual[:, j].all()],
        "never": [name for j, name in enumerate(names) if not predicted[:, j].any() and actual[:, j].any()],
    }
    return {which: labels for which, labels in found.items() if labels}


def say_one_sided(problem: ProblemType, validation, thresholds, label_names) -> dict[str, list[str]]:
    """Say once which labels the best model predicts always or never; the labels."""
    problem = replace(problem, thresholds=tuple(thresholds)) if thresholds else problem
    found = one_sided(problem, problem.decisions(validation.scores), validation.labels, label_names)
    if found:
        said = "; ".join(f"{which}: {', '.join(names[:8])}" for which, names in found.items())
        logger.warning(
            "The best model predicts some labels for every validation text or for none (%s): it may have learned only "
            "how frequent they are. Try --class_weights balanced, more epochs (--num_train_epochs) or a lower "
            "--learning_rate",
            said,
        )
    return found
