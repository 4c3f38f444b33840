"""KServe's v2 REST protocol (the Open Inference Protocol, which Triton and MLServer clients speak): server and model
health, metadata, and infer with a BYTES `text` input (and `text_pair`), answered by the same engine as /predict:
`scores`, the top `label`, and a classifier's `decision` (the checkpoint's, contract/scoring.decide; a request's
`parameters.threshold(s)` decide a multi-label model at those, echoed). Tensors as JSON or in Triton's binary
extension (what tritonclient.http sends by default)."""

from __future__ import annotations

import math
import struct
import time

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from contract.scoring import BEST, THRESHOLDS
from inference import tei_errors
from inference.answers import ModelView
from inference.front_end import json_bounds
from inference.front_end.named_model import check_name, scores_in_label_order
from inference.front_end.routes import (
    VERSION,
    answered,
    check_batch_size,
    count_answer,
    failures_counted,
    guarded,
    live_view,
    queue_sequences,
    service,
)
from inference.front_end.schemas import Json
from inference.settings import Settings
from inference.tei_errors import ServiceError

# {name:path}: a Hub id (org/model) is a model name too. So the longest paths are registered first: the lowest
# decorator first, /ready's function before the bare name's

router = guarded()
public = APIRouter()  # the probes, as /health and /ready
HEADER_LENGTH = "inference-header-content-length"  # Triton's binary tensor extension
INPUTS = ("text", "text_pair")
OUTPUTS = {"scores": "FP32", "label": "BYTES", "decision": "INT8"}  # name: datatype; decision: 1 yes, 0 no, -1 review
PACKED = {"FP32": "<f4", "INT8": "i1"}  # binary tensors' element types (BYTES: pack_bytes)
MODEL_VERSION = "1"


class Tensor(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr
    shape: list[StrictInt] = Field(..., max_length=8)
    datatype: StrictStr
    parameters: dict = {}
    data: list | None = None


class Requested(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr
    parameters: dict = {}


class InferRequest(BaseModel):
    """The Open Inference Protocol's request: inputs, and optionally the outputs wanted."""

    model_config = ConfigDict(extra="ignore")
    id: StrictStr | None = None
    parameters: dict = {}
    inputs: list[Tensor]
    outputs: list[Requested] | None = None


@public.get("/v2/health/live", summary="200 while the server runs (KServe v2)")
async def live() -> dict:
    return {"live": True}


@public.get("/v2/health/ready", summary="200 while the model serves (KServe v2)")
async def ready(request: Request) -> dict:
    live_view(service(request))
    return {"ready": True}


@router.get("/v2", summary="The server's metadata (KServe v2)")
async def server_metadata() -> dict:
    return {"name": "distilbert-agnews", "version": VERSION, "extensions": ["binary_tensor_data"]}


@router.get("/v2/models/{name:path}/ready", summary="200 while the model serves (KServe v2)")
@router.get("/v2/models/{name:path}/versions/{version}/ready", include_in_schema=False)
async def model_ready(request: Request, name: str) -> dict:
    state = service(request)
    _, adapter = check_name(state, name, openai_body=False)
    live_view(state).named(adapter)
    return {"name": name, "ready": True}


@router.get("/v2/models/{name:path}", summary="The model's inputs and outputs (KServe v2)")
@router.get("/v2/models/{name:path}/versions/{version}", include_in_schema=False)
async def model_metadata(request: Request, name: str) -> dict:
    state = service(request)
    _, adapter = check_name(state, name, openai_body=False)
    view = live_view(state).named(adapter)
    outputs = [
        {"name": "scores", "datatype": OUTPUTS["scores"], "shape": [-1, len(view.labels)], "labels": view.labels},
        {"name": "label", "datatype": OUTPUTS["label"], "shape": [-1]},
    ]
    if decides(view):
        outputs.append({"name": "decision", "datatype": OUTPUTS["decision"], "shape": [-1, len(view.labels)],
                        "labels": view.labels, "problem_type": view.problem_card()})  # fmt: skip
    return {
        "name": name,
        "versions": [MODEL_VERSION],
        "platform": "pytorch",
        "inputs": [{"name": n, "datatype": "BYTES", "shape": [-1]} for n in INPUTS],
        "outputs": outputs,
    }


def decides(view: ModelView) -> bool:
    """Whether the model has classes to decide (a `decision` output)."""
    return view.decides in (BEST, THRESHOLDS)


@router.post(
    "/v2/models/{name:path}/infer",
    summary="Classify a BYTES tensor of texts (KServe v2)",
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": InferRequest.model_json_schema()}}}
    },
)
@router.post("/v2/models/{name:path}/versions/{version}/infer", include_in_schema=False)
async def infer(request: Request, name: str) -> Response:
    state, started = service(request), time.perf_counter()
    with failures_counted(state):
        _, adapter = check_name(state, name, openai_body=False)
        body, blobs = read_request(await request.body(), request.headers.get(HEADER_LENGTH), state.settings)
        texts, pairs = input_texts(body, blobs, state.settings)
        view = live_view(state).named(adapter)
        # before the model runs: an unknown output or a bad override costs it nothing
        wanted, thresholds = requested_outputs(body, view), asked_thresholds(body, view)
        state.metrics.request_count.labels("batch").inc()
        job = queue_sequences(state, list(zip(texts, pairs, strict=True)), True, None, False, None, adapter)
        answer = await answered(request, job)
        scores = scores_in_label_order(view, answer)
    count_answer(state, answer, started)
    outputs = {
        "scores": np.asarray(scores, dtype=np.float32),
        "label": np.asarray([ranked[0]["label"] for ranked in answer.ranked], dtype=object),
    }
    if any(asked.name == "decision" for asked in wanted):
        outputs["decision"] = view.decisions(scores, thresholds).tri_state()
    echoed = {} if thresholds is None else {"thresholds": thresholds}  # an override is never silent
    return respond(name, body, wanted, outputs, echoed)


def asked_thresholds(body: InferRequest, view: ModelView) -> list[float] | None:
    """A request's `threshold` (every label) or `thresholds` (one per label) in `parameters`: a multi-label model's
    decisions at them for this request (the review band left out); None when not asked."""
    given = {key: body.parameters[key] for key in ("threshold", "thresholds") if key in body.parameters}
    if not given:
        return None
    if view.decides != THRESHOLDS or len(given) > 1:
        raise bad(f"parameters: {' and '.join(given)} set the decision thresholds of a multi-label model "
                  f"(one of them); this model is {view.problem}")  # fmt: skip
    key, value = next(iter(given.items()))
    values = [value] * len(view.labels) if key == "threshold" else value
    fine = isinstance(values, list) and len(values) == len(view.labels)
    if not fine or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in values):
        raise bad(f"parameters: {key} must be {'a number' if key == 'threshold' else f'{len(view.labels)} numbers'} "
                  f"in [0, 1] (got {value!r:.80})")  # fmt: skip
    return [float(v) for v in values]


