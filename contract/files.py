"""The names of everything in a checkpoint folder: the contract between training and serving.

Nothing else spells a file name of the folder; docs/checkpoints.md describes each file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

WEIGHTS = "distilbert_agnews.pt"
CONFIG = "config.json"
TOKENIZER_DIR = "tokenizer"
METRICS = "metrics.json"
MODEL_CARD = "README.md"

WEIGHTS_SHA256 = "weights_sha256"  # {weights file: sha256} of the set config.json was saved with

HF_WEIGHTS = "model.safetensors"
HF_WEIGHTS_INDEX = "model.safetensors.index.json"  # sharded save_pretrained: model-0000i-of-0000n.safetensors
PICKLED_HF_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")  # refused: unpickling runs code

CURVES_JSON = "training_curves.json"
CURVES_PNG = "training_curves.png"
EVAL_RESULTS = "eval_results.json"
CONFUSION_PNG = "confusion_matrix.png"
RELIABILITY_PNG = "calibration.png"  # single-label: confidence against accuracy (training/calibration.py)
MISCLASSIFIED_CSV = "misclassified.csv"
REVIEW_PNG = "review_band.png"  # precision against coverage (training/scoring/review.py), where a band is fitted
RESIDUALS_PNG = "residuals.png"  # regression
LARGEST_ERRORS_CSV = "largest_errors.csv"  # regression

ADAPTER_DIR = "adapter"  # LoRA runs: training/lora.py writes it, contract/adapters.py serves such a folder
ADAPTER_CONFIG = "adapter_config.json"  # peft's names
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_SHA256 = "adapter_sha256"  # adapter/config.json: {peft's file name: sha256} as training wrote them
ADAPTER_BASE = "adapter_base"  # config.json: the base the adapters were trained on (contract/adapters.py)
ADAPTER_BASE_DIR = "base"  # adapter/base/: a from-scratch base's weights, saved beside its adapters

CALIBRATION = "calibration_texts.json"
DISTILLATION = (
    "distillation.json"  # a distilled student's teacher, held-out texts and agreement (contract/agreement.py)
)
RUNTIME_DIR = "runtime"
RUNTIME_CHOICE = "runtime.json"
RUNTIME_MODEL = "model.xml"  # OpenVINO IR; its weights in model.bin beside it
RUNTIME_ONNX = "model.onnx"  # ONNX Runtime
ONNX_DIR = "onnx"  # onnx/model.onnx for other servers (inference/runtimes/onnx_folder.py): gone with its weights
ONNX_SOURCE = "source.json"  # onnx/source.json: config.json's WEIGHTS_SHA256 the export was made from

# what a run writes at the top of its folder, beside TOKENIZER_DIR, ADAPTER_DIR and its states: another run's (or
# model's) files of these names are what a new run would replace (training/output/claim.py)
RUN_FILES = (
    WEIGHTS, CONFIG, METRICS, MODEL_CARD, HF_WEIGHTS, HF_WEIGHTS_INDEX, CURVES_JSON, CURVES_PNG, EVAL_RESULTS,
    CONFUSION_PNG, RELIABILITY_PNG, MISCLASSIFIED_CSV, REVIEW_PNG, RESIDUALS_PNG, LARGEST_ERRORS_CSV, CALIBRATION,
    DISTILLATION,
    "generation_config.json",  # save_pretrained's, for decoder models
)  # fmt: skip
TOKENIZER_FILES = (  # tokenizer.save_pretrained's names, every tokenizer kind
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
    "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model", "chat_template.jinja",
)  # fmt: skip
HF_WEIGHT_SHARD = "model-*-of-*.safetensors"  # a sharded save_pretrained

LOCK = ".distilbert_agnews.lock"
STATE_DIR = "state"
STATE_PREFIX = "step_"
PROGRESS = "progress.json"
STAGING_PREFIX = ".tmp_"  # state/.tmp_step_N.<run id>: a state being written; never read


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 of a state_dict's names, dtypes, shapes and values."""
    import torch  # lazy: --help must not import torch

    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
    return digest.hexdigest()


def recorded_weights(folder: Path) -> dict | None:
    """config.json's WEIGHTS_SHA256 (the weights it was saved with), or None."""
    try:
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config.get(WEIGHTS_SHA256) if isinstance(config, dict) else None


def stale_export(folder: Path) -> str | None:
    """Why onnx/ does not hold the folder's current weights, or None (also when there is no onnx/)."""
    onnx = folder / ONNX_DIR
    if not onnx.exists() and not onnx.is_symlink():
        return None
    try:
        source = json.loads((onnx / ONNX_SOURCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        source = None
    if not isinstance(source, dict) or source.get(WEIGHTS_SHA256) != recorded_weights(folder):
        return f"{onnx} was exported from other weights than {folder / CONFIG} names"
    return None
