"""The study of `agnews tune` in --output_dir/tune.db and what a trial tells it: each trial's run settings, its
evaluations as the study's values, how it ended, and the line that says so. Called by training/tune.py (one trial
after another) and search/ray_trials.py (side by side).
"""

from __future__ import annotations

import argparse
import logging
import time
from contextlib import contextmanager
from pathlib import Path

from training.config import TrainConfig

logger = logging.getLogger("training.tune")  # the search's lines, as the command's

STUDY = "agnews-tune"
PREEMPTED = "the search was preempted; run the same command again to resume it"


def open_study(args: argparse.Namespace, cfg: TrainConfig, space: dict):
    """The study in --output_dir/tune.db, created or resumed; the settings as given queued first."""
    import optuna

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        study_name=STUDY,
        storage=f"sqlite:///{out / 'tune.db'}",
        load_if_exists=True,
        direction="maximize",  # every value is signed so that greater is better (see signed)
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2),
    )
    # seeded past the trials already there: a resumed search draws new settings, not its first trials' again; side by
    # side (--ray), the sampler counts running trials as done badly, so trials started together differ
    study.sampler = optuna.samplers.TPESampler(seed=args.tune_seed + len(study.trials), constant_liar=args.ray)
    if not study.trials:  # the best is never worse than the settings as given
        study.enqueue_trial({name: getattr(cfg, name) for name in space}, skip_if_exists=True)
    return study


def stored_study(cfg: TrainConfig):
    """The study of --output_dir/tune.db, as its trials left it."""
    import optuna

    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{Path(cfg.output_dir) / 'tune.db'}")


def trial_config(cfg: TrainConfig, params: dict, number: int) -> TrainConfig:
    """The run of trial `number`: the settings as given, the trial's values, its own folder."""
    folder = Path(cfg.output_dir) / "trials" / f"trial_{number}"
    settings = {**cfg.to_dict(), **params, "output_dir": str(folder), "overwrite_output_dir": True}
    return TrainConfig.model_validate({k: v for k, v in settings.items() if k in TrainConfig.model_fields})


def trial_name(number: int, n_trials: int) -> str:
    """'Trial 3/20': a trial's progress bar and its line."""
    return f"Trial {number + 1}/{n_trials}"


def validation_value(trial_cfg: TrainConfig, results: dict, metric: str | None = None) -> float:
    """An evaluation's metric for the study, signed so that greater is better."""
    from training.scoring.metrics import greater_is_better

    metric = metric or trial_cfg.metric_for_best_model or next(iter(results))
    return signed(results.get(metric), greater_is_better(metric, trial_cfg.greater_is_better))


def signed(value, greater: bool) -> float:
    return float("-inf") if value is None else (float(value) if greater else -float(value))


def told(study, trial, ended, trial_cfg: TrainConfig, params: dict, n_trials: int) -> str:
    """The study told how the trial's run ended (its best validation metric); the trial's line."""
    metric = ended.summary["metric_for_best_model"]  # as the run resolved it
    value = validation_value(trial_cfg, ended.summary["validation"] or {}, metric)
    return f"{trial_name(trial.number, n_trials)}: " + tell(study, trial, ended, metric, value, params)


def tell(study, trial, ended, metric: str, value: float, params: dict) -> str:
    """The study told how the trial ended; what the trial's line says of it."""
    from optuna.trial import TrialState

    from training.run import Outcome

    summary = ended.summary
    found = (summary["validation"] or {}).get(metric)
    attributes = {"metric": metric, "best_step": summary["best_step"], "value": found, "test": summary["test"]}
    for key, kept in attributes.items():
        trial.set_user_attr(key, kept)
    was_best = ended.outcome is Outcome.FINISHED and not any(
        t.state is TrialState.COMPLETE and t.value is not None and t.value >= value for t in study.trials
    )
    pruned = ended.outcome is Outcome.PRUNED
    study.tell(trial, state=TrialState.PRUNED) if pruned else study.tell(trial, value)
    shown = f"{metric} {found:.4f}" if isinstance(found, float) else f"no finite {metric}"
    how = (
        f"pruned at step {summary['global_step']} (best {shown})"
        if pruned
        else f"{shown} at step {summary['best_step']}"
    )
    settings = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
    return f"{how}{' (best so far)' if was_best else ''} with {settings}"


@contextmanager
def quiet(verbose: bool):
    """A trial's training lines held back (warnings still shown): each trial ends in one line of the search's."""
    if verbose:
        yield
        return
    trained, ours = logging.getLogger("training"), logger.level
    before = trained.level
    trained.setLevel(logging.WARNING)
    logger.setLevel(logging.INFO)  # ours, as training.tune or __main__
    try:
        yield
    finally:
        trained.setLevel(before)
        logger.setLevel(ours)


class Clock:
    """The search's elapsed time, and what is left: the trials to go at this invocation's mean (`parallel` at a
    time), within --timeout."""

    def __init__(self, n_trials: int, timeout: float | None, parallel: int = 1):
        self.started, self.n_trials, self.timeout, self.parallel = time.monotonic(), n_trials, timeout, parallel
        self.durations: list[float] = []
        self.finished = 0  # trials of the study, resumed ones included

    def took(self, seconds: float) -> None:
        self.durations.append(seconds)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def late(self) -> bool:
        """--timeout has passed: no trial starts any more."""
        return self.timeout is not None and self.elapsed() > self.timeout

    def say(self) -> str:
        mean = sum(self.durations) / len(self.durations)
        left = -(-max(self.n_trials - self.finished, 0) // self.parallel) * mean  # rounds of `parallel` trials
        if self.timeout is not None:
            left = min(left, max(self.timeout - self.elapsed(), 0.0) + mean)  # a started trial runs to its end
        return f"elapsed {duration(self.elapsed())}, " + (f"about {duration(left)} left" if left else "none left")


def duration(seconds: float) -> str:
    """'42 s', '3 min 5 s', '2 h 10 min'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
