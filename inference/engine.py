"""Micro-batching: concurrent requests share forward passes, run by one worker thread off the event loop.

Requests put a job (their texts + an asyncio future) on a queue. The worker (`Engine.run`, on a thread of its
own after `start()`, or on the process's main thread: see inference/__main__.py), which alone touches the
model and the tokenizer, takes the first job, waits up to `max_wait_ms` for more until `max_batch_size`
texts are collected (only while requests keep arriving together), tokenizes them, sorts them by length and runs them in length buckets (little padding),
then hands each job exactly its own rows back on its event loop. The model reference is read once per
micro-batch, so a reload swaps models between batches: in-flight work finishes on the model it started with.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Optional

import torch

from inference.loading import LoadedModel
from inference.metrics import Metrics

logger = logging.getLogger(__name__)


class Overloaded(RuntimeError):
    """The queue holds max_queue_size texts already."""


class TooLong(ValueError):
    def __init__(self, index: int, tokens: int, limit: int):
        super().__init__(f"inputs[{index}] has {tokens} tokens, more than the model's maximum of {limit}; "
                         "send truncate=true or a shorter text")
        self.tokens = tokens


@dataclass
class _Job:
    texts: list[str]
    truncate: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


_STOP = object()


class Engine:
    def __init__(self, loaded: LoadedModel, *, max_batch_size: int, max_wait_ms: float, max_queue_size: int,
                 metrics: Metrics):
        self.current = loaded
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000
        self.max_queue_size = max_queue_size
        self.metrics = metrics
        self._queue: "queue.Queue" = queue.Queue()
        self._queued_texts = 0
        self._lock = threading.Lock()
        self._carry: Optional[_Job] = None
        self._last_jobs = 0
        self._finished = threading.Event()

    # ------------------------------------------------------------------------------- event-loop side

    def start(self) -> None:
        """Run the worker on a new thread (the alternative: call `run()` on a thread of your own)."""
        threading.Thread(target=self.run, name="inference-worker", daemon=True).start()

    def stop(self, timeout: float = 30) -> None:
        """Finish every queued job, then end the worker (waits up to `timeout` s for it)."""
        self._queue.put(_STOP)
        self._finished.wait(timeout)

    def swap(self, loaded: LoadedModel) -> None:
        self.current = loaded  # one reference assignment: atomic; the worker reads it per micro-batch

    async def predict(self, texts: list[str], truncate: bool) -> list[list[float]]:
        """Logits (fp32) for each text, in order. Raises Overloaded or TooLong."""
        with self._lock:
            if self._queued_texts + len(texts) > self.max_queue_size:
                raise Overloaded(f"{self._queued_texts} texts are waiting (limit {self.max_queue_size}); retry later")
            self._queued_texts += len(texts)
            self.metrics.queue_depth.set(self._queued_texts)
        loop = asyncio.get_running_loop()
        job = _Job(texts, truncate, loop, loop.create_future())
        self._queue.put(job)
        return await job.future

    # ---------------------------------------------------------------------------------- worker side

    def _next_batch(self) -> tuple[list[_Job], bool]:
        """Block for one job, then gather more for up to max_wait; (jobs, stop requested)."""
        first = self._carry or self._queue.get()
        self._carry = None
        if first is _STOP:
            return [], True
        jobs, count = [first], len(first.texts)
        # Wait for company only under concurrent load (the last micro-batch merged several requests): a lone
        # client never pays the batching window, busy periods still fill batches.
        deadline = time.monotonic() + (self.max_wait_s if self._last_jobs > 1 else 0.0)
        while count < self.max_batch_size:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is _STOP:
                self._carry = job
                break
            if count + len(job.texts) > self.max_batch_size:
                self._carry = job  # starts the next micro-batch
                break
            jobs.append(job)
            count += len(job.texts)
        self._last_jobs = len(jobs)
        return jobs, False

    def run(self) -> None:
        """The worker loop, on the calling thread, until stop(): every queued job is answered first."""
        try:
            self._serve()
        finally:
            self._finished.set()

    def _serve(self) -> None:
        while True:
            jobs, stop = self._next_batch()
            if stop:
                return
            with self._lock:
                self._queued_texts -= sum(len(j.texts) for j in jobs)
                self.metrics.queue_depth.set(self._queued_texts)
            try:
                self._process(jobs)
            except Exception as exc:  # noqa: BLE001 - a failed forward answers its callers (500), the worker lives on
                logger.exception("inference failed for a micro-batch of %d requests", len(jobs))
                for job in jobs:
                    _resolve(job, exc=exc)

    def _process(self, jobs: list[_Job]) -> None:
        loaded = self.current
        items: list[tuple[int, int, list[int]]] = []  # (job, text, token ids)
        for j, job in enumerate(jobs):
            ids = loaded.tokenizer(job.texts, truncation=job.truncate, max_length=loaded.max_length)["input_ids"]
            too_long = next(((i, len(x)) for i, x in enumerate(ids) if len(x) > loaded.max_length), None)
            if too_long:
                _resolve(job, exc=TooLong(too_long[0], too_long[1], loaded.max_length))
                continue
            items.extend((j, i, x) for i, x in enumerate(ids))
        if not items:
            return
        self.metrics.batch_size.observe(len(items))
        results = {}
        for bucket in length_buckets(sorted(items, key=lambda item: len(item[2]))):
            logits = forward(loaded, [ids for _, _, ids in bucket])
            for (j, i, _), row in zip(bucket, logits.tolist()):
                results[j, i] = row
        for j, job in enumerate(jobs):
            if not job.future.done() and (j, 0) in results:
                _resolve(job, value=[results[j, i] for i in range(len(job.texts))])


def length_buckets(items: list, ratio: float = 1.5, slack: int = 16) -> list[list]:
    """Split length-sorted items where the length grows past ratio x the bucket's shortest (+ slack tokens)."""
    buckets: list[list] = []
    for item in items:
        if buckets and len(item[2]) <= ratio * len(buckets[-1][0][2]) + slack:
            buckets[-1].append(item)
        else:
            buckets.append([item])
    return buckets


def warm_up(loaded: LoadedModel) -> None:
    """One forward pass, so kernels are initialised before the first request."""
    forward(loaded, [loaded.tokenizer("warm up the kernels")["input_ids"]])


@torch.inference_mode()
def forward(loaded: LoadedModel, input_ids: list[list[int]]) -> torch.Tensor:
    batch = loaded.tokenizer.pad({"input_ids": input_ids}, padding=True, pad_to_multiple_of=8, return_tensors="pt")
    batch = {k: v.to(loaded.device) for k, v in batch.items()}
    return loaded.model(**batch).logits.float().cpu()


def _resolve(job: _Job, value=None, exc: Optional[BaseException] = None) -> None:
    def settle() -> None:
        if job.future.done():  # the client went away and the request was cancelled
            return
        if exc is not None:
            job.future.set_exception(exc)
        else:
            job.future.set_result(value)

    job.loop.call_soon_threadsafe(settle)
