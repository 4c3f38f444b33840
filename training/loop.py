"""The training loop: `fit` holds it whole, read top to bottom; `plan_step` decides when to log, evaluate, save or check
for a stop. Called by train.py on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from contract import files, problem_types
from contract.errors import UserError
from training.config import TrainConfig
from training.data.batching import model_inputs
from training.output import reports
from training.output.progress import Progress
from training.run import Outcome, Run, run_summary
from training.scoring.split import FIT, evaluate
from training.speed.capture import eager
from training.speed.throughput import peak_memory_mb

logger = get_logger(__name__)


# -------------------------------------------------------------------------------------------- decisions


def every(step: int, interval: int | None) -> bool:
    """True on multiples of `interval`; never for None or 0."""
    return bool(interval) and step % interval == 0


def save_interval(checkpointing_steps: str) -> int | None:
    """--checkpointing_steps as an interval, or None."""
    return int(checkpointing_steps) if checkpointing_steps.isdigit() else None


@dataclass(frozen=True)
class StepPlan:
    log: bool
    evaluate: bool
    save: bool
    check_stop: bool  # the ranks agree on a stop before saving


CURVE_POINTS = 5  # the fewest logged losses a run's curves get, however short it is


def plan_step(
    cfg: TrainConfig,
    step: int,
    batches_done: int,
    batches_per_epoch: int,
    total_steps: int,
    *,
    epoch_end: bool = False,
    evaluated: bool = False,
) -> StepPlan:
    """What to do after step `step`; at an epoch's end, evaluate unless just done and save a completed epoch's state."""
    if epoch_end:
        save = batches_done >= batches_per_epoch and cfg.checkpointing_steps == "epoch"
        return StepPlan(log=False, evaluate=not evaluated, save=save, check_stop=False)
    evaluate_now = every(step, cfg.eval_steps)
    save_now = every(step, save_interval(cfg.checkpointing_steps))
    boundary = batches_done >= batches_per_epoch or step >= total_steps
    check = evaluate_now or save_now or boundary or every(step, cfg.stop_check_steps)
    interval = min(cfg.logging_steps, max(1, total_steps // CURVE_POINTS))  # a short run's curve is a line too
    log = every(step, interval) or step >= total_steps  # the curves always reach the run's last step
    return StepPlan(log, evaluate_now, save_now, check)


def improved(value: float, best: float | None, greater_is_better: bool = True) -> bool:
    """A finite value better than the best so far."""
    if not math.isfinite(value):
        return False
    return best is None or (value > best if greater_is_better else value < best)


def patience_spent(evals_since_best: int, patience: int | None) -> bool:
    return bool(patience) and evals_since_best >= patience


def record_evaluation(progress: Progress, results: dict[str, Any], metric: str, greater_is_better: bool = True) -> bool:
    """Record an evaluation; True for a new best. A tie is kept too (the later, longer-trained model), but only a
    strict improvement resets the patience."""
    progress.history.append({"step": progress.global_step, "epoch": progress.epoch, **results})
    value = results[metric]
    better = improved(value, progress.best_metric, greater_is_better)
    progress.evals_since_best = 0 if better else progress.evals_since_best + 1
    if not better and value != progress.best_metric:
        return False
    progress.best_metric, progress.best_step, progress.best_validation = value, progress.global_step, results
    return True


def evaluated_now(progress: Progress) -> bool:
    """The last evaluation was at this step."""
    return bool(progress.history) and progress.history[-1]["step"] == progress.global_step


def finish_epoch(progress: Progress, epoch: int, batches_per_epoch: int) -> bool:
    """Advance past a finished epoch; False if stopped early."""
    if progress.batches_done < batches_per_epoch:
        return False
    progress.epoch, progress.batches_done = epoch + 1, 0
    return True


# ------------------------------------------------------------------------------------------------ steps


class LossMeter:
    """The loss summed on the device, averaged over ranks when logged."""

    def __init__(self, device: torch.device):
        self.total = torch.zeros((), device=device)
        self.count = 0

    def add(self, loss: torch.Tensor) -> None:
        self.total += loss.detach()
        self.count += 1

    def mean(self, accelerator: Accelerator) -> float:
        """A collective: the mean over ranks since the last call."""
        value = accelerator.reduce(self.total / self.count, reduction="mean").item()
        self.total.zero_()
        self.count = 0
        return value


def forward_loss(run: Run, batch: dict) -> torch.Tensor:
    logits = run.model(**model_inputs(batch)).logits
    return run.objective(logits, batch["labels"], batch)


def after_optimizer_step(run: Run, bar: tqdm) -> None:
    """The schedule and the step count follow the optimizer."""
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


def save_state(run: Run) -> Path:
    """The loop's one way to save a resumable state."""
    with run.throughput.paused():
        return run.out.save_state(run.progress, run.scheduler)


