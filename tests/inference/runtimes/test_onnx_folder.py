"""onnx/model.onnx in the layout TEI's CPU image and Triton load, read as they read it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from contract import files
from tests.helpers.processes import describe, run_train
from tests.test_commands import agnews

ort = pytest.importorskip("onnxruntime", reason="the onnxruntime extra is not installed")
pytestmark = pytest.mark.slow
TEXTS = ["Stocks fell sharply.", "The Yankees won the pennant in overtime, the AP reported late on Sunday.", "a"]


def test_export_writes_an_onnx_file_other_servers_load_and_it_answers_as_torch(checkpoint_copy):
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification

    done = agnews("export", str(checkpoint_copy), "--runtime", "onnxruntime", timeout=600)
    assert done.returncode == 0, describe(done)
    assert "onnx/model.onnx" in done.stderr
    session = ort.InferenceSession(str(checkpoint_copy / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(str(checkpoint_copy / "tokenizer.json"))  # TEI reads the folder's tokenizer.json
    tokenizer.enable_padding(pad_id=0)
    encoded = tokenizer.encode_batch(TEXTS)
    feed = {
        "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
    }
    assert [i.name for i in session.get_inputs()] == list(feed)  # DistilBERT's tokenizer outputs, in its order
    assert [o.name for o in session.get_outputs()] == ["logits"]
    (logits,) = session.run(["logits"], feed)
    assert logits.dtype == np.float32 and logits.shape == (len(TEXTS), 4)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint_copy).eval()
    with torch.no_grad():
        expected = model(**{k: torch.from_numpy(v) for k, v in feed.items()}).logits.numpy()
    assert np.abs(logits - expected).max() <= 1e-4
    assert not (checkpoint_copy / ".onnx.partial").exists() and (checkpoint_copy / files.WEIGHTS).is_file()


def test_a_retrain_removes_the_export_of_the_weights_it_replaces_and_push_refuses_a_stale_one(checkpoint_copy):
    """A retrain removes onnx/ with the weights it came from (at 53a86bc it stayed beside new ones); push refuses a
    stale one."""
    done = agnews("export", str(checkpoint_copy), "--runtime", "onnxruntime", timeout=600)
    assert done.returncode == 0, describe(done)
    assert files.stale_export(checkpoint_copy) is None
    recorded = json.loads((checkpoint_copy / files.ONNX_DIR / files.ONNX_SOURCE).read_text())
    assert recorded[files.WEIGHTS_SHA256] == files.recorded_weights(checkpoint_copy)
    kept = Path(shutil.copytree(checkpoint_copy / files.ONNX_DIR, checkpoint_copy.parent / "kept_onnx"))
    args = ["--preset", "smoke", "--output_dir", str(checkpoint_copy), "--seed", "7", "--max_train_steps", "6"]
    retrained, _ = run_train([*args, "--eval_steps", "3", "--checkpointing_steps", "3"])
    assert retrained.returncode == 0, describe(retrained)
    assert not (checkpoint_copy / files.ONNX_DIR).exists()
    shutil.copytree(kept, checkpoint_copy / files.ONNX_DIR)  # the old export put back by hand
    assert "exported from other weights" in files.stale_export(checkpoint_copy)
    refused = agnews("push", "--checkpoint_dir", str(checkpoint_copy), "--hub_model_id", "me/model")
    assert refused.returncode == 1 and "exported from other weights" in refused.stderr, describe(refused)
    assert "agnews export" in refused.stderr
