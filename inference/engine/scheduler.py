"""Micro-batching: concurrent requests share forward passes, run off the event loop. Called by the routes.

One model thread gathers queued jobs into micro-batches, tokenizes, runs the passes and answers each job's future.
docs/serving.md tells the policy.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from contract import scoring, shapes
from contract.loading import LoadedModel
from contract.model_call import forward
from inference.answers import Answer, Encoded, NonFinite, Overloaded, Stale
from inference.encoding import encode, spec_of
from inference.engine import captured
from inference.engine.captured import CapturedForward, GraphsUnsupported
from inference.engine.passes import forward_buckets, static_passes
from inference.prometheus import Metrics

logger = logging.getLogger(__name__)
# Idle wake-ups let the main thread run SIGTERM's handler: a wait without timeout would hold it until the next request.
IDLE_WAKE_S = 0.25
READY_BATCHES = 2  # enough to overlap, few enough to hold memory
BUSY_WINDOW_S = 1.0  # te_engine_busy_ratio's window


@dataclass(frozen=True)
class Limits:
    max_batch_requests: int = 32
    max_batch_tokens: int = 16384
    max_concurrent_requests: int = 512
    max_wait_ms: float = 5.0
    max_chunks: int = 16  # windows per input when a job chunks long texts
    static_shapes: bool = False  # fixed (rows, width) passes; CUDA graphs on CUDA
    tokenizer_thread: bool = False  # tokenize beside the forward passes (CUDA)


@dataclass(eq=False)
class _Job:
    encoded: Encoded  # the inputs as a front-end tokenized them
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    scoring: str | None = None  # softmax, sigmoid, none; None: the model's problem type decides
    adapter: str | None = None  # the served model's adapter of this name (LORA_ADAPTERS); None: the model itself
    enqueued: float = field(default_factory=time.perf_counter)
    features: list[dict] = field(default_factory=list)  # one tokenized window each: input_ids (+ token_type_ids)
    queued: bool = True  # queued until the model thread takes it

    @property
    def inputs(self) -> int:
        return self.encoded.inputs

    @property
    def owner(self) -> list[int]:
        return self.encoded.owner

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.encoded.ids)

    @property
    def abandoned(self) -> bool:
        return self.future.done()  # cancelled: the client went away


_STOP = object()


class Engine:
    def __init__(self, loaded: LoadedModel, limits: Limits, metrics: Metrics):
        self.current = loaded
        self.version = 1
        self._versions = {id(loaded): 1}
        self.limits = limits
        self.metrics = metrics
        self._queue: queue.Queue = queue.Queue()  # jobs, waiting to be gathered
        self._ready: queue.Queue = queue.Queue(maxsize=READY_BATCHES)  # from the gathering thread, for the model
        self._in_flight = 0
        self._lock = threading.Lock()
        self._carry = None
        self._last_jobs = self._last_inputs = 0  # the last micro-batch's requests and inputs
        self._encodings: dict[tuple[int, str | None], str] = {}  # (version, adapter): the encoding's digest
        self.busy = BusyShare(metrics)
        self._running = threading.Event()
        self._finished = threading.Event()

    # ------------------------------------------------------------------------------- event-loop side

    @property
    def alive(self) -> bool:
        return self._running.is_set() and not self._finished.is_set()

    def start(self) -> None:
        """Run the worker on a new thread."""
        threading.Thread(target=self.serve_forever, name="inference-worker", daemon=True).start()

    def stop(self, timeout: float = 30) -> None:
        """Finish queued jobs, then end the worker."""
        self._queue.put(_STOP)
        self._finished.wait(timeout)

    def swap(self, loaded: LoadedModel) -> None:
        self._versions = {id(self.current): self.version, id(loaded): self.version + 1}  # the two a batch may use
        self.version += 1
        self.current = loaded  # one reference assignment: atomic; the worker reads it per micro-batch

    def version_of(self, loaded: LoadedModel) -> int:
        """The version the routes know a model by (answers.ModelView): one per model swapped in."""
        return self._versions.get(id(loaded), self.version)

    def submit(self, encoded: Encoded, scoring: str | None = None, adapter: str | None = None) -> asyncio.Future:
        """Queue a front-end's encoded inputs for the model or its adapter of that name; the future gets their Answer
        or the refusal (Stale: encoded for a tokenizer no longer served). Cancelling drops an unstarted job. Raises
        Overloaded at once. Call from the event loop."""
        loop = asyncio.get_running_loop()
        if adapter is not None and adapter not in self.current.adapters:  # the routes check names first
            refused = loop.create_future()
            refused.set_exception(LookupError(f"no adapter named {adapter!r} is served"))
            return refused
        self.admit(encoded.inputs)
        job = _Job(encoded, loop, loop.create_future(), scoring, adapter)
        job.future.add_done_callback(lambda _: self.leave(encoded.inputs))
        self.metrics.queue_size.inc(encoded.inputs)
        self._queue.put(job)
        return job.future

    def know_encoding(self, version: int, adapter: str | None, digest: str) -> None:
        """The encoding a front-end was given for `version` (Service.encoding): jobs encoded by it stay good for a
        later version that encodes the same (a reload of new weights, same tokenizer and limits)."""
        self._encodings[version, adapter] = digest

    def _stale(self, job: _Job, loaded: LoadedModel) -> bool:
        """Encoded for another version whose encoding differs from the served one's (or is unknown)."""
        if job.encoded.version == self.version_of(loaded):
            return False
        theirs = self._encodings.get((job.encoded.version, job.adapter))
        return theirs != spec_of(loaded.named(job.adapter))["digest"]  # computed once per model

    def admit(self, inputs: int) -> None:
        """Count `inputs` in flight, or raise Overloaded past max_concurrent_requests; leave() when answered."""
        with self._lock:
            if self._in_flight + inputs > self.limits.max_concurrent_requests:
                raise Overloaded(
                    f"{self._in_flight} inputs are in flight (limit max_concurrent_requests = "
                    f"{self.limits.max_concurrent_requests}); retry later"
                )
            self._in_flight += inputs

    def leave(self, inputs: int) -> None:
        with self._lock:
            self._in_flight -= inputs

    # ---------------------------------------------------------------------------------- worker side

    def serve_forever(self) -> None:
        """The model thread's loop until stop(); queued jobs answered first. Its busy share and host time per batch
        are measured (/metrics: te_engine_busy_ratio, te_engine_host_duration)."""
        self._running.set()
        try:
            for jobs in self._batches():
                started = time.perf_counter()
                forward_s = self._answer_batch(jobs)
                busy_s = time.perf_counter() - started
                self.metrics.engine_host.observe(max(0.0, busy_s - forward_s))
                self.busy.add(busy_s)
        finally:
            self._finished.set()

    def _batches(self):
        """Gathered micro-batches until stop(): on this thread, or (TOKENIZER_THREAD) on one of their own, ahead."""
        if not self.limits.tokenizer_thread:
            yield from self._gathered()
            return
        threading.Thread(target=self._gather_loop, name="inference-gather", daemon=True).start()
        while True:
            try:
                jobs = self._ready.get(timeout=IDLE_WAKE_S)  # in slices: see IDLE_WAKE_S
            except queue.Empty:
                self.busy.add(0.0)  # an idle engine's share falls too
                continue
            if jobs is _STOP:
                return
            yield jobs

    def _gathered(self):
        """Micro-batches of live jobs with their features until stop() (the queue drained first)."""
        while (jobs := self._gather()) is not None:
            for job in jobs:
                job.features = job.encoded.features()
            yield jobs

    def _gather_loop(self) -> None:
        try:
            for jobs in self._gathered():
                self._ready.put(jobs)
        finally:
            self._ready.put(_STOP)  # the model thread answers the last batch, then ends

    def _next(self, deadline: float | None):
        """The next live job, or None by `deadline`."""
        while True:
            timeout = IDLE_WAKE_S if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                job = self._queue.get(timeout=timeout)
            except queue.Empty:
                if deadline is None:
                    if not self.limits.tokenizer_thread:  # this is the model thread, idle
                        self.busy.add(0.0)
                    continue
                return None
            if job is _STOP:
                return job
            if not job.abandoned:  # a gone client costs nothing
                return job
            self._leave_queue(job)

    def _leave_queue(self, job: _Job) -> None:
        if job.queued:
            job.queued = False
            self.metrics.queue_size.dec(job.inputs)

    def _gather(self) -> list[_Job] | None:
        """One micro-batch, or None once stopped and drained."""
        first, self._carry = self._carry or self._next(None), None
        if first is _STOP:
            return None
        jobs, inputs = [first], first.inputs
        # Wait for company only under concurrent load, and only up to the last batch's size: a lone client never pays
        # the window, and a few clients do not pay it every time.
        deadline = time.monotonic() + (self.limits.max_wait_ms / 1000 if self._last_jobs > 1 else 0.0)
        while inputs < self.limits.max_batch_requests:
            job = self._next(deadline if inputs < self._last_inputs else time.monotonic())
            if job is None:
                break
            if job is _STOP or inputs + job.inputs > self.limits.max_batch_requests:
                self._carry = job  # starts the next micro-batch
                break
            jobs.append(job)
            inputs += job.inputs
        self._last_jobs, self._last_inputs = len(jobs), inputs
        return jobs

    # ---------------------------------------------------------------------------------- model thread

    def _answer_batch(self, jobs: list[_Job]) -> float:
        """The micro-batch run and answered; the seconds its forward passes took."""
        for job in jobs:
            self._leave_queue(job)
        jobs = [job for job in jobs if not job.abandoned]  # clients that left while it waited: not run
        if not jobs:
            return 0.0
        served = self.current
        if stale := [job for job in jobs if self._stale(job, served)]:  # a reload swapped the tokenizer or limits
            changed = Stale("the served model changed while this request waited; encode it again")
            _settle([(job, changed) for job in stale])
            if not (jobs := [job for job in jobs if job not in stale]):
                return 0.0
        version = self.version_of(served)
        adapters = dict.fromkeys(job.adapter for job in jobs)  # an adapter's head is its own: a pass each
        return sum(self._run([job for job in jobs if job.adapter == a], served.named(a), version) for a in adapters)

    def _run(self, jobs: list[_Job], loaded: LoadedModel, version: int) -> float:
        """The jobs' passes through `loaded`, then their answers; the passes' seconds."""
        started = time.perf_counter()
        items = sorted(
            ((j, i, f) for j, job in enumerate(jobs) for i, f in enumerate(job.features)),
            key=lambda item: len(item[2]["input_ids"]),
        )
        self.metrics.batch_size.observe(len(items))
        self.metrics.batch_tokens.observe(sum(len(f["input_ids"]) for _, _, f in items))
        try:
            passes = self._passes(items, loaded)
            rows = host_rows([forward(loaded, [f for _, _, f in part], r, w) for part, r, w in passes])
        except Exception as exc:  # noqa: BLE001 - a failed forward answers its callers (424), the worker lives on
            logger.exception("inference failed for a micro-batch of %d requests", len(jobs))
            for job in jobs:
                _resolve(job, exc=exc)
            return time.perf_counter() - started
        finally:
            self.metrics.record_process()
        inference_s = time.perf_counter() - started
        where = {(j, i): row for row, (j, i, _) in enumerate(items)}
        per_job = [rows[[where[j, i] for i in range(len(job.features))]] for j, job in enumerate(jobs)]
        self._answer(jobs, loaded, per_job, (started, inference_s), version)
        return inference_s

    def _passes(self, items: list, loaded: LoadedModel) -> list[tuple[list, int | None, int | None]]:
        """(items, rows, width) per forward pass; None sizes: dynamic shapes."""
        limits = self.limits
        if limits.static_shapes:
            rows, widths = shapes.serving_buckets(limits.max_batch_requests, loaded.max_length)
            return static_passes(items, rows, widths, limits.max_batch_tokens)
        passes = forward_buckets(items, limits.max_batch_requests, limits.max_batch_tokens)
        return [(part, None, None) for part in passes]

    def _answer(self, jobs: list[_Job], loaded: LoadedModel, logits: list[np.ndarray], timing: tuple, version: int):
        """Each job's logits pooled and scored (NumPy, one thread), answered as `version`; one wake-up per loop.
        `timing`: (when the passes started, their seconds)."""
        started, inference_s = timing
        pooling = loaded.long_text.pooling
        pooled = [scoring.pooled(rows, np.asarray(job.owner), job.inputs, pooling) for job, rows in zip(jobs, logits)]
        scores = scored_rows(pooled, [job.scoring or loaded.problem.function for job in jobs])
        compute, labels = "gpu" if loaded.device.type == "cuda" else "cpu", list(loaded.labels)
        answers: list[tuple[_Job, object]] = []
        for job, job_scores, rows in zip(jobs, scores, pooled):
            if not np.isfinite(rows).all():  # no score to rank: every route refuses it alike (424)
                answers.append((job, NonFinite("the model's output is not finite (NaN or infinity) for this input")))
                continue
            queue_s = max(0.0, started - job.enqueued)
            timings = (job.encoded.seconds, queue_s, inference_s)
            answers.append((job, Answer(job_scores, labels, compute, version, job.tokens, *timings)))
        _settle(answers)


