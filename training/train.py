"""Fine-tune a text classifier (DistilBERT on AG News by default) with a plain PyTorch loop and Accelerate.

    accelerate launch training/train.py                                   # Hub model + data
    python training/train.py --preset smoke                               # offline, CPU, under a minute
    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml training/train.py --preset smoke

Read top to bottom: `make_accelerator` (topology from the launcher), `load_data` and `make_model`,
`set_up` (the run: optimizer, schedule, accelerator.prepare, resume), `main` (fit, then the best model on
the test split, then the reports), `cli`. The loop itself is training/loop.py; the output folder is
training/checkpoint.py's OutputDir. Rank logic goes through the Accelerator only.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script (`python training/train.py`, `accelerate launch training/train.py`): Python put
    # training/ itself first on sys.path. Replace it with the project root, so `training.*` imports work
    # without installing and our module names never shadow an installed library.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import math
import os
import signal
import time
from dataclasses import replace
from datetime import timedelta

import datasets
import torch
import transformers
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    InitProcessGroupKwargs,
    set_seed,
)

from contract import files, precision, task
from contract.attention import SYNC_FREE_SDPA
from contract.errors import UsageError
from training import calibration, capture, cpu_speed, lora, packing, provenance, reports, step_graph
from training.checkpoint import OutputDir, Progress
from training.claim import claim_output_dir
from training.cli import run_command, setup_logging, usage_error
from training.collective import main_first
from training.config import ConfigError, TrainConfig
from training.config_parsing import load_config
from training.data.batching import make_dataloaders, num_texts, pad_widths, steps_in_epoch
from training.data.labels import LabelSpace
from training.data.reading import Splits, load_splits
from training.data.tokenizing import tokenize_splits
from training.guards import StopGuard, TrainingDiverged, check_strategy, check_world_size
from training.hub import ensure_hub_or_offline
from training.loop import Loaders, Run, fit, format_metrics, on_disk, run_summary
from training.metrics import MetricSuite, greater_is_better, one_sided, thin_validation
from training.model import build_model, build_optimizer, keep_optimizer_kind, load_tokenizer
from training.objective import objective_for, problem_type_defaults
from training.push import check_can_push
from training.scoring import score
from training.smoke import ensure_smoke_assets
from training.throughput import Throughput
from training.weights import edit_weights

logger = get_logger(__name__)
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM  # the shell's code for SIGTERM: stopped early, resumable state saved


def launcher_precision() -> str:
    """The precision `accelerate launch` was given (its flag or config file), or "no"."""
    return os.environ.get("ACCELERATE_MIXED_PRECISION", "no")


def resolve_mixed_precision(cfg: TrainConfig) -> str:
    """accelerate's name for the run's precision: --mixed_precision; for `auto`, a launcher config's fp16/bf16
    if it sets one, else `auto` as contract/precision.py decides it for this machine."""
    launcher = launcher_precision()
    if cfg.mixed_precision == precision.AUTO and launcher != "no":
        return launcher
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return precision.accelerate_name(precision.resolve(cfg.mixed_precision, device_type))


def make_accelerator(cfg: TrainConfig) -> Accelerator:
    """One Accelerator for the whole run; topology from `accelerate launch`, precision from resolve_mixed_precision."""
    check_strategy(cfg.lora_r)
    accelerator = Accelerator(
        # On a CPU-only machine, cpu=True turns a torchrun-started group into MULTI_CPU over gloo.
        cpu=not torch.cuda.is_available(),
        mixed_precision=resolve_mixed_precision(cfg),
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        log_with=None if cfg.report_to == "none" else cfg.report_to.split(","),
        project_dir=cfg.output_dir,
        dataloader_config=DataLoaderConfiguration(non_blocking=True),  # pinned batches copied while the GPU runs
        kwargs_handlers=[
            InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.ddp_timeout)),
            # a whole-step graph captures autocast's casts; cached ones would be freed at the end of the capture
            AutocastKwargs(cache_enabled=cfg.torch_compile != capture.WHOLE_STEP),
            DistributedDataParallelKwargs(
                find_unused_parameters=cfg.find_unused_parameters,
                gradient_as_bucket_view=True,  # .grad are views of the all-reduce buckets: no copy in, none out
                broadcast_buffers=False,  # see ddp_buffers: set where the model has buffers a forward pass changes
                # the same parameters every step, so DDP may plan once; not with accumulation, whose no_sync
                # micro-steps DDP's static graph does not support (an internal assertion in the reducer)
                static_graph=not cfg.find_unused_parameters and cfg.gradient_accumulation_steps == 1,
            ),
        ],
    )
    check_world_size(accelerator)
    launcher = launcher_precision()
    if launcher not in ("no", accelerator.mixed_precision):
        logger.warning(
            "accelerate launch asked for %s, but --mixed_precision %s (flag, YAML or preset) decides: training in %s. "
            "Pass --mixed_precision %s to train in %s.",
            launcher,
            cfg.mixed_precision,
            precision.canonical(accelerator.mixed_precision),
            launcher,
            launcher,
        )
    return accelerator


def load_data(cfg: TrainConfig, accelerator: Accelerator):
    """Tokenizer, tokenized splits and loaders; the main process downloads and tokenizes first, the others
    read its cache."""
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
    """Once, at start: a validation split too small to pick the best model, calibrate or fit thresholds on."""
    rows = splits.validation
    windowed = "document" in rows.column_names
    labels = [rows[i]["labels"] for i in _first_windows(rows)] if windowed else rows["labels"]
    why = thin_validation(splits.labels.kind, torch.tensor(labels), splits.label_names)
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
    """The row of each text's first window (--long_text chunk: a text spans several rows)."""
    seen: dict[int, int] = {}
    for i, document in enumerate(rows["document"]):
        seen.setdefault(document, i)
    return list(seen.values())


