"""OpenVINO: the classifier converted from PyTorch, int8-quantized by NNCF on calibration texts, saved as IR and
compiled for the CPU. Loaded through contract/runtimes.py.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import openvino as ov
import torch

from contract import files, precision
from contract.quiet import quiet
from inference.runtimes import signal_stack
from inference.runtimes.logits_only import LogitsOnly

logger = logging.getLogger(__name__)

_HINTS = {precision.FP32: "f32", precision.BF16: "bf16"}  # int8: the runtime's default for what is not quantized


def version() -> str:
    return ov.get_version()


def build(model: torch.nn.Module, example: dict, serving_precision: str, calibration: list[dict], folder: Path) -> Path:
    """model.xml in `folder`, int8-quantized on `calibration` when asked."""
    converted = convert(model, example)
    if serving_precision == precision.INT8:
        names = input_names(converted)  # a BERT tokenizer's token_type_ids may not be
        converted = quantize(converted, [{k: batch[k].numpy() for k in names} for batch in calibration])
    return save(converted, folder)


def convert(model: torch.nn.Module, example: dict[str, torch.Tensor]) -> ov.Model:
    """The classifier as a dynamic-shape OpenVINO model."""
    # the tracer's probing makes transformers warn about an unused loss
    with torch.no_grad(), warnings.catch_warnings(), quiet("transformers.modeling_utils"):
        warnings.simplefilter("ignore")  # shape branches: the graph stays dynamic
        return ov.convert_model(LogitsOnly(model.float().eval()), example_input=example)


def input_names(model: ov.Model | ov.CompiledModel) -> list[str]:
    return [port.get_any_name() for port in model.inputs]


def quantize(model: ov.Model, samples: list[dict[str, np.ndarray]]) -> ov.Model:
    """int8 weights and activations by NNCF, calibrated on `samples`."""
    import nncf  # 4 s to import: only when quantizing

    nncf.set_log_level(logging.WARNING)
    with signal_stack.kept():  # NNCF compiles the model on the CPU plugin to calibrate
        return nncf.quantize(
            model,
            nncf.Dataset(samples),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(samples),
        )


def save(model: ov.Model, folder: Path) -> Path:
    """IR in `folder`, weights uncompressed (fp16 would change answers)."""
    xml = folder / files.RUNTIME_MODEL
    ov.save_model(model, str(xml), compress_to_fp16=False)
    return xml


class Runner:
    """The compiled model: logits as an fp32 tensor."""

    def __init__(self, xml: Path, serving_precision: str, threads: int):
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
        if serving_precision in _HINTS:
            config["INFERENCE_PRECISION_HINT"] = _HINTS[serving_precision]
        with signal_stack.kept():  # keep this thread's signal stack (signal_stack.py)
            self.compiled = ov.Core().compile_model(str(xml), "CPU", config)
        self.inputs = input_names(self.compiled)
        self.request = self.compiled.create_infer_request()

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        result = self.request.infer({name: batch[name].numpy() for name in self.inputs}, share_inputs=True)
        return torch.from_numpy(np.array(result[0], dtype=np.float32))
