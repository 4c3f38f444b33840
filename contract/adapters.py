"""Serve a peft adapter folder: its base model loaded, the adapters and head applied and merged once at load.

    adapter folder   adapter_config.json (base_model_name_or_path) + adapter_model.safetensors; with a LoRA run of
                     ours (its adapter/ folder) also config.json (labels, problem type) and the tokenizer files

After the merge the service holds an ordinary classifier: the runtimes, the int8 guard and every route treat it as
any other. peft is needed only here (`pip install 'distilbert-agnews[peft]'`).
"""

from __future__ import annotations

import hashlib
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
from contract.quiet import quiet_transformers

logger = logging.getLogger(__name__)

HEAD_OUTPUTS = (".classifier.weight", ".score.weight", ".classifier.out_proj.weight")  # the head's last layer


def is_adapter_folder(folder: Path) -> bool:
    return (folder / files.ADAPTER_CONFIG).is_file()


def base_model_of(folder: Path) -> str:
    """Where the adapter's base is: adapter/base/ when training saved it there, else adapter_config.json's
    base_model_name_or_path."""
    base = _adapter_config(folder).get("base_model_name_or_path")
    if not base or not isinstance(base, str):
        raise CheckpointError(f"{folder / files.ADAPTER_CONFIG}: base_model_name_or_path must name the base model")
    if (folder / files.ADAPTER_BASE_DIR / files.CONFIG).is_file():
        return str(folder / files.ADAPTER_BASE_DIR)
    if base.startswith(("/", "./", "../", "~")) and not Path(base).expanduser().is_dir():  # a path, not a Hub id
        raise CheckpointError(
            f"{folder}: its base model folder {base} (adapter_config.json base_model_name_or_path) is not there; "
            "copy the base there or edit that field (the base's weights are checked, not its path)"
        )
    return base


