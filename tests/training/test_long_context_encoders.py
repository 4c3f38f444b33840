"""A tiny ModernBERT trains, predicts and serves at --max_length 1024."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from contract import files
from inference.app import create_app
from inference.settings import Settings
from tests.helpers.processes import cli_env, describe, run_train
from tests.helpers.tiny_models import tiny_config

pytestmark = pytest.mark.slow
LONG = " ".join(["The striker scored twice as the league leaders won the cup final in extra time."] * 40)
TEXTS = [LONG, "Shares fell after the bank cut its forecast.", LONG[:900]]


@pytest.fixture(scope="module")
def modernbert(smoke_dir, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("modernbert")
    tokenizer = AutoTokenizer.from_pretrained(smoke_dir / "model")
    tokenizer.model_max_length = 2048
    config = tiny_config(
        "modernbert",
        len(tokenizer),
        max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def train(modernbert: Path, out: Path, *extra: str) -> str:
    args = ["--preset", "smoke-long", "--model_name_or_path", str(modernbert), "--output_dir", str(out)]
    args += ["--max_train_steps", "20", "--eval_steps", "10", "--checkpointing_steps", "none", *extra]
    result, _ = run_train(args, env=cli_env(), timeout=600)
    assert result.returncode == 0, describe(result)
    return result.stderr


def test_modernbert_trains_and_serves_1024_token_texts_as_each_alone(modernbert, tmp_path):
    out = tmp_path / "truncate"
    log = train(modernbert, out, "--long_text", "truncate", "--max_length", "1024")
    assert f"Model {modernbert}:" in log and " attention, " in log  # the attention implementation it picked
    assert json.loads((out / files.METRICS).read_text())["config"]["max_length"] == 1024
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out / files.TOKENIZER_DIR)
    assert len(tokenizer(TEXTS[0], truncation=True, max_length=1024)["input_ids"]) > 512  # past a BERT's window
    with torch.no_grad():
        alone = [
            model(**tokenizer(t, truncation=True, max_length=1024, return_tensors="pt")).logits[0].softmax(-1)
            for t in TEXTS
        ]
    settings = Settings(model_id=str(out), dtype="fp32", reload_interval_s=0, backend="torch")
    with TestClient(create_app(settings)) as client:
        response = client.post("/predict", json={"inputs": [[t] for t in TEXTS], "truncate": True})
    assert response.status_code == 200, response.text
    labels = list(model.config.id2label.values())
    for answer, expected in zip(response.json(), alone):
        got = {a["label"]: a["score"] for a in answer}
        assert torch.allclose(torch.tensor([got[label] for label in labels]), expected, atol=1e-4)


def test_modernbert_still_trains_on_chunked_long_texts(modernbert, tmp_path):
    out = tmp_path / "chunk"
    train(modernbert, out)  # the smoke-long preset: --long_text chunk, 48-token windows
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config.get("long_text") == "chunk", config
