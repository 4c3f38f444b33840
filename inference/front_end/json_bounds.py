"""How many values a JSON body holds, told before any is built: a body past what a request may carry is refused at
the cost of a small one, whatever its size. Called by routes.parse and the KServe routes before they parse."""

from __future__ import annotations

import re

from pydantic_core import from_json

from inference import tei_errors
from inference.tei_errors import ServiceError

PREFIX_BYTES = 65536  # of a body past the bounds, parsed to tell a malformed one (400) from a large one (422)
SPARE_VALUES = 1024  # beyond the inputs: fields, parameters, and unknown fields clients add (TEI ignores those)
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string after its opening quote


def within(raw: bytes, max_values: int | None, max_containers: int, max_strings: int) -> bool:
    """Whether `raw` holds at most `max_values` values (None: any), `max_containers` lists and objects and
    `max_strings` strings (keys too), the structure counted outside its strings. The work is bounded by the limits,
    not by the body: one string at a time, C scans between."""
    containers = raw.count(b"[") + raw.count(b"{")
    values = raw.count(b",") + containers + 1  # upper bounds: commas, brackets and quotes inside strings count too
    if (
        (max_values is None or values <= max_values)
        and containers <= max_containers
        and raw.count(b'"') <= 2 * max_strings
    ):
        return True
    values, containers, at = 1, 0, 0
    for _ in range(max_strings + 1):
        quote = raw.find(b'"', at)
        end = len(raw) if quote < 0 else quote
        opened = raw.count(b"[", at, end) + raw.count(b"{", at, end)
        containers += opened
        values += raw.count(b",", at, end) + opened
        if containers > max_containers or (max_values is not None and values > max_values):
            return False
        if quote < 0:
            return True
        rest = _STRING_REST.match(raw, quote + 1)
        if rest is None:
            return True  # an unterminated string: the parser says what is wrong
        at = rest.end()
    return False  # more strings than max_strings


def check(raw: bytes, max_client_batch_size: int, token_ids: bool = False) -> None:
    """422 before parsing a body holding more than a request of MAX_CLIENT_BATCH_SIZE inputs can; `token_ids`: a
    /decode body, whose lists of ids are as long as the texts were."""
    max_values = None if token_ids else 8 * max_client_batch_size + SPARE_VALUES
    max_containers = 2 * max_client_batch_size + SPARE_VALUES // 4
    max_strings = SPARE_VALUES if token_ids else 2 * max_values  # keys and texts
    if within(raw, max_values, max_containers, max_strings):
        return
    try:  # a body that is not JSON is 400, as TEI's parser answers it: a prefix shows most (depth, syntax)
        from_json(raw[:PREFIX_BYTES], allow_partial=True)
    except ValueError as exc:
        raise ServiceError(
            tei_errors.VALIDATION, f"the body is not valid JSON ({exc})", status=400, reason="json"
        ) from None
    what = f"{max_containers} lists and objects" if token_ids else f"{max_values} values"
    raise ServiceError(
        tei_errors.VALIDATION,
        f"the body holds more than {what}: more than a request of at most {max_client_batch_size} inputs "
        "(maximum allowed batch size, MAX_CLIENT_BATCH_SIZE) carries",
        reason="batch_size",
    )
