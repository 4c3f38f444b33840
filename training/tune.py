"""`agnews tune`: a hyper-parameter search over training runs with optuna, one trial after another, each on every
process of the launch (`accelerate launch -m training.tune` runs each trial with DDP; the main process holds the study).

Each trial is a whole run of train.main in --output_dir/trials/trial_N, pruned (optuna's median rule) on the
validation metric of each evaluation; the first trial is the settings as given, so the best is never worse than
them. The study lives in --output_dir/tune.db (SQLite), so a stopped search resumes where it stopped;
--output_dir/tune.json holds every trial and the best, with the command that trains it. Only the best trial's
folder is kept. The search space: the defaults below, or a YAML file (--search_space).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import shlex
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from contract.errors import UsageError, UserError
from training.config import ConfigError, TrainConfig
from training.config_parsing import load_config

logger = logging.getLogger(__name__)
STUDY = "agnews-tune"
TUNE_FLAGS = ("--n_trials", "--timeout", "--search_space", "--tune_seed")
# name: (kind, low or choices, high, log): the Trainer's default optuna space, with the settings ours has beside it
DEFAULT_SPACE: dict[str, dict[str, Any]] = {
    "learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
    "num_train_epochs": {"type": "int", "low": 1, "high": 5},
    "warmup_ratio": {"type": "float", "low": 0.0, "high": 0.2},
    "weight_decay": {"type": "float", "low": 0.0, "high": 0.1},
    "per_device_train_batch_size": {"type": "categorical", "choices": [8, 16, 32, 64]},
}
CLASSIFICATION_SPACE = {"class_weights": {"type": "categorical", "choices": ["none", "balanced"]}}
LORA_SPACE = {"lora_r": {"type": "categorical", "choices": [4, 8, 16, 32]}}


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
    return parser


def parse(argv: list[str]) -> tuple[argparse.Namespace, TrainConfig]:
    """The search's own flags, and the training settings of its first trial."""
    ours, rest = build_parser().parse_known_args(argv)
    ours.argv = argv
    if ours.n_trials < 1:
        raise ConfigError("n_trials: must be at least 1")
    return ours, load_config(rest)


def search_space(cfg: TrainConfig, path: Path | None) -> dict[str, dict[str, Any]]:
    """The YAML file's space, else the defaults for this run (class weights for classification, LoRA's rank)."""
    if path is not None:
        try:
            space = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"search_space: {path} cannot be read as YAML ({exc})") from None
    else:
        space = {**DEFAULT_SPACE, **(LORA_SPACE if cfg.lora_r else {})}
        if not (cfg.do_regression or cfg.problem_type or cfg.preset == "smoke-regression"):  # no classes
            space.update(CLASSIFICATION_SPACE)
    unknown = [name for name in space or {} if name not in TrainConfig.model_fields]
    if not isinstance(space, dict) or not space or unknown:
        raise ConfigError(f"search_space: {path}: a mapping of training settings, got {unknown or space!r:.80}")
    return {name: holding(spec, getattr(cfg, name)) for name, spec in space.items()}


def holding(spec: dict[str, Any], given: Any) -> dict[str, Any]:
    """`spec` widened to hold the given setting: the first trial runs the settings as given."""
    if spec.get("type") == "categorical" and given not in spec["choices"]:
        return {**spec, "choices": [given, *spec["choices"]]}
    numeric = spec.get("type") in ("float", "int") and isinstance(given, int | float) and not isinstance(given, bool)
    if numeric and (given > 0 or not spec.get("log")):  # a log scale cannot hold 0
        return {**spec, "low": min(spec["low"], given), "high": max(spec["high"], given)}
    return spec


def suggest(trial, space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One value per setting, as optuna's trial suggests it."""
    params = {}
    for name, spec in space.items():
        kind = spec.get("type")
        if kind == "categorical":
            params[name] = trial.suggest_categorical(name, spec["choices"])
        elif kind in ("float", "int"):
            suggest_number = trial.suggest_float if kind == "float" else trial.suggest_int
            params[name] = suggest_number(name, spec["low"], spec["high"], log=bool(spec.get("log")))
        else:
            raise ConfigError(f"search_space: {name}: type must be float, int or categorical, got {kind!r}")
    return params


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
    if study is None:
        return {}
    summary = report(study, cfg, args.argv)
    (Path(cfg.output_dir) / "tune.json").write_text(json.dumps(summary, indent=2))
    keep_only_best(Path(cfg.output_dir), summary)
    return summary


class Clock:
    """The search's elapsed time, and what is left: the trials to go at this invocation's mean, within --timeout."""

    def __init__(self, n_trials: int, timeout: float | None):
        self.started, self.n_trials, self.timeout = time.monotonic(), n_trials, timeout
        self.durations: list[float] = []
        self.finished = 0  # trials of the study, resumed ones included

    def took(self, seconds: float) -> None:
        self.durations.append(seconds)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self) -> str:
        mean = sum(self.durations) / len(self.durations)
        left = max(self.n_trials - self.finished, 0) * mean
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


