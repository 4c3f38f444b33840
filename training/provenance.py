"""What a run's result depends on, recorded in every resumable state and compared when a run resumes.

A state continues exactly only the run that saved it: the same data (each file's size and SHA-256, or the Hub
dataset's name and fingerprint), the same starting model and tokenizer, the same label mapping, and the settings that
change the result (RESULT_SETTINGS, plus the effective learning rate, the schedule's length in optimizer steps and the
precision). train.py records them once at start (the main process hashes the files, every rank gets its record);
checkpoint.OutputDir.resume refuses a state whose record differs, naming what changed, unless
--allow_inexact_resume (then a warning, and metrics.json keeps both values of every change).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from inference.loading import file_sha256
from training.collective import decided_on_main
from training.config import TrainConfig
from training.data import Splits

RESULT_SETTINGS = (
    "model_name_or_path",
    "tokenizer_name",
    "from_scratch",
    "dropout",
    "text_column_names",
    "text_column_delimiter",
    "text_pair_column",
    "label_column",
    "label_delimiter",
    "do_regression",
    "remove_columns",
    "shuffle_train_dataset",
    "dataset_config_name",
    "train_split_name",
    "validation_split_name",
    "model_revision",
    "ignore_mismatched_sizes",
    "validation_split",
    "num_samples",
    "max_length",
    "weight_decay",
    "warmup_ratio",
    "lr_scheduler_type",
    "max_grad_norm",
    "class_weights",
    "label_smoothing_factor",
    "metric_for_best_model",
    "greater_is_better",
    "threshold_strategy",
    "long_text",
    "chunk_stride",
    "chunk_pooling",
)
_WHERE = "file"  # where a file was read: informative, not compared (the same bytes may move)


def record(cfg: TrainConfig, splits: Splits, accelerator: Accelerator, learning_rate: float, total_steps: int) -> dict:
    """This run's record, identical on every rank (the main process reads the data files, once)."""

    def make() -> dict:
        settings = {name: getattr(cfg, name) for name in RESULT_SETTINGS}
        settings.update(
            learning_rate=learning_rate, optimizer_steps=total_steps, mixed_precision=accelerator.mixed_precision
        )
        made = {
            "data": {split: _describe(source) for split, source in splits.sources.items()},
            "labels": {
                "problem_type": splits.labels.problem_type,
                "names": splits.label_names,
                "values": splits.labels.values,
            },
            "settings": settings,
        }
        return json.loads(json.dumps(made, default=str))  # as progress.json will hold it

    return decided_on_main(accelerator, make)


def _describe(source: dict) -> dict:
    if _WHERE not in source:
        return source  # a Hub split: its dataset name and fingerprint
    path = Path(source[_WHERE])
    return {_WHERE: str(path), "bytes": path.stat().st_size, "sha256": file_sha256(path)}


def changes(saved: dict, current: dict) -> dict[str, dict[str, Any]]:
    """{"settings.max_length": {"saved": 128, "now": 64}, ...} for every value that differs; {} for a state saved
    before runs recorded this; settings recorded only since the state was saved are left out."""
    if not saved:
        return {}
    before, after = _flat(saved), _flat(current)
    return {
        key: {"saved": before.get(key), "now": after.get(key)}
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key) and not key.endswith(f".{_WHERE}") and not _added_since(key, before)
    }


def _added_since(key: str, before: dict) -> bool:
    """A setting (or the problem type) this version records and the saved state's version did not: not compared."""
    return key not in before and (key.startswith("settings.") or key == "labels.problem_type")


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def describe(changed: dict[str, dict[str, Any]]) -> str:
    """`settings.max_length 128 -> 64, data.train.sha256 3f2a9c0b1d2e -> 77aa01c3e9f0`, long values shortened."""
    return ", ".join(f"{key} {_short(v['saved'])} -> {_short(v['now'])}" for key, v in changed.items())


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:12] if isinstance(value, str) and len(text) == 64 else (text if len(text) <= 40 else text[:37] + "...")
