"""`agnews predict --runtime`: rows scored by the service itself (`python -m inference` in its own process on
127.0.0.1), so a batch job runs the runtime and precision the service chooses, behind its agreement guard, and
gets the logits its /predict answers. Called by training/predict.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch
from accelerate.logging import get_logger

from contract.errors import UserError
from contract.loading import LoadedModel
from contract.long_text import LongText

logger = get_logger(__name__)
READY_WITHIN_S = 900  # converting and measuring a model's int8 candidates takes minutes on a small CPU
BATCH = 64  # texts per /predict request


def raw_logits(url: str, inputs: list, labels: list[str], who: str, **options) -> torch.Tensor:
    """One /predict of the service at `url` for raw scores (a TEI batch: [text] or [text, pair] each), as logits in
    `labels`' order; an error answer is one UserError starting with `who`. Also `agnews distill`'s service teacher."""
    body = json.dumps({"inputs": inputs, "raw_scores": True, **options}).encode()
    request = urllib.request.Request(f"{url}/predict", body, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            rows = json.loads(answer.read())
    except urllib.error.HTTPError as exc:  # an OSError: named here, not taken for a write failure
        raise UserError(f"{who}: the service answered {exc.code}: {exc.read().decode()[:200]}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise UserError(f"{who}: {url} cannot be reached ({exc}); is the service running?") from None
    order = {label: i for i, label in enumerate(labels)}
    logits = torch.empty(len(rows), len(order))
    for r, row in enumerate(rows):
        for item in row:
            logits[r, order[item["label"]]] = item["score"]
    return logits


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServiceScorer:
    """The service on a free port for the job's length; `scores` posts texts to its /predict (raw scores)."""

    def __init__(self, checkpoint: str, runtime: str, long_text: LongText, loaded: LoadedModel):
        self.loaded = loaded
        self.url = f"http://127.0.0.1:{_free_port()}"
        flags = ["--model_id", checkpoint, "--hostname", "127.0.0.1", "--port", self.url.rsplit(":", 1)[1]]
        flags += ["--backend", runtime, "--dtype", "auto", "--no-measure_in_background", "--reload_interval_s", "0"]
        flags += ["--max_client_batch_size", str(BATCH), "--long_text", long_text.mode]
        root = str(Path(__file__).resolve().parents[2])  # inference/ importable without installing
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "inference", *flags], env=env, stdout=self.log, stderr=subprocess.STDOUT, text=True
        )
        self.runtime = self._wait_ready()

    def _wait_ready(self) -> str:
        """The runtime the service chose, once it answers; one line with its log's end if it stops first."""
        deadline = time.monotonic() + READY_WITHIN_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                tail = " | ".join(self.log.read().strip().splitlines()[-3:])
                raise UserError(
                    f"--runtime: the service stopped before answering (exit {self.process.returncode}): {tail}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/info", timeout=2) as answer:
                    chosen = json.loads(answer.read())["distilbert_agnews"]["runtime"]
                    return f"{chosen['name']} {chosen['precision']} (agreement with fp32 {chosen['agreement']})"
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        self.close()
        raise UserError(f"--runtime: the service did not answer within {READY_WITHIN_S} s")

    def scores(self, texts: list[str], pairs: list[str] | None) -> tuple[torch.Tensor, list[int]]:
        """(scores by the problem type, windows per text), in input order."""
        # a TEI batch: a list of [text] or [text, pair]
        inputs = [[t, p] for t, p in zip(texts, pairs)] if pairs is not None else [[t] for t in texts]
        logits = torch.cat([self._logits(inputs[i : i + BATCH]) for i in range(0, len(inputs), BATCH)])
        return self.loaded.problem.scores(logits), [1] * len(texts)  # truncated: one window each

    def _logits(self, inputs: list) -> torch.Tensor:
        return raw_logits(self.url, inputs, self.loaded.labels, "--runtime", truncate=True)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(60)
        self.log.close()
