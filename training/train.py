"""Fine-tune a text classifier (DistilBERT on AG News by default) with a plain PyTorch loop and Accelerate.

    accelerate launch training/train.py                                   # Hub model + data
    python training/train.py --preset smoke                               # offline, CPU, under a minute
    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml training/train.py --preset smoke

Read top to bottom: `make_accelerator` (topology from the launcher), `main` (data, model, optimizer,
prepare, resume), `fit` (epochs of `accelerator.accumulate` steps, periodic evaluation, checkpoints, early
stopping), `evaluate` (training/evaluate.py: all ranks in parallel, `gather_for_metrics`), then the best
model on the test split. Rank logic goes through the Accelerator only; files are written by the main
process (training/checkpoint.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script (`python training/train.py`, `accelerate launch training/train.py`): Python put
    # training/ itself first on sys.path. Replace it with the project root, so `training.*` imports work
    # without installing and our module names never shadow an installed library.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import logging
import math
import os
import time
from datetime import timedelta
from importlib.metadata import version

import datasets
import torch
import transformers
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs, set_seed
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from inference import files
from training import checkpoint, faults, model_card, reports
from training.checkpoint import Progress
from training.config import ConfigError, TrainConfig, load_config
from training.data import DataError, load_splits, make_dataloaders, steps_per_epoch, tokenize_splits
from training.evaluate import evaluate
from training.guards import LaunchError, StopGuard, TrainingDiverged, check_world_size
from training.hub import HubUnavailableError, ensure_hub_or_offline
from training.metrics import MetricError, MetricSuite
from training.push import PushError, check_can_push, push
from training.model import attention_for, build_model, build_optimizer, load_tokenizer, use_fast_dropout
from training.smoke import ensure_smoke_assets
from training.throughput import Throughput, peak_memory_mb

logger = get_logger(__name__)
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: the run stopped early, its resumable state is saved


def native_bf16() -> bool:
    """The hardware multiplies bf16 matrices natively: a bf16 GPU, or a CPU with AMX or AVX512-BF16."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    cpu = torch.cpu  # these capability probes are private in torch 2.x; treat their absence as "no"
    return any(getattr(cpu, probe, lambda: False)() for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))


def resolve_mixed_precision(cfg: TrainConfig) -> str:
    """--mixed_precision wins; then a launcher config's fp16/bf16; else bf16 where it is native, else no."""
    if cfg.mixed_precision:
        return cfg.mixed_precision
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if launcher != "no":
        return launcher
    return "bf16" if native_bf16() else "no"


def make_accelerator(cfg: TrainConfig) -> Accelerator:
    """One Accelerator for the whole run; topology from `accelerate launch`, precision from resolve_mixed_precision."""
    accelerator = Accelerator(
        # On a CPU-only machine, cpu=True turns a torchrun-started group into MULTI_CPU over gloo.
        cpu=not torch.cuda.is_available(),
        mixed_precision=resolve_mixed_precision(cfg),
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        log_with=None if cfg.report_to == "none" else cfg.report_to.split(","),
        project_dir=cfg.output_dir,
        kwargs_handlers=[
            InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.ddp_timeout)),
            DistributedDataParallelKwargs(find_unused_parameters=cfg.find_unused_parameters),
        ],
    )
    check_world_size(accelerator)
    return accelerator


