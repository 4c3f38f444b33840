"""The service as the tests reach it: a real `python -m inference` process on 127.0.0.1 (Server, run_cli), the trained
model loaded the plain way to compare answers with (Reference), real AG News texts, and polling with a bound."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from contract import files
from tests.helpers.processes import ROOT, cli_env, free_port


class Reference:
    """The trained model itself, loaded the plain way, to compare the service's answers against."""

    def __init__(self, checkpoint: Path, model=None, tokenizer=None):
        if model is None:
            model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(checkpoint))
            model.load_state_dict(torch.load(checkpoint / files.WEIGHTS, weights_only=True))
        self.model = model.eval()
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(checkpoint / files.TOKENIZER_DIR)
        self.labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]

    @classmethod
    def from_pretrained(cls, folder: Path) -> Reference:
        """A save_pretrained folder, read by transformers itself."""
        model = AutoModelForSequenceClassification.from_pretrained(folder)
        return cls(folder, model, AutoTokenizer.from_pretrained(folder))

    @torch.no_grad()
    def logits(self, text: str, pair: str | None = None, side: str = "right") -> list[float]:
        """One input at a time: no padding at all."""
        self.tokenizer.truncation_side = side
        encoded = self.tokenizer(text, pair, truncation=True, max_length=512, return_tensors="pt")
        return self.model(**encoded).logits[0].tolist()

    def scores(self, texts: list[str]) -> list[dict[str, float]]:
        return [self.probabilities(text) for text in texts]

    def probabilities(self, text: str, pair: str | None = None, side: str = "right") -> dict[str, float]:
        return dict(zip(self.labels, torch.softmax(torch.tensor(self.logits(text, pair, side)), -1).tolist()))


AG_NEWS = ROOT.parent / "shared" / "data" / "ag_news" / "train_subset.csv"


def ag_news_texts(n: int) -> list[str]:
    """The first n texts of the shared AG News rows, read in place; the test is skipped, saying why, without them."""
    if not AG_NEWS.is_file():
        pytest.skip(f"the shared AG News data is not here ({AG_NEWS})")
    with open(AG_NEWS, encoding="utf-8") as fh:
        return [row["text"] for _, row in zip(range(n), csv.DictReader(fh))]


def assert_matches(answer: list[dict], expected: dict[str, float], tolerance: float = 1e-5) -> None:
    """A TEI answer: every label once, best first, scores equal to the expected ones."""
    assert sorted(p["label"] for p in answer) == sorted(expected)
    assert [p["score"] for p in answer] == sorted((p["score"] for p in answer), reverse=True)
    assert all(abs(p["score"] - expected[p["label"]]) < tolerance for p in answer), (answer, expected)


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m inference ARGS` run to its end (a start-up refusal), output captured. Its port is a free one unless
    ARGS or `env` name one: the default 8000 is what tests/test_docs.py serves on, as the docs say."""
    return subprocess.run(
        [sys.executable, "-m", "inference", *args],
        cwd=ROOT,
        env={"PORT": str(free_port()), **(env or cli_env())},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Server:
    """`python -m inference` as a real process on 127.0.0.1. With `model=None` no flag is added: the model and
    the port come from the environment (MODEL_ID, PORT)."""

    def __init__(
        self,
        model: Path | str | None,
        *args: str,
        env: dict | None = None,
        port: int | None = None,
        python: str = sys.executable,
        cwd: Path = ROOT,  # another checkout's folder: its service (bench/refusal_cost.py --before)
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        flags = ["--model_id", str(model), "--port", str(self.port)] if model is not None else []
        # Output goes to a file: a pipe nobody reads fills up with access-log lines and blocks the server.
        self.log = tempfile.TemporaryFile(mode="w+")
        weakref.finalize(self, self.log.close)  # closed with this object, not left to the file's own (warning) GC
        self.process = subprocess.Popen(
            [python, "-m", "inference", *flags, *args],
            cwd=cwd,
            # MEASURE_IN_BACKGROUND off unless a test asks: a runtime race on a thread during every module's tests
            # would change what serves mid-test (tests/inference/test_first_answer.py tests the default)
            env={"MEASURE_IN_BACKGROUND": "false", **(env or cli_env()), "PYTHONFAULTHANDLER": "1"},  # see exit_code
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def wait_ready(self, timeout: float = 90) -> Server:
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
        raise AssertionError(f"server not ready in time: {self.output()}")

    def exit_code(self, timeout: float) -> int | None:
        """The exit status, or None if the process has not ended within `timeout` s. Then it gets SIGABRT, on which
        Python's faulthandler writes every thread's stack into the output: the assertion message shows the hang."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            self.process.wait(30)
            return None

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.terminate()
            assert self.exit_code(30) is not None, f"server did not stop on SIGTERM: {self.output()}"
        return self.output()


def wait_for(get, ok, timeout: float = 60):  # a bound for a slow, busy machine, not a timing assertion
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = get()
        if ok(value):
            return value
        time.sleep(0.1)
    raise AssertionError(f"condition not met in {timeout}s; last value: {value}")
