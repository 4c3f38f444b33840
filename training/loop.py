"""The training loop as named steps: `fit` runs epochs, `train_epoch` runs batches, and every decision
(log? evaluate? save? check for a stop? improved? patience spent?) is a plain function of numbers, unit
tested without a process group (tests/training/test_loop.py).

What a run carries from step to step travels as one `Run`; its output folder is a `checkpoint.OutputDir`.
Every function taking a `Run` is called on all ranks at the same step; rank logic goes through the
Accelerator only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from contract import files, task
from training.capture import CompileReport, eager
from training.checkpoint import OutputDir, Progress
from training.config import TrainConfig
from training.data import Splits, model_inputs, num_texts
from training.evaluate import FIT, evaluate
from training.guards import StopGuard, TrainingDiverged
from training.metrics import MetricSuite
from training.objective import Objective
from training.throughput import Throughput, peak_memory_mb

logger = get_logger(__name__)


@dataclass
class Loaders:
    train: torch.utils.data.DataLoader
    sampler: Any  # the train loader's batch sampler: set_epoch reshuffles it
    validation: torch.utils.data.DataLoader
    test: torch.utils.data.DataLoader | None


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
    objective: Objective  # the loss for the problem type, with class weights and smoothing (training/objective.py)
    compiled: CompileReport  # --torch_compile: the mode, and what compiling cost (training/capture.py)


class Outcome(enum.Enum):
    CONTINUE = "continue"  # the epoch's batches ran out
    STOP = "stop"  # early stopping fired or the last optimizer step is done
    PREEMPTED = "preempted"  # SIGTERM: a resumable state is saved


# -------------------------------------------------------------------------------------------- decisions


def every(step: int, interval: int | None) -> bool:
    """True on multiples of `interval`; never when it is None or 0."""
    return bool(interval) and step % interval == 0


def save_interval(checkpointing_steps: str) -> int | None:
    """--checkpointing_steps as a step interval: N, or None for 'epoch' and 'none'."""
    return int(checkpointing_steps) if checkpointing_steps.isdigit() else None


@dataclass(frozen=True)
class StepPlan:
    log: bool
    evaluate: bool
    save: bool
    check_stop: bool  # the ranks agree on SIGTERM / divergence (a collective) before anything is saved


def plan_step(cfg: TrainConfig, step: int, batches_done: int, batches_per_epoch: int, total_steps: int) -> StepPlan:
    """What to do after optimizer step `step`."""
    evaluate_now = every(step, cfg.eval_steps)
    save_now = every(step, save_interval(cfg.checkpointing_steps))
    boundary = batches_done >= batches_per_epoch or step >= total_steps
    check = evaluate_now or save_now or boundary or every(step, cfg.stop_check_steps)
    return StepPlan(every(step, cfg.logging_steps), evaluate_now, save_now, check)


def improved(value: float, best: float | None, greater_is_better: bool = True) -> bool:
    return best is None or (value > best if greater_is_better else value < best)


def patience_spent(evals_since_best: int, patience: int | None) -> bool:
    return bool(patience) and evals_since_best >= patience


def record_evaluation(progress: Progress, results: dict[str, Any], metric: str, greater_is_better: bool = True) -> bool:
    """Add an evaluation to the history and the best-so-far bookkeeping; True when it is a new best."""
    progress.history.append({"step": progress.global_step, "epoch": progress.epoch, **results})
    if not improved(results[metric], progress.best_metric, greater_is_better):
        progress.evals_since_best += 1
        return False
    progress.best_metric, progress.best_step, progress.best_validation = results[metric], progress.global_step, results
    progress.evals_since_best = 0
    return True


def evaluated_now(progress: Progress) -> bool:
    """The last evaluation was at the current step (no second one needed at the epoch's end)."""
    return bool(progress.history) and progress.history[-1]["step"] == progress.global_step


def finish_epoch(progress: Progress, epoch: int, batches_per_epoch: int) -> bool:
    """Advance the bookkeeping past a finished epoch; False when it stopped early (mid-epoch)."""
    if progress.batches_done < batches_per_epoch:
        return False
    progress.epoch, progress.batches_done = epoch + 1, 0
    return True


# ------------------------------------------------------------------------------------------------ steps


class LossMeter:
    """The training loss summed on the device (no host sync per step), averaged over ranks when logged."""

    def __init__(self, device: torch.device):
        self.total = torch.zeros((), device=device)
        self.count = 0

    def add(self, loss: torch.Tensor) -> None:
        self.total += loss.detach()
        self.count += 1

    def mean(self, accelerator: Accelerator) -> float:
        """A collective: the mean since the last call over all ranks; then starts over."""
        value = accelerator.reduce(self.total / self.count, reduction="mean").item()
        self.total.zero_()
        self.count = 0
        return value


def forward_loss(run: Run, batch: dict) -> torch.Tensor:
    logits = run.model(**model_inputs(batch)).logits
    return run.objective(logits, batch["labels"])


def train_step(run: Run, batch: dict) -> torch.Tensor:
    """Forward and backward one batch; the optimizer steps when the accumulation window is full."""
    accelerator, cfg = run.accelerator, run.cfg
    run.compiled.before(batch)
    with accelerator.accumulate(run.model):
        loss = forward_loss(run, batch)
        accelerator.backward(loss)
        if accelerator.sync_gradients and cfg.max_grad_norm > 0 and not run.compiled.clips_in_step:
            accelerator.clip_grad_norm_(run.model.parameters(), cfg.max_grad_norm)
        run.optimizer.step()
        run.optimizer.zero_grad()
    run.compiled.after()
    run.progress.batches_done += 1
    run.throughput.observe(batch)
    return loss


def after_optimizer_step(run: Run, bar: tqdm) -> None:
    if not run.optimizer.step_was_skipped:  # fp16 overflow skips the step; keep the schedule in step
        run.scheduler.step()
    run.progress.global_step += 1
    bar.update(1)


def log_loss(run: Run, losses: LossMeter, epoch: int, bar: tqdm) -> None:
    step, lr = run.progress.global_step, float(run.scheduler.get_last_lr()[0])  # a tensor when compiled
    mean_loss = losses.mean(run.accelerator)
    run.progress.train_loss.append({"step": step, "loss": mean_loss, "lr": lr})
    bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}")
    logger.info("step %d  loss %.4f  lr %.3e", step, mean_loss, lr)
    run.accelerator.log({"train/loss": mean_loss, "train/lr": lr, "train/epoch": epoch}, step=step)


