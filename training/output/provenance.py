"""What a run's result depends on, recorded in every resumable state and compared when a run resumes.

The data (each file's SHA-256, or the Hub dataset's fingerprint), the starting model and tokenizer, the label
mapping and every setting but those in MAY_CHANGE. train.py records them at start; OutputDir.resume refuses a state
whose record differs, naming what changed, unless --allow_inexact_resume (a warning; metrics.json keeps both).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from contract.files import file_sha256
from training.collective import decided_on_main
from training.config import TrainConfig
from training.data.reading import Splits

MAY_CHANGE = (  # settings a resumed run may change: where it writes and reports, how it reads, when it checks
    "output_dir",
    "export_hf_format",
    "export_runtime",
    "checkpointing_steps",
    "save_total_limit",
    "resume_from_checkpoint",
    "overwrite_output_dir",
    "verbose",
    "allow_inexact_resume",
    "push_to_hub",
    "hub_model_id",
    "hub_private_repo",
    "preset",  # expands into the other settings, which are compared
    "logging_steps",
    "report_to",
    "stop_check_steps",
    "max_nonfinite_steps",
    "ddp_timeout",
    "find_unused_parameters",
    "trust_remote_code",
    "preprocessing_num_workers",
    "dataloader_num_workers",
    "per_device_eval_batch_size",
    "extra_metrics",
)
RECORDED_APART = (  # compared through what they decide: the data's bytes, the labels, the effective values
    "dataset_name",
    "train_file",
    "validation_file",
    "test_file",
    "test_split_name",
    "label_names",
    "learning_rate",  # as scaled (--scale_lr): `learning_rate` in the record
    "scale_lr",
    "num_train_epochs",  # as the schedule's length: `optimizer_steps`
    "max_train_steps",
    "mixed_precision",  # as the accelerator resolved it
)


def result_settings(config_type: type = TrainConfig) -> tuple[str, ...]:
    """Every setting of the configuration but those that may change or are recorded apart: a new flag is compared
    at resume unless it is added to MAY_CHANGE."""
    return tuple(name for name in config_type.model_fields if name not in MAY_CHANGE and name not in RECORDED_APART)


RESULT_SETTINGS = result_settings()
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


def layout(cfg: TrainConfig, accelerator: Accelerator) -> dict:
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
