"""How the routes reach the engine: the app's state (AppState) and the link to an engine in another process
(RemoteLink: ZeroMQ, one JSON message each way, no Python object per token). The link to an engine in the same
process is service.LocalLink; the engine's end of a RemoteLink is link_server.py. Torch-free: a front-end process
(WORKERS > 1) never imports the model's stack.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
from contextlib import asynccontextmanager
from typing import Protocol

import zmq
import zmq.asyncio
from fastapi import FastAPI
from pydantic_core import from_json, to_json
from tokenizers import Tokenizer

from inference import logs, prometheus
from inference.answers import Answer, Encoded, ModelView, Overloaded, Refused
from inference.front_end.encoder import Encoders
from inference.prometheus import Metrics
from inference.settings import Settings

ENGINE_ENV = "DISTILBERT_AGNEWS_ENGINE"  # the engine's address, set by `python -m inference` for its front-ends
HEARTBEAT_S = 1.0  # how often a front-end asks whether the engine serves, and whether its own parent lives
ASK_TIMEOUT_S = 5.0  # an answer the engine owes within this (view, status, tokenizer, admit)
logger = logging.getLogger("inference")


def spare_copy(serialized: str) -> Tokenizer:
    """The served tokenizer from its JSON, untruncated and unpadded (/tokenize and /decode use it)."""
    copy = Tokenizer.from_str(serialized)
    copy.no_truncation()
    copy.no_padding()
    return copy


def identity() -> bytes:
    """This front-end's name on the link: its pid (the engine watches it end) and a nonce (a reused pid is another)."""
    return f"{os.getpid()}-{secrets.token_hex(4)}".encode()


def identity_pid(sender: bytes) -> int | None:
    """The pid in an identity() name; None for another name."""
    pid, _, nonce = sender.partition(b"-")
    return int(pid) if pid.isdigit() and nonce else None


class Link(Protocol):
    """What the routes ask of the engine, wherever it runs."""

    view: ModelView | None  # the served model; None while none serves

    def submit(self, encoded: Encoded, scoring: str | None, adapter: str | None = None) -> asyncio.Future:
        """Encoded inputs queued for the served model or its adapter of that name: the future's result is its
        Answer (or Stale: encode again). May raise Overloaded."""

    async def encoding(self, adapter: str | None) -> dict:
        """What the front-ends tokenize with for the served model or its adapter (Service.encoding)."""

    async def admit(self, inputs: int) -> None:
        """Count inputs in flight (Overloaded past MAX_CONCURRENT_REQUESTS); leave() gives them back."""

    def leave(self, inputs: int) -> None: ...

    def why_not_serving(self) -> str | None: ...

    async def why_not_ready(self) -> str | None: ...

    async def tokenizer(self) -> Tokenizer: ...


class AppState:
    """What the routes read: the settings, this process's metrics, the link to the engine and the tokenizers."""

    def __init__(self, settings: Settings, metrics: Metrics, link: Link):
        self.settings, self.metrics, self.link = settings, metrics, link
        self.encoders = Encoders(lambda adapter: link.encoding(adapter))  # this process tokenizes its requests


