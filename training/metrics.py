"""Classification metrics through Hugging Face `evaluate`, the way the no_trainer examples use it: every rank
adds the batches `gather_for_metrics` returns (`add_batch`), then computes (`compute`) the same numbers.

The project's own metrics are `evaluate` modules in training/metric_modules/, loaded from their local path,
so everything works offline: `accuracy`, `macro_f1` (scikit-learn's definition) and `classification_report`
(per-class precision / recall / F1 / support and the confusion matrix). `--extra_metrics` adds any `evaluate`
metric by Hub name or local path; each is loaded and tried on a tiny input at start, so a metric that cannot
load (offline) or cannot score this task fails before training, not after.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import evaluate

MODULES = Path(__file__).with_name("metric_modules")
SELECTION = ("accuracy", "macro_f1")  # what picks the best model: always computed


class MetricError(RuntimeError):
    """An --extra_metrics entry cannot be loaded or cannot score this task."""


def load_module(name_or_path: str) -> evaluate.EvaluationModule:
    import evaluate  # on first use: python -m training.predict imports this module and never scores

    return evaluate.load(name_or_path, keep_in_memory=True)


def _load_extra(name: str) -> evaluate.EvaluationModule:
    try:
        return load_module(name)
    except (FileNotFoundError, ConnectionError, ImportError, OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise MetricError(
            f"extra_metrics: cannot load {name!r} ({reason}); without the Hub only a local metric folder loads"
        ) from None


def _scalar(value):
    return value.item() if hasattr(value, "item") else value


class MetricSuite:
    """accuracy and macro_f1, plus the extra metrics, fed batch by batch and computed together."""

    def __init__(self, extra: Sequence[str] = (), num_labels: int = 2):
        self.modules = {name: load_module(str(MODULES / name)) for name in SELECTION}
        for name in extra:
            self.modules[name] = _load_extra(name)
            self._try(name, num_labels)

    def _try(self, name: str, num_labels: int) -> None:
        ids = list(range(num_labels))
        try:
            self.modules[name].compute(predictions=ids, references=ids)
        except Exception as exc:  # noqa: BLE001 - any failure of a third-party metric is reported the same way
            raise MetricError(
                f"extra_metrics: {name!r} cannot score {num_labels}-class predictions "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
            ) from None

    def add_batch(self, predictions, references) -> None:
        for module in self.modules.values():
            module.add_batch(predictions=predictions, references=references)

    def compute(self) -> dict:
        """Every metric's result; the project's own names win over an extra metric's same key."""
        results: dict = {}
        for module in self.modules.values():  # the project's own come first
            for key, value in module.compute().items():
                results.setdefault(key, _scalar(value))
        return results


def classification_report(predictions, references, label_names: Sequence[str]) -> dict:
    """{"per_class": {name: {precision, recall, f1, support}}, "confusion_matrix": [[...]]}."""
    return load_module(str(MODULES / "classification_report")).compute(
        predictions=predictions, references=references, label_names=list(label_names)
    )
