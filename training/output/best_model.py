"""The best model's files in --output_dir: weights, config.json, the Hugging Face export, tokenizer and adapter, each
swapped in whole. Called by folder.py (OutputDir.save_model) and by whoever reads the weights back."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import safetensors.torch
import torch
from transformers.utils import logging as transformers_logging

from contract import files
from contract.adapters import adapter_digests
from training import lora
from training.output.atomic import as_plain_files, atomic_write, replace_dir, staging_dir


def write_weights(fh, weights: dict[str, torch.Tensor]) -> None:
    """The state_dict file's bytes (plain tensors: `torch.load(..., weights_only=True)` reads it)."""
    torch.save(weights, fh)


def write_model_files(out: Path, unwrapped, weights: dict, tokenizer, export_hf: bool) -> None:
    """Main process: state_dict, config.json, export and tokenizer, each swapped in whole; config.json last, with the
    weights' sha256. What was derived from the weights before (onnx/) goes first: it never sits beside others."""
    remove_derived(out)
    atomic_write(out / files.WEIGHTS, lambda fh: write_weights(fh, weights))
    digests = {files.WEIGHTS: files.tensors_sha256(weights)}  # before save_pretrained, which empties `weights`
    staging = staging_dir(".hf.", out)
    if export_hf:
        with _no_progress_bar():  # its one-shard bar would cut the training bar
            unwrapped.save_pretrained(staging, state_dict=weights)  # config.json + model.safetensors
        tokenizer.save_pretrained(staging)
    else:
        unwrapped.config.save_pretrained(staging)
        (out / files.HF_WEIGHTS).unlink(missing_ok=True)  # never leave an older model's export beside this one
    as_plain_files(staging)
    if (staging / files.HF_WEIGHTS).is_file():  # save_pretrained may leave out tied weights: hashed as written
        digests[files.HF_WEIGHTS] = files.tensors_sha256(safetensors.torch.load_file(staging / files.HF_WEIGHTS))
    config = json.loads((staging / files.CONFIG).read_text())
    (staging / files.CONFIG).write_text(json.dumps({**config, files.WEIGHTS_SHA256: digests}, indent=2) + "\n")
    for file in sorted(staging.iterdir(), key=lambda f: f.name == files.CONFIG):  # config.json last
        os.replace(file, out / file.name)
    shutil.rmtree(staging, ignore_errors=True)
    tok_staging = staging_dir(f".{files.TOKENIZER_DIR}.", out)
    tokenizer.save_pretrained(tok_staging)
    replace_dir(as_plain_files(tok_staging), out / files.TOKENIZER_DIR)


def remove_derived(out: Path) -> None:
    """onnx/ (agnews export's, for other servers): made from the weights about to be replaced. A link there goes, not
    what it points to."""
    derived = out / files.ONNX_DIR
    if derived.is_symlink() or derived.is_file():
        derived.unlink()
    elif derived.is_dir():
        shutil.rmtree(derived)


def write_adapter(out: Path, model, config, tokenizer) -> None:
    """Main process: adapter/, swapped in whole."""
    staging = staging_dir(f".{files.ADAPTER_DIR}.", out)
    with _no_progress_bar():
        lora.save_adapter(model, staging)
    config.save_pretrained(staging)
    recorded = json.loads((staging / files.CONFIG).read_text())
    recorded[files.ADAPTER_SHA256] = adapter_digests(staging)
    (staging / files.CONFIG).write_text(json.dumps(recorded, indent=2) + "\n")
    tokenizer.save_pretrained(staging)
    replace_dir(as_plain_files(staging), out / files.ADAPTER_DIR)


@contextlib.contextmanager
def _no_progress_bar():
    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The saved state_dict: plain tensors only."""
    return torch.load(path, map_location="cpu", weights_only=True)
