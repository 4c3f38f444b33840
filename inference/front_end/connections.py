"""uvicorn's HTTP protocol with what it lacks against slow clients: a read timeout for each request (head and body),
a write timeout for answers nobody reads, and probes that answer past the connection limit. Called by __main__
(uvicorn's `http` setting)."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

PROBES = (b"/health", b"/ready", b"/ping")  # what an orchestrator asks; a 503 there restarts the pod


class BoundedReads(HttpToolsProtocol):
    """A request must arrive whole within read_timeout_s of its connection (or of its first byte on a kept-alive
    one), and an answer must not wait on a full send buffer for write_timeout_s, else the connection is closed;
    probes are never refused for the connection limit."""

    read_timeout_s = 30.0  # READ_TIMEOUT_S: set in each process by configure(), as uvicorn builds one per connection
    write_timeout_s = 30.0  # WRITE_TIMEOUT_S, likewise
    _reading: asyncio.TimerHandle | None = None
    _writing: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()  # a kept-alive connection's next request

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._writing is not None:
            self._writing.cancel()
            self._writing = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._writing is None:  # the client stopped reading: the answer (and what it holds) waits on it
            self._writing = self.loop.call_later(self.write_timeout_s, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._writing is not None:
            self._writing.cancel()
            self._writing = None

    def _stalled(self) -> None:
        self._writing = None
        if not self.transport.is_closing():
            self.logger.info("Closed a connection that read none of its answer for %gs", self.write_timeout_s)
            self.transport.abort()  # close() would wait for the unread buffer to drain; the sender sees it gone

    def on_headers_complete(self) -> None:
        limit = self.limit_concurrency
        if self.url.split(b"?", 1)[0] in PROBES:  # uvicorn answers 503 past the limit before any route
            self.limit_concurrency = None
        try:
            super().on_headers_complete()
        finally:
            self.limit_concurrency = limit

    def _arm(self) -> None:
        if self._reading is None:
            self._reading = self.loop.call_later(self.read_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None

    def _timed_out(self) -> None:
        self._reading = None
        if not self.transport.is_closing():
            self.logger.info("Closed a connection whose request did not arrive within %gs", self.read_timeout_s)
            self.transport.close()  # a handler waiting for the body sees the client gone


def configure(read_timeout_s: float, write_timeout_s: float) -> None:
    """This process's timeouts (each uvicorn worker builds its app, and calls this, from the environment)."""
    BoundedReads.read_timeout_s = read_timeout_s
    BoundedReads.write_timeout_s = write_timeout_s
