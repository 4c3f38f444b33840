"""`python -m inference` (`agnews serve`): the service from flags and environment (settings.py).

Loads and checks the model before binding, then runs uvicorn (or N worker processes) and drains on SIGTERM.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path

import uvicorn
from pydantic import ValidationError
from pydantic_settings import CliApp, CliSettingsSource

from contract.cpu import available_cores, busy_share, free_cores
from contract.errors import UsageError, UserError
from contract.help import HelpFormatter, prog
from inference import logs, metrics_port
from inference.front_end import connections, tracing
from inference.settings import Settings, describe_error

logger = logging.getLogger("inference")
LOAD_SAMPLE_S = 0.1  # how long start-up samples the cores' load (training takes longer: its runs last longer)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's (inference/prometheus.py), read as it loads


def main(argv: list[str] | None = None) -> int:
    # OpenMP threads spinning after each parallel region took the cores from the engine's host work and from other
    # programs (4.7x the CPU per answer beside two busy processes): they sleep instead. libgomp reads it as torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        command_line = CliSettingsSource(Settings, cli_prog_name=prog("inference"), formatter_class=HelpFormatter)
        settings = CliApp.run(Settings, cli_args=argv, cli_settings_source=command_line)
    except ValidationError as exc:
        sys.stderr.write(f"inference: error: {describe_error(exc)}\n")
        return 2
    logs.configure(settings.json_output)
    threads = choose_threads(settings)  # said once the model is ready: a refusal before stays one line
    # front-end processes read settings from the environment: flags travel there too
    os.environ.update(settings.environment())
    shared = share_metrics() if settings.workers > 1 else None  # before prometheus-client loads: this process counts
    from inference.engine.service import load_for_start, ready_engine  # imported once the environment is set
    from inference.prometheus import Metrics

    try:
        check_start(settings)
        if settings.otlp_endpoint:
            tracing.require_sdk()
        metrics = Metrics()
        if settings.prometheus_port is not None:  # a taken port stops start-up before loading
            metrics_port.start(settings.hostname, settings.prometheus_port, metrics.exposition)
        engine = ready_engine(settings, load_for_start(settings), metrics)
    except UserError as exc:  # unservable model (1), bad setting (2)
        sys.stderr.write(f"inference: error: {exc}\n")
        return exc.exit_code
    if threads:
        logger.info("%s", threads)
    if shared is not None:
        return serve_front_ends(settings, engine, shared)
    return serve_on_main_thread(settings, engine)


def choose_threads(settings: Settings) -> str | None:
    """TORCH_THREADS unless given: the cores others leave free now, as training chooses (OpenMP threads spinning on
    cores other programs hold made a two-core service 7x slower), less a core for every two front-ends, which
    parse, tokenize and answer beside the engine; the line that says so."""
    if settings.torch_threads is not None:
        return None
    cores, busy = available_cores(), busy_share(LOAD_SAMPLE_S)
    front_ends = settings.workers // 2 if settings.workers > 1 else 0
    settings.use_free_cores(max(1, free_cores(cores, busy) - front_ends))
    beside = f", {front_ends} left to {settings.workers} front-ends" if front_ends else ""
    return (
        f"CPU threads: {settings.threads} of {cores} ({100 * busy:.0f} % of the cores busy with other programs"
        f"{beside}; TORCH_THREADS sets it)"
    )


def share_metrics() -> tuple[str, bool]:
    """Every process's metrics in one multiprocess folder (PROMETHEUS_MULTIPROC_DIR, else a temporary one): the
    folder, and whether it is ours to remove."""
    folder = os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower())  # as metrics.multiprocess_dir
    if folder:
        os.environ[MULTIPROC_ENV] = folder
        Path(folder).mkdir(parents=True, exist_ok=True)  # a cluster names it on an empty volume
        for stale in Path(folder).glob("*.db"):
            stale.unlink()
        return folder, False
    folder = tempfile.mkdtemp(prefix="inference-metrics-")
    os.environ[MULTIPROC_ENV] = folder
    return folder, True


def check_start(settings: Settings) -> None:
    """A taken API port, said before the model loads."""
    with socket.socket(socket.AF_INET6 if ":" in settings.hostname else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind((settings.hostname, settings.port))
        except OSError as exc:
            raise UsageError(f"PORT: cannot listen on {settings.hostname}:{settings.port} ({exc.strerror})") from None


def connection_limits(settings: Settings) -> dict:
    """uvicorn's bounds on connections: count (probes past it), read time, idle time, drain time, head size."""
    return {
        "http": connections.BoundedReads,
        "limit_concurrency": settings.max_connections,
        "timeout_keep_alive": settings.keep_alive_timeout_s,
        "timeout_graceful_shutdown": settings.graceful_shutdown_s,
        "h11_max_incomplete_event_size": 64 * 1024,
    }


def serve_front_ends(settings: Settings, engine, shared: tuple[str, bool]) -> int:
    """The engine here, WORKERS front-ends (uvicorn's workers, which never load the model) linked to it over one
    socket: one model, batched across every client. SIGTERM drains the front-ends, then the engine."""
    from inference.engine.link_server import LinkServer
    from inference.engine.service import Service, begin, end, exit_abandoning_race
    from inference.front_end.link import ENGINE_ENV

    service = Service(settings, engine)
    engine.start()
    begin(service)
    sockets = tempfile.mkdtemp(prefix="inference-engine-")  # only this user may reach the engine's socket
    server = LinkServer(service, f"ipc://{sockets}/engine").start()
    os.environ[ENGINE_ENV] = server.address
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a drained SIGTERM is a success: exit 0
    try:
        uvicorn.run(
            "inference.app:app_from_env",
            factory=True,
            host=settings.hostname,
            port=settings.port,
            workers=settings.workers,
            log_config=None,
            **connection_limits(settings),
        )
    finally:
        server.stop()
        end(service)
        shutil.rmtree(sockets, ignore_errors=True)
        if shared[1]:
            shutil.rmtree(shared[0], ignore_errors=True)
    exit_abandoning_race(0)
    return 0


def serve_on_main_thread(settings: Settings, engine) -> int:
    """uvicorn on a thread, the engine here; signals drain both, exit 0."""
    from inference.app import create_app
    from inference.engine.service import exit_abandoning_race

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, engine=engine),
            host=settings.hostname,
            port=settings.port,
            log_config=None,
            **connection_limits(settings),
        )
    )

    def serve() -> None:
        try:
            server.run()  # stops accepting on should_exit, answers what is queued (lifespan: engine.stop)
        finally:
            engine.stop(timeout=0)  # also when uvicorn could not start

    # uvicorn handles signals on the main thread only
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, server.handle_exit)
    thread = threading.Thread(target=serve, name="uvicorn")
    thread.start()
    engine.serve_forever()
    thread.join()
    code = 0 if server.started else 1
    exit_abandoning_race(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
