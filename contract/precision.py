"""One precision vocabulary and bf16 probe for training, evaluation, prediction and serving.

auto, fp32, fp16, bf16, and int8 (serving only). Training autocasts over fp32 weights; the readers cast the weights
once, so all three compute the same numbers.
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
    """The canonical name of any accepted spelling; ValueError otherwise."""
    key = str(name).strip().lower()
    if serving and key == INT8:
        return INT8
    if key not in _ALIASES:
        accepted = SERVING_ACCEPTED if serving else ACCEPTED
        raise ValueError(f"unknown precision {name!r}; use one of {', '.join(accepted)}")
    return _ALIASES[key]


def native_bf16(device_type: str) -> bool:
    """Native bf16 matmuls: a bf16 GPU, or a CPU with AMX or AVX512-BF16."""
    import torch  # lazy: --help must not import torch

    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    cpu = torch.cpu  # private in torch 2.x; absent means "no"
    return any(
        getattr(cpu, probe, lambda: False)() for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    )


def resolve(name: str, device_type: str) -> str:
    """fp32, fp16 or bf16: `auto` decided for this device."""
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
    """TEI's `model_dtype` spelling: float32, float16, bfloat16."""
    return _TEI_NAMES[canonical(precision, serving=True)]
