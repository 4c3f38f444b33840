"""What a run's result depends on (settings, data, labels, versions), recorded in every state and compared when a run
resumes. Called by set_up.py and resume.py.
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

MAY_CHANGE = (  # where it writes, how it reads, when it checks
    "output_dir",
    "export_hf_format",
    "export_runtime",
    "checkpointing_steps",
    "save_total_limit",
    "keep_states",
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
RECORDED_APART = (  # compared through what they decide
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
    """Every setting but MAY_CHANGE and those recorded apart."""
    return tuple(name for name in config_type.model_fields if name not in MAY_CHANGE and name not in RECORDED_APART)


RESULT_SETTINGS = result_settings()
_WHERE = "file"  # informative: the same bytes may move


def record(cfg: TrainConfig, splits: Splits, accelerator: Accelerator, learning_rate: float, total_steps: int) -> dict:
    """This run's record, the same on every rank."""

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
    """{key: {"saved", "now"}} for every differing value."""
    if not saved:
        return {}
    before, after = _flat(saved), _flat(current)
    return {
        key: {"saved": before.get(key), "now": after.get(key)}
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key) and not key.endswith(f".{_WHERE}") and not _added_since(key, before)
    }


def _added_since(key: str, before: dict) -> bool:
    """Recorded only by newer versions: not compared."""
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
    """The changes in one line, long values shortened."""
    return ", ".join(f"{key} {_short(v['saved'])} -> {_short(v['now'])}" for key, v in changed.items())


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:12] if isinstance(value, str) and len(text) == 64 else (text if len(text) <= 40 else text[:37] + "...")


def layout(cfg: TrainConfig, accelerator: Accelerator) -> dict:
    """What must match to continue with exactly the next batches."""
    return {
        "num_processes": accelerator.num_processes,
        "per_device_train_batch_size": cfg.per_device_train_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "seed": cfg.seed,
        "group_by_length": cfg.group_by_length,
        "optim": cfg.optim,  # the saved optimizer state is this optimizer's
        **({"cpu_threads": torch.get_num_threads()} if accelerator.device.type == "cpu" else {}),
    }
