"""Everything a run needs, built from its config on every rank: tokenizer and splits, metrics, the model, loaders,
optimizer and schedule prepared by the Accelerator, the output folder; resumed when asked. Called by train.py."""

from __future__ import annotations

import warnings
from pathlib import Path

import datasets
import torch
from accelerate import Accelerator
from accelerate.logging import get_logger

from contract import files
from contract.hub import ensure_hub_or_offline
from training import calibration
from training.collective import main_first
from training.config import ConfigError, TrainConfig
from training.data.batching import make_dataloaders, num_texts, train_widths
from training.data.reading import Splits, load_splits
from training.data.tokenizing import tokenize_splits
from training.fit_batch import fit_batch
from training.guards import StopGuard
from training.model import keep_optimizer_kind, load_tokenizer, make_model, optimization, schedule_plan
from training.objective import objective_for, problem_type_defaults
from training.output import provenance
from training.output.claim import Previous
from training.output.folder import OutputDir
from training.output.progress import Progress
from training.run import Loaders, Run
from training.scoring.metrics import MetricSuite, greater_is_better, thin_validation
from training.smoke import ensure_smoke_assets
from training.speed import capture, step_graph
from training.speed.throughput import Throughput
from training.weights import ddp_buffers

logger = get_logger(__name__)


def load_data(cfg: TrainConfig, accelerator: Accelerator):
    """Tokenizer, splits and loaders; the main process tokenizes first."""
    local = [cfg.tokenizer_name or cfg.model_name_or_path, cfg.model_name_or_path, *(cfg.extra_metrics or [])]
    local_data = cfg.train_file or Path(cfg.dataset_name).is_dir()  # files, or a dataset folder datasets reads
    if cfg.preset:  # built before the check: a preset's files are local, an empty cache no reason to ask the Hub
        with accelerator.local_main_process_first():
            ensure_smoke_assets()
    ensure_hub_or_offline(needs_hub=not local_data or not all(Path(p).is_dir() for p in local))

    def load() -> tuple:
        tokenizer = load_tokenizer(cfg)
        return tokenizer, tokenize_splits(load_splits(cfg), tokenizer, cfg)

    tokenizer, splits = main_first(accelerator, load)  # a bad file or tokenizer: one line on every rank
    logger.info(
        "Examples: %s train, %s validation, %s test; %s, %d output(s): %s",
        windows_of(splits.train),
        windows_of(splits.validation),
        windows_of(splits.test) if splits.test is not None else "no",
        splits.labels.problem_type,
        len(splits.label_names),
        ", ".join(splits.label_names),
    )
    return tokenizer, splits


def prepared(accelerator: Accelerator, model, optimizer, loaders: Loaders) -> tuple:
    """accelerator.prepare of the model, optimizer and loaders (the loaders in place): (model, optimizer)."""
    with warnings.catch_warnings():
        # accelerate passes DDP's broadcast_buffers, which torch deprecates for forward_sync_buffers; the meaning
        # ddp_buffers chose (no sync at init either) has no other name yet, so the notice would only repeat per rank
        warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
        model, optimizer, loaders.train, loaders.validation, loaders.test = accelerator.prepare(
            model, optimizer, loaders.train, loaders.validation, loaders.test
        )
    return model, optimizer


def warn_thin_validation(cfg: TrainConfig, splits: Splits) -> None:
    """Warn once of a validation split too small."""
    rows = splits.validation
    windowed = "document" in rows.column_names
    labels = [rows[i]["labels"] for i in _first_windows(rows)] if windowed else rows["labels"]
    why = thin_validation(splits.labels.problem, torch.tensor(labels), splits.label_names)
    if why:
        more = (
            "a larger --validation_file"
            if cfg.validation_file
            else f"--validation_split (now {cfg.validation_split or f'{len(rows)} texts'})"
        )
        logger.warning(
            "%s: too few to pick the best model, calibrate or fit thresholds on reliably; hold out more with %s",
            why,
            more,
        )


def _first_windows(rows: datasets.Dataset) -> list[int]:
    """Each text's first window's row."""
    seen: dict[int, int] = {}
    for i, document in enumerate(rows["document"]):
        seen.setdefault(document, i)
    return list(seen.values())


def windows_of(split: datasets.Dataset) -> str:
    """'N' texts, or 'N (W windows)'."""
    texts = num_texts(split)
    return str(texts) if texts == len(split) else f"{texts} ({len(split)} windows)"


