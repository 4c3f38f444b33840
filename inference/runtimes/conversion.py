"""A candidate's runner: the PyTorch model cast, or converted (int8 quantized) by its runtime's module and cached; a
conversion whose digests match is reused.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from contract import precision
from contract.loading import LoadedModel
from contract.model_call import collate
from contract.runtimes import RUNTIMES, Runtime
from inference.encoding import encode
from inference.runtimes import cache as runtime_cache
from inference.runtimes.cache import Cache
from inference.runtimes.report import ConversionFailed
from inference.settings import BACKENDS

logger = logging.getLogger("inference.runtimes.choice")  # one channel for the runtime choice, whichever part logs

AUTO, TORCH, *OPTIMIZED = BACKENDS  # the optimized runtimes in auto's order among equals (contract/runtimes.py)


@dataclass(frozen=True)
class Candidate:
    runtime: str
    precision: str

    @property
    def name(self) -> str:
        return f"{self.runtime} {self.precision}"


def torch_runner(model: torch.nn.Module):
    def forward(batch: dict) -> torch.Tensor:
        with torch.inference_mode():
            return model(**batch).logits.float()

    return forward


def digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12] if texts else "none"


def runner_for(loaded: LoadedModel, candidate: Candidate, cache: Cache, threads: int, calibration: list[str]):
    """The candidate's runner; ConversionFailed says why there is none."""
    if candidate.runtime == TORCH:
        return torch_runner(copy.deepcopy(loaded.model).to(precision.torch_dtype(candidate.precision)))
    try:
        path = _converted(loaded, candidate, cache, calibration)
        return RUNTIMES[candidate.runtime].load().Runner(path, candidate.precision, threads)
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party converter refuses this candidate alone
        cache.discard(conversion_name(candidate, calibration))
        logger.warning("Runtime: %s cannot be built: %s: %s", candidate.name, type(exc).__name__, _short(exc))
        raise ConversionFailed(f"refused: conversion failed ({type(exc).__name__}: {_short(exc)})") from exc


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def conversion_name(candidate: Candidate, calibration: list[str]) -> str:
    """The candidate's cache folder name."""
    return RUNTIMES[candidate.runtime].folder(candidate.precision, digest(calibration))


def _converted(loaded: LoadedModel, candidate: Candidate, cache: Cache, calibration: list[str]) -> Path:
    """The candidate's converted model: a verified earlier one, else a new one."""
    runtime: Runtime = RUNTIMES[candidate.runtime]
    name = conversion_name(candidate, calibration)
    folder = cache.folder / name
    if name in cache.converted:  # a hinted precision shares the fp32 model
        return folder / runtime.model_file
    if folder.exists():
        problem = cache.damage(name)
        if problem is None:
            return folder / runtime.model_file
        logger.warning("Runtime: %s; converting again", problem)
        cache.discard(name)
    started = time.perf_counter()
    # traced on a pair: every tokenizer output becomes an input
    example = collate(encode(loaded, [("an example text", "and its pair")], True, False), loaded.tokenizer.pad_token_id)
    calibrating = runtime.calibrated and candidate.precision == precision.INT8
    staging = cache.folder / runtime_cache.staging_name(name)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    samples = _batches_of_one(loaded, calibration) if calibrating else []
    runtime.load().build(loaded.model, example, candidate.precision, samples, staging)
    os.replace(staging, folder)
    cache.converted.add(name)
    logger.info("Runtime: converted %s in %.1f s into %s", candidate.name, time.perf_counter() - started, folder)
    return folder / runtime.model_file


def _batches_of_one(loaded: LoadedModel, texts: list[str]) -> list[dict]:
    features = encode(loaded, [(t, None) for t in texts], truncate=True, left=False)
    return [collate([f], loaded.tokenizer.pad_token_id) for f in features]
