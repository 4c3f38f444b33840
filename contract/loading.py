"""Load a classifier: our checkpoint folder, any `save_pretrained` folder, a peft adapter or a Hub id. Called by the
service, evaluate and predict.

Pickles are refused (they can run code), and so is a model without its classification head.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file as load_safetensors
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from contract import adapters, files, label_tokens, precision
from contract.errors import CheckpointError
from contract.files import file_sha256
from contract.hub import HUB_ID, hub_reachable, hub_url, is_offline, looks_local
from contract.long_text import LongText, LongTextError
from contract.padding import NoPadToken, ensure_pad_token, match_pad_token
from contract.problem_types import ProblemType, ProblemTypeError, SingleLabel, calibration_of
from contract.quiet import quiet_transformers
from contract.templates import TemplateError, template_of

logger = logging.getLogger(__name__)

HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model"]  # config, weights, tokenizer (never pickles)


class TornCheckpoint(CheckpointError):
    """config.json and the weights are from different saves."""


@dataclass
class LoadedModel:
    model: torch.nn.Module | None  # None when an optimized runtime serves (runner)
    tokenizer: Any
    labels: list[str]
    max_length: int
    device: torch.device
    precision: str  # fp32, fp16 or bf16
    model_id: str  # as configured: a folder or a Hub id
    folder: Path  # where the files were read
    weights_file: str
    sha256: str
    model_sha: str | None = None  # the Hub commit, for a Hub id
    metrics: dict | None = None
    signature: tuple = ()  # the files just before loading; reload compares to it
    runtime: str = "torch"  # or openvino, onnxruntime: inference/runtimes/choice.py
    runner: Callable[[dict[str, torch.Tensor]], torch.Tensor] | None = None  # batch -> logits, instead of `model`
    problem: ProblemType = field(
        default_factory=lambda: SingleLabel(2)
    )  # scores and decisions: contract/problem_types.py
    long_text: LongText = field(default_factory=LongText)  # windowing and pooling of long texts: contract/long_text.py
    # the other adapters of this model's base, served beside it by name (LORA_ADAPTERS); each a LoadedModel whose
    # model is an adapters.AdapterSwitch on the one shared base
    adapters: dict[str, LoadedModel] = field(default_factory=dict)
    # AGREEMENT_WITH: how far it keeps the decisions of the model it replaces, as the service measured it at load
    agreement: dict | None = None

    @property
    def id2label(self) -> dict[str, str]:
        return {str(i): label for i, label in enumerate(self.labels)}

    def named(self, adapter: str | None) -> LoadedModel:
        """This model (None), or its adapter of that name."""
        return self if adapter is None else self.adapters[adapter]

    def all_served(self) -> list[LoadedModel]:
        return [self, *self.adapters.values()]


def resolve_device(setting: str) -> torch.device:
    """auto: cuda when available, else cpu; else a torch device name."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def signature(folder: str | Path) -> tuple:
    """(name, mtime, size) of every file served: reload compares these."""
    root = Path(folder)
    names = (files.WEIGHTS, files.HF_WEIGHTS, files.HF_WEIGHTS_INDEX, files.CONFIG, files.ADAPTER_WEIGHTS)
    paths = [root / name for name in (*names, files.ADAPTER_CONFIG, f"{files.ADAPTER_BASE_DIR}/{files.HF_WEIGHTS}")]
    paths += sorted(root.glob("model-*.safetensors"))
    paths += sorted((root / files.TOKENIZER_DIR).glob("*")) if (root / files.TOKENIZER_DIR).is_dir() else []
    found = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:  # absent, or replaced between the listing and the stat
            continue
        if path.is_file():
            found.append((str(path.relative_to(root)), stat.st_mtime_ns, stat.st_size))
    return tuple(found)


