"""Property-based fuzzing of every operation in the service's own OpenAPI schema: no input may cause a 5xx."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis not installed (pip install -e '.[dev]')")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from inference.app import create_app  # noqa: E402
from inference.settings import Settings  # noqa: E402


@pytest.fixture(scope="module")
def api_schema(smoke_checkpoint):
    app = create_app(Settings(model_id=str(smoke_checkpoint), dtype="fp32", reload_interval_s=0))
    with TestClient(app):  # runs the lifespan: the model is loaded and the worker thread is up
        yield schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_causes_a_server_error(case):
    response = case.call()
    assert response.status_code < 500, (
        f"{case.method} {case.path} {case.body!r} -> {response.status_code} {response.text}"
    )
    if response.status_code == 404 and "classify" in case.path:  # an unknown `model`: vLLM's error body
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    elif response.status_code >= 400:
        assert set(response.json()) == {"error", "error_type"}
