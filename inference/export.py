"""`python -m inference.export CHECKPOINT_DIR --runtime openvino`: convert and measure a checkpoint for an optimized CPU
runtime now, so the service's first start only compiles; with onnxruntime, also onnx/model.onnx in the folder (the
layout other servers load: inference/runtimes/onnx_folder.py).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from contract.errors import UserError
from contract.help import HelpFormatter, prog
from contract.runtimes import RUNTIMES
from inference import logs

logger = logging.getLogger("inference")
DESCRIPTION = (
    "Convert a checkpoint for an optimized CPU runtime now, so the service's first start only compiles. With "
    "onnxruntime, also write onnx/model.onnx into the folder (fp32, output `logits`): the file TEI's CPU image, "
    "Triton's ONNX Runtime backend and transformers.js load."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog("inference.export"), description=DESCRIPTION, formatter_class=HelpFormatter
    )
    parser.add_argument("checkpoint_dir", help="a checkpoint folder (training's output_dir) or save_pretrained folder")
    parser.add_argument("--runtime", required=True, choices=sorted(RUNTIMES), help="the runtime to convert for")
    args = parser.parse_args(argv)
    logs.configure()
    from inference.runtimes.choice import (
        export,  # imported once the arguments are good
    )

    try:
        export(Path(args.checkpoint_dir), args.runtime)
        if args.runtime == "onnxruntime":
            from inference.runtimes import onnx_folder

            onnx_folder.write(Path(args.checkpoint_dir))
    except UserError as exc:
        logger.error("%s", exc)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