def validate_and_save(run: Run) -> None:
    """Evaluate on every rank; save an improved model; early stopping."""
    with run.throughput.paused():
        cfg = run.cfg
        fit = cfg.threshold_strategy == "per_label" and run.metrics.problem.thresholded
        thresholds = FIT if fit else None
        model = eager(run.model)  # evaluation's shapes would only add graphs to a compiled model
        loader, long_text = run.loaders.validation, cfg.long_text_rule()
        results = evaluate(run.accelerator, model, loader, run.metrics, thresholds, long_text)
        best = record_evaluation(run.progress, results, cfg.metric_for_best_model, cfg.greater_is_better)
        run.accelerator.log(
            {f"eval/{k}": v for k, v in results.items() if isinstance(v, (int, float))}, step=run.progress.global_step
        )
        logger.info(
            "Validation at step %d: %s%s",
            run.progress.global_step,
            format_metrics(results),
            " (best so far: saving it)" if best else "",  # a failed save stops the run with its own line
        )
        if best:
            if "thresholds" in results:  # multi-label: the thresholds go with the model (config.json)
                setattr(run.accelerator.unwrap_model(model).config, problem_types.THRESHOLDS, results["thresholds"])
            run.out.save_model(model, run.tokenizer, run.cfg.export_hf_format)
            run.out.write_json(files.METRICS, run_summary(run))
            if run.accelerator.is_main_process:  # the PNG is drawn once, at the end
                reports.write_training_curves(run.out.root, run.progress, plot=False)
    if patience_spent(run.progress.evals_since_best, run.cfg.early_stopping_patience):
        run.accelerator.set_trigger()
    if run.search is not None and run.search.prune(run.progress.global_step, results):  # the same on every rank
        run.pruned_at = run.progress.global_step
        run.accelerator.set_trigger()
    # every rank has the same metrics; check_trigger decides together all the same
    run.early_stopped = run.accelerator.check_trigger()


def preempted_or_diverged(run: Run) -> bool:
    """All ranks together: save after SIGTERM, raise on divergence."""
    preempted, diverged = run.guard.check()  # one all-reduce: the same answer on every rank
    progress = run.progress
    if diverged:
        raise UserError(
            f"The loss was not finite for {run.cfg.max_nonfinite_steps} consecutive batches (by step "
            f"{progress.global_step}); stopped without saving the diverged model. {on_disk(run)} Try a lower "
            "--learning_rate, gradient clipping, bf16 instead of fp16, or (regression) targets of a smaller scale."
        )
    if preempted:
        path = save_state(run)
        logger.warning(
            "SIGTERM: stopped at step %d and saved %s; continue with --resume_from_checkpoint latest",
            progress.global_step,
            path,
        )
    return preempted


def on_disk(run: Run) -> str:
    """What a stopped run leaves, for its last message."""
    progress = run.progress
    if progress.best_step is None:
        return f"No model was saved to {run.out.root} (no evaluation gave a finite {run.cfg.metric_for_best_model})."
    return (
        f"{run.out.path(files.WEIGHTS)} holds the best model, of step {progress.best_step} "
        f"({run.cfg.metric_for_best_model} {progress.best_metric:.4f})."
    )


# ------------------------------------------------------------------------------------------------- loop


