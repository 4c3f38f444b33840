"""The service's log lines: time, level, logger, process, request id, message; JSON lines with JSON_OUTPUT."""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar

request_id: ContextVar[str] = ContextVar("request_id", default="-")
LOGGERS = ("inference", "uvicorn", "uvicorn.access")
HANDLER = "distilbert-agnews"  # names ours among the root logger's handlers
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s pid %(process)d [%(request_id)s] %(message)s"


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(json_output: bool = False) -> None:
    """One handler on the service's and uvicorn's loggers; the root logger's warnings (libraries': OpenTelemetry's
    exporter, transformers) in the same format, so JSON_OUTPUT gives only JSON lines."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if json_output else logging.Formatter(TEXT_FORMAT))
    for name in LOGGERS:
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(logging.INFO)
        log.propagate = False
    handler.set_name(HANDLER)
    root = logging.getLogger()  # others' handlers (a test's capture) stay; a configure before this one's goes
    root.handlers[:] = [h for h in root.handlers if h.get_name() != HANDLER] + [handler]
    root.setLevel(min(root.level or logging.WARNING, logging.WARNING))