def windows_of(split: datasets.Dataset) -> str:
    """'N' texts, or 'N (W windows)' when --long_text chunk cut some into several."""
    texts = num_texts(split)
    return str(texts) if texts == len(split) else f"{texts} ({len(split)} windows)"


def make_model(cfg: TrainConfig, accelerator: Accelerator, labels: LabelSpace, pad_token_id: int) -> torch.nn.Module:
    """The classifier, with the CPU speed-ups (training/cpu_speed.py) switched on when training on CPU."""
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
        "Model %s: %.1f M parameters, %s attention, %s AdamW%s",
        cfg.model_name_or_path,
        sum(p.numel() for p in model.parameters()) / 1e6,
        attention,
        "fused" if cfg.fused_optimizer else "multi-tensor",
        f", {swapped} dropout modules swapped for FastDropout" if swapped else "",
    )
    return model


def choose_metrics(cfg: TrainConfig, splits: Splits) -> tuple[TrainConfig, MetricSuite]:
    """The problem type's metrics (extras loaded and tried here, not after training) and the config with the metric
    that picks the best model and its direction decided (metrics.json records them)."""
    metrics = MetricSuite(splits.labels.task, splits.label_names, cfg.extra_metrics or [])
    metric = cfg.metric_for_best_model or splits.labels.kind.selection
    metrics.check_selection(metric)
    greater = greater_is_better(metric, cfg.greater_is_better)
    return cfg.model_copy(update={"metric_for_best_model": metric, "greater_is_better": greater}), metrics


def set_up(cfg: TrainConfig, accelerator: Accelerator, run_id: str) -> Run:
    """Data, model, optimizer and schedule, prepared by the Accelerator; resumed when asked."""
    tokenizer, splits = load_data(cfg, accelerator)
    warn_thin_validation(cfg, splits)
    cfg, metrics = choose_metrics(cfg, splits)
    cfg = problem_type_defaults(cfg, splits.labels.kind)
    if cfg.calibration == calibration.TEMPERATURE and calibration.scale_for(splits.labels.problem_type) is None:
        raise ConfigError(f"calibration: a {splits.labels.problem_type} model has no probabilities to calibrate")
    objective = objective_for(cfg, splits.labels, splits.train["labels"]).to(accelerator.device)
    model = make_model(cfg, accelerator, splits.labels, tokenizer.pad_token_id)
    world = accelerator.num_processes
    learning_rate, epoch_steps, total_steps, num_epochs = schedule_plan(cfg, world, len(splits.train))
    compiled = resolve_compile(cfg, accelerator, total_steps)
    loaders = Loaders(*make_dataloaders(splits, tokenizer, cfg, world, accelerator.device.type, compiled))
    optimizer, scheduler = optimization(cfg, accelerator, model, learning_rate, total_steps, compiled)
    ddp_buffers(accelerator, model)
    model, optimizer, loaders.train, loaders.validation, loaders.test = accelerator.prepare(
        model, optimizer, loaders.train, loaders.validation, loaders.test
    )
    widths = pad_widths(cfg, accelerator.device.type, compiled)
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
        out=OutputDir(cfg.output_dir, accelerator, cfg.save_total_limit, run_id),
        progress=Progress(),
        total_steps=total_steps,
        num_epochs=num_epochs,
        throughput=Throughput(accelerator.device),
        guard=StopGuard(accelerator, cfg.max_nonfinite_steps),
        objective=objective,
        compiled=capture.CompileReport(
            compiled,
            clips_in_step=capture.steps_compiled(compiled, accelerator.mixed_precision),
            accumulation=cfg.gradient_accumulation_steps,
        ),
    )
    if compiled == capture.WHOLE_STEP:
        run.graphs = step_graphs(cfg, model, optimizer, run.guard, accelerator.device)
    run.progress.provenance = provenance.record(cfg, splits, accelerator, learning_rate, total_steps)
    resume(run)
    if splits.calibration:
        run.out.write_json(files.CALIBRATION, {"texts": splits.calibration, "source": "a seeded sample of train"})
    return run


