"""ONNX Runtime: the classifier exported to ONNX, int8 by dynamic quantization (no calibration texts), run by an
InferenceSession on the CPU. Loaded through contract/runtimes.py.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from contract import files, precision
from contract.quiet import quiet
from inference.runtimes.logits_only import LogitsOnly

logger = logging.getLogger(__name__)


def version() -> str:
    return ort.__version__


def build(model: torch.nn.Module, example: dict, serving_precision: str, calibration: list[dict], folder: Path) -> Path:
    """model.onnx in `folder`, int8-quantized dynamically when asked."""
    int8 = serving_precision == precision.INT8
    target = folder / files.RUNTIME_ONNX
    exported = folder / "exported.onnx" if int8 else target
    # the exporter logs every pass and warns about torchvision
    chatter = quiet("onnx_ir", "onnxscript", "torch.onnx._internal.exporter._registration")
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), chatter:
        warnings.simplefilter("ignore")  # the exporter's chatter is not ours to show
        program = torch.onnx.export(
            LogitsOnly(model.float().eval()),
            (),
            kwargs=dict(example),
            input_names=list(example),
            output_names=["logits"],
            dynamic_shapes={name: {0: batch, 1: length} for name in example},
            dynamo=True,
        )
    program.save(str(exported))
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        root = logging.getLogger()  # a root-logger hint: silence only that
        root.disabled = True
        try:
            quantize_dynamic(str(exported), str(target), weight_type=QuantType.QInt8)
        finally:
            root.disabled = False
        exported.unlink()
    return target


class Runner:
    """The session: logits as an fp32 tensor."""

    def __init__(self, path: Path, serving_precision: str, threads: int):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        (logits,) = self.session.run(None, {name: batch[name].numpy() for name in self.inputs})
        return torch.from_numpy(np.asarray(logits, dtype=np.float32))
