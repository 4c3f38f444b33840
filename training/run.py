"""What one training run carries from step to step (`Run`), how it ended (`Outcome`, `Result`) and its metrics.json
summary. Built by train.py's set_up; read by loop.py, finish.py and tune.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from importlib.metadata import version
from typing import Any

import torch
from accelerate import Accelerator

from training.config import TrainConfig
from training.data.batching import num_texts
from training.data.reading import Splits
from training.guards import StopGuard
from training.lora import parameter_counts
from training.objective import Objective
from training.output.folder import OutputDir
from training.output.progress import Progress
from training.scoring.metrics import MetricSuite
from training.speed.capture import CompiledSteps
from training.speed.step_graph import StepGraph
from training.speed.throughput import Throughput


@dataclass
class Loaders:
    train: torch.utils.data.DataLoader
    sampler: Any  # the train loader's batch sampler: set_epoch reshuffles it
    validation: torch.utils.data.DataLoader
    test: torch.utils.data.DataLoader | None


@dataclass(frozen=True)
class Search:
    """What a search (agnews tune) asks of one of its runs."""

    name: str  # the progress bar's label, "Trial 2/4"; the bar is cleared when the run ends
    prune: Callable[[int, dict], bool]  # after each validation (step, results): True stops the run, untested


@dataclass
class Run:
    """Everything one training run carries from step to step."""

    cfg: TrainConfig
    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    tokenizer: Any
    loaders: Loaders
    splits: Splits
    metrics: MetricSuite
    out: OutputDir
    progress: Progress
    total_steps: int
    num_epochs: int
    throughput: Throughput
    guard: StopGuard
    objective: Objective  # the problem type's loss (objective.py)
    compiled: CompiledSteps  # --torch_compile: the mode, and what compiling cost (training/speed/capture.py)
    graphs: StepGraph | None = None  # --torch_compile whole-step: the captured steps (training/speed/step_graph.py)
    early_stopped: bool = False  # set when the patience is spent
    search: Search | None = None  # the run is a trial of agnews tune
    pruned_at: int | None = None  # the step at which the search stopped it

    def finished(self) -> bool:
        """Stop when early stopping fired or every step was taken."""
        return self.early_stopped or self.progress.global_step >= self.total_steps


class Outcome(Enum):
    FINISHED = "finished"  # the best model is saved
    PREEMPTED = "preempted"  # SIGTERM: a resumable state was saved; resume later
    PRUNED = "pruned"  # a search stopped it: its best model so far saved, neither calibrated nor tested


@dataclass(frozen=True)
class Result:
    """How train.main ended: finished with its metrics.json summary, or preempted (a resumable state saved)."""

    outcome: Outcome
    summary: dict | None = None


def run_summary(run: Run, test_metrics: dict | None = None, runtime_s: float | None = None) -> dict:
    """metrics.json: best, test, history, config, versions."""
    cfg, progress, splits, world = run.cfg, run.progress, run.splits, run.accelerator.num_processes
    chunked = cfg.long_text_rule().chunked
    return {
        "validation": progress.best_validation,
        "test": test_metrics,
        "best_step": progress.best_step,
        "global_step": progress.global_step,
        "epochs_completed": progress.epoch,
        "metric_for_best_model": cfg.metric_for_best_model,
        "world_size": world,
        "effective_batch_size": cfg.effective_batch_size(world),
        "mixed_precision": run.accelerator.mixed_precision,
        "parameters": parameter_counts(run.accelerator.unwrap_model(run.model, keep_torch_compile=False)),
        "history": progress.history,
        "train_loss": progress.train_loss,
        "config": cfg.to_dict(),
        "versions": {name: version(name) for name in ("torch", "accelerate", "transformers", "datasets", "tokenizers")},
        "train_runtime_s": runtime_s,
        "cpu_threads": progress.layout.get("cpu_threads"),  # chosen by the machine's load unless OMP_NUM_THREADS
        "num_examples": {name: num_texts(split) for name, split in splits.named().items()},
        **({"num_windows": {name: len(split or ()) for name, split in splits.named().items()}} if chunked else {}),
        "label_names": splits.label_names,
        "problem_type": splits.labels.problem_type,
        "label_values": splits.labels.values,  # the training data's value of each class id
        "provenance": progress.provenance,  # data fingerprints, model and settings (training/output/provenance.py)
        "inexact_resumes": progress.inexact_resumes,  # what changed at a resume with --allow_inexact_resume
    }
