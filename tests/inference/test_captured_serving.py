"""The CUDA-graph serving path, on the CPU stand-in."""

from __future__ import annotations

import time

import pytest
import torch

from inference.engine.captured import CapturedForward
from inference.engine.scheduler import graph_shapes
from tests.helpers.cuda_graphs.stand_in import CpuGraphs, install_serving
from tests.helpers.service import assert_matches, wait_for
from tests.inference.test_app import TEXTS, make_client, recording_shapes
from tests.inference.test_reload import permuted_copy

CAPTURED = {"static_shapes": True, "tokenizer_thread": True, "backend": "torch"}


@pytest.fixture
def graphs(monkeypatch):
    install_serving(monkeypatch)


def test_the_captured_engine_starts_and_pads_every_pass_to_a_captured_shape(graphs, smoke_checkpoint, reference):
    """Start-up captures every bucket; every request replays a captured shape."""
    before = CpuGraphs.captures
    with make_client(smoke_checkpoint, **CAPTURED) as c:
        loaded = c.app.state.service.engine.current
        assert isinstance(loaded.runner, CapturedForward)
        captured = set(graph_shapes(loaded, c.app.state.service.engine.limits))
        assert CpuGraphs.captures - before == len(captured) > 10
        recording_shapes(c)
        for text in ("hi", TEXTS[0]):  # warm-up's size, a lone request
            assert_matches(c.post("/predict", json={"inputs": text}).json(), reference.probabilities(text), 1e-4)
        batch = c.post("/predict", json={"inputs": [[t] for t in TEXTS]}).json()
        for got, text in zip(batch, TEXTS, strict=True):
            assert_matches(got, reference.probabilities(text), tolerance=1e-4)
        assert c.shapes_seen and set(c.shapes_seen) <= captured, c.shapes_seen
        with pytest.raises(KeyError):  # as on CUDA: a shape that was not captured cannot replay
            loaded.runner({"input_ids": torch.ones(1, 8, dtype=torch.long)})
        rows, width = min(captured)
        batches = [{"input_ids": torch.full((rows, width), i, dtype=torch.long)} for i in (5, 6)]
        for batch in batches:
            batch["attention_mask"] = torch.ones(rows, width, dtype=torch.long)
        first = loaded.runner(batches[0])
        kept = first.clone()
        second = loaded.runner(batches[1])  # the next replay rewrites the graph's output, not the copy handed out
        assert first.device.type == "cpu" and first.dtype == torch.float32
        assert torch.equal(first, kept) and not torch.equal(first, second)


def test_passes_within_a_small_token_budget_replay_several_captured_shapes(graphs, smoke_checkpoint, reference):
    """MAX_BATCH_TOKENS below a full bucket: long inputs split into passes of their own, each a captured shape."""
    texts = [" ".join(["the yankees beat the red sox"] * (2 + 9 * i)) for i in range(10)]
    with make_client(smoke_checkpoint, max_batch_tokens=1024, max_batch_requests=8, **CAPTURED) as c:
        captured = set(graph_shapes(c.app.state.service.engine.current, c.app.state.service.engine.limits))
        assert max(r * w for r, w in captured) <= 1024
        recording_shapes(c)
        answer = c.post("/predict", json={"inputs": [[t] for t in texts], "truncate": True}).json()
        for got, text in zip(answer, texts):
            assert_matches(got, reference.probabilities(text), tolerance=1e-4)
        assert len(set(c.shapes_seen)) > 1 and set(c.shapes_seen) <= captured, c.shapes_seen


def test_a_hot_reload_captures_the_new_models_graphs_and_answers_with_them(graphs, checkpoint_copy, tmp_path):
    """A reload builds and warms up the new model's graphs (thread-local capture while the old ones serve), then
    swaps: afterwards every answer is the new model's (a label-permuted twin: same best label names, other ids)."""
    twin = permuted_copy(checkpoint_copy, tmp_path / "twin")
    with make_client(checkpoint_copy, reload_interval_s=0.1, **CAPTURED) as c:
        old = c.app.state.service.engine.current
        before = c.post("/predict", json={"inputs": [[t] for t in TEXTS]}).json()
        captures = CpuGraphs.captures
        for name in ("distilbert_agnews.pt", "config.json"):
            (checkpoint_copy / name).write_bytes((twin / name).read_bytes())
            time.sleep(0.05)
        wait_for(lambda: c.app.state.service.engine.current, lambda current: current is not old)
        new = c.app.state.service.engine.current
        assert isinstance(new.runner, CapturedForward) and new.runner is not old.runner
        assert CpuGraphs.captures - captures == len(graph_shapes(new, c.app.state.service.engine.limits))
        after = c.post("/predict", json={"inputs": [[t] for t in TEXTS]}).json()
        assert [a[0]["label"] for a in after] == [b[0]["label"] for b in before]
        for got, expected in zip(after, before):  # same scores per label name, computed by the permuted head
            assert_matches(got, {p["label"]: p["score"] for p in expected}, tolerance=1e-4)
        assert new.model.config.id2label != old.model.config.id2label
