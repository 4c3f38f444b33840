"""Several LoRA adapters on one base, each as served alone."""

from __future__ import annotations

import json
import shutil

import httpx
import numpy as np
import pytest

from tests.helpers.adapters import write_adapter, write_body
from tests.helpers.service import Server, run_cli, wait_for
from tests.inference.test_app import TEXTS, make_client

pytest.importorskip("peft", reason="pip install 'distilbert-agnews[peft]' (dev extra)")
pytestmark = pytest.mark.slow

TOPICS = ["World", "Sports", "Business", "Sci/Tech"]
MULTI_LABEL = "multi_label_classification"
FLAGS = ("--backend", "torch", "--dtype", "float32", "--served_model_name", "topics")
QUERY, DOCUMENTS = "who won the match", ["The striker scored twice.", "Shares fell after the forecast."]


@pytest.fixture(scope="module")
def folders(smoke_dir, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("adapters")
    body = write_body(root / "body", smoke_dir)
    other_body = write_body(root / "other_body", smoke_dir)  # the same weights, but another base by its place
    return {
        "body": body,
        "topics": write_adapter(root / "topics", body, TOPICS, seed=1),
        "tags": write_adapter(
            root / "tags", body, ["urgent", "local"], seed=2, problem_type="multi_label_classification"
        ),
        "relevance": write_adapter(root / "relevance", body, ["relevance"], seed=3, problem_type="regression"),
        "elsewhere": write_adapter(root / "elsewhere", other_body, ["a", "b"], seed=4),
    }


@pytest.fixture(scope="module")
def server(folders):
    adapters = f"tags={folders['tags']},relevance={folders['relevance']}"
    running = Server(folders["topics"], *FLAGS, "--lora_adapters", adapters, "--reload_interval_s", "0.2")
    yield running.wait_ready()
    running.stop()


def alone(folder, path: str, body: dict) -> dict:
    """What the service answers with this adapter as its only model (in-process, the same routes)."""
    with make_client(folder, backend="torch") as client:
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        return response.json()


def test_each_adapter_answers_as_served_alone_by_the_name_each_client_family_sends(server, folders):
    http = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is a dev dependency")
    for name in ("tags", "topics"):
        said = httpx.post(f"{server.url}/v1/classify", json={"model": name, "input": TEXTS}).json()
        expected = alone(folders[name], "/v1/classify", {"input": TEXTS})
        assert said["model"] == name and [d["label"] for d in said["data"]] == [d["label"] for d in expected["data"]]
        for row, one in zip(said["data"], expected["data"], strict=True):
            assert row["num_classes"] == one["num_classes"] and row["probs"] == pytest.approx(one["probs"], abs=1e-5)
    # TEI's routes answer MODEL_ID's adapter
    predicted = httpx.post(f"{server.url}/predict", json={"inputs": TEXTS[0]}).json()
    assert predicted == pytest.approx(alone(folders["topics"], "/predict", {"inputs": TEXTS[0]}), abs=1e-5)
    assert {entry["label"] for entry in predicted} == set(TOPICS)

    client = http.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        assert client.is_model_ready("tags") and not client.is_model_ready("sentiment")
        assert client.get_model_metadata("tags")["outputs"][0]["labels"] == ["urgent", "local"]
        text = http.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array(TEXTS, dtype=object))
        scores = client.infer("tags", [text]).as_numpy("scores")
    finally:
        client.close()
    expected = alone(folders["tags"], "/v1/classify", {"input": TEXTS})
    np.testing.assert_allclose(scores, [d["probs"] for d in expected["data"]], rtol=0, atol=1e-5)

    reranked = httpx.post(
        f"{server.url}/v2/rerank", json={"model": "relevance", "query": QUERY, "documents": DOCUMENTS}
    ).json()
    ranked = alone(folders["relevance"], "/rerank", {"query": QUERY, "texts": DOCUMENTS})
    assert [r["index"] for r in reranked["results"]] == [r["index"] for r in ranked]
    assert [r["relevance_score"] for r in reranked["results"]] == pytest.approx([r["score"] for r in ranked], abs=1e-5)


