"""The engine's end of the front-ends' links (link.RemoteLink): one ZeroMQ socket on a thread of its own, every
front-end's jobs handed to the one engine, which batches across all of them. Started by `python -m inference` when
WORKERS > 1.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import zmq
import zmq.asyncio
from pydantic_core import from_json, to_json

from inference.answers import Overloaded, failure
from inference.engine.service import Service

logger = logging.getLogger("inference")


class LinkServer:
    """Answers every front-end's requests from the service's engine."""

    def __init__(self, service: Service, address: str):
        self.service, self.address = service, address
        self._jobs: dict[tuple[bytes, int], asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
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
        self._task = self._loop.create_task(self._serve(socket))
        self._bound.set()
        try:
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass  # stop(): the front-ends have drained
        finally:
            socket.close()
            self._loop.close()

    async def _serve(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            sender, raw = await socket.recv_multipart()
            message = from_json(raw)
            try:
                self._handle(socket, sender, message)
            except Exception as exc:  # noqa: BLE001 - one bad message answers its sender; the link serves on
                logger.exception("link: a %s request failed", message.get("op"))
                self._reply(socket, sender, message["id"], {"error": list(failure(exc))})

    def _handle(self, socket: zmq.asyncio.Socket, sender: bytes, message: dict) -> None:
        op, number, service = message["op"], message["id"], self.service
        if op == "submit":
            sequences = [(text, pair) for text, pair in message["sequences"]]
            try:
                job = service.engine.submit(
                    sequences, message["truncate"], message["left"], message["chunk"], message["scoring"],
                    message["adapter"],
                )  # fmt: skip
            except Overloaded as exc:
                return self._reply(socket, sender, number, {"error": list(failure(exc))})
            self._jobs[sender, number] = job
            job.add_done_callback(lambda done: self._answer(socket, sender, number, done))
        elif op == "cancel":
            job = self._jobs.pop((sender, message["of"]), None)
            if job is not None:
                job.cancel()  # an unstarted job is dropped (Engine.submit)
        elif op == "admit":
            service.engine.admit(message["inputs"])
            self._reply(socket, sender, number, {})
        elif op == "leave":
            service.engine.leave(message["inputs"])
        elif op == "view":
            view, why = service.view(), service.why_not_serving()
            self._reply(socket, sender, number, {"view": view.wire() if view else None, "why": why})
        elif op == "status":
            self._reply(socket, sender, number, {"why": service.why_not_ready()})
        elif op == "tokenizer":
            view = service.view()
            said = {"version": view.version if view else 0, "tokenizer": service.serialized_tokenizer()}
            self._reply(socket, sender, number, said)

    def _answer(self, socket: zmq.asyncio.Socket, sender: bytes, number: int, job: asyncio.Future) -> None:
        self._jobs.pop((sender, number), None)
        if job.cancelled():
            return
        exc = job.exception()
        self._reply(socket, sender, number, {"error": list(failure(exc))} if exc else {"answer": job.result().wire()})

    @staticmethod
    def _reply(socket: zmq.asyncio.Socket, sender: bytes, number: int, fields: dict) -> None:
        socket.send_multipart([sender, to_json({"id": number, **fields})])
