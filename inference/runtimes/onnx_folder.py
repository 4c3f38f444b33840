"""onnx/model.onnx in a model folder, the layout TEI's CPU image, Triton's ONNX Runtime backend and transformers.js
load: fp32, inputs named as the tokenizer names them, one output `logits`. Written by `agnews export --runtime
onnxruntime` (inference/export.py), checked against the PyTorch model before it replaces an earlier one, with
onnx/source.json naming the weights it came from (training removes the folder when it saves new ones)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch

from contract import files, precision
from contract.errors import UserError
from contract.loading import load_model
from contract.model_call import collate
from inference.encoding import encode
from inference.runtimes import onnx

logger = logging.getLogger("inference")
FOLDER = files.ONNX_DIR
TOLERANCE = 1e-4  # largest logit difference from PyTorch fp32 the file may show
TEXTS = [("Stocks fell sharply after the report.", None), ("a", None), ("Who won?", "The Yankees won the final.")]


class OnnxMismatch(UserError):
    """The exported file does not answer as the PyTorch model does."""


def write(folder: Path) -> Path:
    """`folder`/onnx/model.onnx, exported, checked on ragged inputs and pairs, then moved in whole."""
    source = files.recorded_weights(folder)  # before loading: a retrain meanwhile shows as a change below
    loaded = load_model(str(folder), device="cpu", dtype=precision.FP32)
    pad = loaded.tokenizer.pad_token_id
    example = collate(encode(loaded, [("an example text", "and its pair")], True, False), pad)  # every input named
    staging = folder / f".{FOLDER}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    exported = onnx.build(loaded.model, example, precision.FP32, [], staging)
    batch = collate(encode(loaded, TEXTS, True, False), pad)
    with torch.no_grad():
        expected = loaded.model(**batch).logits.float()
    got = onnx.Runner(exported, precision.FP32, threads=1)(batch)
    difference = (got - expected).abs().max().item()
    if not difference <= TOLERANCE:  # NaN fails too
        shutil.rmtree(staging)
        raise OnnxMismatch(f"{FOLDER}/{files.RUNTIME_ONNX}: logits differ from PyTorch's by {difference:.2e}")
    (staging / files.ONNX_SOURCE).write_text(json.dumps({files.WEIGHTS_SHA256: source}, indent=2) + "\n")
    if files.recorded_weights(folder) != source:
        shutil.rmtree(staging)
        raise UserError(f"{folder}: new weights were saved during the export; run it again")
    remove(folder / FOLDER)
    os.replace(staging, folder / FOLDER)
    target = folder / FOLDER / files.RUNTIME_ONNX
    logger.info("Wrote %s (fp32, output `logits`; within %.1e of PyTorch)", target, difference)
    return target


def remove(path: Path) -> None:
    """A folder, or a link in its place (the link itself)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
