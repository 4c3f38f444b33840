"""The running service's state and lifespan: load once, serve, reload, drain."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import torch
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from tokenizers import Tokenizer

from contract import precision
from contract.adapters import SharedBase
from contract.loading import CheckpointError, LoadedModel, load_model
from contract.long_text import CHUNK, LongTextError
from inference import logs, memory, prometheus, tei_errors
from inference.answers import Encoded, ModelView
from inference.encoding import spec_of, window_length
from inference.engine import agreement_guard
from inference.engine.reload import CheckpointWatcher, read_from
from inference.engine.scheduler import Engine, Limits, warm_up
from inference.front_end.link import AppState, spare_copy
from inference.prometheus import Metrics
from inference.runtimes import choice as runtimes
from inference.settings import Settings, SettingsError

RACE_THREAD = "runtime-race"  # the thread measuring runtimes in the background (MEASURE_IN_BACKGROUND)
logger = logging.getLogger("inference")


class Service(AppState):
    """The engine's process: settings, metrics, the engine once ready, hot reload and the runtime race; the routes
    of this process reach it through a LocalLink."""

    def __init__(self, settings: Settings, engine: Engine | None = None):
        super().__init__(settings, engine.metrics if engine else Metrics(), LocalLink(self))
        self.engine = engine
        self.ready = False
        self.reloads = 0
        self.watcher: CheckpointWatcher | None = None
        self.owns_process = False  # app_from_env: the process ends when uvicorn returns (exit_abandoning_race)
        # reload and the runtime race swap one at a time, so older weights never return
        self._swapping = threading.Lock()
        self._view: ModelView | None = None

    def why_not_serving(self) -> str | None:
        if not self.ready or self.engine is None:
            return "the model is not loaded yet"
        return None if self.engine.alive else "the inference worker has stopped"

    def why_not_ready(self) -> str | None:
        """/ready: serving, and watching when asked."""
        if why := self.why_not_serving():
            return why
        if self.watcher is not None and not self.watcher.is_alive():
            return "the checkpoint watcher has stopped: new checkpoints will not be served"
        return None

    def view(self) -> ModelView | None:
        """What the routes know of the served model (answers.ModelView), one per version; None while none serves."""
        if self.why_not_serving():
            return None
        loaded = self.engine.current  # first the model, then its version: never a view of one under another's number
        version = self.engine.version_of(loaded)
        if self._view is None or self._view.version != version:
            self._view = view_of(loaded, version, self.settings, self.reloads)
        return self._view

    def encoding(self, adapter: str | None) -> dict:
        """What a front-end tokenizes with for the served model (or its adapter) and the version it belongs to
        (front_end/encoder.py): the engine then takes its ids as they come."""
        loaded = self.engine.current
        version = self.engine.version_of(loaded)
        spec = spec_of(loaded.named(adapter))
        self.engine.know_encoding(version, adapter, spec["digest"])
        return {**spec, "version": version}

    def serialized_tokenizer(self) -> str:
        """The served tokenizer as JSON (link.spare_copy rebuilds it), or TEI's Tokenizer error without a fast one."""
        backend = getattr(self.engine.current.tokenizer, "backend_tokenizer", None)
        if backend is None:  # a Python-only tokenizer (no `tokenizers` backend): TEI serves none either
            raise tei_errors.ServiceError(
                tei_errors.TOKENIZER, "this model's tokenizer has no fast (Rust) backend to copy"
            )
        return backend.to_str()

    def watcher_exited(self) -> None:
        self.metrics.watcher_up.set(0)
        if self.ready:
            logger.error("The checkpoint watcher of %s has stopped; /ready now fails.", self.settings.model_id)

    def swap_in(self, loaded: LoadedModel) -> None:
        """A checked, warmed-up reload replaces the served model."""
        with self._swapping:
            self._swap(loaded, reload=True)

    def settle_runtime(self, loaded: LoadedModel) -> None:
        """The background runtime replaces fp32 if the weights still serve."""
        with self._swapping:
            if not self.ready or self.engine is None or self.engine.current.sha256 != loaded.sha256:
                return
            self._swap(loaded, reload=False)

    def _swap(self, loaded: LoadedModel, reload: bool) -> None:
        check_servable(self.settings, loaded)
        warm_up(loaded, self.engine.limits)
        if reload:  # counted before /info shows the weights
            self.reloads += 1
            self.metrics.reloads.labels("ok").inc()
        self.engine.swap(loaded)
        served = f"{loaded.runtime} {loaded.precision}"
        logger.info("Now serving %s (sha256 %s, %s)", loaded.weights_file, loaded.sha256[:12], served)
        memory.freeze_long_lived()  # new objects out of the collector's walks

    def refused(self) -> None:
        self.metrics.reloads.labels("failed").inc()


