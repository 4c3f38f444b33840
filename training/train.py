"""Fine-tune a text classifier (DistilBERT on AG News by default) with a plain PyTorch loop and Accelerate.

    accelerate launch training/train.py --preset smoke

set_up builds the run; loop.fit trains it; train_and_report scores, calibrates and reports.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # as a script, Python put training/ first on sys.path: the project root instead, so nothing shadows a library
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):  # before torch loads: an answer in a second
    from training.config_parsing import build_parser

    build_parser().print_help()
    sys.exit(0)

import signal
import time
from collections.abc import Callable
from datetime import timedelta

import datasets
import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    InitProcessGroupKwargs,
    set_seed,
)

from contract import files
from contract.errors import UsageError, UserError
from training import calibration, launch, lora
from training.cli import run_command, setup_logging, usage_error
from training.collective import main_first
from training.config import ConfigError, TrainConfig
from training.config_parsing import load_config
from training.data.batching import make_dataloaders, num_texts, train_widths
from training.data.labels import LabelSpace
from training.data.reading import Splits, load_splits
from training.data.tokenizing import tokenize_splits
from training.fit_batch import fit_batch
from training.guards import StopGuard, check_strategy, check_world_size
from training.hub import ensure_hub_or_offline
from training.loop import Loaders, Outcome, Run, fit, format_metrics, on_disk
from training.model import OPTIMIZERS, build_model, keep_optimizer_kind, load_tokenizer, optimization, schedule_plan
from training.objective import objective_for, problem_type_defaults
from training.output import provenance, reports
from training.output.checkpoint import OutputDir, Progress
from training.output.claim import Previous, claim_output_dir
from training.output.reports import run_summary
from training.push import check_can_push
from training.scoring.metrics import MetricSuite, greater_is_better, say_one_sided, thin_validation
from training.scoring.split import score
from training.smoke import ensure_smoke_assets
from training.speed import capture, cpu_speed, packing, step_graph
from training.speed.throughput import Throughput
from training.weights import ddp_buffers

logger = get_logger(__name__)
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM  # the shell's code for SIGTERM: stopped early, resumable state saved


def make_accelerator(cfg: TrainConfig) -> Accelerator:
    """One Accelerator: topology from the launcher, precision from launch.py."""
    check_strategy(cfg.lora_r)
    accelerator = Accelerator(
        # without GPUs, cpu=True makes a torchrun group MULTI_CPU over gloo
        cpu=not torch.cuda.is_available(),
        mixed_precision=launch.mixed_precision(cfg.mixed_precision),
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        log_with=None if cfg.report_to == "none" else cfg.report_to.split(","),
        project_dir=cfg.output_dir,
        dataloader_config=DataLoaderConfiguration(non_blocking=True),  # pinned batches copied while the GPU runs
        kwargs_handlers=[
            InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.ddp_timeout)),
            # a whole-step graph captures the casts
            AutocastKwargs(cache_enabled=cfg.torch_compile != capture.WHOLE_STEP),
            DistributedDataParallelKwargs(
                find_unused_parameters=cfg.find_unused_parameters,
                gradient_as_bucket_view=True,  # no copy in or out of the buckets
                broadcast_buffers=False,  # see ddp_buffers
                # DDP may plan once; not with accumulation's no_sync
                static_graph=not cfg.find_unused_parameters
                and cfg.gradient_accumulation_steps == 1
                and not cfg.auto_find_batch_size,  # which may raise the accumulation
            ),
        ],
    )
    check_world_size(accelerator)
    launch.say_overridden_precision(cfg.mixed_precision, accelerator.mixed_precision)
    return accelerator


def load_data(cfg: TrainConfig, accelerator: Accelerator):
    """Tokenizer, splits and loaders; the main process tokenizes first."""
    local = [cfg.tokenizer_name or cfg.model_name_or_path, cfg.model_name_or_path, *(cfg.extra_metrics or [])]
    local_data = cfg.train_file or Path(cfg.dataset_name).is_dir()  # files, or a dataset folder datasets reads
    ensure_hub_or_offline(needs_hub=not local_data or not all(Path(p).is_dir() for p in local))
    if cfg.preset:
        with accelerator.local_main_process_first():
            ensure_smoke_assets()

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


def warn_thin_validation(cfg: TrainConfig, splits: Splits) -> None:
    """Warn once of a validation split too small."""
    rows = splits.validation
    windowed = "document" in rows.column_names
    labels = [rows[i]["labels"] for i in _first_windows(rows)] if windowed else rows["labels"]
    why = thin_validation(splits.labels.problem, torch.tensor(labels), splits.label_names)
    if why:
        more = (
            "a larger --validation_file" if cfg.validation_file else f"--validation_split (now {cfg.validation_split})"
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


def make_model(cfg: TrainConfig, accelerator: Accelerator, labels: LabelSpace, pad_token_id: int) -> torch.nn.Module:
    """The classifier, with CPU speed-ups on CPU."""
    device = accelerator.device
    attention = cpu_speed.attention_for(cfg.attn_implementation, cfg.fast_dropout, device)
    model = build_model(cfg, labels, packing.register() if cfg.packing else attention, pad_token_id)
    if cfg.packing and not packing.supported(model):
        raise ConfigError(
            f"packing: {model.config.model_type} is not supported (its head would read packed rows; packing knows "
            f"{', '.join(packing.MODEL_TYPES)}): leave --packing off"
        )
    if cfg.packing:
        packing.hand_first_tokens(model)
    if cfg.lora_r:
        model = lora.apply_lora(
            model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules, cfg.from_scratch
        )
    swapped = cpu_speed.enable(model, cfg.fast_dropout, device)
    logger.info(
        "Model %s: %.1f M parameters, %s attention, %s%s",
        cfg.model_name_or_path,
        sum(p.numel() for p in model.parameters()) / 1e6,
        attention,
        OPTIMIZERS[cfg.optim]
        if cfg.optim != "adamw"
        else f"{'fused' if cfg.fused_optimizer else 'multi-tensor'} AdamW",
        f", {swapped} dropout modules swapped for FastDropout" if swapped else "",
    )
    return model


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
    model, optimizer, loaders.train, loaders.validation, loaders.test = accelerator.prepare(
        model, optimizer, loaders.train, loaders.validation, loaders.test
    )
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


def score_best_model(run: Run) -> tuple[dict | None, dict, dict]:
    """The best model back, scored on validation, calibrated when asked, then on test: (test metrics, calibration,
    thresholds)."""
    run.out.restore_best(run.model)
    model, long_text = capture.eager(run.model), run.cfg.long_text_rule()
    validation, _, _ = score(run.accelerator, model, run.loaders.validation, run.metrics, long_text=long_text)
    best_thresholds = (run.progress.best_validation or {}).get("thresholds")
    found = say_one_sided(run.metrics.problem, validation, best_thresholds, run.splits.label_names)
    calibrated = calibration.apply(run, validation)
    if run.loaders.test is None:
        return None, calibrated, found
    # thresholds moved with the temperatures
    thresholds = calibrated.get("thresholds") or best_thresholds
    scored, results, _ = score(run.accelerator, model, run.loaders.test, run.metrics, thresholds, long_text)
    calibration.add_test_errors(calibrated, scored, run.objective.problem.name)
    logger.info("Test (best model, step %s): %s", run.progress.best_step, format_metrics(results))
    return results, calibrated, found


def tracker_config(cfg: TrainConfig) -> dict:
    """Trackers (TensorBoard hparams) accept only scalars."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in cfg.to_dict().items()}


