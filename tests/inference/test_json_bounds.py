"""A body past what a request may carry is refused before it is parsed: the count against a parse, and every JSON
route and KServe's tensors over the app (its cost: bench/refusal_cost.py)."""

from __future__ import annotations

import json
import random
import struct

import pytest

from inference.front_end.json_bounds import within
from tests.inference.test_app import JSON, make_client

NAME = "agnews-topics"


def counted(value) -> tuple[int, int, int]:
    """(values, lists and objects, strings) of a parsed document; keys are strings, not values."""
    if isinstance(value, list):
        inner, keys = [counted(v) for v in value], 0
    elif isinstance(value, dict):
        inner, keys = [counted(v) for v in value.values()], len(value)
    else:
        return 1, 0, int(isinstance(value, str))
    return 1 + sum(i[0] for i in inner), 1 + sum(i[1] for i in inner), keys + sum(i[2] for i in inner)


def document(rng: random.Random, depth: int = 0):
    """Random JSON whose strings hold the structure's own characters, escapes and unicode; no empty containers."""
    kind = rng.random()
    if depth < 3 and kind < 0.3:
        return [document(rng, depth + 1) for _ in range(rng.randint(1, 6))]
    if depth < 3 and kind < 0.5:
        return {f"k{i},[{{": document(rng, depth + 1) for i in range(rng.randint(1, 4))}
    if kind < 0.8:
        return "".join(rng.choice(['"', "\\", ",", "[", "{", "]", "a", "é", "🔋", "\n", " "]) for _ in range(8))
    return rng.choice([0, -1.5e3, True, None, 12345678901234567890])


def test_the_count_agrees_with_a_parse_on_random_documents():
    rng = random.Random(0)
    for _ in range(2000):
        parsed = document(rng)
        raw = json.dumps(parsed, ensure_ascii=rng.random() < 0.5).encode()
        values, containers, strings = counted(parsed)
        for limit in (values - 1, values):
            assert within(raw, limit, 10**6, 10**6) == (values <= limit), raw
        for limit in (containers - 1, containers):
            assert within(raw, None, limit, 10**6) == (containers <= limit), raw
        for limit in (strings - 1, strings):
            assert within(raw, None, 10**6, limit) == (strings <= limit), raw


def test_an_oversized_body_is_refused_and_a_long_text_full_of_commas_is_not():
    assert not within(json.dumps({"input": [""] * 390_000}).encode(), 1280, 320, 2560)
    assert not within(json.dumps({"inputs": [[""]] * 240_000}).encode(), 1280, 320, 2560)
    assert not within(b"[" + b"0," * 900_000 + b"0]", 1280, 320, 2560)
    assert not within(json.dumps({"ids": [1], "note": [""] * 300_000}).encode(), None, 320, 1024)
    assert within(json.dumps({"inputs": 'a, [b], {c}, \\ "q"' * 100_000}).encode(), 1280, 320, 2560)
    assert within(b'{"inputs": "unterminated, , , ,', 2, 1, 2)  # the parser says what is wrong with it


@pytest.fixture(scope="module")
def client(smoke_checkpoint):
    with make_client(smoke_checkpoint, served_model_name=NAME, max_client_batch_size=8) as c:
        yield c


ROUTES = {
    "/predict": {"inputs": [["a"]] * 5_000},
    "/rerank": {"query": "q", "texts": ["a"] * 5_000},
    "/v1/classify": {"input": ["a"] * 5_000},
    "/v2/rerank": {"query": "q", "documents": ["a"] * 5_000},
    "/tokenize": {"inputs": ["a"] * 5_000},
    "/decode": {"ids": [[1]] * 5_000},
    f"/v2/models/{NAME}/infer": {
        "inputs": [{"name": "text", "shape": [5_000], "datatype": "BYTES", "data": ["a"] * 5_000}]
    },  # fmt: skip
}


@pytest.mark.parametrize("path", ROUTES)
def test_every_json_route_refuses_a_body_past_the_bounds_before_parsing_it(client, path):
    answer = client.post(path, content=json.dumps(ROUTES[path]), headers=JSON)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error_type"] == "Validation"
    assert "more than a request of at most 8 inputs" in answer.json()["error"]


def test_a_body_past_the_bounds_that_is_not_json_is_400_as_teis_parser_answers(client):
    for body in (b"[" * 3000, b'{"inputs": [' + b'[""],' * 500 + b"}]"):
        answer = client.post("/predict", content=body, headers=JSON)
        assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"], answer.text


def test_within_the_bounds_unknown_fields_and_long_ids_are_still_taken(client):
    extra = {f"field{i}": [i, {"note": "x"}] for i in range(100)}
    assert client.post("/predict", json={"inputs": [["a"]] * 8, **extra}).status_code == 200
    assert client.post("/decode", json={"ids": [101] * 20_000}).status_code == 200  # one long text's ids


def test_a_kserve_shape_past_the_batch_size_is_refused_before_its_elements_are_read(client):
    blob = struct.pack("<I", 0) * 490_000
    head = json.dumps(
        {
            "inputs": [
                {"name": "text", "shape": [490_000], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}
            ]
        }  # fmt: skip
    ).encode()
    answer = client.post(
        f"/v2/models/{NAME}/infer", content=head + blob, headers={"Inference-Header-Content-Length": str(len(head))}
    )
    assert answer.status_code == 422 and answer.json()["error"] == "batch size 490000 > maximum allowed batch size 8"
    two = json.dumps(
        {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": 15}}]}
    ).encode()
    three = struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b" + struct.pack("<I", 1) + b"c"
    headers = {"Inference-Header-Content-Length": str(len(two))}
    more = client.post(f"/v2/models/{NAME}/infer", content=two + three, headers=headers)
    assert more.status_code == 400 and "more elements than its shape declares (2)" in more.json()["error"]


def test_a_header_length_that_is_not_ascii_digits_is_shown_as_sent(client):
    answer = client.post(
        f"/v2/models/{NAME}/infer",
        content=b"{}",
        headers=[(b"Inference-Header-Content-Length", "²".encode())],
    )
    assert answer.status_code == 400 and "'²' is not a length" in answer.json()["error"], answer.text
