"""Serve a peft adapter folder: its base loaded, the adapters merged once at load; or several adapters of one base
kept apart on one copy of it (SharedBase), each answered through its own AdapterSwitch. Called by loading.py.

After a merge the service holds an ordinary classifier. peft is needed only here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """adapter/base/ when training saved it, else base_model_name_or_path."""
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


# where the base is: editable, since its weights are checked by hash
WHERE_THE_BASE_IS = ("base_model_name_or_path", "revision")


def adapter_config_sha256(config: dict) -> str:
    """sha256 of the adapter settings, the base's location left out."""
    kept = {k: v for k, v in config.items() if k not in WHERE_THE_BASE_IS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def adapter_digests(folder: Path) -> dict[str, str]:
    """What adapter/config.json records of peft's two files (files.ADAPTER_SHA256)."""
    return {
        files.ADAPTER_WEIGHTS: file_sha256(folder / files.ADAPTER_WEIGHTS),
        files.ADAPTER_CONFIG: adapter_config_sha256(_adapter_config(folder)),
    }


def base_sha256(model: torch.nn.Module, head: list[str]) -> str:
    """The base's identity: its float32 weights outside the head."""
    tensors = {k: v.float() for k, v in model.state_dict().items() if k.split(".")[0] not in head}
    return files.tensors_sha256(tensors)


@dataclass
class SharedBase:
    """One base for several adapters (LORA_ADAPTERS): the peft model they are added to, set by the first one loaded."""

    model: Any = None  # peft's PeftModelForSequenceClassification
    base: str = ""  # the first adapter's base_model_of
    sha256: str = ""  # that base's identity (base_sha256)
    first: Path | None = None


class AdapterSwitch(torch.nn.Module):
    """One adapter of a SharedBase, as a classifier: its config (labels, problem type), and a forward pass that makes
    it the active adapter first. One caller at a time (the engine's model thread), since the active adapter is the
    shared model's state."""

    def __init__(self, shared: SharedBase, name: str, config):
        super().__init__()
        self.shared, self.adapter, self.config = shared.model, name, config

    def forward(self, **batch):
        if self.shared.active_adapter != self.adapter:
            self.shared.set_adapter(self.adapter)
        return self.shared(**batch)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.shared.get_input_embeddings()


def load_adapter_model(folder: Path, shared: SharedBase | None = None) -> tuple[torch.nn.Module, Path, str]:
    """(classifier, adapter weights file, sha256): merged into its base, or with `shared` an AdapterSwitch added to
    that base; CheckpointError when peft is missing, the files or base are not those training used, or the adapter
    does not fit."""
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
    if shared is not None and shared.model is not None:
        return _add_adapter(folder, shared, base, config, recorded), weights, file_sha256(weights)
    head = [m for m in _adapter_config(folder).get("modules_to_save") or [] if isinstance(m, str)]
    model = _body(folder, base, config, head, _revision(folder, base, recorded))
    identity = base_sha256(model, head)
    if recorded.get("sha256") and identity != recorded["sha256"]:
        raise CheckpointError(
            f"{folder}: its base model {base!r} is not the one the adapter was trained on (its weights' sha256 differs "
            f"from {files.CONFIG} {files.ADAPTER_BASE}); point base_model_name_or_path at that base"
        )
    name = "adapter_0" if shared is not None else "default"
    adapted = _with_adapter(folder, base, lambda peft: peft.PeftModel.from_pretrained(model, folder, name))
    _check_keys(folder, adapted, weights, name)
    if shared is None:
        logger.info("Serving the adapter in %s merged into %s", folder, base)
        return adapted.merge_and_unload(), weights, file_sha256(weights)
    shared.model, shared.base, shared.sha256, shared.first = adapted, base, identity, folder
    logger.info("Serving the adapter in %s on its base %s (kept apart: more adapters share that base)", folder, base)
    return AdapterSwitch(shared, name, config), weights, file_sha256(weights)


def _add_adapter(folder: Path, shared: SharedBase, base: str, config, recorded: dict) -> AdapterSwitch:
    """The adapter in `folder` added to the shared base, its head sized to its own labels; another base refused."""
    from peft import PeftConfig
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    same = recorded.get("sha256") == shared.sha256 if recorded.get("sha256") else _same_place(base, shared.base)
    if not same:
        raise CheckpointError(
            f"{folder}: its base model {base!r} is not the base the other adapters of this service share "
            f"({shared.base!r}, from {shared.first}); serve it from its own service"
        )
    name = f"adapter_{len(shared.model.peft_config)}"
    tensors = load_file(folder / files.ADAPTER_WEIGHTS)

    def add(_) -> None:
        shared.model.add_adapter(name, PeftConfig.from_pretrained(folder))
        _fit_head(shared.model, name, tensors)
        set_peft_model_state_dict(shared.model, tensors, adapter_name=name)

    _with_adapter(folder, base, add)
    _check_keys(folder, shared.model, folder / files.ADAPTER_WEIGHTS, name)
    logger.info("Serving the adapter in %s on the shared base %s", folder, base)
    return AdapterSwitch(shared, name, config)


def _same_place(one: str, other: str) -> bool:
    """Two bases named alike: the same folder, or the same Hub id."""
    a, b = Path(one).expanduser(), Path(other).expanduser()
    return a.resolve() == b.resolve() if a.is_dir() and b.is_dir() else one == other


def _fit_head(model, name: str, tensors: dict[str, torch.Tensor]) -> None:
    """The adapter's copy of each saved head layer sized as saved: another adapter's labels may be fewer or more (peft
    copies the head the base was built with). Only peft's per-adapter copies are touched, never the shared base."""
    for key, saved in tensors.items():
        parent, slot, layer, copied = None, None, model.base_model.model, False
        for part in key.removeprefix("base_model.model.").split(".")[:-1]:
            parent, slot, layer = layer, part, getattr(layer, part, None)
            if hasattr(layer, "modules_to_save"):  # peft's ModulesToSaveWrapper: this adapter's own copy
                parent, slot, layer, copied = layer.modules_to_save, name, layer.modules_to_save[name], True
        fits = not isinstance(layer, torch.nn.Linear) or layer.weight.shape == saved.shape
        if copied and key.endswith(".weight") and not fits:
            resized = torch.nn.Linear(saved.shape[1], saved.shape[0], bias=layer.bias is not None)
            if isinstance(parent, torch.nn.ModuleDict):
                parent[slot] = resized
            else:
                setattr(parent, slot, resized)


def _with_adapter(folder: Path, base: str, load):
    """peft's load, its errors as one line naming the folder; peft missing: how to install it."""
    try:
        import peft
    except ImportError:
        raise CheckpointError(
            f"{folder}: a peft adapter folder; serving it needs peft: pip install 'distilbert-agnews[peft]'"
        ) from None
    try:
        with warnings.catch_warnings():  # peft reads transformers' old checkpointing attribute
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            warnings.filterwarnings("ignore", message="Found missing adapter keys")  # checked after, as an error
            return load(peft)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError, SafetensorError) as exc:
        raise CheckpointError(
            f"{folder}: the adapter does not fit its base model {base!r}: {' '.join(str(exc).split())[:200]}"
        ) from None


