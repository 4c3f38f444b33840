"""The optimized CPU runtimes, each described once by a `Runtime`: what it needs installed, the precisions it serves,
the file its conversion writes and the module that builds and runs it. The dispatcher (inference/runtimes.py) and
its cache know a runtime only through this interface; adding a runtime is one entry here and one module.

A runtime's module is imported only when it serves or is measured (OpenVINO alone takes seconds to import, and
neither is installed by default), so the declarations live here, apart from the code they point to. The module
provides:

    version() -> str                                      part of the conversion cache's key
    build(model, example, precision, calibration, folder) the classifier converted (quantized for int8) into
                                                          `folder`; `calibration`: batches of one text (int8 only)
    Runner(path, precision, threads)                      called with a batch of tensors, returns fp32 logits; one
                                                          thread at a time (the engine's model thread)
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from contract import files, precision

AGREEMENT_BOUND = 0.995  # the share of fp32's decisions a precision other than fp32 must keep to serve


@dataclass(frozen=True)
class Runtime:
    name: str  # BACKEND's value (inference/settings.py)
    needs: tuple[str, ...]  # the import names that must be installed
    precisions: tuple[str, ...]  # what it serves on the CPU, in auto's order of preference
    model_file: str  # what its conversion writes (contract/files.py)
    module: str  # version(), build(), Runner
    calibrated: bool = False  # its int8 is calibrated on texts: the conversion's folder names their digest
    hinted: tuple[str, ...] = ()  # precisions served from the fp32 conversion by a compile-time hint

    def installed(self) -> bool:
        return all(importlib.util.find_spec(name) is not None for name in self.needs)

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def folder(self, serving_precision: str, calibration_digest: str) -> str:
        """The name of the conversion that serves `serving_precision`, in the cache's folder."""
        converted = precision.FP32 if serving_precision in self.hinted else serving_precision
        if self.calibrated and converted == precision.INT8:
            return f"{self.name}-{converted}-{calibration_digest}"
        return f"{self.name}-{converted}"


OPENVINO = Runtime(
    name="openvino",
    needs=("openvino", "nncf"),
    precisions=(precision.INT8, precision.BF16, precision.FP32),
    model_file=files.RUNTIME_MODEL,
    module="inference.openvino_runtime",
    calibrated=True,  # NNCF post-training quantization
    hinted=(precision.BF16,),
)
ONNXRUNTIME = Runtime(
    name="onnxruntime",
    needs=("onnxruntime", "onnx", "onnxscript"),
    precisions=(precision.INT8, precision.FP32),  # int8: dynamic quantization, no calibration texts
    model_file=files.RUNTIME_ONNX,
    module="inference.onnx_runtime",
)
RUNTIMES = {runtime.name: runtime for runtime in (OPENVINO, ONNXRUNTIME)}  # in auto's order among equals
