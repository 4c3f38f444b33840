"""text-embeddings-inference's /predict contract, case by case, against a real `python -m inference` process.

The reference is TEI's own source (huggingface/text-embeddings-inference, read at commit 0d124dc):
  router/src/http/types.rs   PredictInput's Deserialize (visit_str / visit_seq), PredictRequest, TruncationDirection
  router/src/http/server.rs  predict(), the routes, `From<&ErrorType> for StatusCode`
  router/src/lib.rs          Info, ClassifierModel, ModelType, ErrorType, ResponseMetadata's headers
  core/src/tokenization.rs   EncodingInput::is_empty, MAX_CHAR_MULTIPLIER, the token-count error
  core/src/infer.rs          predict(): softmax (sigmoid for one label) unless raw_scores
Where TEI's OpenAPI examples and its deserializer disagree (["a", "b"]), the deserializer wins.
"""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.service import assert_matches

pytestmark = pytest.mark.slow

JSON = {"content-type": "application/json"}
SPORTS = "The yankees beat the red sox in overtime, the ap reported."
BUSINESS = "Shares of oracle rose in early trading after the earnings report."


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def post(http, body, path="/predict") -> httpx.Response:
    return http.post(path, json=body)


# ------------------------------------------------------------------- inputs (types.rs: PredictInput)


def test_a_string_is_one_text_answered_with_one_flat_list(http, reference):
    """visit_str -> PredictInput::Single(Sequence::Single); server.rs: PredictResponse::Single, sorted by score."""
    response = post(http, {"inputs": BUSINESS})
    assert response.status_code == 200
    assert_matches(response.json(), reference.probabilities(BUSINESS))


def test_a_list_of_one_string_is_one_text_too(http):
    """visit_seq: first element Internal::Single and no second -> PredictInput::Single(Sequence::Single)."""
    assert post(http, {"inputs": [BUSINESS]}).json() == post(http, {"inputs": BUSINESS}).json()


def test_two_strings_are_one_text_pair_tokenized_as_a_pair(http, reference):
    """visit_seq: first element Internal::Single, a second one -> Single(Sequence::Pair(first, second)),
    encoded as (text, text_pair) (EncodingInput::Dual). Not a batch of two."""
    answer = post(http, {"inputs": [SPORTS, BUSINESS]}).json()
    assert isinstance(answer[0], dict)  # one flat list: one input
    assert_matches(answer, reference.probabilities(SPORTS, BUSINESS))
    assert answer != post(http, {"inputs": SPORTS}).json()


def test_a_list_of_lists_is_a_batch_of_singles_and_pairs_in_order(http, reference):
    """visit_seq: first element Internal::Multiple -> PredictInput::Batch; each item has 1 (Single) or 2 (Pair)
    strings; server.rs: PredictResponse::Batch, one list per input, in input order."""
    answer = post(http, {"inputs": [[SPORTS], [BUSINESS, SPORTS], [BUSINESS]]}).json()
    assert len(answer) == 3 and all(isinstance(a, list) for a in answer)
    assert_matches(answer[0], reference.probabilities(SPORTS))
    assert_matches(answer[1], reference.probabilities(BUSINESS, SPORTS))
    assert_matches(answer[2], reference.probabilities(BUSINESS))
    assert post(http, {"inputs": [[SPORTS]]}).json() == [post(http, {"inputs": SPORTS}).json()]


@pytest.mark.parametrize(
    "inputs",
    [
        ["a", "b", "c"],  # visit_seq: a third string -> invalid_length(3)
        [],  # no first element -> invalid_length(0)
        [[]],  # sequence_from_vec: 0 strings
        [["a", "b", "c"]],  # sequence_from_vec: 3 strings
        [["a"], "b"],  # after a batch item, next_element::<Vec<String>> meets a string
        ["a", ["b"]],  # after a single, the second element must be a string
        5,
        None,
        [1],
        {"text": "a"},
    ],
)
def test_shapes_tei_rejects_get_422_validation(http, inputs):
    response = post(http, {"inputs": inputs})
    assert response.status_code == 422, response.text
    assert response.json()["error_type"] == "Validation" and response.json()["error"].startswith("inputs")


def test_three_strings_get_a_message_saying_how_to_send_a_batch(http):
    error = post(http, {"inputs": ["a", "b", "c"]}).json()["error"]
    assert "neither one text nor a pair" in error and '[["text 1"], ["text 2"], ...]' in error