def epoch_batches(run: Run, epoch: int):
    """The epoch's loader: reshuffled alike on every rank, past batches already trained."""
    # the prepared loader sets its own epoch too; otherwise a mid-epoch resume replays epoch 0's order
    run.loaders.sampler.set_epoch(epoch)
    run.loaders.train.set_epoch(epoch)
    if run.progress.batches_done:
        return run.accelerator.skip_first_batches(run.loaders.train, run.progress.batches_done)
    return run.loaders.train


def fit(run: Run) -> Outcome:
    """Train until done, early-stopped or preempted."""
    cfg, accelerator, progress, model = run.cfg, run.accelerator, run.progress, run.model
    per_epoch = len(run.loaders.train)
    clip_here = cfg.max_grad_norm > 0 and not run.compiled.clips_in_step  # a compiled step clips in its own graph
    bar = tqdm(
        total=run.total_steps,
        initial=progress.global_step,
        desc=run.search.name if run.search else "Training",
        unit="step",
        disable=not accelerator.is_local_main_process,
        leave=run.search is None,  # a search's trial ends in its own line
    )
    losses = LossMeter(accelerator.device)
    for epoch in range(progress.epoch, run.num_epochs):
        if run.finished():
            break
        progress.epoch = epoch
        model.train()
        for batch in epoch_batches(run, epoch):
            # Forward and backward; step when the window is full.
            run.throughput.begin_step(run.compiled.begin_step(batch))  # steady: neither compiling nor recording
            with accelerator.accumulate(model):
                if run.graphs is not None:  # all of the below as one replay (training/speed/step_graph.py)
                    loss = run.graphs.step(batch, accelerator.sync_gradients, lambda b: forward_loss(run, b))
                else:
                    loss = forward_loss(run, batch)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and clip_here:
                        accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    run.optimizer.step()
                    run.optimizer.zero_grad(set_to_none=run.compiled.grads_to_none)
                    run.guard.observe(loss)
            run.compiled.end_step()
            progress.batches_done += 1
            run.throughput.observe(batch)
            losses.add(loss)  # on the device: no host sync here
            if not accelerator.sync_gradients:
                continue  # still accumulating
            after_optimizer_step(run, bar)
            # Log, check for a stop, evaluate, save: as planned.
            plan = plan_step(cfg, progress.global_step, progress.batches_done, per_epoch, run.total_steps)
            if plan.log:
                log_loss(run, losses, epoch, bar)
            if plan.check_stop and preempted_or_diverged(run):
                bar.close()
                return Outcome.PREEMPTED
            if plan.evaluate:
                validate_and_save(run)
            if plan.save:
                save_state(run)
            if run.finished():
                break
        # The epoch's end: evaluate unless just done; save its state.
        where = (progress.global_step, progress.batches_done, per_epoch, run.total_steps)
        plan = plan_step(cfg, *where, epoch_end=True, evaluated=evaluated_now(progress))
        finish_epoch(progress, epoch, per_epoch)
        if plan.evaluate:
            validate_and_save(run)
        if plan.save and not run.finished():
            save_state(run)
        logger.info("Epoch %d: peak memory %.0f MB (this process)", epoch + 1, peak_memory_mb(accelerator.device))
    bar.close()
    if patience_spent(progress.evals_since_best, cfg.early_stopping_patience):
        logger.info(
            "Early stopping: no improvement of %s in %d evaluations (best %.4f at step %s).",
            cfg.metric_for_best_model,
            progress.evals_since_best,
            progress.best_metric,
            progress.best_step,
        )
    return Outcome.FINISHED


# -------------------------------------------------------------------------------------------- reporting


PER_CLASS = ("precision_", "recall_", "f1_")  # per-class metrics go to metrics.json only


def format_metrics(metrics: dict) -> str:
    shown = {k: v for k, v in metrics.items() if not k.startswith(PER_CLASS)}
    return "  ".join(_shown(k, v) for k, v in shown.items())


def _shown(name: str, value) -> str:
    """A metric for the log line."""
    if isinstance(value, float):
        return f"{name} {value:.4f}"
    if isinstance(value, list) and len(value) > 8:
        return f"{name} [{len(value)} values: {files.METRICS}]"
    return f"{name} {value}"
