"""The optimized CPU runtimes, each declared once: what it needs, what it serves, the module that builds and runs it.
inference/runtimes/ knows a runtime only through this.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from contract import files, precision

AGREEMENT_BOUND = 0.995  # share of fp32's decisions a lower precision must keep


@dataclass(frozen=True)
class Runtime:
    name: str  # BACKEND's value (inference/settings.py)
    needs: tuple[str, ...]  # the import names that must be installed
    precisions: tuple[str, ...]  # in auto's order of preference
    model_file: str  # what its conversion writes (contract/files.py)
    module: str  # version(), build(), Runner
    calibrated: bool = False  # int8 calibration texts: their digest names the folder
    hinted: tuple[str, ...] = ()  # precisions served from the fp32 conversion by a compile-time hint

    def installed(self) -> bool:
        return all(importlib.util.find_spec(name) is not None for name in self.needs)

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def folder(self, serving_precision: str, calibration_digest: str) -> str:
        """The cache folder name of a conversion."""
        converted = precision.FP32 if serving_precision in self.hinted else serving_precision
        if self.calibrated and converted == precision.INT8:
            return f"{self.name}-{converted}-{calibration_digest}"
        return f"{self.name}-{converted}"


OPENVINO = Runtime(
    name="openvino",
    needs=("openvino", "nncf"),
    precisions=(precision.INT8, precision.BF16, precision.FP32),
    model_file=files.RUNTIME_MODEL,
    module="inference.runtimes.openvino",
    calibrated=True,  # NNCF post-training quantization
    hinted=(precision.BF16,),
)
ONNXRUNTIME = Runtime(
    name="onnxruntime",
    needs=("onnxruntime", "onnx", "onnxscript"),
    precisions=(precision.INT8, precision.FP32),  # int8: dynamic quantization, no calibration texts
    model_file=files.RUNTIME_ONNX,
    module="inference.runtimes.onnx",
)
RUNTIMES = {runtime.name: runtime for runtime in (OPENVINO, ONNXRUNTIME)}  # in auto's order among equals