def save_state(run: Run) -> None:
    with run.throughput.paused():
        run.out.save_state(run.progress)


def validate_and_save(run: Run) -> bool:
    """Evaluate on every rank, save the model if it improved; True when early stopping fires (on all ranks)."""
    with run.throughput.paused():
        cfg = run.cfg
        fit = cfg.threshold_strategy == "per_label" and run.metrics.task.problem_type == task.MULTI
        thresholds = FIT if fit else None
        model = eager(run.model)  # evaluation's shapes would only add graphs to a compiled model
        results = evaluate(run.accelerator, model, run.loaders.validation, run.metrics, thresholds, cfg.windowing())
        best = record_evaluation(run.progress, results, cfg.metric_for_best_model, cfg.greater_is_better)
        run.accelerator.log(
            {f"eval/{k}": v for k, v in results.items() if isinstance(v, (int, float))}, step=run.progress.global_step
        )
        logger.info(
            "Validation at step %d: %s%s",
            run.progress.global_step,
            format_metrics(results),
            " (best so far, saved)" if best else "",
        )
        if best:
            if "thresholds" in results:  # multi-label: the thresholds go with the model (config.json)
                setattr(run.accelerator.unwrap_model(model).config, task.THRESHOLDS, results["thresholds"])
            run.out.save_model(model, run.tokenizer, run.cfg.export_hf_format)
            run.out.write_json(files.METRICS, run_summary(run))
            run.out.write_curves(run.progress, plot=False)  # the PNG is drawn once, at the end
    if patience_spent(run.progress.evals_since_best, run.cfg.early_stopping_patience):
        run.accelerator.set_trigger()
    # Every rank computed the same metrics from the same gathered predictions; check_trigger (an all-reduce)
    # makes the stop decision collectively all the same, so no rank can be left waiting.
    return run.accelerator.check_trigger()


def preempted_or_diverged(run: Run) -> bool:
    """All ranks together: save and report True after a SIGTERM; raise TrainingDiverged on a non-finite loss."""
    preempted, diverged = run.guard.check()  # one all-reduce: the same answer on every rank
    progress = run.progress
    if diverged:
        raise TrainingDiverged(
            f"The loss was not finite for {run.cfg.max_nonfinite_steps} consecutive batches (by step "
            f"{progress.global_step}); stopped without saving the diverged model (best model: step "
            f"{progress.best_step}). Try a lower --learning_rate, gradient clipping, or bf16 instead of fp16."
        )
    if preempted:
        path = run.out.save_state(progress)
        logger.warning(
            "SIGTERM: stopped at step %d and saved %s; continue with --resume_from_checkpoint latest",
            progress.global_step,
            path,
        )
    return preempted


# ------------------------------------------------------------------------------------------------- loop


