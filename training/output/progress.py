"""Where training stands: saved with every state, read by the loop, the reports and resume."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Progress:
    """Where training stands; saved with every resumable state."""

    epoch: int = 0
    """Epoch in progress (0-based)."""
    batches_done: int = 0
    """Batches of that epoch each rank has already trained on."""
    global_step: int = 0
    """Optimizer steps taken."""
    best_metric: float | None = None
    """Best validation value of metric_for_best_model so far."""
    best_step: int | None = None
    """Optimizer step at which the best model was saved."""
    best_validation: dict[str, Any] = field(default_factory=dict)
    """All validation metrics of the best model."""
    evals_since_best: int = 0
    """Evaluations without improvement (early stopping)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """Every evaluation: step, epoch and metrics."""
    train_loss: list[dict[str, Any]] = field(default_factory=list)
    """Every logged training loss (mean over ranks): step, loss, learning rate."""
    layout: dict[str, Any] = field(default_factory=dict)
    """World size, batch size, accumulation, seed: what fixes the order of the batches."""
    provenance: dict[str, Any] = field(default_factory=dict)
    """Data fingerprints, model, labels and result-changing settings of the run (training/output/provenance.py)."""
    inexact_resumes: list[dict[str, Any]] = field(default_factory=list)
    """Resumes with --allow_inexact_resume whose provenance differed: the step and each changed value, both sides."""