class BusyShare:
    """The model thread's busy seconds (a counter) and their share of each BUSY_WINDOW_S (a gauge)."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self._since, self._busy = time.monotonic(), 0.0
        self._lock = threading.Lock()  # the tokenizer thread's idle ticks too

    def add(self, seconds: float) -> None:
        if seconds:
            self.metrics.engine_busy.inc(seconds)
        with self._lock:
            self._busy += seconds
            elapsed = time.monotonic() - self._since
            if elapsed >= BUSY_WINDOW_S:
                self.metrics.engine_busy_share.set(min(1.0, self._busy / elapsed))
                self._since, self._busy = time.monotonic(), 0.0


def host_rows(logits: list[torch.Tensor]) -> np.ndarray:
    """The passes' fp32 logits as one host array: one copy from a GPU, none on a CPU."""
    if logits and logits[0].device.type != "cpu":
        return torch.cat(logits).cpu().numpy()
    return np.concatenate([rows.numpy() for rows in logits]) if len(logits) > 1 else logits[0].numpy()


def scored_rows(pooled: list[np.ndarray], functions: list[str]) -> list[list[list[float]]]:
    """Per job, each input's scores by its function: one NumPy call and one conversion per function."""
    answers: list = [None] * len(pooled)
    for function in dict.fromkeys(functions):
        which = [j for j, f in enumerate(functions) if f == function]
        rows = scoring.scored(np.concatenate([pooled[j] for j in which]), function).tolist()
        for j in which:
            answers[j], rows = rows[: len(pooled[j])], rows[len(pooled[j]) :]
    return answers