def main(cfg: TrainConfig, accelerator: Accelerator) -> dict | None:
    """The whole run; returns the metrics summary, or None when preempted (state saved, resume later)."""
    started = time.time()
    set_seed(cfg.seed)
    logger.info("Distributed: %s, %d process(es), mixed precision %s, device %s", accelerator.distributed_type,
                accelerator.num_processes, accelerator.mixed_precision, accelerator.device)

    if cfg.push_to_hub:  # before hours of training, not after
        check_can_push(cfg.hub_model_id)

    # ---- data and tokenizer (the main process downloads/tokenizes first; the others read its cache)
    local = [cfg.tokenizer_name or cfg.model_name_or_path, cfg.model_name_or_path, *(cfg.extra_metrics or [])]
    ensure_hub_or_offline(needs_hub=not cfg.train_file or not all(Path(p).is_dir() for p in local))
    if cfg.preset == "smoke":
        with accelerator.local_main_process_first():
            ensure_smoke_assets()
    with accelerator.main_process_first():
        tokenizer = load_tokenizer(cfg)
        splits = tokenize_splits(load_splits(cfg), tokenizer, cfg)
    train_loader, sampler, val_loader, test_loader = make_dataloaders(
        splits, tokenizer, cfg, accelerator.num_processes, device_type=accelerator.device.type)
    metrics = MetricSuite(cfg.extra_metrics or [], num_labels=len(splits.label_names))  # extras fail here, not later

    # ---- model, optimizer, schedule
    attention = attention_for(cfg, accelerator.device)
    model = build_model(cfg, splits.label_names, attention)
    fast_dropouts = use_fast_dropout(model) if cfg.fast_dropout and accelerator.device.type == "cpu" else 0
    logger.info("Model %s: %.1f M parameters, %s attention, %s AdamW%s", cfg.model_name_or_path,
                sum(p.numel() for p in model.parameters()) / 1e6, attention,
                "fused" if cfg.fused_optimizer else "multi-tensor",
                f", {fast_dropouts} dropout modules swapped for FastDropout" if fast_dropouts else "")
    learning_rate = cfg.learning_rate * (accelerator.num_processes if cfg.scale_lr == "linear" else 1)
    optimizer = build_optimizer(model, cfg, learning_rate)
    epoch_steps = steps_per_epoch(len(sampler) // accelerator.num_processes, cfg.gradient_accumulation_steps)
    total_steps = cfg.max_train_steps or epoch_steps * cfg.num_train_epochs
    num_epochs = math.ceil(total_steps / epoch_steps)
    scheduler = transformers.get_scheduler(cfg.lr_scheduler_type, optimizer, num_training_steps=total_steps,
                                           num_warmup_steps=round(cfg.warmup_ratio * total_steps))
    model, optimizer, train_loader, val_loader, test_loader = accelerator.prepare(
        model, optimizer, train_loader, val_loader, test_loader)
    accelerator.register_for_checkpointing(scheduler)  # stepped by us once per optimizer step

    logger.info("Examples: %d train, %d validation, %s test; %d classes: %s", len(splits.train),
                len(splits.validation), len(splits.test) if splits.test is not None else "no",
                len(splits.label_names), ", ".join(splits.label_names))
    logger.info("Effective batch size %d (%d per device x %d accumulation x %d processes); learning rate %g; "
                "%d optimizer steps (%d per epoch, %d epochs)", cfg.effective_batch_size(accelerator.num_processes),
                cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps, accelerator.num_processes,
                learning_rate, total_steps, epoch_steps, num_epochs)

    # ---- resume
    progress = Progress(layout=layout_of(cfg, accelerator))
    resume_from = cfg.resume_from_checkpoint
    if resume_from == "latest":
        resume_from = checkpoint.find_latest_state(cfg.output_dir)
        if resume_from is None:
            logger.info("No resumable state under %s/state; starting from scratch.", cfg.output_dir)
    if resume_from:
        progress = checkpoint.load_state(accelerator, resume_from, layout=progress.layout)
        logger.info("Resumed from %s: epoch %d, %d batches into it, optimizer step %d", resume_from,
                    progress.epoch, progress.batches_done, progress.global_step)

    if accelerator.log_with:
        accelerator.init_trackers("distilbert_agnews", config=tracker_config(cfg))

    # ---- train, then score the best model once on the test split
    throughput = Throughput(accelerator.device)
    if fit(cfg, accelerator, model, optimizer, scheduler, tokenizer, train_loader, sampler, val_loader, progress,
           total_steps, num_epochs, throughput, splits, metrics):
        return None  # preempted: the resumable state is saved; the test split waits for the finished run
    speed = throughput.summary(accelerator)
    logger.info("Training speed: %.1f examples/s, %.0f tokens/s (padding %.1f%%), %.1f s; peak memory %.0f MB "
                "per process", speed["examples_per_second"], speed["tokens_per_second"],
                100 * speed["padding_fraction"], speed["train_seconds"], speed["peak_memory_mb_per_process"])
    test_metrics = None
    if test_loader is not None:
        best = checkpoint.load_weights(Path(cfg.output_dir) / files.WEIGHTS)
        accelerator.unwrap_model(model).load_state_dict(best)
        test_metrics = evaluate(accelerator, model, test_loader, metrics)
        logger.info("Test (best model, step %s): %s", progress.best_step, format_metrics(test_metrics))
    summary = run_summary(cfg, accelerator, splits, progress, test_metrics, time.time() - started)
    summary["throughput"] = speed
    if accelerator.is_main_process:
        checkpoint.write_json(Path(cfg.output_dir) / files.METRICS, summary)
        reports.write_training_curves(Path(cfg.output_dir), progress)
        model_card.write_model_card(Path(cfg.output_dir), summary, cfg.hub_model_id)
        if cfg.push_to_hub:
            push(Path(cfg.output_dir), cfg.hub_model_id, cfg.hub_private_repo)
    accelerator.wait_for_everyone()
    return summary


def fit(cfg, accelerator, model, optimizer, scheduler, tokenizer, train_loader, sampler, val_loader,
        progress: Progress, total_steps: int, num_epochs: int, throughput: Throughput, splits, metrics) -> bool:
    """Train until done, early-stopped or preempted; True when preempted (a resumable state was saved)."""
    guard = StopGuard(accelerator, cfg.max_nonfinite_steps)
    save_every = int(cfg.checkpointing_steps) if cfg.checkpointing_steps.isdigit() else None
    bar = tqdm(total=total_steps, initial=progress.global_step, desc="Training", unit="step",
               disable=not accelerator.is_local_main_process)
    loss_sum = torch.zeros((), device=accelerator.device)  # summed on device: no host sync per step
    loss_count = 0

    def validate_and_save() -> bool:
        with throughput.paused():
            return _validate_and_save()

    def _validate_and_save() -> bool:
        """Evaluate on every rank, save the model if it improved; True when early stopping fires."""
        results = evaluate(accelerator, model, val_loader, metrics)
        progress.history.append({"step": progress.global_step, "epoch": progress.epoch, **results})
        accelerator.log({f"eval/{k}": v for k, v in results.items() if isinstance(v, (int, float))},
                        step=progress.global_step)
        value = results[cfg.metric_for_best_model]
        improved = progress.best_metric is None or value > progress.best_metric
        logger.info("Validation at step %d: %s%s", progress.global_step, format_metrics(results),
                    " (best so far, saved)" if improved else "")
        if improved:
            progress.best_metric, progress.best_step, progress.best_validation = value, progress.global_step, results
            progress.evals_since_best = 0
            checkpoint.save_model(accelerator, model, tokenizer, cfg.output_dir, cfg.export_hf_format)
            if accelerator.is_main_process:
                checkpoint.write_json(Path(cfg.output_dir) / files.METRICS,
                                      run_summary(cfg, accelerator, splits, progress, None, None))
                reports.write_training_curves(Path(cfg.output_dir), progress)
        else:
            progress.evals_since_best += 1
        if cfg.early_stopping_patience and progress.evals_since_best >= cfg.early_stopping_patience:
            accelerator.set_trigger()
        # Every rank computed the same metrics from the same gathered predictions; check_trigger (an
        # all-reduce) makes the stop decision collectively all the same, so no rank can be left waiting.
        return accelerator.check_trigger()

    stop = progress.global_step >= total_steps
    for epoch in range(progress.epoch, num_epochs):
        if stop:
            break
        progress.epoch = epoch
        sampler.set_epoch(epoch)  # reshuffle: same permutation on every rank, different each epoch
        batches = accelerator.skip_first_batches(train_loader, progress.batches_done) if progress.batches_done \
            else train_loader
        model.train()
        for batch in batches:
            with accelerator.accumulate(model):
                loss = guard.inject(model(**batch).loss, progress.global_step)
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            progress.batches_done += 1
            throughput.observe(batch)
            loss_sum += loss.detach()
            loss_count += 1
            guard.observe(loss)
            if not accelerator.sync_gradients:
                continue  # still accumulating

            # ---- one optimizer step is done
            if not optimizer.step_was_skipped:  # fp16 overflow skips the step; keep the schedule in step
                scheduler.step()
            progress.global_step += 1
            faults.after_optimizer_step(progress.global_step, accelerator.process_index)  # test-only, inert
            bar.update(1)
            if progress.global_step % cfg.logging_steps == 0:
                mean_loss = accelerator.reduce(loss_sum / loss_count, reduction="mean").item()
                loss_sum.zero_()
                loss_count = 0
                lr = scheduler.get_last_lr()[0]
                progress.train_loss.append({"step": progress.global_step, "loss": mean_loss, "lr": lr})
                bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}")
                logger.info("step %d  loss %.4f  lr %.3e", progress.global_step, mean_loss, lr)
                accelerator.log({"train/loss": mean_loss, "train/lr": lr, "train/epoch": epoch},
                                step=progress.global_step)
            evaluate_now = bool(cfg.eval_steps) and progress.global_step % cfg.eval_steps == 0
            save_now = bool(save_every) and progress.global_step % save_every == 0
            boundary = progress.batches_done >= len(train_loader) or progress.global_step >= total_steps
            if evaluate_now or save_now or boundary or progress.global_step % cfg.stop_check_steps == 0:
                if preempted_or_diverged(cfg, accelerator, guard, progress):
                    bar.close()
                    return True
            if evaluate_now:
                stop = validate_and_save()
            if save_now:
                with throughput.paused():
                    checkpoint.save_state(accelerator, cfg.output_dir, progress, cfg.save_total_limit)
            if stop or progress.global_step >= total_steps:
                stop = True
                break

        epoch_done = progress.batches_done >= len(train_loader)
        if epoch_done:
            progress.epoch, progress.batches_done = epoch + 1, 0
        if not (progress.history and progress.history[-1]["step"] == progress.global_step):
            stop = validate_and_save() or stop  # end of epoch, or the last step (unless just evaluated)
        if epoch_done and not stop and cfg.checkpointing_steps == "epoch":
            with throughput.paused():
                checkpoint.save_state(accelerator, cfg.output_dir, progress, cfg.save_total_limit)
        logger.info("Epoch %d: peak memory %.0f MB (this process)", epoch + 1, peak_memory_mb(accelerator.device))
    bar.close()
    if cfg.early_stopping_patience and progress.evals_since_best >= cfg.early_stopping_patience:
        logger.info("Early stopping: no improvement of %s in %d evaluations (best %.4f at step %s).",
                    cfg.metric_for_best_model, progress.evals_since_best, progress.best_metric, progress.best_step)
    return False