@pytest.mark.parametrize("body", [b"{not json", b"", b'{"inputs": "a"', b'{"inputs": "\xff"}'])
def test_text_that_is_not_json_is_400_and_json_of_the_wrong_shape_422(http, body):
    """TEI's handler takes `Json<PredictRequest>` (router/src/http/server.rs, axum 0.7 per router/Cargo.toml): axum
    answers a body that is not syntactically valid JSON with its JsonSyntaxError, 400 Bad Request, and valid JSON
    that does not deserialize into PredictRequest with JsonDataError, 422."""
    response = http.post("/predict", content=body, headers=JSON)
    assert response.status_code == 400, response.text
    assert response.json()["error_type"] == "Validation" and "not valid JSON" in response.json()["error"]
    assert post(http, {"truncate": True}).status_code == 422  # valid JSON, no inputs
    assert http.post("/predict", content=b'{"inputs": 5}', headers=JSON).status_code == 422


# ----------------------------------------------------------------- empty (tokenization.rs: is_empty)


@pytest.mark.parametrize("inputs, where", [("", ""), ([["ok"], [""]], "inputs[1]"), (["", ""], "")])
def test_only_zero_length_inputs_are_empty_400(http, inputs, where):
    """EncodingInput::is_empty: Single(s) -> s.is_empty(); Dual(a, b) -> both empty. ErrorType::Empty -> 400."""
    response = post(http, {"inputs": inputs})
    assert response.status_code == 400
    assert response.json() == {
        "error": "`inputs` cannot be empty" + (f" ({where})" if where else ""),
        "error_type": "Empty",
    }


@pytest.mark.parametrize("inputs", ["   ", "\n\t", ["", "a pair with an empty first text"], "\u200b"])
def test_whitespace_and_half_empty_pairs_are_classified(http, inputs):
    response = post(http, {"inputs": inputs})
    assert response.status_code == 200 and len(response.json()) == 4


# ------------------------------------------------------------- truncation (types.rs: PredictRequest)


def long_text(start: str, end: str) -> str:
    """A text of ~1,100 tokens whose first 512 tokens are about one topic and whose last 512 about another."""
    return " ".join([start] * 45 + [end] * 45)


def test_truncate_null_or_absent_means_the_server_default(http):
    """server.rs: `req.truncate.unwrap_or(info.auto_truncate)`; AUTO_TRUNCATE defaults to true."""
    text = long_text(SPORTS, BUSINESS)
    absent, null = post(http, {"inputs": text}), post(http, {"inputs": text, "truncate": None})
    assert absent.status_code == null.status_code == 200 and absent.json() == null.json()


def test_truncate_false_refuses_a_long_input_with_its_token_count(http, reference):
    """tokenization.rs encode_input: `inputs` must have less than {max_input_length} tokens. Given: {seq_len}."""
    text = long_text(SPORTS, BUSINESS)
    tokens = len(reference.tokenizer(text)["input_ids"])
    response = post(http, {"inputs": text, "truncate": False})
    assert response.status_code == 422
    assert response.json() == {
        "error": f"`inputs` must have less than 512 tokens. Given: {tokens}",
        "error_type": "Validation",
    }


@pytest.mark.parametrize("direction", ["Left", "left"])
def test_left_truncation_keeps_the_end_of_the_text(http, reference, direction):
    """TruncationDirection: Left (alias left) / Right (alias right, the default), passed to the tokenizer."""
    text = long_text(SPORTS, BUSINESS)
    left = post(http, {"inputs": text, "truncation_direction": direction}).json()
    right = post(http, {"inputs": text, "truncation_direction": "right"}).json()
    assert_matches(left, reference.probabilities(text, side="left"))
    assert_matches(right, reference.probabilities(text, side="right"))
    assert left[0]["label"] == "Business" and right[0]["label"] == "Sports"
    assert post(http, {"inputs": text}).json() == right  # Right is the default


def test_an_unknown_truncation_direction_is_422(http):
    assert post(http, {"inputs": "x", "truncation_direction": "Up"}).status_code == 422


