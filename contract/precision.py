"""One precision vocabulary and one bf16 probe for training, evaluation, batch prediction and serving.

auto (bf16 where the hardware has native bf16, fp16 on a GPU without it, else fp32), fp32/no/float32, fp16/float16,
bf16/bfloat16, and int8 (serving only, through an optimized CPU runtime). Training uses a precision as autocast over
fp32 master weights; evaluation, prediction and serving cast the weights to it once, so the three compute the same
numbers on a checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

AUTO, FP32, FP16, BF16, INT8 = "auto", "fp32", "fp16", "bf16", "int8"
_ALIASES = {
    "auto": AUTO,
    "fp32": FP32,
    "no": FP32,
    "float32": FP32,
    "fp16": FP16,
    "float16": FP16,
    "bf16": BF16,
    "bfloat16": BF16,
}
ACCEPTED = tuple(_ALIASES)
SERVING_ACCEPTED = (*ACCEPTED, INT8)
_DTYPES = {FP32: "float32", FP16: "float16", BF16: "bfloat16"}  # torch's names: no torch at import (--help)
_TEI_NAMES = {FP32: "float32", FP16: "float16", BF16: "bfloat16", INT8: "int8"}


def canonical(name: str, serving: bool = False) -> str:
    """auto, fp32, fp16 or bf16 (or int8 when `serving`) for any accepted spelling; ValueError naming the accepted
    ones otherwise."""
    key = str(name).strip().lower()
    if serving and key == INT8:
        return INT8
    if key not in _ALIASES:
        accepted = SERVING_ACCEPTED if serving else ACCEPTED
        raise ValueError(f"unknown precision {name!r}; use one of {', '.join(accepted)}")
    return _ALIASES[key]


def native_bf16(device_type: str) -> bool:
    """The hardware multiplies bf16 matrices natively: a bf16 GPU, or a CPU with AMX or AVX512-BF16."""
    import torch  # here: contract/ imports without torch, so every command's --help answers at once

    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    cpu = torch.cpu  # these capability probes are private in torch 2.x; their absence means "no"
    return any(
        getattr(cpu, probe, lambda: False)() for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    )


def resolve(name: str, device_type: str) -> str:
    """fp32, fp16 or bf16: `auto` decided for this device, any other name made canonical."""
    precision = canonical(name)
    if precision != AUTO:
        return precision
    if native_bf16(device_type):
        return BF16
    return FP16 if device_type == "cuda" else FP32


def torch_dtype(precision: str) -> torch.dtype:
    import torch

    return getattr(torch, _DTYPES[canonical(precision)])


def accelerate_name(precision: str) -> str:
    """accelerate's `mixed_precision` value: no, fp16 or bf16."""
    resolved = canonical(precision)
    return "no" if resolved == FP32 else resolved


def tei_name(precision: str) -> str:
    """text-embeddings-inference's spelling (`model_dtype` in /info): float32, float16 or bfloat16 (int8: ours)."""
    return _TEI_NAMES[canonical(precision, serving=True)]
