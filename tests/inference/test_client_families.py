"""vLLM classify, Cohere rerank and KServe v2 through their real clients, over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
import torch

from contract import files, problem_types
from tests.helpers.docs import block
from tests.helpers.files import save_new_weights
from tests.helpers.processes import describe, launch
from tests.helpers.service import Server
from tests.inference.test_app import JSON, TEXTS, make_client, model_busy

pytestmark = pytest.mark.slow
NAME = "agnews-topics"
ARGS = ("--backend", "torch", "--dtype", "float32", "--reload_interval_s", "0", "--served_model_name", NAME)
# vLLM's fields, read from its source (vllm/entrypoints/pooling/classify/protocol.py, ClassificationResponse and
# ClassificationData; UsageInfo and ErrorInfo in vllm/entrypoints/openai/protocol.py)
VLLM_RESPONSE = {"id", "object", "created", "model", "data", "usage"}
VLLM_DATA = {"index", "label", "probs", "num_classes"}
VLLM_USAGE = {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"}
VLLM_ERROR = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def reranker(smoke_checkpoint, tmp_path_factory):
    """The smoke model with one output (its first label's row): TEI's rule makes it a reranker."""
    import shutil

    folder = shutil.copytree(smoke_checkpoint, tmp_path_factory.mktemp("reranker") / "ckpt")
    (folder / files.HF_WEIGHTS).unlink()
    config = json.loads((folder / files.CONFIG).read_text())
    config.update(id2label={"0": "relevance"}, label2id={"relevance": 0}, problem_type="regression")
    config.pop("calibration")
    config[files.WEIGHTS_SHA256].pop(files.HF_WEIGHTS)
    (folder / files.CONFIG).write_text(json.dumps(config))
    state = torch.load(folder / files.WEIGHTS, weights_only=True)
    state["classifier.weight"], state["classifier.bias"] = state["classifier.weight"][:1], state["classifier.bias"][:1]
    save_new_weights(folder, state)
    return folder


@pytest.fixture(scope="module")
def servers(smoke_checkpoint, reranker):
    classifier = Server(smoke_checkpoint, *ARGS)
    ranking = Server(reranker, *ARGS)
    yield classifier.wait_ready(), ranking.wait_ready()
    classifier.stop()
    ranking.stop()


def by_label(ranked: list[dict], labels: list[str]) -> list[float]:
    scores = {entry["label"]: entry["score"] for entry in ranked}
    return [scores[label] for label in labels]


def test_vllm_classify_answers_as_predict_in_vllms_fields(servers):
    server, _ = servers
    labels = list(httpx.get(f"{server.url}/info").json()["model_type"]["classifier"]["id2label"].values())
    predicted = httpx.post(f"{server.url}/predict", json={"inputs": [[t] for t in TEXTS]})
    logits = httpx.post(f"{server.url}/predict", json={"inputs": [[t] for t in TEXTS], "raw_scores": True}).json()
    for path in ("/classify", "/v1/classify"):
        answer = httpx.post(f"{server.url}{path}", json={"model": NAME, "input": TEXTS})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert set(body) == VLLM_RESPONSE and body["object"] == "list" and body["model"] == NAME
        assert body["id"].startswith("classify-") and isinstance(body["created"], int)
        assert set(body["usage"]) == VLLM_USAGE and body["usage"]["completion_tokens"] == 0
        assert body["usage"]["prompt_tokens"] == int(predicted.headers["x-compute-tokens"]) > len(TEXTS)
        for i, (row, ranked) in enumerate(zip(body["data"], predicted.json(), strict=True)):
            assert set(row) == VLLM_DATA and row["index"] == i and row["num_classes"] == len(labels)
            assert row["label"] == ranked[0]["label"]
            assert row["probs"] == pytest.approx(by_label(ranked, labels), abs=1e-5)
    one = httpx.post(f"{server.url}/classify", json={"input": TEXTS[1], "use_activation": False}).json()
    assert one["model"] == NAME and one["data"][0]["probs"] == pytest.approx(by_label(logits[1], labels), abs=1e-5)
    cut = httpx.post(f"{server.url}/classify", json={"input": " ".join(TEXTS * 40), "truncate_prompt_tokens": -1})
    assert cut.status_code == 200, cut.text
    shorter = httpx.post(f"{server.url}/classify", json={"input": TEXTS[0], "truncate_prompt_tokens": 5})
    assert shorter.status_code == 400 and "send -1" in shorter.json()["error"]


def test_an_unknown_model_is_vllms_404_and_v1_models_lists_the_served_one(servers):
    server, _ = servers
    missing = httpx.post(f"{server.url}/v1/classify", json={"model": "gpt-4o", "input": "x"})
    assert missing.status_code == 404
    assert set(missing.json()) == {"error"} and set(missing.json()["error"]) == VLLM_ERROR
    assert missing.json()["error"]["type"] == "NotFoundError" and missing.json()["error"]["code"] == 404
    assert "`gpt-4o` does not exist" in missing.json()["error"]["message"]
    listed = httpx.get(f"{server.url}/v1/models").json()
    assert listed["object"] == "list" and [card["id"] for card in listed["data"]] == [NAME]
    assert listed["data"][0]["object"] == "model" and listed["data"][0]["max_model_len"] > 0
    assert httpx.get(f"{server.url}/info").json()["served_model_name"] == NAME


def test_the_cohere_sdk_reranks_as_rerank_does(servers):
    cohere = pytest.importorskip("cohere", reason="the cohere SDK is a dev dependency (pip install -e '.[dev]')")
    classifier, server = servers
    query, documents = "who won the game", TEXTS + ["the yankees won the series", "oil prices rose"]
    expected = httpx.post(f"{server.url}/rerank", json={"query": query, "texts": documents}).json()
    v2 = cohere.ClientV2(api_key="unused", base_url=server.url).rerank(
        model=NAME, query=query, documents=documents, top_n=3
    )
    assert [r.index for r in v2.results] == [rank["index"] for rank in expected][:3]
    assert [r.relevance_score for r in v2.results] == pytest.approx([rank["score"] for rank in expected][:3], abs=1e-5)
    v1 = cohere.Client(api_key="unused", base_url=server.url).rerank(
        model=NAME, query=query, documents=[{"text": d} for d in documents], return_documents=True
    )
    assert [r.index for r in v1.results] == [rank["index"] for rank in expected]
    assert [r.document.text for r in v1.results] == [documents[rank["index"]] for rank in expected]
    with pytest.raises(cohere.core.ApiError) as unknown:
        cohere.ClientV2(api_key="unused", base_url=server.url).rerank(model="rerank-v3.5", query=query, documents=["a"])
    assert unknown.value.status_code == 404
    not_a_reranker = httpx.post(f"{classifier.url}/v2/rerank", json={"query": query, "documents": documents})
    assert not_a_reranker.status_code == 424 and "not a re-ranker" in not_a_reranker.json()["error"]


def test_the_cohere_block_of_the_serving_docs_runs_against_a_reranker(servers):
    """docs/serving.md's Cohere block, as written but for the address (the docs' service is a classifier)."""
    _, server = servers
    code = block("docs/serving.md", "cohere.ClientV2").code.replace("http://localhost:8000", server.url)
    python = os.environ.get("CLIENTS_ONLY_PYTHON") or sys.executable  # .ci/run: the documented client install alone
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    index, score = done.stdout.split()
    assert index in ("0", "1") and 0 < float(score) < 1


def test_tritonclient_infers_over_kserve_v2_in_json_and_binary(servers):
    http = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is a dev dependency")
    server, _ = servers
    labels = list(httpx.get(f"{server.url}/info").json()["model_type"]["classifier"]["id2label"].values())
    expected = httpx.post(f"{server.url}/predict", json={"inputs": [[t] for t in TEXTS]}).json()
    client = http.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(NAME)
        assert not client.is_model_ready("another")
        metadata = client.get_model_metadata(NAME)
        assert [i["name"] for i in metadata["inputs"]] == ["text", "text_pair"]
        assert [o["name"] for o in metadata["outputs"]] == ["scores", "label", "decision"]
        assert metadata["outputs"][0]["shape"] == [-1, len(labels)] and metadata["outputs"][0]["labels"] == labels
        for binary in (True, False):
            text = http.InferInput("text", [len(TEXTS)], "BYTES")
            text.set_data_from_numpy(np.array(TEXTS, dtype=object), binary_data=binary)
            outputs = None if binary else [http.InferRequestedOutput(n, binary_data=False) for n in ("scores", "label")]
            result = client.infer(NAME, [text], outputs=outputs, request_id="r1")
            scores, best = result.as_numpy("scores"), result.as_numpy("label")
            assert scores.shape == (len(TEXTS), len(labels)) and scores.dtype == np.float32
            for row, label, ranked in zip(scores, best, expected, strict=True):
                assert row.tolist() == pytest.approx(by_label(ranked, labels), abs=1e-5)
                assert (label.decode() if isinstance(label, bytes) else label) == ranked[0]["label"]
            assert result.get_response()["id"] == "r1"
    finally:
        client.close()


def test_kserve_v2_refuses_malformed_tensors_with_400(servers):
    server, _ = servers
    url = f"{server.url}/v2/models/{NAME}/infer"
    tensor = {"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}
    bad = [
        {"inputs": [{**tensor, "shape": [3]}]},  # the shape does not hold the data
        {"inputs": [{**tensor, "datatype": "FP32"}]},
        {"inputs": [{**tensor, "data": [1, 2]}]},
        {"inputs": [tensor, {**tensor, "name": "image"}]},
        {"inputs": [{**tensor, "parameters": {"binary_data_size": 10}}]},  # no binary part
        {"inputs": [tensor], "outputs": [{"name": "logits"}]},
        {"inputs": [tensor], "parameters": {"threshold": 0.7}},  # a single-label model decides by its best label
    ]
    for body in bad:
        answer = httpx.post(url, json=body)
        assert answer.status_code == 400 and answer.json()["error"], (body, answer.text)
    torn = json.dumps({"inputs": [{**tensor, "data": None, "parameters": {"binary_data_size": 6}}]}).encode()
    answer = httpx.post(
        url, content=torn + b"\x09\x00\x00\x00ab", headers={"Inference-Header-Content-Length": str(len(torn))}
    )
    assert answer.status_code == 400 and "past its tensor" in answer.json()["error"]
    assert httpx.post(f"{server.url}/v2/models/other/infer", json={"inputs": [tensor]}).status_code == 404
    _, reranker = servers  # no classes: no decision output, and asking for one is refused
    one_output = httpx.get(f"{reranker.url}/v2/models/{NAME}").json()["outputs"]
    assert [o["name"] for o in one_output] == ["scores", "label"]
    asked = httpx.post(
        f"{reranker.url}/v2/models/{NAME}/infer", json={"inputs": [tensor], "outputs": [{"name": "decision"}]}
    )
    assert asked.status_code == 400 and "no output `decision`" in asked.json()["error"]


@pytest.mark.parametrize("threshold", [1.5, -0.1, True, "0.5", [0.5, 0.5]])
def test_a_bad_threshold_override_is_refused_by_a_multi_label_model(checkpoint_copy, threshold):
    """Per-request thresholds are numbers in [0, 1], one per label; anything else is 400 before the model runs."""
    config = json.loads((checkpoint_copy / files.CONFIG).read_text())
    config["problem_type"] = problem_types.MULTI
    (checkpoint_copy / files.CONFIG).write_text(json.dumps(config))
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}
    with make_client(checkpoint_copy) as client:
        for key in ("threshold", "thresholds"):
            answer = client.post(
                f"/v2/models/{checkpoint_copy}/infer", json={"inputs": [tensor], "parameters": {key: threshold}}
            )
            assert answer.status_code == 400 and f"parameters: {key} must be" in answer.json()["error"], answer.text
        both = client.post(
            f"/v2/models/{checkpoint_copy}/infer",
            json={"inputs": [tensor], "parameters": {"threshold": 0.5, "thresholds": [0.5] * 4}},
        )
        assert both.status_code == 400 and "one of them" in both.json()["error"]


def test_the_new_routes_answer_401_413_415_and_429_as_teis_do(smoke_checkpoint):
    limits = {"max_concurrent_requests": 3, "max_client_batch_size": 3, "payload_limit": 2_000}
    good = {"Authorization": "Bearer k", **JSON}
    bodies = {
        "/v1/classify": {"input": ["c", "d"]},
        "/v2/rerank": {"query": "q", "documents": ["c", "d"]},
        f"/v2/models/{NAME}/infer": {
            "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["c", "d"]}]
        },
    }
    with make_client(smoke_checkpoint, api_key="k", served_model_name=NAME, **limits) as c:
        for path, body in bodies.items():
            assert c.post(path, json=body).status_code == 401, path
            assert c.post(path, content=b" " * 3_000, headers=good).status_code == 413, path
        for path in ("/v1/classify", "/v2/rerank"):
            assert (
                c.post(path, content=json.dumps(bodies[path]), headers={"Authorization": "Bearer k"}).status_code == 415
            )
        for path in ("/v1/classify", f"/v2/models/{NAME}/infer"):
            with model_busy(c, {"inputs": [["a"], ["b"]]}, good) as first:
                busy = c.post(path, json=bodies[path], headers=good)
                assert busy.status_code == 429 and busy.json()["error_type"] == "Overloaded", (path, busy.text)
            assert first[0].status_code == 200
        assert c.get("/v2/health/ready").status_code == 200 and c.get("/v2/health/live").status_code == 200


# vLLM's score protocol, read from its source (vllm/entrypoints/pooling/scoring/protocol.py: ScoreTextRequest,
# ScoreDataRequest, ScoreQueriesDocumentsRequest, ScoreQueriesItemsRequest, ScoreResponse, ScoreResponseData; the
# pairing rule and its messages in vllm/entrypoints/pooling/scoring/utils.py, _validate_score_input_lens)
SCORE_RESPONSE = {"id", "object", "created", "model", "data", "usage"}
SCORE_DATA = {"index", "object", "score"}
QUERY, DOCUMENTS = "who won the final?", ["Shares fell", "The Yankees won the pennant", "Rain is expected"]


@pytest.mark.parametrize(("first", "second"), [("text_1", "text_2"), ("data_1", "data_2"), ("queries", "documents"),
                                               ("queries", "items")])  # fmt: skip
def test_vllm_score_equals_rerank_one_against_many_and_pair_by_pair(servers, first, second):
    _, server = servers
    reranked = httpx.post(f"{server.url}/rerank", json={"query": QUERY, "texts": DOCUMENTS}).json()
    expected = [next(r["score"] for r in reranked if r["index"] == i) for i in range(len(DOCUMENTS))]
    for path in ("/score", "/v1/score"):
        answer = httpx.post(f"{server.url}{path}", json={"model": NAME, first: QUERY, second: DOCUMENTS})
        assert answer.status_code == 200, answer.text
        said = answer.json()
        assert set(said) == SCORE_RESPONSE and said["object"] == "list" and said["model"] == NAME
        assert set(said["usage"]) == VLLM_USAGE and said["usage"]["prompt_tokens"] > 0
        assert [set(d) for d in said["data"]] == [SCORE_DATA] * 3 and [d["index"] for d in said["data"]] == [0, 1, 2]
        assert np.allclose([d["score"] for d in said["data"]], expected, atol=1e-6, rtol=0)
    pairwise = httpx.post(f"{server.url}/score", json={first: [QUERY] * 3, second: DOCUMENTS}).json()  # N:N
    assert np.allclose([d["score"] for d in pairwise["data"]], expected, atol=1e-6, rtol=0)


def test_vllm_score_logits_and_refusals_as_vllm_gives_them(servers):
    classifier, server = servers
    probabilities = httpx.post(f"{server.url}/score", json={"text_1": QUERY, "text_2": DOCUMENTS}).json()["data"]
    logits = httpx.post(f"{server.url}/score", json={"text_1": QUERY, "text_2": DOCUMENTS, "use_activation": False})
    assert np.allclose(torch.tensor([d["score"] for d in logits.json()["data"]]).sigmoid().tolist(),
                       [d["score"] for d in probabilities], atol=1e-6)  # fmt: skip
    uneven = httpx.post(f"{server.url}/score", json={"text_1": ["a", "b"], "text_2": DOCUMENTS})
    assert uneven.status_code == 400 and set(uneven.json()["error"]) == VLLM_ERROR
    assert uneven.json()["error"]["message"] == "Input lengths must be either 1:1, 1:N or N:N"
    empty = httpx.post(f"{server.url}/score", json={"text_1": QUERY, "text_2": []})
    assert empty.status_code == 400 and "At least one text_pair element" in empty.json()["error"]["message"]
    neither = httpx.post(f"{server.url}/score", json={"query": QUERY, "texts": DOCUMENTS})
    assert neither.status_code == 400 and "text_1 and text_2" in neither.json()["error"]["message"]
    # a classifier of several labels: vLLM serves no score route for it (tests/entrypoints/pooling/classify: 404)
    several = httpx.post(f"{classifier.url}/score", json={"text_1": QUERY, "text_2": DOCUMENTS})
    assert several.status_code == 404 and several.json() == {"detail": "Not Found"}
    named = httpx.post(f"{server.url}/v1/score", json={"model": "another", "text_1": QUERY, "text_2": DOCUMENTS})
    assert named.status_code == 404 and set(named.json()["error"]) == VLLM_ERROR


# OpenAI's moderation shape, read from the SDK's own types (openai/types/moderation_create_response.py:
# ModerationCreateResponse; openai/types/moderation.py: Moderation's flagged, categories, category_scores,
# category_applied_input_types)
MODERATION = {"id", "model", "results"}
# ours beside them: `review`, the labels the review band withholds
MODERATION_RESULT = {"flagged", "categories", "category_scores", "category_applied_input_types", "review"}


def test_openais_sdk_moderates_with_the_checkpoints_decision(servers):
    """`client.moderations.create` against a single-label classifier: each label a category, decided as the
    checkpoint decides (its best label), scored as /predict scores; every label flags by default."""
    openai = pytest.importorskip("openai", reason="the openai SDK is a dev dependency")
    server, _ = servers
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    said = client.moderations.create(model=NAME, input=TEXTS)
    labels = list(httpx.get(f"{server.url}/info").json()["model_type"]["classifier"]["id2label"].values())
    expected = httpx.post(f"{server.url}/predict", json={"inputs": [[t] for t in TEXTS]}).json()
    assert said.model == NAME and said.id.startswith("modr-") and len(said.results) == len(TEXTS)
    raw = httpx.post(f"{server.url}/v1/moderations", json={"input": TEXTS[0]}).json()
    assert set(raw) == MODERATION and set(raw["results"][0]) == MODERATION_RESULT
    for result, ranked in zip(said.results, expected):
        decisions = result.categories.model_extra  # our labels, beyond OpenAI's own categories
        scores = result.category_scores.model_extra
        assert list(decisions) == labels and [k for k, v in decisions.items() if v] == [ranked[0]["label"]]
        assert np.allclose([scores[label] for label in labels], by_label(ranked, labels), atol=1e-6)
        assert result.flagged is True  # by default every label of a single-label model flags
    single = client.moderations.create(input="The yankees beat the red sox in overtime.").results[0]
    assert single.categories.model_extra["Sports"] is True


def test_moderation_flags_by_flag_labels_and_negative_label_and_refuses_a_reranker(smoke_checkpoint, servers):
    _, reranker = servers
    with make_client(smoke_checkpoint, flag_labels="Sports") as client:
        results = client.post("/v1/moderations", json={"input": TEXTS}).json()["results"]
        assert [r["flagged"] for r in results] == [r["categories"]["Sports"] for r in results]
        assert any(r["flagged"] for r in results) and not all(r["flagged"] for r in results)
    with make_client(smoke_checkpoint, negative_label="Sports") as client:
        results = client.post("/v1/moderations", json={"input": TEXTS}).json()["results"]
        assert [r["flagged"] for r in results] == [not r["categories"]["Sports"] for r in results]
    with make_client(smoke_checkpoint, flag_labels="Weather") as client:
        refused = client.post("/v1/moderations", json={"input": TEXTS[0]})
        assert refused.status_code == 424 and "'Weather', which the model lacks" in refused.json()["error"]
    one_output = httpx.post(f"{reranker.url}/v1/moderations", json={"input": "a"})
    assert one_output.status_code == 424 and "moderation needs a classifier" in one_output.json()["error"]


@pytest.fixture(scope="module")
def banded(smoke_checkpoint, tmp_path_factory, smoke_dir) -> tuple[Path, list[str], list[int]]:
    """The smoke model with a review band on its top score at the median top score of 200 test texts (half of them
    withheld), written as training writes it; and those texts and labels."""
    import shutil

    from contract.loading import load_model

    rows = pd.read_csv(smoke_dir / "test.csv").head(200)
    texts, labels = rows["text"].tolist(), rows["label"].tolist()
    loaded = load_model(str(smoke_checkpoint), device="cpu", dtype="fp32")
    with torch.no_grad():
        batch = loaded.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        top = loaded.problem.scores(loaded.model(**batch).logits.float()).max(dim=1).values
    folder = shutil.copytree(smoke_checkpoint, tmp_path_factory.mktemp("banded") / "ckpt")
    config = json.loads((folder / files.CONFIG).read_text())
    config[problem_types.REVIEW_BAND] = {"precision": 0.95, "ranges": [[0.0, float(top.median())]]}
    (folder / files.CONFIG).write_text(json.dumps(config))
    return folder, texts, labels


def test_a_single_label_decision_is_the_same_in_every_shape_and_by_hand(banded, tmp_path):
    """200 texts, a review band: each decision (the best label, or `review`) is the same in moderation (openai SDK),
    KServe (tritonclient), vLLM's label, predict, evaluate's table, and the band applied to /predict's scores."""
    openai = pytest.importorskip("openai", reason="the openai SDK is a dev dependency")
    http = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is a dev dependency")
    folder, texts, truth = banded
    (tmp_path / "texts.csv").write_text(pd.DataFrame({"text": texts, "label": truth}).to_csv(index=False))
    output = tmp_path / "labelled.jsonl"
    args = ["--checkpoint_dir", str(folder), "--input_file", str(tmp_path / "texts.csv"), "--output_file", str(output)]
    result, _ = launch(["-m", "training.predict", *args, "--mixed_precision", "fp32"])
    assert result.returncode == 0, describe(result)
    predicted = [json.loads(line)["decision"] for line in output.read_text().splitlines()]
    server = Server(folder, *ARGS).wait_ready()
    try:
        labels = list(httpx.get(f"{server.url}/info").json()["model_type"]["classifier"]["id2label"].values())
        [card] = httpx.get(f"{server.url}/v1/models").json()["data"]
        metadata = httpx.get(f"{server.url}/v2/models/{NAME}").json()["outputs"][2]
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        moderated, scored, vllm = [], [], []
        for start in range(0, 200, 32):
            chunk = texts[start : start + 32]
            moderated += client.moderations.create(model=NAME, input=chunk).results
            scored += httpx.post(f"{server.url}/predict", json={"inputs": [[t] for t in chunk]}).json()
            vllm += httpx.post(f"{server.url}/classify", json={"model": NAME, "input": chunk}).json()["data"]
        triton = http.InferenceServerClient(url=server.url.removeprefix("http://"))
        tri_state = []
        for start in range(0, 200, 32):
            text = http.InferInput("text", [len(texts[start : start + 32])], "BYTES")
            text.set_data_from_numpy(np.array(texts[start : start + 32], dtype=object))
            tri_state += list(triton.infer(NAME, [text]).as_numpy("decision"))
        triton.close()
    finally:
        server.stop()
    band = json.loads((folder / files.CONFIG).read_text())[problem_types.REVIEW_BAND]
    assert card["problem_type"]["review_band"] == metadata["problem_type"]["review_band"] == band
    high = band["ranges"][0][1]
    by_hand = ["review" if np.float32(a[0]["score"]) < np.float32(high) else a[0]["label"] for a in scored]

    def one(chosen: list[str], withheld: list[str]) -> str:
        return "review" if withheld else chosen[0]

    moderation = [
        one([k for k, on in r.categories.model_extra.items() if on], r.model_extra["review"]) for r in moderated
    ]
    kserve = [one([labels[j] for j in np.flatnonzero(row == 1)], list(np.flatnonzero(row == -1))) for row in tri_state]
    assert moderation == kserve == [d["label"] for d in vllm] == predicted == by_hand
    assert 50 < by_hand.count("review") < 150 and all(r.flagged == (d != "review") for r, d in zip(moderated, by_hand))
    result, _ = launch(["-m", "training.evaluate", "--checkpoint_dir", str(folder),
                        "--test_file", str(tmp_path / "texts.csv"), "--mixed_precision", "fp32"])  # fmt: skip
    assert result.returncode == 0, describe(result)
    table = pd.read_csv(folder / files.MISCLASSIFIED_CSV)
    assert len(table) > 0 and [by_hand[i] for i in table["row"]] == table["decision"].tolist()
    band = json.loads((folder / files.EVAL_RESULTS).read_text())["review_band"]
    assert band["coverage"] == pytest.approx(1 - by_hand.count("review") / 200)