class LocalLink:
    """The engine in this process (WORKERS=1): the routes call it directly."""

    def __init__(self, service: Service):
        self.service = service
        self._tokenizer: tuple[int, Tokenizer] | None = None

    @property
    def view(self) -> ModelView | None:
        return self.service.view()

    def submit(self, encoded: Encoded, scoring: str | None, adapter: str | None = None) -> asyncio.Future:
        return self.service.engine.submit(encoded, scoring, adapter)

    async def encoding(self, adapter: str | None) -> dict:
        return self.service.encoding(adapter)

    async def admit(self, inputs: int) -> None:
        self.service.engine.admit(inputs)

    def leave(self, inputs: int) -> None:
        self.service.engine.leave(inputs)

    def why_not_serving(self) -> str | None:
        return self.service.why_not_serving()

    async def why_not_ready(self) -> str | None:
        return self.service.why_not_ready()

    async def tokenizer(self) -> Tokenizer:
        version = self.service.engine.version_of(self.service.engine.current)
        if self._tokenizer is None or self._tokenizer[0] != version:
            self._tokenizer = (version, spare_copy(self.service.serialized_tokenizer()))
        return self._tokenizer[1]


def view_of(loaded: LoadedModel, version: int, settings: Settings, reloads: int) -> ModelView:
    adapters = {name: view_of(one, version, settings, reloads) for name, one in loaded.adapters.items()}
    return ModelView(
        adapters=adapters,
        version=version,
        labels=list(loaded.labels),
        max_length=loaded.max_length,
        window=window_length(loaded),
        chunks=chunks_long_texts(settings, loaded),
        long_text=loaded.long_text.config_fields(),
        problem=loaded.problem.name,
        decides=loaded.problem.decides,
        thresholds=list(loaded.problem.thresholds),
        review_band=loaded.problem.band_record(),
        device=str(loaded.device),
        precision=loaded.precision,
        runtime=getattr(loaded, "report", {}),
        model_sha=loaded.model_sha,
        folder=str(loaded.folder),
        weights_file=loaded.weights_file,
        sha256=loaded.sha256,
        loaded_at=getattr(loaded, "loaded_at", time.time()),
        metrics=loaded.metrics,
        reloads=reloads,
        torch_threads=torch.get_num_threads(),
        agreement=loaded.agreement,
    )


def load_configured(settings: Settings) -> runtimes.ServedModel:
    """The model in the configured runtime and precision (with LORA_ADAPTERS: beside its adapters, on torch)."""
    if settings.adapters():
        return _with_adapters(settings)
    return runtimes.choose_runtime(_fp32(settings), settings)


def load_for_start(settings: Settings) -> runtimes.ServedModel:
    """As load_configured, but a first measurement runs in the background while fp32 serves."""
    if settings.adapters():
        return _with_adapters(settings)
    loaded = _fp32(settings)
    if settings.measure_in_background and runtimes.needs_measuring(loaded, settings):
        return runtimes.provisional(loaded)
    return runtimes.choose_runtime(loaded, settings)


def _fp32(settings: Settings, shared: SharedBase | None = None) -> LoadedModel:
    loaded = load_model(
        settings.model_id, device=settings.device, dtype=precision.FP32, revision=settings.revision, shared=shared
    )
    agreement_guard.check(settings, loaded)
    return loaded


def _with_adapters(settings: Settings) -> runtimes.ServedModel:
    """MODEL_ID's adapter and LORA_ADAPTERS' on one copy of their base."""
    shared = SharedBase()
    loaded = _fp32(settings, shared)
    adapters = {
        name: load_model(folder, device=settings.device, dtype=precision.FP32, shared=shared)
        for name, folder in settings.adapters().items()
    }
    return runtimes.with_adapters(loaded, adapters, settings)


def measure_in_background(service: Service) -> threading.Thread | None:
    """Measure on a thread, then swap the chosen runtime in; a failure keeps fp32 serving."""
    if not service.engine.current.report.get("provisional"):
        return None

    def measure() -> None:
        try:
            service.settle_runtime(load_configured(service.settings))
        except Exception as exc:  # noqa: BLE001 - any runtime's own error; fp32 keeps serving
            logger.warning(
                "Runtime: measuring in the background failed (%s: %s); torch fp32 keeps serving",
                type(exc).__name__,
                exc,
            )

    thread = threading.Thread(target=measure, name=RACE_THREAD, daemon=True)
    thread.start()
    if service.owns_process:  # `uvicorn inference.app:app_from_env --factory`: no main() of ours ends the process
        atexit.register(exit_abandoning_race, 0)
    return thread


def exit_abandoning_race(code: int) -> None:
    """Exit now if a background conversion still runs: finalising around its native threads aborts the process."""
    if not any(t.name == RACE_THREAD and t.is_alive() for t in threading.enumerate()):
        return
    logger.info("Runtime: the background measurement is abandoned at shutdown; the next start measures again")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def chunks_long_texts(settings: Settings, loaded: LoadedModel) -> bool:
    """LONG_TEXT, else what the model's config.json records (contract/long_text.py)."""
    return (settings.long_text or loaded.long_text.mode) == CHUNK