class RemoteLink:
    """The engine of another process: requests out on one socket, answers matched back by id."""

    def __init__(self, address: str):
        self.address = address
        self.view: ModelView | None = None
        self._why = "the engine has not answered yet"
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._tokenizer: tuple[int, Tokenizer] | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._outbox: list[dict] = []  # requests of this loop turn, sent together
        self._tasks: list[asyncio.Task] = []
        self._parent = os.getppid()

    async def start(self) -> None:
        """Connect, learn what is served; then keep watching the engine and this process's parent."""
        self._socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.IDENTITY, identity())  # the engine knows this process by it (and its end)
        self._socket.connect(self.address)
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._watch())]
        await self._refresh()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._socket is not None:
            self._socket.close()

    def submit(self, encoded: Encoded, scoring: str | None, adapter: str | None = None) -> asyncio.Future:
        number, future = self._send("submit", {"encoded": encoded.wire(), "scoring": scoring, "adapter": adapter})
        future.add_done_callback(lambda done: done.cancelled() and self._send("cancel", {"of": number}, reply=False))
        return future

    async def admit(self, inputs: int) -> None:
        try:
            await self._ask("admit", {"inputs": inputs})
        except Refused as exc:
            if exc.kind == "overloaded":
                raise Overloaded(exc.message) from None
            raise

    def leave(self, inputs: int) -> None:
        self._send("leave", {"inputs": inputs}, reply=False)

    def why_not_serving(self) -> str | None:
        return None if self.view is not None else self._why

    async def why_not_ready(self) -> str | None:
        try:
            return (await self._ask("status", {}))["why"]
        except (TimeoutError, Refused) as exc:
            return f"the engine does not answer ({exc or 'timeout'})"

    async def encoding(self, adapter: str | None) -> dict:
        return await self._ask("encoding", {"adapter": adapter})

    async def tokenizer(self) -> Tokenizer:
        version = self.view.version if self.view else 0
        if self._tokenizer is None or self._tokenizer[0] != version:
            said = await self._ask("tokenizer", {})
            self._tokenizer = (said["version"], spare_copy(said["tokenizer"]))
        return self._tokenizer[1]

    def _send(self, op: str, fields: dict, reply: bool = True) -> tuple[int, asyncio.Future | None]:
        number = next(self._ids)
        loop = asyncio.get_running_loop()
        future = loop.create_future() if reply else None
        if future is not None:
            self._pending[number] = future
        self._outbox.append({"op": op, "id": number, **fields})
        if len(self._outbox) == 1:  # what this loop turn has ready travels as one message
            loop.call_soon(self._flush)
        return number, future

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        if self._socket is not None and not self._socket.closed:
            self._socket.send(to_json(outbox))  # queued at once: no await on the hot path

    async def _ask(self, op: str, fields: dict, timeout: float = ASK_TIMEOUT_S) -> dict:
        _, future = self._send(op, fields)
        return await asyncio.wait_for(future, timeout)

    async def _receive(self) -> None:
        while True:
            for message in from_json(await self._socket.recv()):  # the replies of one of the engine's loop turns
                self._settle(message)

    def _settle(self, message: dict) -> None:
        future = self._pending.pop(message["id"], None)
        if future is None or future.done():
            return
        if "error" in message:
            future.set_exception(Refused(*message["error"]))
        elif "answer" in message:
            answer = Answer(**message["answer"])
            if self.view is None or answer.version != self.view.version:  # a reload: what /info says follows
                asyncio.create_task(self._refresh())
            future.set_result(answer)
        else:
            future.set_result(message)

    async def _refresh(self, timeout: float = ASK_TIMEOUT_S) -> None:
        said = await self._ask("view", {}, timeout)
        self.view = ModelView.from_wire(said["view"]) if said["view"] else None
        self._why = said.get("why") or self._why

    async def _watch(self) -> None:
        """The engine serving, and this process's parent (the engine's) alive: else 503, or the process ends."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            if os.getppid() != self._parent:  # the engine's process is gone: nothing here can answer
                logger.error("The engine's process has ended; this front-end exits")
                logging.shutdown()
                os._exit(1)
            try:
                await self._refresh(2 * HEARTBEAT_S)
            except (TimeoutError, Refused) as exc:
                self.view, self._why = None, f"the engine does not answer ({exc or 'timeout'})"


@asynccontextmanager
async def front_end_lifespan(app: FastAPI):
    """A front-end process's life: connect to the engine, serve, let go."""
    state: AppState = app.state.service
    logs.configure(state.settings.json_output)
    await state.link.start()
    logger.info("Front-end ready: the engine at %s serves %s", state.link.address, state.settings.model_id)
    yield
    await state.link.stop()
    if getattr(app.state, "tracing", None):
        app.state.tracing.shut_down()
    prometheus.worker_exited()