def load_model(
    model_id: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    revision: str | None = None,
    shared: adapters.SharedBase | None = None,
) -> LoadedModel:
    """The model on the resolved device and precision; with `shared`, a peft adapter folder kept apart on that base
    (adapters.SharedBase: one base for several adapters)."""
    target = resolve_device(device)
    resolved = precision.resolve(dtype, target.type)
    folder, model_sha = locate(model_id, revision)
    before = signature(folder)
    try:
        model, weights, digest = _read_model(folder, shared)
        tokenizer = _read_tokenizer(folder)
    except PermissionError as exc:  # another user's folder: one line, not a trace
        user = getattr(os, "getuid", lambda: "?")()
        raise CheckpointError(f"{exc.filename}: cannot be read by this user (uid {user}): {exc.strerror}") from None
    check_finite(model, weights)
    check_vocabulary(folder, model, tokenizer)
    config = model.config
    try:  # a decoder saved without pad token (contract/padding.py)
        if said := ensure_pad_token(tokenizer, str(folder)):
            logger.info("%s", said)
    except NoPadToken as exc:
        raise CheckpointError(str(exc)) from None
    match_pad_token(config, tokenizer.pad_token_id)
    labels = label_names(config, folder)
    problem, long_text = read_contract(config, folder, tokenizer)
    max_length = min(tokenizer.model_max_length, getattr(config, "max_position_embeddings", 512))
    if max_length <= tokenizer.num_special_tokens_to_add(pair=True):  # no room for any text: one answer for all
        raise CheckpointError(
            f"{folder}: the tokenizer's model_max_length ({tokenizer.model_max_length}) leaves no room for text "
            f"beside its {tokenizer.num_special_tokens_to_add(pair=True)} special tokens"
        )
    # cast once; autocast would re-cast every call
    model = model.eval().to(device=target, dtype=precision.torch_dtype(resolved))
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        labels=labels,
        max_length=max_length,
        device=target,
        precision=resolved,
        model_id=model_id,
        folder=folder,
        weights_file=str(weights),
        sha256=digest,
        model_sha=model_sha,
        metrics=_read_metrics(folder),
        signature=before,
        problem=problem,
        long_text=long_text,
    )


def read_contract(config, folder: Path, tokenizer) -> tuple[ProblemType, LongText]:
    """config.json's problem type and long-text settings, its calibration checked, its template set on `tokenizer`
    (as trained, whatever post-processor the tokenizer's class rebuilt on loading)."""
    try:
        problem, long_text = ProblemType.of(config), LongText.of(config)
        calibration_of(config)
        template = template_of(config)
    except (ProblemTypeError, LongTextError, TemplateError) as exc:
        raise CheckpointError(f"{folder}: {exc}") from None
    if template is not None:
        template.apply(tokenizer)
    return problem, long_text


def check_same_save(config, weights: Path, tensors: Callable[[], dict[str, torch.Tensor] | None]) -> None:
    """TornCheckpoint unless the weights hold the tensors config.json records, so a half-copied folder is never served.
    Hashes only when a hash is recorded."""
    record = getattr(config, files.WEIGHTS_SHA256, None) or {}
    if not isinstance(record, dict) or not all(isinstance(v, str) for v in record.values()):
        raise CheckpointError(
            f"{weights.parent / files.CONFIG}: {files.WEIGHTS_SHA256} must map each weights file to its sha256 (a "
            f"string), not {record!r:.60}; delete the field from {files.CONFIG} after editing the weights by hand"
        )
    recorded = record.get(weights.name)
    found = tensors() if recorded else None
    digest = files.tensors_sha256(found) if found is not None else None
    if recorded and digest and recorded != digest:
        raise TornCheckpoint(
            f"{weights}: sha256 {digest[:12]}, but {files.CONFIG} beside it was saved with {recorded[:12]}: the two "
            f"are from different saves (a copy under way?). Copy both; after editing one by hand, delete "
            f"{files.WEIGHTS_SHA256} from {files.CONFIG}"
        )


def check_finite(model: torch.nn.Module, weights: Path) -> None:
    """NaN or infinite weights would answer NaN: refused at start and reload."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                raise CheckpointError(f"{weights}: {name} holds {bad} NaN or infinite values (a diverged model)")


def label_names(config, folder: Path) -> list[str]:
    """id2label as the names of outputs 0..n-1, each once."""
    id2label = getattr(config, "id2label", None) or {}
    missing = [i for i in range(config.num_labels) if i not in id2label]
    if missing:
        raise CheckpointError(
            f"{folder / files.CONFIG}: id2label has no name for output {missing[0]} (ids {sorted(id2label)} for "
            f"{config.num_labels} outputs); number the labels 0..{config.num_labels - 1}"
        )
    names = [str(id2label[i]) for i in range(config.num_labels)]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise CheckpointError(f"{folder / files.CONFIG}: id2label names {twice[0]!r} twice; each label needs a name")
    return names


def locate(model_id: str, revision: str | None = None) -> tuple[Path, str | None]:
    """(local folder, Hub commit or None) for a path or an org/name id."""
    path = Path(model_id).expanduser()
    if path.is_dir():
        return path, None
    if path.exists():
        raise CheckpointError(f"{model_id}: not a folder")
    if not HUB_ID.match(model_id) or looks_local(model_id):  # runs/nope beside runs/: a folder, not a Hub id
        raise CheckpointError(f"{model_id}: checkpoint folder not found{_beside(path)}")
    return _download(model_id, revision)


def _beside(path: Path) -> str:
    """What the missing folder's parent holds that could be meant, and how else to name a model."""
    parent = path.parent
    models = sorted(p.name for p in parent.iterdir() if (p / files.CONFIG).is_file())[:6] if parent.is_dir() else []
    if models:
        return f" ({parent} holds {', '.join(models)}; a Hub id such as org/name is read from the Hub)"
    return (
        " (train one with `python training/train.py --preset smoke`, or give a save_pretrained folder or a Hub id "
        "such as org/name)"
    )