def open_study(args: argparse.Namespace, cfg: TrainConfig, space: dict):
    """The study in --output_dir/tune.db, created or resumed; the settings as given queued first."""
    import optuna

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        study_name=STUDY,
        storage=f"sqlite:///{out / 'tune.db'}",
        load_if_exists=True,
        direction="maximize",  # every value is signed so that greater is better (see trial_value)
        sampler=optuna.samplers.TPESampler(seed=args.tune_seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2),
    )
    if not study.trials:  # the best is never worse than the settings as given
        study.enqueue_trial({name: getattr(cfg, name) for name in space}, skip_if_exists=True)
    return study


def next_trial(study, args: argparse.Namespace, clock: Clock):
    """optuna's next trial, or None once --n_trials have finished or --timeout has passed."""
    clock.finished = len([t for t in study.trials if t.state.is_finished()])
    late = args.timeout is not None and clock.elapsed() > args.timeout
    return None if clock.finished >= args.n_trials or late else study.ask()


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
    from training.scoring.metrics import greater_is_better

    number = shared(accelerator, trial.number if trial is not None else None)
    folder = Path(cfg.output_dir) / "trials" / f"trial_{number}"
    settings = {**cfg.to_dict(), **params, "output_dir": str(folder), "overwrite_output_dir": True}
    trial_cfg = TrainConfig.model_validate({k: v for k, v in settings.items() if k in TrainConfig.model_fields})

    def value_of(results: dict, metric: str) -> float:
        return signed(results.get(metric), greater_is_better(metric, trial_cfg.greater_is_better))

    def prune(step: int, results: dict) -> bool:
        if trial is not None:
            trial.report(value_of(results, trial_cfg.metric_for_best_model or next(iter(results))), step)
        return shared(accelerator, trial.should_prune() if trial is not None else None)

    with quiet(cfg.verbose):
        ended = train.main(trial_cfg, accelerator, Search(f"Trial {number + 1}/{n_trials}", prune))
    accelerator.free_memory()  # the trial's model and optimizer leave with it
    if ended.outcome is Outcome.PREEMPTED:
        raise UserError("the search was preempted; run the same command again to resume it")
    if trial is None:
        return None
    metric = ended.summary["metric_for_best_model"]  # as the run resolved it
    value = value_of(ended.summary["validation"] or {}, metric)
    return f"Trial {number + 1}/{n_trials}: " + tell(study, trial, ended, metric, value, params)


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


def signed(value, greater: bool) -> float:
    return float("-inf") if value is None else (float(value) if greater else -float(value))


def report(study, cfg: TrainConfig, argv: list[str]) -> dict:
    """tune.json: every trial, the best, and the command that trains it."""
    trials = [
        {
            "number": t.number,
            "state": t.state.name.lower(),
            "params": t.params,
            "metric": t.user_attrs.get("metric"),
            "value": t.user_attrs.get("value"),
            "best_step": t.user_attrs.get("best_step"),
            "test": t.user_attrs.get("test"),  # a pruned trial is not tested
        }
        for t in study.trials
    ]
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    if not done:
        raise UserError(f"no trial finished; see the logs of {Path(cfg.output_dir) / 'trials'}")
    best = study.best_trial
    dropped = (*TUNE_FLAGS, "--output_dir", *(f"--{name}" for name in best.params))  # the best's own values follow
    command = ["agnews", "train", *without(argv, dropped), *(f"--{k}={v}" for k, v in best.params.items())]
    command += ["--output_dir", str(Path(cfg.output_dir) / "best")]
    return {
        "trials": trials,
        "best": {
            "number": best.number,
            "params": best.params,
            "metric": best.user_attrs["metric"],
            "value": best.user_attrs["value"],
            "best_step": best.user_attrs["best_step"],
            "folder": str(Path(cfg.output_dir) / "trials" / f"trial_{best.number}"),
        },
        "command": shlex.join(command),
    }


def without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """`argv` less these flags and their values."""
    kept, skip = [], False
    for token in argv:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in flags:
            skip = "=" not in token
        else:
            kept.append(token)
    return kept


def keep_only_best(out: Path, summary: dict) -> None:
    """The other trials' folders removed: a model each is more than a search keeps."""
    best = Path(summary["best"]["folder"]).name
    for folder in sorted((out / "trials").glob("trial_*")):
        if folder.name != best:
            shutil.rmtree(folder, ignore_errors=True)


def cli(argv: list[str] | None = None) -> int:
    from training.cli import run_command, setup_logging, usage_error  # here: --help comes before torch

    setup_logging()
    try:
        args, cfg = parse(sys.argv[1:] if argv is None else argv)
        if importlib.util.find_spec("optuna") is None:
            raise ConfigError("tune needs optuna: pip install 'distilbert-agnews[tune]'")
    except UsageError as exc:
        return usage_error("agnews tune", exc)

    from training.train import make_accelerator

    accelerator = make_accelerator(cfg)  # through run_command: the trials' CPU threads chosen as train's are

    def work() -> None:
        summary = tune(args, cfg, accelerator)
        if summary:  # the main process
            logger.info("%s", closing_line(summary, cfg))

    return run_command(work, accelerator)


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