def preempted_or_diverged(cfg: TrainConfig, accelerator: Accelerator, guard: StopGuard, progress: Progress) -> bool:
    """All ranks together: save and report True after a SIGTERM; raise TrainingDiverged on a non-finite loss."""
    preempted, diverged = guard.check()  # one all-reduce: the same answer on every rank
    if diverged:
        raise TrainingDiverged(
            f"The loss was not finite for {cfg.max_nonfinite_steps} consecutive batches (by step "
            f"{progress.global_step}); stopped without saving the diverged model (best model: step "
            f"{progress.best_step}). Try a lower --learning_rate, gradient clipping, or bf16 instead of fp16.")
    if preempted:
        path = checkpoint.save_state(accelerator, cfg.output_dir, progress, cfg.save_total_limit)
        logger.warning("SIGTERM: stopped at step %d and saved %s; continue with --resume_from_checkpoint latest",
                       progress.global_step, path)
    return preempted


# ------------------------------------------------------------------------------------------ reporting


def layout_of(cfg: TrainConfig, accelerator: Accelerator) -> dict:
    """What must match for a mid-epoch resume to continue with exactly the next batches."""
    return {"num_processes": accelerator.num_processes, "per_device_train_batch_size": cfg.per_device_train_batch_size,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps, "seed": cfg.seed,
            "group_by_length": cfg.group_by_length}


