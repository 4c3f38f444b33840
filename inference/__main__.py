"""`python -m inference --checkpoint_dir checkpoints --host 0.0.0.0 --port 8000`

Flags override the environment variables of inference/settings.py. The checkpoint is checked here first,
so a missing or broken one stops the command with one line naming the file (exit 1) instead of a traceback.

With one worker process the model runs on this process's main thread and uvicorn's event loop on a second
thread: on CPU, PyTorch's OpenMP kernels run a batch-1 forward ~1.7x slower from any thread other than the
main one (measured in docs/benchmarks.md), which is the whole latency of a lone request.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

import uvicorn

from inference.loading import CheckpointError, LoadedModel, load_configured
from inference.metrics import Metrics
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
    if workers > 1:  # each worker process loads its own copy and runs its engine on a worker thread
        del loaded
        # uvicorn drains on SIGTERM, then re-raises it; a drained shutdown is a success: exit code 0.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        uvicorn.run("inference.app:app", host=host, port=port, workers=workers, timeout_graceful_shutdown=30)
        return 0
    return serve_on_main_thread(settings, loaded, host, port)


def serve_on_main_thread(settings: Settings, loaded: LoadedModel, host: str, port: int) -> int:
    """uvicorn on a side thread, the engine's worker loop here; SIGTERM/SIGINT drain both, then exit 0."""
    from inference.app import create_app, ready_engine  # imported only now that the environment is set

    engine = ready_engine(settings, loaded, Metrics())
    server = uvicorn.Server(uvicorn.Config(create_app(settings, engine=engine), host=host, port=port,
                                           timeout_graceful_shutdown=30))

    def serve() -> None:
        try:
            server.run()  # stops accepting on should_exit, answers what is queued (lifespan: engine.stop)
        finally:
            engine.stop(timeout=0)  # also ends the loop below when uvicorn could not start (port in use)

    # uvicorn installs signal handlers only on the main thread: forward the signals to it ourselves.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, server.handle_exit)
    thread = threading.Thread(target=serve, name="uvicorn")
    thread.start()
    engine.run()
    thread.join()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