def _download(model_id: str, revision: str | None) -> tuple[Path, str]:
    offline = is_offline() or not hub_reachable()
    try:
        folder = Path(
            snapshot_download(model_id, revision=revision, allow_patterns=HUB_FILES, local_files_only=offline)
        )
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"{model_id}: not in the local Hugging Face cache and the Hub ({hub_url()}) is out of "
            "reach; download it where there is internet, or serve a local folder"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise CheckpointError(f"{model_id}: cannot download from the Hub ({_short(exc)})") from None
    return folder, folder.name


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _read_model(folder: Path, shared: adapters.SharedBase | None = None) -> tuple[torch.nn.Module, Path, str]:
    """(model, weights file, sha256): our state_dict, else the export; checked against config.json. With `shared`,
    the folder's adapter (adapter/ in our checkpoint) on that base."""
    if shared is not None:
        adapter = folder / files.ADAPTER_DIR if adapters.is_adapter_folder(folder / files.ADAPTER_DIR) else folder
        if not adapters.is_adapter_folder(adapter):
            raise CheckpointError(
                f"{folder}: not a peft adapter folder (no {files.ADAPTER_CONFIG}, nor {files.ADAPTER_DIR}/ holding "
                "one); several models share one service only as LoRA adapters of one base"
            )
        return adapters.load_adapter_model(adapter, shared)
    if adapters.is_adapter_folder(folder) and not (folder / files.WEIGHTS).is_file():
        return adapters.load_adapter_model(folder)
    if not (folder / files.CONFIG).is_file():
        raise CheckpointError(f"{folder / files.CONFIG}: missing")
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder / files.CONFIG}: {_short(exc)}") from None
    if (folder / files.WEIGHTS).is_file():
        return _from_state_dict(folder / files.WEIGHTS, config)
    if (folder / label_tokens.SPEC_FILE).is_file():
        return _from_label_tokens(folder, config)
    shards = folder / files.HF_WEIGHTS_INDEX
    weights = folder / files.HF_WEIGHTS if (folder / files.HF_WEIGHTS).is_file() else shards
    if weights.is_file():
        model = _from_pretrained(folder, config)  # first: it turns an unreadable file into a CheckpointError
        check_same_save(
            config, weights, lambda: load_safetensors(weights) if weights.name == files.HF_WEIGHTS else None
        )
        return model, weights, file_sha256(weights)
    pickled = [name for name in files.PICKLED_HF_WEIGHTS if (folder / name).is_file()]
    if pickled:
        raise CheckpointError(
            f"{folder / pickled[0]}: pickled weights are refused (unpickling can run code); "
            "save the model again with save_pretrained, which writes model.safetensors"
        )
    raise CheckpointError(f"{folder / files.WEIGHTS}: missing (nor {files.HF_WEIGHTS})")


