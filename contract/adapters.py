"""Serve a peft adapter folder: its base model loaded, the adapters and head applied and merged once at load.

    adapter folder   adapter_config.json (base_model_name_or_path) + adapter_model.safetensors; with a LoRA run of
                     ours (its adapter/ folder) also config.json (labels, task) and the tokenizer files

After the merge the service holds an ordinary classifier: the runtimes, the int8 guard and every route treat it as
any other. peft is needed only here (`pip install 'distilbert-agnews[peft]'`).
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForSequenceClassification

from contract import files
from contract.errors import CheckpointError
from contract.files import file_sha256
from contract.quiet import quiet

logger = logging.getLogger(__name__)

HEAD_OUTPUTS = (".classifier.weight", ".score.weight", ".classifier.out_proj.weight")  # the head's last layer


def is_adapter_folder(folder: Path) -> bool:
    return (folder / files.ADAPTER_CONFIG).is_file()


def base_model_of(folder: Path) -> str:
    """adapter_config.json's base_model_name_or_path."""
    try:
        base = json.loads((folder / files.ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder / files.ADAPTER_CONFIG}: unreadable ({exc})") from None
    if not base:
        raise CheckpointError(f"{folder / files.ADAPTER_CONFIG}: names no base_model_name_or_path")
    return base


def load_adapter_model(folder: Path) -> tuple[torch.nn.Module, Path, str]:
    """(the merged classifier, the adapter weights file, its SHA-256); CheckpointError in one line when peft is
    missing, the base model cannot be found, or the adapter does not fit it."""
    try:
        from peft import PeftModel
    except ImportError:
        raise CheckpointError(
            f"{folder}: a peft adapter folder; serving it needs peft: pip install 'distilbert-agnews[peft]'"
        ) from None
    base = base_model_of(folder)
    weights = folder / files.ADAPTER_WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing (the adapter's weights, beside {files.ADAPTER_CONFIG})")
    config = _config(folder, base, weights)
    model = _body(folder, base, config)
    try:
        with warnings.catch_warnings():  # peft asks the model whether it checkpoints by transformers' old name
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            merged = PeftModel.from_pretrained(model, folder).merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(
            f"{folder}: the adapter does not fit its base model {base!r}: {' '.join(str(exc).split())[:200]}"
        ) from None
    logger.info("Serving the adapter in %s merged into %s", folder, base)
    return merged, weights, file_sha256(weights)


def _body(folder: Path, base: str, config) -> torch.nn.Module:
    """The base model as a classifier of `config`. Its head starts random, or the base's own head of another size is
    dropped: the adapter's head (modules_to_save) replaces it. Any other weight missing or of another shape means
    the adapter was trained on another base: refused."""
    head = json.loads((folder / files.ADAPTER_CONFIG).read_text()).get("modules_to_save") or []
    try:
        with quiet("transformers"):  # its load report names the head it starts fresh
            model, info = AutoModelForSequenceClassification.from_pretrained(
                base, config=config, use_safetensors=True, ignore_mismatched_sizes=True, output_loading_info=True
            )
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{folder}: its base model {base!r} (adapter_config.json base_model_name_or_path) cannot be loaded: "
            f"{' '.join(str(exc).split())[:200]}"
        ) from None
    wrong = [*info["missing_keys"], *(key for key, *_ in info["mismatched_keys"])]
    wrong = sorted(key for key in wrong if key.split(".")[0] not in head)  # transformers reports them in any order
    if wrong:
        raise CheckpointError(
            f"{folder}: the adapter does not fit its base model {base!r}: {wrong[0]} is missing from it or of "
            f"another shape than {files.CONFIG} describes"
        )
    return model


def _config(folder: Path, base: str, weights: Path):
    """The folder's config.json (labels, task: a LoRA run of ours writes it) or the base model's, with as many
    outputs as the adapter's head has."""
    source = folder if (folder / files.CONFIG).is_file() else base
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{folder}: no config.json, and its base model {base!r} has none that can be read ({exc})"
        ) from None
    outputs = _head_outputs(weights)
    if source == base and outputs and outputs != config.num_labels:
        config.num_labels = outputs  # id2label becomes LABEL_0..LABEL_n-1
    return config


def _head_outputs(weights: Path) -> int | None:
    """Rows of the adapter's trained head (its last layer), or None when the file holds no head."""
    try:
        with safe_open(str(weights), "pt") as fh:
            for key in fh.keys():
                if key.endswith(HEAD_OUTPUTS):
                    return fh.get_slice(key).get_shape()[0]
    except (OSError, SafetensorError):
        return None  # PeftModel.from_pretrained names the damage
    return None