def _adapter_config(folder: Path) -> dict:
    try:
        config = json.loads((folder / files.ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder / files.ADAPTER_CONFIG}: unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{folder / files.ADAPTER_CONFIG}: not a JSON object")
    return config


# adapter_config.json's fields that say where the base is: free to edit (moving the base), since its weights are
# checked against the recorded hash instead
WHERE_THE_BASE_IS = ("base_model_name_or_path", "revision")


def adapter_config_sha256(config: dict) -> str:
    """sha256 of adapter_config.json's settings (rank, alpha, target modules, head, ...), where the base is left out."""
    kept = {k: v for k, v in config.items() if k not in WHERE_THE_BASE_IS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def adapter_digests(folder: Path) -> dict[str, str]:
    """What adapter/config.json records of peft's two files (files.ADAPTER_SHA256)."""
    return {
        files.ADAPTER_WEIGHTS: file_sha256(folder / files.ADAPTER_WEIGHTS),
        files.ADAPTER_CONFIG: adapter_config_sha256(_adapter_config(folder)),
    }


def base_sha256(model: torch.nn.Module, head: list[str]) -> str:
    """The base's identity: its weights outside the head (which the adapter brings), as float32, whatever the dtype
    they were loaded in."""
    tensors = {k: v.float() for k, v in model.state_dict().items() if k.split(".")[0] not in head}
    return files.tensors_sha256(tensors)


def load_adapter_model(folder: Path) -> tuple[torch.nn.Module, Path, str]:
    """(the merged classifier, the adapter weights file, its SHA-256); CheckpointError in one line when peft is
    missing, the adapter files are not those training wrote, the base model cannot be found or is not the one the
    adapters were trained on, or the adapter does not fit it."""
    try:
        from peft import PeftModel
    except ImportError:
        raise CheckpointError(
            f"{folder}: a peft adapter folder; serving it needs peft: pip install 'distilbert-agnews[peft]'"
        ) from None
    weights = folder / files.ADAPTER_WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing (the adapter's weights, beside {files.ADAPTER_CONFIG})")
    recorded = _check_recorded(folder)
    try:
        with safe_open(str(weights), "pt") as fh:
            fh.keys()
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"{weights}: not a readable safetensors file (truncated or damaged: {exc})") from None
    base = base_model_of(folder)
    config = _config(folder, base, weights)
    head = [m for m in _adapter_config(folder).get("modules_to_save") or [] if isinstance(m, str)]
    model = _body(folder, base, config, head, _revision(folder, base, recorded))
    if recorded.get("sha256") and base_sha256(model, head) != recorded["sha256"]:
        raise CheckpointError(
            f"{folder}: its base model {base!r} is not the one the adapter was trained on (its weights' sha256 differs "
            f"from {files.CONFIG} {files.ADAPTER_BASE}); point base_model_name_or_path at that base"
        )
    try:
        with warnings.catch_warnings():  # peft asks the model whether it checkpoints by transformers' old name
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            warnings.filterwarnings("ignore", message="Found missing adapter keys")  # checked below, as an error
            adapted = PeftModel.from_pretrained(model, folder)
    except (RuntimeError, ValueError, KeyError, SafetensorError) as exc:
        raise CheckpointError(
            f"{folder}: the adapter does not fit its base model {base!r}: {' '.join(str(exc).split())[:200]}"
        ) from None
    _check_keys(folder, adapted, weights)
    logger.info("Serving the adapter in %s merged into %s", folder, base)
    return adapted.merge_and_unload(), weights, file_sha256(weights)


def _check_recorded(folder: Path) -> dict:
    """The adapter files checked against the sha256 that training recorded in the folder's config.json (a LoRA run's
    adapter/); the recorded base identity ({} for an adapter folder from elsewhere, which records none)."""
    path = folder / files.CONFIG
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable ({exc})") from None
    digests, base = config.get(files.ADAPTER_SHA256), config.get(files.ADAPTER_BASE)
    if digests is None and base is None:
        return {}
    if not _strings(digests, (files.ADAPTER_WEIGHTS, files.ADAPTER_CONFIG)) or not isinstance(base, dict):
        raise CheckpointError(
            f"{path}: {files.ADAPTER_SHA256} and {files.ADAPTER_BASE} are not as training writes them"
        )
    for name, found in adapter_digests(folder).items():
        if found != digests[name]:
            raise CheckpointError(
                f"{folder / name}: sha256 {found[:12]}, but {files.CONFIG} records {digests[name][:12]}: the adapter "
                "was damaged or edited after training; copy the folder again from the run"
            )
    return base


def _strings(record, keys: tuple[str, ...]) -> bool:
    return isinstance(record, dict) and all(isinstance(record.get(k), str) for k in keys)


def _revision(folder: Path, base: str, recorded: dict) -> str | None:
    """The Hub revision to load the base at: adapter_config.json's `revision`, else the commit training recorded; none
    for a local folder."""
    if Path(base).expanduser().is_dir():
        return None
    revision = _adapter_config(folder).get("revision") or recorded.get("revision")
    if revision is not None and not isinstance(revision, str):
        raise CheckpointError(f"{folder / files.ADAPTER_CONFIG}: revision must be a string (a branch, tag or commit)")
    return revision


def _check_keys(folder: Path, adapted, weights: Path) -> None:
    """peft's missing adapter keys (its warning: the trained deltas dropped, the base answering) or unexpected ones
    (weights the model has no place for) as an error."""
    from peft.utils import get_peft_model_state_dict

    with warnings.catch_warnings():  # it looks for the base's config.json to see whether embeddings were resized
        warnings.simplefilter("ignore", UserWarning)
        expected = set(get_peft_model_state_dict(adapted))
    with safe_open(str(weights), "pt") as fh:
        saved = set(fh.keys())
    missing, unexpected = sorted(expected - saved), sorted(saved - expected)
    if missing or unexpected:
        which = f"lacks {missing[0]}" if missing else f"holds {unexpected[0]}, which the model has no place for"
        raise CheckpointError(
            f"{weights}: {which} ({len(missing)} missing, {len(unexpected)} unexpected; adapter_config.json's "
            "target_modules or modules_to_save do not match its weights)"
        )


def _body(folder: Path, base: str, config, head: list[str], revision: str | None) -> torch.nn.Module:
    """The base model as a classifier of `config`. Its head starts random, or the base's own head of another size is
    dropped: the adapter's head (modules_to_save) replaces it. Any other weight missing or of another shape means
    the adapter was trained on another base: refused."""
    try:
        with quiet_transformers():  # its load report names the head it starts fresh
            model, info = AutoModelForSequenceClassification.from_pretrained(
                base,
                config=config,
                revision=revision,
                use_safetensors=True,
                ignore_mismatched_sizes=True,
                output_loading_info=True,
            )
    except (OSError, ValueError, SafetensorError) as exc:
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
    """The folder's config.json (labels, problem type: a LoRA run of ours writes it) or the base model's, with as many
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