def test_mixed_concurrent_requests_each_get_their_own_adapters_answer(server, folders):
    """Requests for three adapters at once share the engine's micro-batches: none is answered by another's head."""
    import concurrent.futures

    expected = {name: alone(folders[name], "/v1/classify", {"input": TEXTS}) for name in ("topics", "tags")}

    def ask(i: int) -> tuple[str, dict]:
        name = ("topics", "tags")[i % 2]
        return name, httpx.post(f"{server.url}/classify", json={"model": name, "input": TEXTS}, timeout=60).json()

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for name, said in pool.map(ask, range(64)):
            probs = [d["probs"] for d in said["data"]]
            np.testing.assert_allclose(
                probs, [d["probs"] for d in expected[name]["data"]], rtol=0, atol=1e-5, err_msg=name
            )


def test_adapters_are_answered_through_front_end_processes(folders):
    """WORKERS=2: the adapter's name travels from a front-end to the one engine."""
    running = Server(folders["topics"], *FLAGS, "--lora_adapters", f"tags={folders['tags']}", "--workers", "2")
    try:
        said = httpx.post(f"{running.wait_ready().url}/classify", json={"model": "tags", "input": TEXTS}).json()
    finally:
        running.stop()
    expected = alone(folders["tags"], "/v1/classify", {"input": TEXTS})
    np.testing.assert_allclose([d["probs"] for d in said["data"]], [d["probs"] for d in expected["data"]], atol=1e-5)


def test_the_lists_name_every_adapter_and_an_unknown_name_is_vllms_404(server, folders):
    cards = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert [(c["id"], c["parent"]) for c in cards] == [("topics", None), ("tags", "topics"), ("relevance", "topics")]
    adapters = httpx.get(f"{server.url}/info").json()["distilbert_agnews"]["adapters"]
    assert adapters["tags"]["id2label"] == {"0": "urgent", "1": "local"}
    assert adapters["relevance"]["problem_type"]["name"] == "regression" and set(adapters) == {"tags", "relevance"}
    missing = httpx.post(f"{server.url}/v1/classify", json={"model": "sentiment", "input": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    assert "`tags`" in missing.json()["error"]["message"]
    assert httpx.get(f"{server.url}/v2/models/sentiment").status_code == 404


def test_another_base_or_a_model_id_that_is_no_adapter_stops_the_start_in_one_line(folders, smoke_checkpoint, tmp_path):
    other = run_cli("--model_id", str(folders["topics"]), "--lora_adapters", f"x={folders['elsewhere']}")
    assert other.returncode == 1 and "is not the base the other adapters of this service share" in other.stderr
    assert str(folders["elsewhere"]) in other.stderr and "Traceback" not in other.stderr
    plain = run_cli("--model_id", str(smoke_checkpoint), "--lora_adapters", f"x={folders['tags']}")
    assert plain.returncode == 1 and "not a peft adapter folder" in plain.stderr, plain.stderr
    clash = run_cli("--model_id", str(folders["topics"]), "--lora_adapters", f"{folders['topics']}={folders['tags']}")
    assert clash.returncode == 2 and "LORA_ADAPTERS" in clash.stderr
    unfit = shutil.copytree(folders["tags"], tmp_path / "unfit")  # its LoRA aims at layers the base does not have
    config = json.loads((unfit / "adapter_config.json").read_text())
    (unfit / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["no_such_layer"]}))
    refused = run_cli("--model_id", str(folders["topics"]), "--lora_adapters", f"x={unfit}")
    assert refused.returncode == 1 and f"{unfit}: the adapter does not fit" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_changed_adapter_folder_is_reloaded_and_the_others_keep_answering(server, folders, tmp_path):
    before = httpx.post(f"{server.url}/classify", json={"model": "topics", "input": TEXTS}).json()["data"]
    retrained = write_adapter(tmp_path / "retrained", folders["body"], ["urgent", "local"], seed=7)
    expected = alone(retrained, "/v1/classify", {"input": TEXTS})["data"]
    for name in ("adapter_config.json", "adapter_model.safetensors", "config.json"):
        shutil.copy(retrained / name, folders["tags"] / name)

    def tags_now() -> list:
        return httpx.post(f"{server.url}/classify", json={"model": "tags", "input": TEXTS}).json()["data"]

    wait_for(tags_now, lambda data: data[0]["probs"] == pytest.approx(expected[0]["probs"], abs=1e-5))
    np.testing.assert_allclose([d["probs"] for d in tags_now()], [d["probs"] for d in expected], rtol=0, atol=1e-5)
    after = httpx.post(f"{server.url}/classify", json={"model": "topics", "input": TEXTS}).json()["data"]
    np.testing.assert_allclose([d["probs"] for d in after], [d["probs"] for d in before], rtol=0, atol=1e-5)
