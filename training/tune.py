"""`agnews tune`: a hyper-parameter search over training runs with optuna, one trial after another, each on every
process of the launch (`accelerate launch -m training.tune` runs each trial with DDP; the main process holds the study),
or side by side as Ray tasks with --ray (training/search/ray_trials.py). Each trial is a whole run of train.main in
--output_dir/trials/trial_N, pruned on its evaluations (optuna's median rule); the first runs the settings as given.
The study resumes from --output_dir/tune.db; tune.json holds every trial and the best. The parts: training/search/.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path

from contract.errors import UsageError, UserError
from training.config import ConfigError, TrainConfig
from training.config_parsing import load_config
from training.search.space import search_space, suggest
from training.search.study import (
    PREEMPTED,
    Clock,
    open_study,
    quiet,
    told,
    trial_config,
    trial_name,
    validation_value,
)
from training.search.summary import RAY_FLAGS, finish_search

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The search's own flags; every other flag is `agnews train`'s, for every trial."""
    parser = argparse.ArgumentParser(
        prog="agnews tune",
        description="Search training settings with optuna: each trial a whole run (pruned on its evaluations), the "
        "first one the settings as given. Every `agnews train` flag is taken too, for every trial.",
    )
    parser.add_argument("--n_trials", type=int, default=20, help="trials in all, counting those of a resumed study")
    parser.add_argument("--timeout", type=float, help="stop starting trials after this many seconds")
    parser.add_argument(
        "--search_space", type=Path, help="YAML file: setting: {type: float|int|categorical, low, high, log, choices}"
    )
    parser.add_argument("--tune_seed", type=int, default=0, help="the sampler's seed (--seed is the runs')")
    ray = parser.add_argument_group("Ray: trials side by side, on this machine or a Ray cluster (pip install '.[ray]')")
    ray.add_argument("--ray", action="store_true", help="run trials as Ray tasks, several at once")
    ray.add_argument("--ray_address", help="a Ray cluster ('auto', 'ray://head:10001'); default: one started here")
    ray.add_argument("--max_concurrent_trials", type=int, help="default: as many as the cluster's CPUs or GPUs hold")
    ray.add_argument("--trial_cpus", type=float, default=1.0, help="CPUs per trial (its torch threads)")
    ray.add_argument("--trial_gpus", type=float, help="GPUs per trial, at most 1 (default: 1 if the cluster has GPUs)")
    return parser


def parse(argv: list[str]) -> tuple[argparse.Namespace, TrainConfig]:
    """The search's own flags, and the training settings of its first trial."""
    ours, rest = build_parser().parse_known_args(argv)
    ours.argv = argv
    if ours.n_trials < 1:
        raise ConfigError("n_trials: must be at least 1")
    given = [flag for flag in (*RAY_FLAGS, "--ray_address") if flag in (token.split("=")[0] for token in argv)]
    if given and not ours.ray:
        raise ConfigError(f"{given[0]} places trials on Ray: add --ray")
    gpus, width = ours.trial_gpus or 0, ours.max_concurrent_trials
    if ours.ray and not (ours.trial_cpus > 0 and 0 <= gpus <= 1 and (width is None or width >= 1)):
        raise ConfigError(
            "--ray: --trial_cpus above 0, --trial_gpus from 0 to 1 (each trial is one process), "
            "--max_concurrent_trials at least 1"
        )
    return ours, load_config(rest)


def tune(args: argparse.Namespace, cfg: TrainConfig, accelerator) -> dict:
    """Run the study to --n_trials (or --timeout); tune.json's content on the main process, {} on the others."""
    space = search_space(cfg, args.search_space)
    study = open_study(args, cfg, space) if accelerator.is_main_process else None
    clock = Clock(args.n_trials, args.timeout)
    while True:
        trial = next_trial(study, args, clock) if study is not None else None
        params = shared(accelerator, suggest(trial, space) if trial is not None else None)
        if params is None:
            break
        started = time.monotonic()
        said = run_trial(study, trial, params, cfg, accelerator, args.n_trials)
        clock.took(time.monotonic() - started)
        if said:
            logger.info("%s; %s", said, clock.say())
    return {} if study is None else finish_search(study, cfg, args.argv)


