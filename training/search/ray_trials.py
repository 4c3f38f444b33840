"""`agnews tune --ray`: the search's trials side by side as Ray tasks, on this machine's cores and GPUs or a Ray
cluster's. The study stays optuna's, in --output_dir/tune.db: one actor on this machine holds it, asks it for each
trial's settings and takes every trial's evaluations (the median pruner decides there). Each task is one whole
one-process run of train.main in a fresh worker. Called by training/tune.py.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tqdm.auto import tqdm

from contract.errors import UsageError, UserError
from training.config import TrainConfig
from training.run import Outcome, Result
from training.search import space as spaces
from training.search import study as studies
from training.search.summary import finish_search

logger = logging.getLogger(__name__)


class Keeper:
    """The study and this search's trials in flight, in one actor: its calls run one at a time, as SQLite wants."""

    def __init__(self, args: argparse.Namespace, cfg: TrainConfig, space: dict):
        self.study = studies.open_study(args, cfg, space)
        self.cfg, self.space, self.n_trials = cfg, space, args.n_trials
        self.trials: dict[int, Any] = {}

    def finished(self) -> int:
        return sum(t.state.is_finished() for t in self.study.trials)

    def ask(self, late: bool) -> tuple[int, dict] | None:
        """The next trial's number and settings; None once running and finished trials make --n_trials, or late."""
        if late or self.finished() + len(self.trials) >= self.n_trials:
            return None
        trial = self.study.ask()
        self.trials[trial.number] = trial
        return trial.number, spaces.suggest(trial, self.space)

    def report(self, number: int, step: int, value: float) -> bool:
        """One evaluation of a trial; whether the trial stops there."""
        trial = self.trials[number]
        trial.report(value, step)
        return trial.should_prune()

    def tell(self, number: int, params: dict, ended: Result) -> str:
        trial, trial_cfg = self.trials.pop(number), studies.trial_config(self.cfg, params, number)
        return studies.told(self.study, trial, ended, trial_cfg, params, self.n_trials)

    def fail(self, number: int, why: str) -> str:
        from optuna.trial import TrialState

        self.study.tell(self.trials.pop(number), state=TrialState.FAIL)
        return f"{studies.trial_name(number, self.n_trials)}: failed ({why})"


def run_trial(trial_cfg: TrainConfig, number: int, n_trials: int, keeper) -> Result:
    """One trial in a Ray worker: a one-process run whose evaluations the keeper judges. Ray set OMP_NUM_THREADS
    to the task's CPUs, so torch runs that many threads."""
    from training import train
    from training.run import Search

    accelerator = train.make_accelerator(trial_cfg)

    def prune(step: int, results: dict) -> bool:
        return ray.get(keeper.report.remote(number, step, studies.validation_value(trial_cfg, results)))

    try:
        with studies.quiet(trial_cfg.verbose):
            return train.main(trial_cfg, accelerator, Search(studies.trial_name(number, n_trials), prune))
    finally:
        accelerator.end_training()


def search(args: argparse.Namespace, cfg: TrainConfig) -> dict:
    """The study run to --n_trials (or --timeout) with trials side by side; tune.json's content."""
    space = spaces.search_space(cfg, args.search_space)
    ray.init(
        address=args.ray_address,
        ignore_reinit_error=True,
        log_to_driver=cfg.verbose,  # the trials' own logs; otherwise in the Ray session's log files
        include_dashboard=False,
        logging_level=logging.ERROR,
    )
    try:
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)  # tune.db's disk
        keeper = ray.remote(Keeper).options(num_cpus=0, scheduling_strategy=here).remote(args, cfg, space)
        run_trials(keeper, args, cfg)
        ray.kill(keeper)
    finally:
        ray.shutdown()  # a Ray started here stops; a cluster's keeps running
    return finish_search(studies.stored_study(cfg), cfg, args.argv)


def run_trials(keeper, args: argparse.Namespace, cfg: TrainConfig) -> None:
    """Trials started while fewer than the width run and the keeper has more; each one's line as it ends, under a
    bar of the study's finished trials."""
    gpus, width = placement(args)
    # a fresh worker per trial (max_calls=1): no model, thread pool or accelerate state carried to the next one
    task = ray.remote(num_cpus=args.trial_cpus, num_gpus=gpus, max_calls=1, max_retries=0)(run_trial)
    clock = studies.Clock(args.n_trials, args.timeout, parallel=width)
    logger.info("Trials: %d at a time, %g CPU(s) and %g GPU(s) each", width, args.trial_cpus, gpus)
    running: dict[Any, tuple[int, dict, float]] = {}  # a task's result: its trial, settings and start
    with tqdm(total=args.n_trials, initial=ray.get(keeper.finished.remote()), desc="Trials", unit="trial") as bar:
        while True:
            while len(running) < width and (asked := ray.get(keeper.ask.remote(clock.late()))) is not None:
                number, params = asked
                trial_cfg = studies.trial_config(cfg, params, number)
                running[task.remote(trial_cfg, number, args.n_trials, keeper)] = (number, params, time.monotonic())
            if not running:
                return
            bar.set_postfix_str(f"{len(running)} running")
            [done], _ = ray.wait(list(running), num_returns=1)
            number, params, started = running.pop(done)
            try:
                line = ended_line(keeper, done, number, params)
            except UserError:
                for other in running:  # the same mistake would end them too
                    ray.cancel(other, force=True)
                raise
            clock.took(time.monotonic() - started)
            clock.finished = ray.get(keeper.finished.remote())
            bar.update(clock.finished - bar.n)
            logger.info("%s; %s", line, clock.say())


def ended_line(keeper, done, number: int, params: dict) -> str:
    """The study told how a trial ended. A trial's UserError (a flag, a file) ends the search in its one line; a
    crash (out of memory, a lost node) fails that trial alone."""
    try:
        ended = ray.get(done)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        if isinstance(cause, UserError):
            raise type(cause)(f"Trial {number + 1}: {cause}") from None
        return ray.get(keeper.fail.remote(number, f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1]}"))
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.OutOfMemoryError) as exc:
        return ray.get(keeper.fail.remote(number, type(exc).__name__))
    if ended.outcome is Outcome.PREEMPTED:
        raise UserError(studies.PREEMPTED)
    return ray.get(keeper.tell.remote(number, params, ended))


def placement(args: argparse.Namespace) -> tuple[float, int]:
    """GPUs per trial (1 where the cluster has GPUs, unless given) and how many trials run at once: by default as
    many as its CPUs and GPUs hold, at most --n_trials. A trial the cluster cannot hold is refused, not left pending."""
    have = ray.cluster_resources()
    cpus, all_gpus = have.get("CPU", 0.0), have.get("GPU", 0.0)
    gpus = args.trial_gpus if args.trial_gpus is not None else (1.0 if all_gpus else 0.0)
    if args.trial_cpus > cpus or gpus > all_gpus:
        raise UsageError(
            f"--ray: a trial asks {args.trial_cpus:g} CPU(s) and {gpus:g} GPU(s); the Ray cluster has {cpus:g} and "
            f"{all_gpus:g}"
        )
    fits = min(cpus // args.trial_cpus, all_gpus // gpus if gpus else cpus)
    return gpus, int(min(args.max_concurrent_trials or fits, args.n_trials))
