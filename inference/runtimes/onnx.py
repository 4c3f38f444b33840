"""ONNX Runtime, the other optimized CPU runtime: the classifier exported to ONNX (`torch.onnx.export`, batch and
length dynamic), quantized to int8 by ONNX Runtime's dynamic quantization when asked (int8 weights, activations
quantized per batch at run time: no calibration texts), and run by an InferenceSession on the CPU.

Imported only when ONNX Runtime serves or is measured (`pip install 'distilbert-agnews[onnxruntime]'`). Like
OpenVINO, a session releases the GIL and runs as fast on a worker thread as on the main thread.
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

logger = logging.getLogger(__name__)


def version() -> str:
    return ort.__version__


class _Logits(torch.nn.Module):
    """The classifier with its logits as the one output (the exporter flattens a ModelOutput otherwise)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ):
        pair = {} if token_type_ids is None else {"token_type_ids": token_type_ids}  # a BERT's; DistilBERT has none
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **pair).logits


def build(model: torch.nn.Module, example: dict, serving_precision: str, calibration: list[dict], folder: Path) -> Path:
    """model.onnx in `folder` (contract/runtimes.py's interface): the exported classifier, fed the names in
    `example`, quantized for int8 (dynamically: `calibration` is not needed)."""
    int8 = serving_precision == precision.INT8
    target = folder / files.RUNTIME_ONNX
    exported = folder / "exported.onnx" if int8 else target
    # The exporter's passes log every step at INFO, and it warns that torchvision's operators (never used here)
    # cannot be registered when torchvision is not installed.
    chatter = quiet("onnx_ir", "onnxscript", "torch.onnx._internal.exporter._registration")
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), chatter:
        warnings.simplefilter("ignore")  # the exporter's progress lines and deprecation notes are not ours to show
        program = torch.onnx.export(
            _Logits(model.float().eval()),
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

        root = logging.getLogger()  # it logs "consider pre-processing" on the root logger itself: silence only that
        root.disabled = True
        try:
            quantize_dynamic(str(exported), str(target), weight_type=QuantType.QInt8)
        finally:
            root.disabled = False
        exported.unlink()
    return target


class Runner:
    """The session, called by one thread at a time (the engine's worker): logits as an fp32 tensor."""

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