def resolve_compile(cfg: TrainConfig, accelerator: Accelerator, total_steps: int) -> str:
    """--torch_compile for this run (training/capture.py); whole-step only where CUDA graphs exist."""
    device, world = accelerator.device, accelerator.num_processes
    distributed = accelerator.distributed_type != DistributedType.NO
    mode = capture.resolve(
        cfg.torch_compile, cfg.pad_buckets, device.type, total_steps, world, accelerator.mixed_precision, distributed
    )
    if mode == capture.WHOLE_STEP and not step_graph.available(device):
        raise ConfigError(f"torch_compile: whole-step captures CUDA graphs, which a {device.type} device has not")
    attention = cpu_speed.attention_for(cfg.attn_implementation, cfg.fast_dropout, device)
    if mode == capture.WHOLE_STEP and attention != SYNC_FREE_SDPA:
        raise ConfigError(
            f"torch_compile: whole-step needs --attn_implementation sdpa ({attention} attention asks the device "
            "whether a batch has padding, which a CUDA graph capture cannot do)"
        )
    return mode


def step_graphs(cfg: TrainConfig, model, optimizer, guard: StopGuard, device: torch.device) -> step_graph.StepGraph:
    accumulation = cfg.gradient_accumulation_steps
    return step_graph.StepGraph(model, optimizer, cfg.max_grad_norm, accumulation, guard, device)


def schedule_plan(cfg: TrainConfig, world: int, train_examples: int) -> tuple[float, int, int, int]:
    """(learning rate, optimizer steps per epoch, in all, epochs): --scale_lr linear multiplies the rate by the world
    size; --max_train_steps, when set, decides the length over --num_train_epochs."""
    learning_rate = cfg.learning_rate * (world if cfg.scale_lr == "linear" else 1)
    batch, accumulation = cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    epoch_steps = steps_in_epoch(train_examples, batch, world, accumulation)
    total_steps = cfg.max_train_steps or epoch_steps * cfg.num_train_epochs
    return learning_rate, epoch_steps, total_steps, math.ceil(total_steps / epoch_steps)


def optimization(
    cfg: TrainConfig,
    accelerator: Accelerator,
    model: torch.nn.Module,
    learning_rate: float,
    total_steps: int,
    compiled: str,
):
    """(AdamW, its schedule): with compilation on (training/capture.py), a capturable AdamW whose compiled step reads
    a tensor learning rate, except under fp16, where the GradScaler steps it eagerly."""
    step_compiled = capture.steps_compiled(compiled, accelerator.mixed_precision)
    captured = compiled == capture.WHOLE_STEP  # the fused AdamW, replayed uncompiled (training/step_graph.py)
    optimizer = build_optimizer(model, cfg, learning_rate, capturable=step_compiled or captured, fused=captured)
    scheduler = transformers.get_scheduler(
        cfg.lr_scheduler_type,
        optimizer,
        num_training_steps=total_steps,
        num_warmup_steps=round(cfg.warmup_ratio * total_steps),
    )
    if step_compiled:
        capture.compile_optimizer_step(optimizer, compiled, accelerator.device, cfg.max_grad_norm)
    elif captured:
        capture.tensor_learning_rate(optimizer, accelerator.device)
    if compiled == capture.REDUCE_OVERHEAD and cfg.gradient_accumulation_steps > 1:
        capture.grads_outside_graphs(model)
    return optimizer, scheduler