def next_trial(study, args: argparse.Namespace, clock: Clock):
    """optuna's next trial, or None once --n_trials have finished or --timeout has passed."""
    clock.finished = len([t for t in study.trials if t.state.is_finished()])
    return None if clock.finished >= args.n_trials or clock.late() else study.ask()


def shared(accelerator, value):
    """The main process's value on every process (trials run on all of them, the study on the main one)."""
    if accelerator.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list  # here: --help comes before torch

    return broadcast_object_list([value])[0]


def run_trial(study, trial, params: dict, cfg: TrainConfig, accelerator, n_trials: int) -> str | None:
    """One training run on every process with the trial's settings; the main process tells the study its best
    validation metric, signed (greater is better), or that it was pruned, and returns the trial's line."""
    from training import train
    from training.run import Outcome, Search

    number = shared(accelerator, trial.number if trial is not None else None)
    trial_cfg = trial_config(cfg, params, number)

    def prune(step: int, results: dict) -> bool:
        if trial is not None:
            trial.report(validation_value(trial_cfg, results), step)
        return shared(accelerator, trial.should_prune() if trial is not None else None)

    with quiet(cfg.verbose):
        ended = train.main(trial_cfg, accelerator, Search(trial_name(number, n_trials), prune))
    accelerator.free_memory()  # the trial's model and optimizer leave with it
    if ended.outcome is Outcome.PREEMPTED:
        raise UserError(PREEMPTED)
    return None if trial is None else told(study, trial, ended, trial_cfg, params, n_trials)


def cli(argv: list[str] | None = None) -> int:
    from training.cli import run_command, setup_logging, usage_error  # here: --help comes before torch

    setup_logging()
    try:
        args, cfg = parse(sys.argv[1:] if argv is None else argv)
        if importlib.util.find_spec("optuna") is None:
            raise ConfigError("tune needs optuna: pip install 'distilbert-agnews[tune]'")
        if args.ray:
            check_ray_launch()
    except UsageError as exc:
        return usage_error("agnews tune", exc)
    if args.ray:
        from training.search import ray_trials  # only with --ray: importing ray costs seconds

        return run_command(lambda: logger.info("%s", closing_line(ray_trials.search(args, cfg), cfg)))

    from training.train import make_accelerator

    accelerator = make_accelerator(cfg)  # through run_command: the trials' CPU threads chosen as train's are

    def work() -> None:
        summary = tune(args, cfg, accelerator)
        if summary:  # the main process
            logger.info("%s", closing_line(summary, cfg))

    return run_command(work, accelerator)


def check_ray_launch() -> None:
    """--ray in one process with ray installed: Ray places the trials, each a one-process run."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("tune --ray needs ray: pip install 'distilbert-agnews[ray]'")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("--ray: Ray places the trials; run it in one process, not under accelerate launch")


def closing_line(summary: dict, cfg: TrainConfig) -> str:
    """The search's last line: how its trials ended, the best, and the commands for the one folder kept."""
    from training.output.reports import next_steps

    best, states = summary["best"], [t["state"] for t in summary["trials"]]
    kept = json.loads((Path(best["folder"]) / "metrics.json").read_text())
    counts = ", ".join(f"{states.count(s)} {s}" for s in ("complete", "pruned", "fail") if states.count(s))
    folder_cfg = cfg.model_copy(update={"output_dir": best["folder"], "metric_for_best_model": best["metric"]})
    then = next_steps(folder_cfg, best["best_step"], best["value"], kept.get("test"))
    return (
        f"Best trial: {Path(best['folder']).name} of {len(states)} ({counts}; every trial in "
        f"{Path(cfg.output_dir) / 'tune.json'}): {then.removeprefix('Done: ')}  |  train it again: {summary['command']}"
    )


if __name__ == "__main__":
    sys.exit(cli())


if __name__ == "__main__":
    sys.exit(cli())