def test_inputs_over_the_character_bound_are_cut_or_refused_before_tokenizing(http):
    """tokenization.rs tokenize_input: limit = max_input_length * MAX_CHAR_MULTIPLIER (250); over it, refused
    without truncation, cut to the limit with it."""
    text = "news " * (512 * 250 // 5 + 10)
    refused = post(http, {"inputs": text, "truncate": False})
    assert refused.status_code == 422
    assert refused.json()["error"] == f"`inputs` must have less than {512 * 250} characters. Given: {len(text)}"
    assert post(http, {"inputs": text}).status_code == 200


# ----------------------------------------------------------- scores, options, unknown fields, limits


def test_raw_scores_are_the_logits(http, reference):
    """infer.rs predict(): softmax only when !raw_scores."""
    answer = post(http, {"inputs": SPORTS, "raw_scores": True}).json()
    logits = dict(zip(reference.labels, reference.logits(SPORTS)))
    assert all(abs(p["score"] - logits[p["label"]]) < 1e-4 for p in answer)
    assert [p["score"] for p in answer] == sorted((p["score"] for p in answer), reverse=True)


def test_inference_api_parameters_top_k_and_function_to_apply(http, reference):
    """What huggingface_hub's InferenceClient.text_classification sends: {"inputs", "parameters": {...}}."""
    import torch

    top = post(http, {"inputs": SPORTS, "parameters": {"top_k": 2}}).json()
    assert [p["label"] for p in top] == [p["label"] for p in post(http, {"inputs": SPORTS}).json()][:2]
    sigmoid = post(http, {"inputs": SPORTS, "parameters": {"function_to_apply": "sigmoid"}}).json()
    expected = dict(zip(reference.labels, torch.sigmoid(torch.tensor(reference.logits(SPORTS))).tolist()))
    assert_matches(sigmoid, expected)
    none = post(http, {"inputs": SPORTS, "parameters": {"function_to_apply": "none"}}).json()
    assert none == post(http, {"inputs": SPORTS, "raw_scores": True}).json()
    assert post(http, {"inputs": SPORTS, "parameters": {"function_to_apply": "relu"}}).status_code == 422


def test_top_k_extension_and_unknown_fields_ignored(http):
    """serde ignores unknown fields by default (no deny_unknown_fields on PredictRequest)."""
    full = post(http, {"inputs": [[SPORTS], [BUSINESS]]}).json()
    top1 = post(http, {"inputs": [[SPORTS], [BUSINESS]], "top_k": 1, "normalize": True, "whatever": {"a": 1}}).json()
    assert top1 == [answer[:1] for answer in full]
    assert post(http, {"inputs": SPORTS, "top_k": 10}).json() == post(http, {"inputs": SPORTS}).json()
    assert post(http, {"inputs": SPORTS, "top_k": 0}).status_code == 422


def test_a_batch_over_max_client_batch_size_is_422(http):
    """server.rs predict: batch_size > info.max_client_batch_size -> Validation."""
    response = post(http, {"inputs": [["t"]] * 33})
    assert response.status_code == 422
    assert response.json()["error"] == "batch size 33 > maximum allowed batch size 32"
    assert post(http, {"inputs": [["t"]] * 32}).status_code == 200


def test_response_headers(http, reference):
    """lib.rs `From<ResponseMetadata> for HeaderMap`: x-compute-time, -characters, -tokens, x-total-time,
    x-tokenization-time, x-queue-time, x-inference-time (milliseconds)."""
    inputs = [[SPORTS], [BUSINESS, SPORTS]]
    response = post(http, {"inputs": inputs})
    headers = response.headers
    for name in ("x-compute-time", "x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert headers[name].isdigit(), name
    assert int(headers["x-compute-characters"]) == sum(len(t) for item in inputs for t in item)
    tokens = len(reference.tokenizer(SPORTS)["input_ids"]) + len(reference.tokenizer(BUSINESS, SPORTS)["input_ids"])
    assert int(headers["x-compute-tokens"]) == tokens
    assert headers["x-compute-type"] == "cpu"


# ------------------------------------------------------------------------ routes (server.rs: run())


@pytest.mark.parametrize("path", ["/", "/invocations"])
def test_post_root_and_invocations_answer_as_predict(http, path):
    body = {"inputs": [[SPORTS], [BUSINESS]]}
    assert post(http, body, path).json() == post(http, body).json()


@pytest.mark.parametrize("path", ["/health", "/", "/ping"])
def test_health_routes(http, path):
    assert http.get(path).status_code == 200


def test_info_is_tei_info(http, smoke_checkpoint):
    """lib.rs Info: model_id, model_sha, model_dtype, served_model_name, model_type {classifier: {id2label,
    label2id}}, router parameters, version; our details under a key of their own."""
    info = http.get("/info").json()
    assert info["model_id"] == str(smoke_checkpoint) and info["model_sha"] is None
    assert info["model_dtype"] == "float32"
    labels = ["World", "Sports", "Business", "Sci/Tech"]
    assert info["model_type"] == {
        "classifier": {
            "id2label": {str(i): name for i, name in enumerate(labels)},
            "label2id": {name: i for i, name in enumerate(labels)},
        }
    }
    assert (
        info["max_concurrent_requests"],
        info["max_input_length"],
        info["max_batch_tokens"],
        info["max_batch_requests"],
        info["max_client_batch_size"],
        info["auto_truncate"],
        info["tokenization_workers"],
    ) == (512, 512, 16384, 32, 32, True, 1)
    assert isinstance(info["version"], str)
    assert len(info["distilbert_agnews"]["checkpoint"]["sha256"]) == 64


def test_errors_have_tei_error_bodies(http):
    """lib.rs ErrorResponse {error, error_type}; ErrorType serialized by name (Empty, Validation, ...)."""
    for body, status, kind in (({"inputs": ""}, 400, "Empty"), ({"inputs": 5}, 422, "Validation")):
        response = post(http, body)
        assert response.status_code == status and set(response.json()) == {"error", "error_type"}
        assert response.json()["error_type"] == kind


# ------------------------------------------- /tokenize, /decode, /rerank, content type (server.rs, types.rs)


@pytest.fixture(scope="module")
def tokenizer(smoke_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smoke_checkpoint / "tokenizer")


def test_tokenize_answers_tei_simple_tokens(http, tokenizer):
    """TEI's /tokenize: tokens with byte offsets, specials without (server.rs, tokenization.rs)."""
    text = "Café owners rallied"
    [tokens] = post(http, {"inputs": text}, "/tokenize").json()
    ids = tokenizer(text)["input_ids"]
    assert [t["id"] for t in tokens] == ids
    assert tokens[0] == {"id": ids[0], "text": tokenizer.cls_token, "special": True, "start": None, "stop": None}
    assert tokens[-1]["special"] and tokens[-1]["text"] == tokenizer.sep_token
    words = tokens[1:-1]
    assert not any(t["special"] for t in words)
    raw = text.encode()
    assert all(raw[t["start"] : t["stop"]].decode() == t["text"] for t in words)
    assert words[-1]["stop"] == len(raw) == len(text) + 1  # é is two bytes
    batch = post(http, {"inputs": [text, "ok"], "add_special_tokens": False}, "/tokenize").json()
    assert [t["id"] for t in batch[0]] == ids[1:-1] and batch[0] == words and len(batch) == 2


def test_tokenize_refuses_a_prompt_name_empty_batches_and_oversized_ones_as_tei(http):
    """prepare_pre_prompt: a prompt name with no Sentence Transformers prompts is a Validation error (422);
    server.rs: an empty batch is Empty (400), one over MAX_CLIENT_BATCH_SIZE (32) Validation (422)."""
    prompt = post(http, {"inputs": "a", "prompt_name": "query"}, "/tokenize")
    assert prompt.status_code == 422 and prompt.json()["error_type"] == "Validation"
    assert "`default-prompt-name` is set to `query` but no prompts were found" in prompt.json()["error"]
    empty = post(http, {"inputs": []}, "/tokenize")
    assert empty.status_code == 400 and empty.json() == {"error": "`inputs` cannot be empty", "error_type": "Empty"}
    over = post(http, {"inputs": ["a"] * 33}, "/tokenize")
    assert over.status_code == 422 and "batch size 33 > maximum allowed batch size 32" in over.json()["error"]


def test_tokenize_bounds_each_input_as_tei_and_answers_a_long_one_whole(http, tokenizer):
    """/tokenize never truncates; past the bound it is a Validation error."""
    limit = http.get("/info").json()["max_input_length"] * 250
    over = post(http, {"inputs": ["ok", "a" * (limit + 1)]}, "/tokenize")
    assert over.status_code == 422 and over.json() == {
        "error": f"`inputs` must have less than {limit} characters. Given: {limit + 1}",
        "error_type": "Validation",
    }
    text = ("Café owners rallied; naïve déjà vu in Zürich. " * (limit // 40))[:limit]
    [tokens] = post(http, {"inputs": text}, "/tokenize").json()
    assert [t["id"] for t in tokens] == tokenizer(text, verbose=False)["input_ids"]
    raw = text.encode()
    assert all(raw[t["start"] : t["stop"]].decode() == t["text"] for t in tokens if not t["special"])
    assert tokens[-2]["stop"] == len(raw) > len(text)


def test_tokenize_and_decode_name_what_they_take_when_the_shape_is_wrong(http):
    """A pair or a number sent to /tokenize is told what /tokenize takes (not /predict's pairs); a negative id in a
    /decode batch is named by its place in the batch."""
    for inputs in (["a", ["b", "c"]], 5, [3]):
        response = post(http, {"inputs": inputs}, "/tokenize")
        assert response.status_code == 422
        assert response.json()["error"].startswith("inputs: expected a string or a list of strings"), response.text
        assert "pair" not in response.json()["error"]
    negative = post(http, {"ids": [[5, 6], [7, -2]]}, "/decode")
    assert negative.status_code == 422 and "ids[1][1] is -2; token ids are 0 or more" in negative.json()["error"]
    single = post(http, {"ids": [5, -1]}, "/decode")
    assert single.status_code == 422 and "ids[1] is -1" in single.json()["error"]


def test_decode_answers_texts_from_ids_as_tei(http, tokenizer):
    """server.rs `decode`: one list of ids or a batch, skip_special_tokens (default true), a list of strings; an
    id outside the vocabulary is the tokenizer's error (422)."""
    ids = tokenizer("Shares rose")["input_ids"]
    assert post(http, {"ids": ids}, "/decode").json() == [tokenizer.decode(ids, skip_special_tokens=True)]
    both = post(http, {"ids": [ids, ids[1:2]], "skip_special_tokens": False}, "/decode").json()
    assert both == [tokenizer.decode(ids), tokenizer.decode(ids[1:2])] and both[0].startswith(tokenizer.cls_token)
    # untagged InputIds tries Single(Vec<u32>) first: [] is one empty sequence, not an empty batch
    assert post(http, {"ids": []}, "/decode").json() == [""]
    bad = post(http, {"ids": [len(tokenizer) + 5]}, "/decode")
    assert bad.status_code == 422 and bad.json()["error_type"] == "Tokenizer"


def test_rerank_on_a_classifier_is_tei_backend_error(http):
    """server.rs `rerank`: empty texts first (Empty, 400), then a model that is not a re-ranker (several labels):
    `Backend error: model is not a re-ranker model`, 424, counted as te_request_failure{err="model_type"}."""
    empty = post(http, {"query": "q", "texts": []}, "/rerank")
    assert empty.status_code == 400 and empty.json() == {"error": "`texts` cannot be empty", "error_type": "Empty"}
    refused = post(http, {"query": "q", "texts": [SPORTS]}, "/rerank")
    assert refused.status_code == 424
    assert refused.json() == {"error": "Backend error: model is not a re-ranker model", "error_type": "Backend"}
    assert 'te_request_failure{err="model_type"}' in http.get("/metrics").text
    assert post(http, {"inputs": SPORTS}).status_code == 200  # /predict serves this model


@pytest.mark.parametrize("path", ["/predict", "/rerank", "/tokenize", "/decode"])
@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_sent_as_json_is_415_as_axum_answers_it(http, path, content_type):
    """TEI's handlers take axum's `Json` extractor, which refuses a missing or non-JSON Content-Type with 415
    Unsupported Media Type before reading the body (application/json and application/*+json pass, with a charset)."""
    headers = {"content-type": content_type} if content_type else {}
    response = http.post(path, content=b'{"inputs": "a"}', headers=headers)
    assert response.status_code == 415, response.text
    assert response.json() == {
        "error": "Expected request with `Content-Type: application/json`",
        "error_type": "UnsupportedMediaType",
    }
    typed = http.post(
        "/predict", content=b'{"inputs": "a"}', headers={"content-type": "application/json; charset=utf-8"}
    )
    assert typed.status_code == 200


def test_answers_are_json_as_serde_json_writes_it_a_non_finite_score_as_null():
    """Non-finite floats are null, as serde_json writes them (src/ser.rs)."""
    import json

    from inference.front_end.schemas import Json

    answer = [[{"label": "Économie", "score": 0.912345678}, {"label": "Sports", "score": 1e-05}]]
    assert json.loads(Json(answer).body) == json.loads(json.dumps(answer))
    assert "Économie".encode() in Json(answer).body
    odd = [{"label": "a", "score": float("nan")}, {"label": "b", "score": float("inf")}]
    assert json.loads(Json(odd).body) == [{"label": "a", "score": None}, {"label": "b", "score": None}]