def _from_state_dict(path: Path, config) -> tuple[torch.nn.Module, Path, str]:
    data = path.read_bytes()
    try:
        state_dict = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as exc:
        raise CheckpointError(
            f"{path}: not a loadable tensor state_dict (truncated, or holds pickled objects): {_short(exc)}"
        ) from None
    if (
        not isinstance(state_dict, dict)
        or not state_dict
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state_dict.items())
    ):
        raise CheckpointError(f"{path}: expected a dict of parameter name -> tensor")
    check_same_save(config, path, lambda: state_dict)
    model = _classifier_from_config(config, path)
    _check_shapes(path, {k: tuple(v.shape) for k, v in state_dict.items()}, model, config)
    result = model.load_state_dict(state_dict, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(
            f"{path}: does not match {files.CONFIG} (missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]})"
        )
    return model, path, hashlib.sha256(data).hexdigest()


def _check_shapes(path: Path, shapes: dict[str, tuple], model: torch.nn.Module, config) -> None:
    """One line for weights that do not fit config.json's model."""
    expected = model.state_dict()
    for name, shape in shapes.items():
        if name in expected and tuple(expected[name].shape) != shape:
            raise CheckpointError(
                f"{path}: does not match {files.CONFIG}: {name} is {list(shape)} in the weights and "
                f"{list(expected[name].shape)} in the model {files.CONFIG} describes ({config.num_labels} labels in "
                "its id2label); the config belongs to other weights"
            )


def _safetensors_shapes(folder: Path) -> dict[str, tuple]:
    shapes = {}
    for path in [folder / files.HF_WEIGHTS, *sorted(folder.glob("model-*.safetensors"))]:
        if path.is_file():
            with safe_open(str(path), "pt") as fh:
                shapes.update({k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()})
    return shapes


def _classifier_from_config(config, path: Path) -> torch.nn.Module:
    try:
        return AutoModelForSequenceClassification.from_config(config)
    except ValueError as exc:
        raise CheckpointError(
            f"{path.parent / files.CONFIG}: not a sequence-classification model ({_short(exc)})"
        ) from None


def _from_label_tokens(folder: Path, config) -> tuple[torch.nn.Module, Path, str]:
    """A downloaded causal LM served as the classifier its label_tokens.json names: the body as saved, the head the
    LM's own rows of those tokens."""
    weights = folder / files.HF_WEIGHTS if (folder / files.HF_WEIGHTS).is_file() else folder / files.HF_WEIGHTS_INDEX
    try:
        spec = label_tokens.read_spec(folder)
        label_tokens.check_causal(config, str(folder), from_scratch=False)
        label_tokens.classifier_config(config, spec)
        model = _from_pretrained(folder, config, fresh=label_tokens.head_layer)
        label_tokens.head_from_spec(model, folder, _read_tokenizer(folder), spec)
    except label_tokens.LabelTokenError as exc:
        raise CheckpointError(str(exc)) from None
    return model, weights, file_sha256(weights)


def _from_pretrained(folder: Path, config, fresh=None) -> torch.nn.Module:
    """The classifier a folder saved; `fresh` names the head layer the caller sets itself (a causal LM has none)."""
    with quiet_transformers():
        try:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                folder, config=config, use_safetensors=True, output_loading_info=True
            )
        except (OSError, ValueError, SafetensorError, RuntimeError) as exc:
            if "mismatched_sizes" in str(exc):  # transformers' words for tensors that do not fit config.json
                _check_shapes(folder, _safetensors_shapes(folder), _classifier_from_config(config, folder), config)
            raise CheckpointError(f"{folder}: cannot load the weights ({_short(exc)})") from None
    head = fresh(model, config.num_labels) if fresh is not None else None
    missing = sorted(key for key in info["missing_keys"] if key.rpartition(".")[0] != head)
    if missing:
        raise CheckpointError(
            f"{folder}: the weights lack {', '.join(missing[:3])}: not a fine-tuned sequence "
            f"classifier (architectures {config.architectures}); fine-tune it first, or, for a causal LM read "
            f"through its label tokens, add {label_tokens.SPEC_FILE} (docs/serving.md)"
        )
    return model


def _read_tokenizer(folder: Path):
    """tokenizer/, else the folder's tokenizer files, else the base's."""
    where = folder / files.TOKENIZER_DIR if (folder / files.TOKENIZER_DIR).is_dir() else folder
    if adapters.is_adapter_folder(folder) and not (folder / "tokenizer_config.json").is_file():
        where = adapters.base_model_of(folder)
    vocabularies = [name for name in files.TOKENIZER_FILES if name != "tokenizer_config.json"]
    if Path(where).is_dir() and not any((Path(where) / name).is_file() for name in vocabularies):
        # transformers would build an empty tokenizer from config.json alone: every word [UNK], confident answers
        raise CheckpointError(
            f"{where}: no tokenizer files (tokenizer.json, vocab.txt, ...): copy the tokenizer the model was trained "
            f"with there (tokenizer.save_pretrained) or into {Path(where) / files.TOKENIZER_DIR}"
        )
    try:
        return AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{where}: no usable tokenizer ({_short(exc)})") from None


def check_vocabulary(folder: Path, model: torch.nn.Module, tokenizer) -> None:
    """The tokenizer fits the model: no id past its embeddings, and not a fraction of them (another model's)."""
    embeddings = getattr(model.get_input_embeddings(), "num_embeddings", None)
    if embeddings is None:
        return
    tokens = len(tokenizer)
    if tokens > embeddings or 2 * tokens < embeddings:  # padded embeddings (to 8, 64, 128 rows) stay well above half
        raise CheckpointError(
            f"{folder}: the tokenizer knows {tokens} tokens but the model's embeddings have {embeddings} rows: it is "
            "not the tokenizer this model was trained with; save that one beside the model"
        )


def _read_metrics(folder: Path) -> dict | None:
    path = folder / files.METRICS
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        logger.warning("%s is unreadable; /info will show no metrics", path)
        return None
