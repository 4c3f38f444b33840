"""The search space of `agnews tune`: the defaults for a run, or a YAML file's, widened to hold the settings as
given, and one value per setting as optuna's trial suggests it. Called by training/tune.py and search/study.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from training.config import ConfigError, TrainConfig

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
    for name, spec in space.items():  # here, before any trial starts (on Ray, in another process)
        if not isinstance(spec, dict) or spec.get("type") not in ("float", "int", "categorical"):
            raise ConfigError(f"search_space: {name}: type must be float, int or categorical, got {spec!r:.60}")
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
