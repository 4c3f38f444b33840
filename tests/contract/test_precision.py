"""One precision vocabulary: every spelling, and `auto` decided the same way for every device."""

from __future__ import annotations

import pytest
import torch

from contract import precision


@pytest.mark.parametrize(
    "spelling, canonical",
    [
        ("auto", "auto"),
        ("fp32", "fp32"),
        ("no", "fp32"),
        ("float32", "fp32"),
        ("FP16", "fp16"),
        ("float16", "fp16"),
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        (" BFloat16 ", "bf16"),
    ],
)
def test_every_spelling(spelling, canonical):
    assert precision.canonical(spelling) == canonical


def test_unknown_names_list_the_accepted_ones():
    with pytest.raises(ValueError, match="unknown precision 'fp8'; use one of auto, fp32, no"):
        precision.canonical("fp8")


@pytest.mark.parametrize(
    "device, bf16, expected",
    [
        ("cuda", True, "bf16"),  # A100, H100
        ("cuda", False, "fp16"),  # T4 (Kaggle): no bf16
        ("cpu", True, "bf16"),  # AMX or AVX512-BF16
        ("cpu", False, "fp32"),
    ],
)
def test_auto_is_bf16_where_native_fp16_on_older_gpus_else_fp32(monkeypatch, device, bf16, expected):
    monkeypatch.setattr(precision, "native_bf16", lambda device_type: bf16)
    assert precision.resolve("auto", device) == expected
    assert precision.resolve("float32", device) == "fp32"  # an explicit choice is kept


def test_names_for_each_library():
    assert [precision.accelerate_name(p) for p in ("fp32", "no", "fp16", "bf16")] == ["no", "no", "fp16", "bf16"]
    assert [precision.tei_name(p) for p in ("fp32", "fp16", "bf16")] == ["float32", "float16", "bfloat16"]
    assert precision.torch_dtype("bfloat16") is torch.bfloat16


def test_the_cpu_probe_agrees_with_torch():
    expected = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    assert precision.native_bf16("cpu") == expected