def bad(message: str) -> ServiceError:
    return ServiceError(tei_errors.VALIDATION, message, status=400, reason="validation")


def read_request(raw: bytes, header_length: str | None, settings: Settings) -> tuple[InferRequest, bytes]:
    """The JSON header and the binary tensors after it (none without the extension's header); a header holding more
    than a request of MAX_CLIENT_BATCH_SIZE inputs is refused before it is parsed."""
    split = len(raw)
    if header_length is not None:
        if not (header_length.isascii() and header_length.isdigit()) or int(header_length) > len(raw):
            sent = header_length.encode("latin-1", "replace").decode("utf-8", "replace")  # as the client wrote it
            raise bad(f"Inference-Header-Content-Length {sent!r} is not a length within the body")
        split = int(header_length)
    json_bounds.check(raw[:split], settings.max_client_batch_size)
    try:
        return InferRequest.model_validate_json(raw[:split]), raw[split:]
    except ValidationError as exc:
        raise bad(
            tei_errors.describe_validation(exc.errors(include_url=False), "an Open Inference Protocol request")
        ) from None


def input_texts(body: InferRequest, blobs: bytes, settings: Settings) -> tuple[list[str], list[str | None]]:
    """`text` (or the only input, whatever its name) and `text_pair`: BYTES, one element per input; a shape declaring
    more than MAX_CLIENT_BATCH_SIZE is refused before any element is read."""
    names = [tensor.name for tensor in body.inputs] if len(body.inputs) > 1 else ["text"] * len(body.inputs)
    if "text" not in names or set(names) - set(INPUTS) or len(set(names)) != len(names):
        raise bad(f"inputs: expected `text` and optionally `text_pair` (BYTES), got {names}")
    offset, columns = 0, {}
    for tensor in body.inputs:
        check_batch_size(settings, declared(tensor))
    for name, tensor in zip(names, body.inputs, strict=True):  # binary tensors follow the header in this order
        columns[name], offset = tensor_strings(tensor, blobs, offset)
    texts = columns["text"]
    pairs = columns.get("text_pair", [None] * len(texts))
    if not texts:
        raise ServiceError(tei_errors.EMPTY, "`text` cannot be empty", reason="validation")
    if len(pairs) != len(texts):
        raise bad(f"text_pair holds {len(pairs)} elements for {len(texts)} texts")
    return texts, pairs


