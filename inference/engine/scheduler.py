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

import torch

from contract import shapes
from contract.loading import LoadedModel
from contract.model_call import forward
from inference.answers import Answer, NonFinite, Overloaded, Sequence
from inference.encoding import REFUSALS, check_length, check_tokens, encode, encode_unchecked, windows
from inference.engine import captured
from inference.engine.captured import CapturedForward, GraphsUnsupported
from inference.engine.passes import forward_buckets, static_passes
from inference.prometheus import Metrics

logger = logging.getLogger(__name__)
# Idle wake-ups let the main thread run SIGTERM's handler: a wait without timeout would hold it until the next request.
IDLE_WAKE_S = 0.25
READY_BATCHES = 2  # enough to overlap, few enough to hold memory


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
    sequences: list[Sequence]
    truncate: bool
    left: bool
    chunk: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    scoring: str | None = None  # softmax, sigmoid, none; None: the model's problem type decides
    adapter: str | None = None  # the served model's adapter of this name (LORA_ADAPTERS); None: the model itself
    enqueued: float = field(default_factory=time.perf_counter)
    features: list[dict] = field(default_factory=list)  # one tokenized window each: input_ids (+ token_type_ids)
    owner: list[int] = field(default_factory=list)  # the input of each window
    tokenized_by: LoadedModel | None = None
    tokenization_s: float = 0.0
    queued: bool = True  # queued until the model thread takes it

    @property
    def tokens(self) -> int:
        return sum(len(f["input_ids"]) for f in self.features)

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
        self._ready: queue.Queue = queue.Queue(maxsize=READY_BATCHES)  # from the tokenizer thread, for the model
        self._in_flight = 0
        self._lock = threading.Lock()
        self._carry = None
        self._tokenizing = threading.Lock()  # both threads may tokenize after a reload
        self._last_jobs = self._last_inputs = 0  # the last micro-batch's requests and inputs
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

    def submit(
        self,
        sequences: list[Sequence],
        truncate: bool,
        left: bool = False,
        chunk: bool = False,
        scoring: str | None = None,
        adapter: str | None = None,
    ) -> asyncio.Future:
        """Queue the inputs for the model or its adapter of that name; the future gets their Answer or the refusal.
        Cancelling drops an unstarted job. Raises Overloaded at once. Call from the event loop."""
        loop = asyncio.get_running_loop()
        if adapter is not None and adapter not in self.current.adapters:  # the routes check names first
            refused = loop.create_future()
            refused.set_exception(LookupError(f"no adapter named {adapter!r} is served"))
            return refused
        self.admit(len(sequences))
        job = _Job(sequences, truncate, left, chunk, loop, loop.create_future(), scoring, adapter)
        job.future.add_done_callback(lambda _: self.leave(len(sequences)))
        self.metrics.queue_size.inc(len(sequences))
        self._queue.put(job)
        return job.future

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
        """The model thread's loop until stop(); queued jobs answered first."""
        self._running.set()
        try:
            for jobs in self._batches():
                self._answer_batch(jobs)
        finally:
            self._finished.set()

    def _batches(self):
        """Tokenized micro-batches until stop()."""
        if not self.limits.tokenizer_thread:
            yield from self._tokenized()
            return
        threading.Thread(target=self._tokenize_loop, name="inference-tokenizer", daemon=True).start()
        while True:
            try:
                jobs = self._ready.get(timeout=IDLE_WAKE_S)  # in slices: see IDLE_WAKE_S
            except queue.Empty:
                continue
            if jobs is _STOP:
                return
            yield jobs

    def _tokenized(self):
        """Gathered and tokenized micro-batches until stop() (the queue drained first)."""
        while (jobs := self._gather()) is not None:
            if tokenized := self._tokenize_or_fail(jobs, self.current):
                yield tokenized

    # ------------------------------------------------------------------------------- tokenizer thread

    def _tokenize_loop(self) -> None:
        try:
            for jobs in self._tokenized():
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
            self.metrics.queue_size.dec(len(job.sequences))

    def _gather(self) -> list[_Job] | None:
        """One micro-batch, or None once stopped and drained."""
        first, self._carry = self._carry or self._next(None), None
        if first is _STOP:
            return None
        jobs, inputs = [first], len(first.sequences)
        # Wait for company only under concurrent load, and only up to the last batch's size: a lone client never pays
        # the window, and a few clients do not pay it every time.
        deadline = time.monotonic() + (self.limits.max_wait_ms / 1000 if self._last_jobs > 1 else 0.0)
        while inputs < self.limits.max_batch_requests:
            job = self._next(deadline if inputs < self._last_inputs else time.monotonic())
            if job is None:
                break
            if job is _STOP or inputs + len(job.sequences) > self.limits.max_batch_requests:
                self._carry = job  # starts the next micro-batch
                break
            jobs.append(job)
            inputs += len(job.sequences)
        self._last_jobs, self._last_inputs = len(jobs), inputs
        return jobs

    def _tokenize_or_fail(self, jobs: list[_Job], loaded: LoadedModel) -> list[_Job]:
        """_tokenize; a tokenizer failure answers its jobs (424), and the thread lives on."""
        try:
            with self._tokenizing:  # one tokenizing caller at a time
                return self._tokenize(jobs, loaded)
        except Exception as exc:  # noqa: BLE001 - answered to its callers, like a failed forward pass
            logger.exception("tokenizing failed for a micro-batch of %d requests", len(jobs))
            for job in jobs:
                self._leave_queue(job)
                _resolve(job, exc=exc)
            return []

    def _tokenize(self, jobs: list[_Job], served: LoadedModel) -> list[_Job]:
        """Tokenize for `served` (each job for its adapter); refused jobs are answered and left out."""
        started, kept = time.perf_counter(), []
        for (truncate, left, adapter), group in _by_settings(job for job in jobs if not job.chunk):
            found = encode_unchecked(served.named(adapter), [s for job in group for s in job.sequences], truncate, left)
            for job in group:
                job.features, found = found[: len(job.sequences)], found[len(job.sequences) :]
                job.owner = list(range(len(job.features)))
        for job in jobs:
            loaded = served.named(job.adapter)
            try:
                if job.chunk:
                    job.features, job.owner = windows(loaded, job.sequences, self.limits.max_chunks)
                else:
                    check_length(loaded, job.features)
                check_tokens(job.features, job.owner, len(job.sequences))  # its own request only, not its batch
            except REFUSALS as exc:
                self._leave_queue(job)
                _resolve(job, exc=exc)
                continue
            job.tokenized_by = loaded
            kept.append(job)
            for feature in job.features:
                self.metrics.input_length.observe(len(feature["input_ids"]))
        for job in jobs:
            job.tokenization_s += time.perf_counter() - started  # the call all of them waited for
        return kept

    # ---------------------------------------------------------------------------------- model thread

    def _answer_batch(self, jobs: list[_Job]) -> None:
        for job in jobs:
            self._leave_queue(job)
        jobs = [job for job in jobs if not job.abandoned]  # clients that left while it waited: not run
        if not jobs:
            return
        served = self.current
        if any(job.tokenized_by is not served.named(job.adapter) for job in jobs):  # a reload swapped the model
            if not (jobs := self._tokenize_or_fail(jobs, served)):
                return
        version = self.version_of(served)
        for adapter in dict.fromkeys(job.adapter for job in jobs):  # an adapter's head is its own: a pass each
            self._run([job for job in jobs if job.adapter == adapter], served.named(adapter), version)

    def _run(self, jobs: list[_Job], loaded: LoadedModel, version: int) -> None:
        """The jobs' passes through `loaded`, then their answers."""
        started = time.perf_counter()
        items = sorted(
            ((j, i, f) for j, job in enumerate(jobs) for i, f in enumerate(job.features)),
            key=lambda item: len(item[2]["input_ids"]),
        )
        self.metrics.batch_size.observe(len(items))
        self.metrics.batch_tokens.observe(sum(len(f["input_ids"]) for _, _, f in items))
        try:
            passes = self._passes(items, loaded)
            logits = [forward(loaded, [f for _, _, f in part], rows, width) for part, rows, width in passes]
            found = dict(zip(((j, i) for j, i, _ in items), torch.cat(logits).cpu()))  # left on the device until here
        except Exception as exc:  # noqa: BLE001 - a failed forward answers its callers (424), the worker lives on
            logger.exception("inference failed for a micro-batch of %d requests", len(jobs))
            for job in jobs:
                _resolve(job, exc=exc)
            return
        finally:
            self.metrics.record_process()
        inference_s = time.perf_counter() - started
        self._answer(jobs, loaded, found, (started, inference_s), version)

    def _passes(self, items: list, loaded: LoadedModel) -> list[tuple[list, int | None, int | None]]:
        """(items, rows, width) per forward pass; None sizes: dynamic shapes."""
        limits = self.limits
        if limits.static_shapes:
            rows, widths = shapes.serving_buckets(limits.max_batch_requests, loaded.max_length)
            return static_passes(items, rows, widths, limits.max_batch_tokens)
        passes = forward_buckets(items, limits.max_batch_requests, limits.max_batch_tokens)
        return [(part, None, None) for part in passes]

    def _answer(self, jobs: list[_Job], loaded: LoadedModel, found: dict, timing: tuple, version: int) -> None:
        """Each job's logits pooled, scored and ranked together, answered as `version`; one wake-up per loop.
        `timing`: (when the passes started, their seconds)."""
        started, inference_s = timing
        pooled = [
            loaded.long_text.pool(
                torch.stack([found[j, i] for i in range(len(job.features))]), job.owner, len(job.sequences)
            )
            for j, job in enumerate(jobs)
        ]
        ranked = rank(loaded, pooled, [job.scoring for job in jobs])
        compute = "gpu" if loaded.device.type == "cuda" else "cpu"
        answers: list[tuple[_Job, object]] = []
        for job, job_ranked, logits in zip(jobs, ranked, pooled):
            if not torch.isfinite(logits).all():  # no score to rank: every route refuses it alike (424)
                answers.append((job, NonFinite("the model's output is not finite (NaN or infinity) for this input")))
                continue
            queue_s = max(0.0, started - job.enqueued - job.tokenization_s)
            timings = (job.tokenization_s, queue_s, inference_s)
            answers.append((job, Answer(job_ranked, compute, version, job.tokens, *timings)))
        _settle(answers)


def rank(loaded: LoadedModel, pooled: list[torch.Tensor], scorings: list[str | None]) -> list[list[list[dict]]]:
    """Per job, each input's ranked labels: one scoring call and sort per function."""
    ranked: list = [None] * len(pooled)
    labels = loaded.labels
    for scoring in dict.fromkeys(scorings):
        which = [j for j, s in enumerate(scorings) if s == scoring]
        scores = loaded.problem.scores(torch.cat([pooled[j] for j in which]), scoring)
        values, order = scores.sort(dim=-1, descending=True, stable=True)  # ties keep the labels' order
        rows = [
            [{"score": v, "label": labels[i]} for v, i in zip(row_values, row_order)]
            for row_values, row_order in zip(values.tolist(), order.tolist())
        ]
        for j in which:
            ranked[j], rows = rows[: len(pooled[j])], rows[len(pooled[j]) :]
    return ranked


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
