"""Fine-tune a text classifier (DistilBERT on AG News by default) with a plain PyTorch loop and Accelerate.

    accelerate launch training/train.py --preset smoke

set_up builds the run; loop.fit trains it; finish scores, calibrates and reports it.
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

import json
import signal
import time
from datetime import timedelta

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
from training import launch
from training.cli import run_command, setup_logging, usage_error
from training.config import TrainConfig
from training.config_parsing import load_config
from training.finish import finish
from training.guards import check_strategy, check_world_size
from training.loop import fit, on_disk
from training.output.claim import claim_output_dir
from training.push import check_can_push
from training.run import Outcome, Result, Run, Search, run_summary
from training.set_up import set_up
from training.speed import capture

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


def tracker_config(cfg: TrainConfig) -> dict:
    """Trackers (TensorBoard hparams) accept only scalars."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in cfg.to_dict().items()}


def main(cfg: TrainConfig, accelerator: Accelerator, search: Search | None = None) -> Result:
    """The whole run: finished with its summary, preempted, or pruned by `search` (a trial of agnews tune)."""
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
        if claim.done and cfg.resume_from_checkpoint == "latest":  # a job requeued after it finished
            return Result(Outcome.FINISHED, nothing_to_resume(Path(cfg.output_dir)))
        run = set_up(cfg, accelerator, claim.run_id, claim.previous)
        run.search = search
        return train_and_report(run, started)
    finally:
        claim.release()


def nothing_to_resume(root: Path) -> dict:
    """A finished run's metrics.json, said in one line."""
    summary = json.loads((root / files.METRICS).read_text(encoding="utf-8"))
    logger.info(
        "Nothing to resume: %s holds a finished run (best step %s) and no resumable state. Start a new run there "
        "without --resume_from_checkpoint, or fine-tune its model further: --model_name_or_path %s",
        root,
        summary.get("best_step"),
        root,
    )
    return summary


def train_and_report(run: Run, started: float) -> Result:
    """Fit, then test the best model and write the reports."""
    if run.accelerator.log_with:
        run.accelerator.init_trackers("distilbert_agnews", config=tracker_config(run.cfg))
    if fit(run) is Outcome.PREEMPTED:
        return Result(Outcome.PREEMPTED)  # the state is saved
    if run.pruned_at is not None:  # a trial that lost: not worth calibrating or testing
        return Result(Outcome.PRUNED, run_summary(run))
    if run.progress.best_step is None:  # every evaluation was non-finite
        raise UserError(f"Training ended without a model to keep. {on_disk(run)}")
    return Result(Outcome.FINISHED, finish(run, started))


def cli(argv: list[str] | None = None) -> int:
    setup_logging()
    try:
        cfg = load_config(argv)
        setup_logging(cfg.verbose)
        accelerator = make_accelerator(cfg)
    except UsageError as exc:
        return usage_error("train.py", exc)
    finished = lambda: main(cfg, accelerator).outcome is Outcome.FINISHED  # noqa: E731
    return run_command(lambda: 0 if finished() else PREEMPTED_EXIT_CODE, accelerator)


if __name__ == "__main__":
    sys.exit(cli())
