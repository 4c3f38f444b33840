"""onnx/model.onnx in the layout TEI's CPU image and Triton load, read as they read it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contract import files
from tests.helpers.processes import describe
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