def format_metrics(metrics: dict) -> str:
    return "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())


def tracker_config(cfg: TrainConfig) -> dict:
    """Trackers (TensorBoard hparams) accept only scalars."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in cfg.to_dict().items()}


def run_summary(cfg, accelerator, splits, progress: Progress, test_metrics, runtime_s) -> dict:
    summary = {
        "validation": progress.best_validation,
        "test": test_metrics,
        "best_step": progress.best_step,
        "global_step": progress.global_step,
        "epochs_completed": progress.epoch,
        "metric_for_best_model": cfg.metric_for_best_model,
        "world_size": accelerator.num_processes,
        "effective_batch_size": cfg.effective_batch_size(accelerator.num_processes),
        "mixed_precision": accelerator.mixed_precision,
        "history": progress.history,
        "train_loss": progress.train_loss,
        "config": cfg.to_dict(),
        "versions": {name: version(name) for name in ("torch", "accelerate", "transformers", "datasets", "tokenizers")},
        "train_runtime_s": runtime_s,
    }
    if splits is not None:
        summary["num_examples"] = {"train": len(splits.train), "validation": len(splits.validation),
                                   "test": len(splits.test) if splits.test is not None else 0}
        summary["label_names"] = splits.label_names
        summary["label_values"] = splits.labels.values  # the training data's value of each class id
    return summary


def cli(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO)
    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        sys.stderr.write(f"train.py: error: {exc}\n")
        return 2
    try:
        accelerator = make_accelerator(cfg)
    except LaunchError as exc:
        sys.stderr.write(f"train.py: error: {exc}\n")
        return 2
    if not accelerator.is_local_main_process:  # one copy of library chatter per machine
        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    try:
        with logging_redirect_tqdm():  # log lines print above the progress bar instead of through it
            summary = main(cfg, accelerator)
    except (DataError, HubUnavailableError, MetricError, PushError, checkpoint.ResumeError, TrainingDiverged) as exc:
        # Expected, explainable failures: one paragraph, no traceback. Everything else propagates.
        logger.error("%s", exc)
        return 1
    finally:
        accelerator.end_training()  # destroys the process group; without it gloo may abort at exit
    return 0 if summary is not None else PREEMPTED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(cli())
