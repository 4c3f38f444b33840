"""The service on the session's smoke checkpoint (tests/conftest.py), for a whole test module (helpers:
tests/helpers/service.py), and a full-size DistilBERT beside it for tests that need seconds of work per batch."""

from __future__ import annotations

import pytest

from contract import files
from tests.helpers.service import Server


@pytest.fixture(scope="module")
def server(smoke_checkpoint):
    """One real service on the smoke checkpoint for a whole test module (fp32: answers comparable to 1e-5)."""
    running = Server(smoke_checkpoint, "--dtype", "float32", "--reload_interval_s", "0").wait_ready()
    yield running
    running.stop()


@pytest.fixture
def slow_checkpoint(checkpoint_copy):
    """The smoke checkpoint with a full-size DistilBERT (random weights): a 512-token batch takes seconds here."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, DistilBertConfig

    small = AutoConfig.from_pretrained(checkpoint_copy)
    config = DistilBertConfig(
        vocab_size=small.vocab_size, pad_token_id=small.pad_token_id, id2label=small.id2label, label2id=small.label2id
    )
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    config.save_pretrained(checkpoint_copy)
    torch.save(model.state_dict(), checkpoint_copy / files.WEIGHTS)
    return checkpoint_copy