def _by_settings(jobs):
    """((truncation settings, adapter), their jobs): one tokenizer call each."""
    groups: dict[tuple[bool, bool, str | None], list[_Job]] = {}
    for job in jobs:
        groups.setdefault((job.truncate, job.left, job.adapter), []).append(job)
    return groups.items()


def graph_shapes(loaded: LoadedModel, limits: Limits) -> list[tuple[int, int]]:
    """Every (rows, width) a static-shape pass may have."""
    rows, widths = shapes.serving_buckets(limits.max_batch_requests, loaded.max_length)
    return [(r, w) for r in rows for w in widths if r * w <= limits.max_batch_tokens]


def warm_up(served: LoadedModel, limits: Limits) -> None:
    """One forward pass so kernels start before requests; with static shapes on CUDA, every bucket captured first
    (for each adapter: its graphs replay its own weights)."""
    for loaded in served.all_served():
        if limits.static_shapes and captured.available(loaded.device) and loaded.runner is None:
            try:
                loaded.runner = CapturedForward(loaded.model, graph_shapes(loaded, limits), loaded.tokenizer)
            except GraphsUnsupported as exc:
                logger.warning("No CUDA graphs (static shapes, eager forward passes): %s", exc)
        forward(loaded, encode(loaded, [("warm up the kernels", None)], truncate=True, left=False))


def _resolve(job: _Job, value=None, exc: BaseException | None = None) -> None:
    _settle([(job, exc if exc is not None else value)])


def _settle(outcomes: list[tuple[_Job, object]]) -> None:
    """Each job's future gets its answer: one wake-up per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for job, outcome in outcomes:
        by_loop.setdefault(job.loop, []).append((job.future, outcome))
    for loop, settled in by_loop.items():
        loop.call_soon_threadsafe(_set_all, settled)


def _set_all(settled: list[tuple[asyncio.Future, object]]) -> None:
    for future, outcome in settled:
        if future.done():  # the client went away and the request was cancelled
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
