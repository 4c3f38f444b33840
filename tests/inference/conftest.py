"""A checkpoint produced by the real smoke training run, once per session, and helpers to serve it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from tests.conftest import ROOT, cli_env, describe, free_port, run_train


@pytest.fixture(scope="session")
def smoke_checkpoint(smoke_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serving") / "checkpoint"
    result, _ = run_train(["--preset", "smoke", "--output_dir", str(out), "--num_train_epochs", "2",
                           "--checkpointing_steps", "none"])
    assert result.returncode == 0, describe(result)
    return out


@pytest.fixture
def checkpoint_copy(smoke_checkpoint, tmp_path) -> Path:
    """A private copy a test may overwrite (reload, corruption)."""
    return Path(shutil.copytree(smoke_checkpoint, tmp_path / "ckpt"))


class Reference:
    """The trained model itself, loaded the plain way, to compare the service's answers against."""

    def __init__(self, checkpoint: Path):
        self.model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(checkpoint)).eval()
        self.model.load_state_dict(torch.load(checkpoint / "distilbert_agnews.pt", weights_only=True))
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint / "tokenizer")
        self.labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]

    @torch.no_grad()
    def scores(self, texts: list[str]) -> list[dict[str, float]]:
        out = []
        for text in texts:  # one at a time: no padding at all
            logits = self.model(**self.tokenizer(text, truncation=True, return_tensors="pt")).logits[0]
            out.append(dict(zip(self.labels, torch.softmax(logits, -1).tolist())))
        return out


@pytest.fixture(scope="session")
def reference(smoke_checkpoint) -> Reference:
    return Reference(smoke_checkpoint)


class Server:
    """`python -m inference` as a real process on 127.0.0.1."""

    def __init__(self, checkpoint: Path, *args: str, env: dict | None = None, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Output goes to a file: a pipe nobody reads fills up with access-log lines and blocks the server.
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "inference", "--checkpoint_dir", str(checkpoint), "--port", str(self.port), *args],
            cwd=ROOT, env=env or cli_env(), stdout=self.log, stderr=subprocess.STDOUT, text=True)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def wait_ready(self, timeout: float = 60) -> "Server":
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited {self.process.returncode}: {self.output()}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("server not ready in time")

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        return self.output()