def _check_recorded(folder: Path) -> dict:
    """The adapter files checked against the recorded sha256; the recorded base identity, or {}."""
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
    """The base's Hub revision: the adapter's, else the recorded commit; None locally."""
    if Path(base).expanduser().is_dir():
        return None
    revision = _adapter_config(folder).get("revision") or recorded.get("revision")
    if revision is not None and not isinstance(revision, str):
        raise CheckpointError(f"{folder / files.ADAPTER_CONFIG}: revision must be a string (a branch, tag or commit)")
    return revision


def _check_keys(folder: Path, adapted, weights: Path, name: str) -> None:
    """peft's missing or unexpected adapter keys, as an error."""
    from peft.utils import get_peft_model_state_dict

    with warnings.catch_warnings():  # peft checks it for resized embeddings
        warnings.simplefilter("ignore", UserWarning)
        expected = set(get_peft_model_state_dict(adapted, adapter_name=name))
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
    """The base as a classifier of `config`, its head left to the adapter. Any other missing or reshaped weight means
    another base: refused."""
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
    """config.json of the folder, else of the base, sized to the adapter's head."""
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
    """Rows of the adapter's trained head, or None without one."""
    try:
        with safe_open(str(weights), "pt") as fh:
            for key in fh.keys():
                if key.endswith(HEAD_OUTPUTS):
                    return fh.get_slice(key).get_shape()[0]
    except (OSError, SafetensorError):
        return None  # PeftModel.from_pretrained names the damage
    return None
