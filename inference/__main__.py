"""`python -m inference --checkpoint_dir checkpoints --host 0.0.0.0 --port 8000`

Flags override the environment variables of inference/settings.py. The checkpoint is checked here first,
so a missing or broken one stops the command with one line naming the file (exit 1) instead of a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

import uvicorn

from inference.loading import CheckpointError, load_configured
from inference.settings import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint_dir")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (each loads the model)")
    for name in ("max_client_batch_size", "max_batch_size", "max_queue_size", "torch_threads"):
        parser.add_argument(f"--{name}", type=int)
    parser.add_argument("--max_wait_ms", type=float)
    parser.add_argument("--reload_interval_s", type=float)
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    args = vars(parser.parse_args(argv))
    host, port, workers = args.pop("host"), args.pop("port"), args.pop("workers")
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    try:
        settings = Settings.from_env(**args)
        loaded = load_configured(settings.checkpoint_dir, settings.device, settings.precision)
    except (CheckpointError, ValueError) as exc:
        sys.stderr.write(f"inference: error: {exc}\n")
        return 1
    # Worker processes (and the module-level app of inference.app) read their settings from the environment.
    for name, value in vars(settings).items():
        os.environ[name.upper()] = str(value)
    # uvicorn drains on SIGTERM (stops accepting, answers queued requests, runs the lifespan shutdown), then
    # restores the previous handler and re-raises the signal. A drained shutdown is a success: this handler
    # turns that last re-raise (or a SIGTERM during start-up) into exit code 0.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if workers == 1:  # serve the model checked above; imported only now that the environment is set
        from inference.app import create_app

        app = create_app(settings, preloaded=loaded)
        uvicorn.run(app, host=host, port=port, timeout_graceful_shutdown=30)
    else:  # each worker process loads its own copy
        del loaded
        uvicorn.run("inference.app:app", host=host, port=port, workers=workers, timeout_graceful_shutdown=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
