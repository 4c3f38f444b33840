"""The real huggingface_hub InferenceClient against a real service, unchanged. text_classification returns element [0]
of the answer (huggingface_hub/inference/_client.py); health_check needs provider="hf-inference"."""

from __future__ import annotations

import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError

from tests.helpers.service import Server

pytestmark = pytest.mark.slow
TEXT = "Shares of oracle rose in early trading after the earnings report."


@pytest.fixture(scope="module")
def keyed_server(smoke_checkpoint):
    running = Server(
        smoke_checkpoint, "--dtype", "float32", "--reload_interval_s", "0", "--api_key", "s3cret"
    ).wait_ready()
    yield running
    running.stop()


def test_text_classification_with_base_url(keyed_server, reference):
    client = InferenceClient(base_url=keyed_server.url, api_key="s3cret")
    best = client.text_classification(TEXT)
    expected = reference.probabilities(TEXT)
    assert best.label == max(expected, key=expected.get) == "Business"
    assert best.score == pytest.approx(expected["Business"], abs=1e-5)
    assert client.text_classification(TEXT, top_k=1) == best


def test_health_check_and_endpoint_info(keyed_server, smoke_checkpoint):
    client = InferenceClient(base_url=keyed_server.url, provider="hf-inference", api_key="s3cret")
    assert client.health_check() is True
    info = client.get_endpoint_info()
    assert info["model_id"] == str(smoke_checkpoint)
    assert info["model_type"]["classifier"]["id2label"]["1"] == "Sports"


def test_errors_surface_as_hf_hub_http_error_with_our_message(keyed_server):
    client = InferenceClient(base_url=keyed_server.url, api_key="s3cret")
    with pytest.raises(HfHubHTTPError) as empty:
        client.text_classification("")
    assert empty.value.response.status_code == 400 and "`inputs` cannot be empty" in str(empty.value)
    assert empty.value.server_message == "`inputs` cannot be empty"
    with pytest.raises(HfHubHTTPError) as unauthorized:
        InferenceClient(base_url=keyed_server.url, api_key="wrong").text_classification(TEXT)
    assert unauthorized.value.response.status_code == 401 and "missing or wrong API key" in str(unauthorized.value)
    # the request id the client reports is the one the service logged
    request_id = unauthorized.value.request_id
    assert request_id and f"[{request_id}]" in keyed_server.output()