def train_epoch(run: Run, epoch: int, bar: tqdm, losses: LossMeter) -> Outcome:
    """The batches of one epoch (the rest of it, after a mid-epoch resume)."""
    progress, accelerator = run.progress, run.accelerator
    progress.epoch = epoch
    # Reshuffle: the same permutation on every rank, another each epoch. Through the prepared loader: it sets its own
    # epoch counter too, which its __iter__ hands to the sampler; a resumed run that skipped into the middle of an
    # epoch would otherwise replay epoch 0's order in the next one (a 1-process run resumed across an epoch end).
    run.loaders.sampler.set_epoch(epoch)
    run.loaders.train.set_epoch(epoch)
    batches = run.loaders.train
    if progress.batches_done:
        batches = accelerator.skip_first_batches(batches, progress.batches_done)
    run.model.train()
    for batch in batches:
        loss = train_step(run, batch)
        losses.add(loss)
        run.guard.observe(loss)
        if not accelerator.sync_gradients:
            continue  # still accumulating
        after_optimizer_step(run, bar)
        plan = plan_step(run.cfg, progress.global_step, progress.batches_done, len(run.loaders.train), run.total_steps)
        if plan.log:
            log_loss(run, losses, epoch, bar)
        if plan.check_stop and preempted_or_diverged(run):
            return Outcome.PREEMPTED
        stop = validate_and_save(run) if plan.evaluate else False
        if plan.save:
            save_state(run)
        if stop or progress.global_step >= run.total_steps:
            return Outcome.STOP
    return Outcome.CONTINUE


def end_epoch(run: Run, epoch: int, stopping: bool) -> bool:
    """Evaluate (unless just done) and save the epoch's state; True when training stops here."""
    epoch_done = finish_epoch(run.progress, epoch, len(run.loaders.train))
    stop = stopping
    if not evaluated_now(run.progress):
        stop = validate_and_save(run) or stop  # end of epoch, or the last step
    if epoch_done and not stop and run.cfg.checkpointing_steps == "epoch":
        save_state(run)
    logger.info("Epoch %d: peak memory %.0f MB (this process)", epoch + 1, peak_memory_mb(run.accelerator.device))
    return stop


def fit(run: Run) -> bool:
    """Train until done, early-stopped or preempted; True when preempted (a resumable state was saved)."""
    progress = run.progress
    bar = tqdm(
        total=run.total_steps,
        initial=progress.global_step,
        desc="Training",
        unit="step",
        disable=not run.accelerator.is_local_main_process,
    )
    losses = LossMeter(run.accelerator.device)
    stop = progress.global_step >= run.total_steps
    for epoch in range(progress.epoch, run.num_epochs):
        if stop:
            break
        outcome = train_epoch(run, epoch, bar, losses)
        if outcome is Outcome.PREEMPTED:
            bar.close()
            return True
        stop = end_epoch(run, epoch, stopping=outcome is Outcome.STOP)
    bar.close()
    if patience_spent(progress.evals_since_best, run.cfg.early_stopping_patience):
        logger.info(
            "Early stopping: no improvement of %s in %d evaluations (best %.4f at step %s).",
            run.cfg.metric_for_best_model,
            progress.evals_since_best,
            progress.best_metric,
            progress.best_step,
        )
    return False


# -------------------------------------------------------------------------------------------- reporting


PER_CLASS = ("precision_", "recall_", "f1_")  # per-class metrics: in metrics.json and the trackers, not the log line


def format_metrics(metrics: dict) -> str:
    shown = {k: v for k, v in metrics.items() if not k.startswith(PER_CLASS)}
    return "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())


def run_summary(run: Run, test_metrics: dict | None = None, runtime_s: float | None = None) -> dict:
    """metrics.json: the best validation, the test metrics, the history, the config, versions."""
    cfg, progress, splits, world = run.cfg, run.progress, run.splits, run.accelerator.num_processes
    chunked = cfg.windowing().chunked
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
        "history": progress.history,
        "train_loss": progress.train_loss,
        "config": cfg.to_dict(),
        "versions": {name: version(name) for name in ("torch", "accelerate", "transformers", "datasets", "tokenizers")},
        "train_runtime_s": runtime_s,
        "num_examples": {name: num_texts(split) for name, split in splits.named().items()},
        **({"num_windows": {name: len(split or ()) for name, split in splits.named().items()}} if chunked else {}),
        "label_names": splits.label_names,
        "problem_type": splits.labels.problem_type,
        "label_values": splits.labels.values,  # the training data's value of each class id
        "provenance": progress.provenance,  # data fingerprints, model and settings (training/provenance.py)
        "inexact_resumes": progress.inexact_resumes,  # what changed at a resume with --allow_inexact_resume
    }
