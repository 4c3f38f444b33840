"""The engine's end of the front-ends' links (link.RemoteLink): one ZeroMQ socket on a thread of its own, every
front-end's jobs handed to the one engine, which batches across all of them. Started by `python -m inference` when
WORKERS > 1.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path

import zmq
import zmq.asyncio
from pydantic_core import from_json, to_json

from inference.answers import Encoded, Overloaded, failure
from inference.engine.service import Service
from inference.front_end.link import HEARTBEAT_S, identity_pid

logger = logging.getLogger("inference")


GONE_AFTER_S = 10 * HEARTBEAT_S  # a front-end silent this long is taken for gone even if its process lives (wedged)


class LinkServer:
    """Answers every front-end's requests from the service's engine; what a front-end holds (inputs admitted, jobs
    queued) is its own, and given back when it is gone."""

    def __init__(self, service: Service, address: str):
        self.service, self.address = service, address
        self._jobs: dict[tuple[bytes, int], asyncio.Future] = {}
        self._admitted: dict[bytes, int] = {}  # inputs each front-end holds through admit, until it leaves
        self._heard: dict[bytes, float] = {}  # when each front-end last sent anything (it asks every HEARTBEAT_S)
        self._outbox: dict[bytes, list[dict]] = {}  # replies of this loop turn, per front-end
        self._flushing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task | None = None
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._run, name="link-server", daemon=True)

    def start(self) -> LinkServer:
        self._thread.start()
        self._bound.wait(30)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()  # the engine resolves jobs' futures in this loop
        asyncio.set_event_loop(self._loop)
        socket = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.bind(self.address)
        self._socket = socket
        self._task = self._loop.create_task(self._both(socket))
        self._bound.set()
        try:
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass  # stop(): the front-ends have drained
        finally:
            socket.close()
            self._loop.close()

    async def _both(self, socket: zmq.asyncio.Socket) -> None:
        """Serving and sweeping, cancelled together by stop()."""
        await asyncio.gather(self._serve(socket), self._sweep())

    async def _serve(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            sender, raw = await socket.recv_multipart()
            self._heard[sender] = time.monotonic()
            for message in from_json(raw):  # what the front-end had ready in one of its loop turns
                try:
                    self._handle(sender, message)
                except Exception as exc:  # noqa: BLE001 - one bad message answers its sender; the link serves on
                    logger.exception("link: a %s request failed", message.get("op"))
                    self._reply(sender, message["id"], {"error": list(failure(exc))})

    def _handle(self, sender: bytes, message: dict) -> None:
        op, number, service = message["op"], message["id"], self.service
        if op == "submit":
            encoded = Encoded(**message["encoded"])
            try:
                job = service.engine.submit(encoded, message["scoring"], message["adapter"])
            except Overloaded as exc:
                return self._reply(sender, number, {"error": list(failure(exc))})
            self._jobs[sender, number] = job
            job.add_done_callback(lambda done: self._answer(sender, number, done))
        elif op == "cancel":
            job = self._jobs.pop((sender, message["of"]), None)
            if job is not None:
                job.cancel()  # an unstarted job is dropped (Engine.submit)
        elif op == "admit":
            service.engine.admit(message["inputs"])
            self._admitted[sender] = self._admitted.get(sender, 0) + message["inputs"]
            self._reply(sender, number, {})
        elif op == "leave":
            self._give_back(sender, message["inputs"])
        elif op == "view":
            view, why = service.view(), service.why_not_serving()
            self._reply(sender, number, {"view": view.wire() if view else None, "why": why})
        elif op == "status":
            self._reply(sender, number, {"why": service.why_not_ready()})
        elif op == "encoding":
            self._reply(sender, number, service.encoding(message["adapter"]))
        elif op == "tokenizer":
            view = service.view()
            said = {"version": view.version if view else 0, "tokenizer": service.serialized_tokenizer()}
            self._reply(sender, number, said)

    def _give_back(self, sender: bytes, inputs: int) -> None:
        """What `sender` admitted, up to what it holds: a leave after its admissions were taken back (it was
        silent, or this engine started after it admitted) gives nothing twice."""
        held = self._admitted.get(sender, 0)
        given = min(held, inputs)
        if given:
            self._admitted[sender] = held - given
            self.service.engine.leave(given)

    async def _sweep(self) -> None:
        """Every HEARTBEAT_S: a front-end whose process ended, or that is silent past GONE_AFTER_S, gives back its
        admissions, and its queued jobs are dropped."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            now = time.monotonic()
            for sender in [s for s, heard in self._heard.items() if now - heard > GONE_AFTER_S or ended(s)]:
                self.forget(sender)

    def forget(self, sender: bytes) -> None:
        """A front-end gone: its admissions given back, its unstarted jobs cancelled (a started one finishes)."""
        self._heard.pop(sender, None)
        held = self._admitted.pop(sender, 0)
        jobs = [key for key in self._jobs if key[0] == sender]
        if held or jobs:
            logger.warning("A front-end (%s) is gone: %d admitted inputs given back, %d jobs dropped", sender.decode(
                errors="replace"), held, len(jobs))  # fmt: skip
        if held:
            self.service.engine.leave(held)
        for key in jobs:
            self._jobs.pop(key).cancel()
            # a wedged front-end that wakes up gets an answer, not a wait; a dead one's is dropped by ZeroMQ
            refused = Overloaded(f"this front-end was silent for {GONE_AFTER_S:g}s and its work was dropped; retry")
            self._reply(sender, key[1], {"error": list(failure(refused))})

    def _answer(self, sender: bytes, number: int, job: asyncio.Future) -> None:
        self._jobs.pop((sender, number), None)
        if job.cancelled():
            return
        exc = job.exception()
        self._reply(sender, number, {"error": list(failure(exc))} if exc else {"answer": job.result().wire()})

    def _reply(self, sender: bytes, number: int, fields: dict) -> None:
        """Queued for `sender`: one loop turn's replies (a micro-batch settles together) go as one message."""
        outbox = self._outbox.setdefault(sender, [])
        outbox.append({"id": number, **fields})
        if not self._flushing:
            self._flushing = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        outboxes, self._outbox = self._outbox, {}
        for sender, replies in outboxes.items():
            self._socket.send_multipart([sender, to_json(replies)])


def ended(sender: bytes) -> bool:
    """Whether the front-end process named in `sender` (link.identity) has ended: gone, or a zombie not yet reaped."""
    pid = identity_pid(sender)
    if pid is None:
        return False
    if Path("/proc/self/stat").is_file():
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except (OSError, IndexError):
            return True
    try:  # no procfs: a zombie still counts as alive until its parent reaps it
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