def check_chunking(settings: Settings, loaded: LoadedModel) -> None:
    """A chunked model can window its inputs."""
    if not chunks_long_texts(settings, loaded):
        return
    try:
        replace(loaded.long_text, mode=CHUNK).check(loaded.tokenizer, window_length(loaded))
    except LongTextError as exc:
        raise SettingsError(f"LONG_TEXT=chunk cannot serve {loaded.model_id}: {exc}") from None


def check_servable(settings: Settings, loaded: LoadedModel) -> None:
    """The settings can serve this model and its adapters (at start and reload)."""
    for one in loaded.all_served():
        if getattr(one.tokenizer, "backend_tokenizer", None) is None:
            raise SettingsError(
                f"{one.folder}: its tokenizer has no fast (Rust) backend, which the front-ends tokenize with; save a "
                "tokenizer.json beside it (AutoTokenizer.from_pretrained(...).save_pretrained(...) converts one)"
            )
        if settings.max_batch_tokens < one.max_length:
            adapter = "" if one is loaded else f", adapter {one.folder}"
            raise SettingsError(
                f"MAX_BATCH_TOKENS: must be at least the model's maximum input length "
                f"({one.max_length}{adapter}), got {settings.max_batch_tokens}"
            )
        check_chunking(settings, one)


def ready_engine(settings: Settings, loaded: LoadedModel, service_metrics: Metrics) -> Engine:
    """Threads set, limits checked, the model warmed up: an Engine."""
    check_servable(settings, loaded)
    torch.set_num_threads(settings.threads)
    memory.keep_large_blocks_off_the_heap()  # RSS stays flat under varied batch shapes (inference/memory.py)
    cuda = loaded.device.type == "cuda"
    limits = Limits(
        max_batch_requests=settings.max_batch_requests,
        max_batch_tokens=settings.max_batch_tokens,
        max_concurrent_requests=settings.max_concurrent_requests,
        max_wait_ms=settings.max_wait_ms,
        max_chunks=settings.max_chunks,
        static_shapes=cuda if settings.static_shapes is None else settings.static_shapes,
        tokenizer_thread=cuda if settings.tokenizer_thread is None else settings.tokenizer_thread,
    )
    warm_up(loaded, limits)
    return Engine(loaded, limits, service_metrics)


def _watcher(service: Service) -> CheckpointWatcher | None:
    """Hot reload, for a local folder (and the folders of its adapters)."""
    settings, served = service.settings, service.engine.current
    if settings.reload_interval_s <= 0 or served.model_sha is not None or not Path(settings.model_id).is_dir():
        return None
    adapter_dirs = tuple(str(one.folder) for one in served.adapters.values())
    watcher = CheckpointWatcher(
        str(served.folder),
        settings.reload_interval_s,
        read_from(served, adapter_dirs),
        load=lambda: load_configured(settings),
        on_loaded=service.swap_in,
        on_failed=service.refused,
        on_exit=service.watcher_exited,
        adapter_dirs=adapter_dirs,
    )
    service.metrics.watcher_up.set(1)
    watcher.start()
    return watcher


def begin(service: Service) -> None:
    """The engine serves: hot reload watched, the runtime race started, /ready true."""
    service.watcher = _watcher(service)
    served = service.engine.current
    memory.freeze_long_lived()  # what start-up made: no garbage-collection pause walks it under load
    service.ready = True
    measure_in_background(service)
    logger.info(
        "Ready: %s on %s (%s %s), labels %s",
        served.weights_file,
        served.device,
        served.runtime,
        served.precision,
        ", ".join(served.labels),
    )
    for name, adapter in served.adapters.items():
        logger.info("Adapter %s on the same base: %s, labels %s", name, adapter.folder, ", ".join(adapter.labels))


def end(service: Service) -> None:
    """Stop watching, then answer every queued request before the process exits."""
    service.ready = False  # set first: the watcher's end at shutdown is no error
    if service.watcher:
        service.watcher.stop()
    service.engine.stop()


@asynccontextmanager
async def lifespan(app: FastAPI):
    service: Service = app.state.service
    logs.configure(service.settings.json_output)
    if service.engine is None:  # the factory loads here
        try:
            loaded = await run_in_threadpool(load_for_start, service.settings)
            service.engine = await run_in_threadpool(ready_engine, service.settings, loaded, service.metrics)
        except (CheckpointError, SettingsError) as exc:
            logger.error("Cannot serve %s: %s", service.settings.model_id, exc)
            raise
        service.engine.start()
    begin(service)
    yield
    await run_in_threadpool(end, service)
    if getattr(app.state, "tracing", None):
        await run_in_threadpool(app.state.tracing.shut_down)  # the last spans, within a bound
    prometheus.worker_exited()
