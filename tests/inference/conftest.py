"""The smoke checkpoint of the session, and the fixtures that serve it (helpers: tests/helpers/service.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.service import Reference, Server


@pytest.fixture(scope="session")
def smoke_checkpoint(smoke_model) -> Path:
    """The session's trained smoke model (tests/conftest.py); tests that change files use checkpoint_copy."""
    return smoke_model


@pytest.fixture
def checkpoint_copy(smoke_checkpoint, tmp_path) -> Path:
    """A private copy a test may overwrite (reload, corruption)."""
    return Path(shutil.copytree(smoke_checkpoint, tmp_path / "ckpt"))


@pytest.fixture(scope="session")
def reference(smoke_checkpoint) -> Reference:
    return Reference(smoke_checkpoint)


@pytest.fixture(scope="module")
def server(smoke_checkpoint):
    """One real service on the smoke checkpoint for a whole test module (fp32: answers comparable to 1e-5)."""
    running = Server(smoke_checkpoint, "--dtype", "float32", "--reload_interval_s", "0").wait_ready()
    yield running
    running.stop()