def tensor_strings(tensor: Tensor, blobs: bytes, offset: int) -> tuple[list[str], int]:
    """A BYTES tensor's elements as text, from its JSON data or its binary data at `offset`."""
    if tensor.datatype != "BYTES":
        raise bad(f"input {tensor.name}: datatype {tensor.datatype}; texts are BYTES")
    count = declared(tensor)
    size = tensor.parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size < 0 or offset + size > len(blobs):
            raise bad(f"input {tensor.name}: binary_data_size {size!r} is past the body's end")
        elements, offset = unpack_bytes(blobs[offset : offset + size], tensor.name, count), offset + size
    elif tensor.data is not None:
        elements = list(flatten(tensor.data))
    else:
        raise bad(f"input {tensor.name}: no data")
    if count != len(elements):
        raise bad(f"input {tensor.name}: shape {tensor.shape} does not hold its {len(elements)} elements")
    if not all(isinstance(e, str) for e in elements):
        raise bad(f"input {tensor.name}: every element must be a string")
    return elements, offset


def declared(tensor: Tensor) -> int:
    """The elements its shape declares; -1 for a shape that declares none (a negative dimension)."""
    return math.prod(tensor.shape) if all(n >= 0 for n in tensor.shape) else -1


def flatten(data: list):
    for item in data:
        if isinstance(item, list):
            yield from flatten(item)
        else:
            yield item


def unpack_bytes(blob: bytes, name: str, count: int) -> list[str]:
    """Triton's BYTES serialization: each element a 4-byte little-endian length, then its bytes (UTF-8 here); past
    the `count` elements the shape declared is refused before they are read."""
    elements, at = [], 0
    while at < len(blob):
        if len(elements) == count:
            raise bad(f"input {name}: more elements than its shape declares ({count})")
        if at + 4 > len(blob):
            raise bad(f"input {name}: a torn element length")
        (length,) = struct.unpack_from("<I", blob, at)
        if at + 4 + length > len(blob):
            raise bad(f"input {name}: an element runs past its tensor")
        try:
            elements.append(blob[at + 4 : at + 4 + length].decode())
        except UnicodeDecodeError:
            raise bad(f"input {name}: an element is not UTF-8 text") from None
        at += 4 + length
    return elements


def requested_outputs(body: InferRequest, view: ModelView) -> list[Requested]:
    """The outputs asked for, all the model has by default; an unknown name is 400."""
    has = [name for name in OUTPUTS if name != "decision" or decides(view)]
    wanted = body.outputs or [Requested(name=n) for n in has]
    for asked in wanted:
        if asked.name not in has:
            raise bad(f"outputs: no output `{asked.name}`; this model has {has}")
    return wanted


def respond(name: str, body: InferRequest, wanted: list[Requested], outputs: dict, parameters: dict) -> Response:
    """Each output asked for, as JSON data or binary after the header, as requested; `parameters` echoed."""
    all_binary = body.parameters.get("binary_data_output") is True
    header, blobs = [], []
    for asked in wanted:
        array = outputs[asked.name]
        tensor = {"name": asked.name, "datatype": OUTPUTS[asked.name], "shape": list(array.shape)}
        if all_binary or asked.parameters.get("binary_data") is True:
            kind = OUTPUTS[asked.name]
            blob = array.astype(PACKED[kind]).tobytes() if kind in PACKED else pack_bytes(array)
            header.append({**tensor, "parameters": {"binary_data_size": len(blob)}})
            blobs.append(blob)
        else:
            header.append({**tensor, "data": array.ravel().tolist()})
    document = {"model_name": name, "model_version": MODEL_VERSION, "outputs": header}
    if body.id is not None:
        document["id"] = body.id
    if parameters:
        document["parameters"] = parameters
    if not blobs:
        return Json(document)
    head = Json(document).body
    return Response(
        head + b"".join(blobs),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(head))},
    )


def pack_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES serialization of text elements (unpack_bytes reads it)."""
    encoded = [element.encode() for element in array.ravel()]
    return b"".join(struct.pack("<I", len(e)) + e for e in encoded)
