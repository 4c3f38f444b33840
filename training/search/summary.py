"""What a finished `agnews tune` leaves: tune.json (every trial, the best, the command that trains it) and only the
best trial's folder. Called by training/tune.py and search/ray_trials.py.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from contract.errors import UserError
from training.config import TrainConfig

# the search's own flags: none of them is in the command that trains the best trial again
RAY_FLAGS = ("--max_concurrent_trials", "--trial_cpus", "--trial_gpus")  # with --ray only
TUNE_FLAGS = ("--n_trials", "--timeout", "--search_space", "--tune_seed", "--ray_address", *RAY_FLAGS)
SWITCHES = ("--ray",)  # those that take no value


def finish_search(study, cfg: TrainConfig, argv: list[str]) -> dict:
    """tune.json written, only the best trial's folder kept; tune.json's content."""
    summary = report(study, cfg, argv)
    (Path(cfg.output_dir) / "tune.json").write_text(json.dumps(summary, indent=2))
    keep_only_best(Path(cfg.output_dir), summary)
    return summary


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
    kept = without([token for token in argv if token not in SWITCHES], dropped)
    command = ["agnews", "train", *kept, *(f"--{k}={v}" for k, v in best.params.items())]
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