def choose_metrics(cfg: TrainConfig, splits: Splits) -> tuple[TrainConfig, MetricSuite]:
    """Metrics (extras tried now) and the selection metric decided."""
    metrics = MetricSuite(splits.labels.problem, splits.label_names, cfg.extra_metrics or [])
    metric = cfg.metric_for_best_model or splits.labels.problem.selection
    metrics.check_selection(metric)
    greater = greater_is_better(metric, cfg.greater_is_better)
    return cfg.model_copy(update={"metric_for_best_model": metric, "greater_is_better": greater}), metrics


def set_up(cfg: TrainConfig, accelerator: Accelerator, run_id: str, previous: Previous | None = None) -> Run:
    """Everything prepared by the Accelerator; resumed when asked."""
    tokenizer, splits = load_data(cfg, accelerator)
    warn_thin_validation(cfg, splits)
    cfg, metrics = choose_metrics(cfg, splits)
    cfg = problem_type_defaults(cfg, splits.labels.problem)
    if cfg.calibration == calibration.TEMPERATURE and calibration.scale_for(splits.labels.problem_type) is None:
        raise ConfigError(f"calibration: a {splits.labels.problem_type} model has no probabilities to calibrate")
    objective = objective_for(cfg, splits.labels, splits.train["labels"]).to(accelerator.device)
    model = make_model(cfg, accelerator, splits.labels, tokenizer.pad_token_id)
    if cfg.auto_find_batch_size:
        cfg = fit_batch(cfg, accelerator, model)
    world = accelerator.num_processes
    learning_rate, epoch_steps, total_steps, num_epochs = schedule_plan(cfg, world, len(splits.train))
    compiled = capture.for_run(cfg, accelerator, total_steps)
    loaders = Loaders(*make_dataloaders(splits, tokenizer, cfg, world, accelerator.device.type, compiled))
    optimizer, scheduler = optimization(cfg, accelerator, model, learning_rate, total_steps, compiled)
    ddp_buffers(accelerator, model)
    model, optimizer = prepared(accelerator, model, optimizer, loaders)
    widths = train_widths(cfg, accelerator.device.type, compiled)
    model = capture.compiled_model(model, compiled, len(widths), accelerator.device.type)
    logger.info(
        "Effective batch size %d (%d per device x %d accumulation x %d processes); learning rate %g; "
        "%d optimizer steps (%d per epoch, %d epochs); batch widths %s; torch.compile %s",
        cfg.effective_batch_size(world),
        *(cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps, world, learning_rate),
        *(total_steps, epoch_steps, num_epochs),
        ", ".join(map(str, widths)) or "dynamic",
        compiled,
    )
    run = Run(
        cfg,
        accelerator,
        model,
        optimizer,
        scheduler,
        tokenizer,
        loaders,
        splits,
        metrics,
        out=OutputDir(cfg.output_dir, accelerator, cfg.save_total_limit, run_id, previous),
        progress=Progress(),
        total_steps=total_steps,
        num_epochs=num_epochs,
        throughput=Throughput(accelerator.device),
        guard=StopGuard(accelerator, cfg.max_nonfinite_steps),
        objective=objective,
        compiled=capture.CompiledSteps(
            compiled,
            clips_in_step=capture.steps_compiled(compiled, accelerator.mixed_precision),
            accumulation=cfg.gradient_accumulation_steps,
        ),
    )
    if compiled == capture.WHOLE_STEP:
        accumulation, clip = cfg.gradient_accumulation_steps, cfg.max_grad_norm
        run.graphs = step_graph.StepGraph(model, optimizer, clip, accumulation, run.guard, accelerator.device)
    record_and_resume(run, learning_rate)
    return run


def record_and_resume(run: Run, learning_rate: float) -> None:
    """Provenance, then the resume; the calibration texts."""
    cfg, splits = run.cfg, run.splits
    run.progress.provenance = provenance.record(cfg, splits, run.accelerator, learning_rate, run.total_steps)
    resume(run)
    if splits.calibration:
        run.out.write_json(files.CALIBRATION, {"texts": splits.calibration, "source": "a seeded sample of train"})


def resume(run: Run) -> None:
    """Resume from --resume_from_checkpoint."""
    run.progress.layout = provenance.layout(run.cfg, run.accelerator)
    resumed = run.out.resume(run.cfg.resume_from_checkpoint, run.progress, run.scheduler, run.cfg.allow_inexact_resume)
    if resumed is None:
        if run.cfg.resume_from_checkpoint:
            logger.info("No resumable state under %s; starting from scratch.", run.out.path(files.STATE_DIR))
        return
    folder, run.progress = resumed
    keep_optimizer_kind(run.optimizer)  # a compiled run's state resumed eagerly, or the reverse
    logger.info(
        "Resumed from %s: epoch %d, %d batches into it, optimizer step %d",
        folder,
        run.progress.epoch,
        run.progress.batches_done,
        run.progress.global_step,
    )