def ddp_buffers(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """DDP broadcasts rank 0's buffers before every forward pass unless told not to (make_accelerator does): a
    collective per step that only buffers a forward pass changes need (running statistics of batch norms); the
    constant buffers of transformer classifiers (position ids) are equal on every rank already."""
    handler = accelerator.ddp_handler
    if accelerator.distributed_type == DistributedType.FSDP:  # DDP's settings do not apply: say what shards
        plugin = accelerator.state.fsdp_plugin
        logger.info(
            "FSDP%d: parameters, gradients and optimizer state sharded over %d processes (%s wrapping); states "
            "saved as %s",
            plugin.fsdp_version,
            accelerator.num_processes,
            plugin.auto_wrap_policy.__name__ if callable(plugin.auto_wrap_policy) else plugin.auto_wrap_policy,
            plugin.state_dict_type.name if hasattr(plugin.state_dict_type, "name") else plugin.state_dict_type,
        )
        return
    if handler is None or accelerator.num_processes == 1:
        return
    handler.broadcast_buffers = any(getattr(m, "track_running_stats", False) for m in model.modules())
    logger.info(
        "DDP: gradients as views of the all-reduce buckets, %s, buffers %s",
        "static graph" if handler.static_graph else "graph found each step",
        "broadcast every step" if handler.broadcast_buffers else "not broadcast (none changes)",
    )


def layout_of(cfg: TrainConfig, accelerator: Accelerator) -> dict:
    """What must match for a mid-epoch resume to continue with exactly the next batches (and, on CPU, the same
    sums: the intra-op threads decide how kernels split them)."""
    return {
        "num_processes": accelerator.num_processes,
        "per_device_train_batch_size": cfg.per_device_train_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "seed": cfg.seed,
        "group_by_length": cfg.group_by_length,
        **({"cpu_threads": torch.get_num_threads()} if accelerator.device.type == "cpu" else {}),
    }


def resume(run: Run) -> None:
    """Continue from --resume_from_checkpoint ('latest' or a state folder) when there is one."""
    run.progress.layout = layout_of(run.cfg, run.accelerator)
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
    """The best saved model put back, scored on validation (all ranks), calibrated there (and saved again) when asked,
    said when it predicts some label for every text or for none, then scored once on the test split: (test metrics or
    None without a test split, what calibration applied and measured, the labels predicted always or never)."""
    run.out.restore_best(run.model)
    model, windowing = capture.eager(run.model), run.cfg.windowing()
    validation, _, _ = score(run.accelerator, model, run.loaders.validation, run.metrics, windowing=windowing)
    best_thresholds = (run.progress.best_validation or {}).get("thresholds")
    found = warn_one_sided(run, validation, best_thresholds)
    calibrated = calibrate(run, validation)
    if run.loaders.test is None:
        return None, calibrated, found
    # multi-label: the best model's thresholds, moved with its temperatures when calibrated
    thresholds = calibrated.get("thresholds") or best_thresholds
    scored, results, _ = score(run.accelerator, model, run.loaders.test, run.metrics, thresholds, windowing)
    if "ece" in calibrated:  # auto kept no temperature: the error of the scores as they are
        calibrated["ece"]["test"] = calibration.scale_for(run.objective.problem_type).error(
            scored.scores, scored.labels
        )
    if "ece_after" in calibrated:
        scale = calibration.scale_for(run.objective.problem_type)
        undone = [1 / t for t in calibration.Scale.temperatures(calibrated)]  # the logits are the calibrated ones
        calibrated["ece_before"]["test"] = scale.error(scale.probabilities(scored.logits, undone), scored.labels)
        calibrated["ece_after"]["test"] = scale.error(scale.probabilities(scored.logits), scored.labels)
    logger.info("Test (best model, step %s): %s", run.progress.best_step, format_metrics(results))
    return results, calibrated, found


def warn_one_sided(run: Run, validation, thresholds) -> dict[str, list[str]]:
    """A best model that predicts a label for every validation text, or for none of those that have it, learned the
    label frequencies rather than the texts: said once, with what to try; the labels (metrics.json)."""
    labels = replace(run.metrics.task, thresholds=tuple(thresholds)) if thresholds else run.metrics.task
    found = one_sided(labels.kind, labels.decisions(validation.scores), validation.labels, run.splits.label_names)
    if found:
        said = "; ".join(f"{which}: {', '.join(names[:8])}" for which, names in found.items())
        logger.warning(
            "The best model predicts some labels for every validation text or for none (%s): it may have learned only "
            "how frequent they are. Try --class_weights balanced, more epochs (--num_train_epochs) or a lower "
            "--learning_rate",
            said,
        )
    return found


def calibrate(run: Run, validation) -> dict:
    """--calibration on the best model (put back, scored on `validation` by every rank: each fits the same): with
    `temperature` the temperatures are fitted and folded into the output layer; with `auto` only where they help
    held-out texts (training/calibration.py). Multi-label thresholds move with them and the model is saved again;
    config.json says what was applied. A best model an earlier run of this folder already calibrated (a finished run
    resumed from one of its states, no better model since) is kept as it is. What was applied and measured."""
    unwrapped = run.accelerator.unwrap_model(run.model, keep_torch_compile=False)
    if run.cfg.calibration == calibration.NONE:
        setattr(unwrapped.config, calibration.CONFIG_FIELD, {"method": calibration.NONE})
        return {"method": calibration.NONE}
    scale, labels = calibration.scale_for(run.objective.problem_type), validation.labels
    kept, logits, measured = run.out.saved_calibration(), validation.logits, None
    if kept.get("method") == calibration.TEMPERATURE:
        temperatures = calibration.Scale.temperatures(kept)
        logits = logits.double() * torch.tensor(temperatures, dtype=torch.float64)  # as before calibration
        said = calibration.rounded(temperatures)
        logger.info("Calibration: kept, as an earlier run of this folder applied it (T %s)", said)
    else:
        temperatures = scale.fit(logits, labels)
        if run.cfg.calibration == calibration.AUTO:
            measured = calibration.held_out(scale, logits, labels, run.cfg.seed)
            if not calibration.helps(measured):
                ece = {"validation": scale.error(scale.probabilities(logits), labels)}
                return {**calibration.not_applied(unwrapped, temperatures, measured), "ece": ece}
        layer = calibration.output_layer(unwrapped, len(run.splits.label_names))
        edit_weights(run.accelerator, run.model, lambda w: calibration.fold_temperature(w, layer, temperatures))
        said = calibration.rounded(temperatures), calibration.held_out_figures(measured)
        logger.info("Calibration: temperature %s fitted on validation, folded in%s", *said)
    applied = scale.record(temperatures)
    setattr(unwrapped.config, calibration.CONFIG_FIELD, applied)
    thresholds = (run.progress.best_validation or {}).get("thresholds")
    if thresholds:  # multi-label: the same decisions from the calibrated scores
        applied = {**applied, "thresholds": calibration.moved_thresholds(thresholds, temperatures)}
        setattr(unwrapped.config, task.THRESHOLDS, applied["thresholds"])
    if kept.get("method") != calibration.TEMPERATURE:
        run.out.save_model(run.model, run.tokenizer, run.cfg.export_hf_format)
    return {
        **applied,
        "clamped": calibration.say_clamped(temperatures),
        "held_out": measured,
        "bins": calibration.BINS,
        "ece_before": {"validation": scale.error(scale.probabilities(logits), labels)},
        "ece_after": {"validation": scale.error(scale.probabilities(logits, temperatures), labels)},
    }


def tracker_config(cfg: TrainConfig) -> dict:
    """Trackers (TensorBoard hparams) accept only scalars."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in cfg.to_dict().items()}


def main(cfg: TrainConfig, accelerator: Accelerator) -> dict | None:
    """The whole run; returns the metrics summary, or None when preempted (state saved, resume later)."""
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
    # writable, ours alone, and not another run's, before data or model load
    claim = claim_output_dir(cfg.output_dir, accelerator, resuming, cfg.overwrite_output_dir)
    try:
        return train_and_report(cfg, accelerator, set_up(cfg, accelerator, claim.run_id), started)
    finally:
        claim.release()


def train_and_report(cfg: TrainConfig, accelerator: Accelerator, run: Run, started: float) -> dict | None:
    """Fit, then score the best model on the test split and write the final reports (and push)."""
    cfg = run.cfg  # as set_up decided it: the metric that picks the best model and its direction
    if accelerator.log_with:
        accelerator.init_trackers("distilbert_agnews", config=tracker_config(cfg))

    if fit(run):
        return None  # preempted: the resumable state is saved; the test split waits for the finished run
    if run.progress.best_step is None:  # every evaluation was NaN or infinite: nothing was saved as best
        raise TrainingDiverged(f"Training ended without a model to keep. {on_disk(run)}")
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
    summary["one_sided_labels"] = found  # labels the best model predicts for every validation text or for none
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
