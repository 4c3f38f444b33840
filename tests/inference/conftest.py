"""The service on the session's smoke checkpoint (tests/conftest.py), for a whole test module (helpers:
tests/helpers/service.py)."""

from __future__ import annotations

import pytest

from tests.helpers.service import Server


@pytest.fixture(scope="module")
def server(smoke_checkpoint):
    """One real service on the smoke checkpoint for a whole test module (fp32: answers comparable to 1e-5)."""
    running = Server(smoke_checkpoint, "--dtype", "float32", "--reload_interval_s", "0").wait_ready()
    yield running
    running.stop()