def main(cfg: TrainConfig, accelerator: Accelerator, on_evaluation: Callable | None = None) -> dict | None:
    """The whole run; the summary, or None when preempted. `on_evaluation`: loop.Run's."""
    started = time.time()
    set_seed(cfg.seed)
    logger.info(
        "Distributed: %s, %d process(es), mixed precision %s, device %s",
        accelerator.distributed_type,
        accelerator.num_processes,
        accelerator.mixed_precision,
        accelerator.device,
    )
    if cfg.push_to_hub:  # before hours of training, not after
        check_can_push(cfg.hub_model_id)
    resuming = cfg.resume_from_checkpoint is not None
    # claimed before data or model load
    claim = claim_output_dir(cfg.output_dir, accelerator, resuming, cfg.overwrite_output_dir, cfg.model_name_or_path)
    try:
        run = set_up(cfg, accelerator, claim.run_id, claim.previous)
        run.on_evaluation = on_evaluation
        return train_and_report(run, started)
    finally:
        claim.release()


def train_and_report(run: Run, started: float) -> dict | None:
    """Fit, then test the best model and write the reports."""
    cfg, accelerator = run.cfg, run.accelerator
    if accelerator.log_with:
        accelerator.init_trackers("distilbert_agnews", config=tracker_config(cfg))

    if fit(run) is Outcome.PREEMPTED:
        return None  # preempted: the state is saved
    if run.progress.best_step is None:  # every evaluation was non-finite
        raise UserError(f"Training ended without a model to keep. {on_disk(run)}")
    speed = run.throughput.summary(accelerator)
    logger.info(
        "Training speed: %.1f examples/s, %.0f tokens/s (padding %.1f%%), %.1f s; peak memory %.0f MB per process",
        speed["examples_per_second"],
        speed["tokens_per_second"],
        100 * speed["padding_fraction"],
        speed["train_seconds"],
        speed["peak_memory_mb_per_process"],
    )
    test_metrics, calibrated, found = score_best_model(run)
    summary = run_summary(run, test_metrics, time.time() - started)
    summary["calibration"] = calibrated
    summary["one_sided_labels"] = found  # labels predicted always or never
    summary["throughput"] = speed
    summary["compilation"] = run.compiled.summary()
    if run.graphs is not None:
        summary["compilation"]["captured_graphs"] = run.graphs.captured
    run.out.write_final(summary, run.progress, cfg.hub_model_id)
    if cfg.export_runtime != "none":
        run.out.export_runtime(cfg.export_runtime)
    if cfg.push_to_hub:
        run.out.push(cfg.hub_model_id, cfg.hub_private_repo)
    accelerator.wait_for_everyone()
    logger.info(reports.next_steps(cfg, run.progress.best_step, run.progress.best_metric, test_metrics))
    return summary


def cli(argv: list[str] | None = None) -> int:
    setup_logging()
    try:
        cfg = load_config(argv)
        setup_logging(cfg.verbose)
        accelerator = make_accelerator(cfg)
    except UsageError as exc:
        return usage_error("train.py", exc)
    return run_command(lambda: 0 if main(cfg, accelerator) is not None else PREEMPTED_EXIT_CODE, accelerator)


if __name__ == "__main__":
    sys.exit(cli())
