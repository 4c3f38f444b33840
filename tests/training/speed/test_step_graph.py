"""The whole step as one captured graph, on the stand-in."""

from __future__ import annotations

import gc
import math
import signal
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from transformers import DistilBertConfig, DistilBertForSequenceClassification

from contract.attention import sync_free_sdpa
from tests.helpers.cuda_graphs.stand_in import CpuStepGraphs, SyncDuringCapture, install_step_graphs
from tests.helpers.processes import train_under_graphs
from training.guards import StopGuard
from training.speed import capture, step_graph

WIDTHS = (8, 16, 8, 16, 16, 8, 8, 16, 8, 16, 16, 16)  # the width of each micro-batch, in order
BATCH, CLIP, LR = 4, 0.5, 1e-2


@pytest.fixture(autouse=True)
def cpu_graphs(monkeypatch):
    install_step_graphs(monkeypatch)


@pytest.fixture
def guard():
    """The run's StopGuard (its SIGTERM handler put back after the test)."""
    previous = signal.getsignal(signal.SIGTERM)
    yield StopGuard(Accelerator(cpu=True), max_nonfinite_steps=3)
    signal.signal(signal.SIGTERM, previous)


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=50, dim=16, n_layers=2, n_heads=2, hidden_dim=32, num_labels=3, max_position_embeddings=32
    )
    config.dropout = config.attention_dropout = config.seq_classif_dropout = 0.0
    config._attn_implementation = sync_free_sdpa()
    return DistilBertForSequenceClassification(config).train()


def batches() -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for width in WIDTHS:
        lengths = torch.randint(2, width + 1, (BATCH,), generator=generator)
        mask = (torch.arange(width) < lengths[:, None]).long()
        ids = torch.randint(1, 50, (BATCH, width), generator=generator) * mask
        out.append({"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 3, (BATCH,))})
    return out


def forward(model):
    def loss(batch):
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return torch.nn.functional.cross_entropy(model(**inputs).logits, batch["labels"])

    return loss


def eager_losses(accumulation: int) -> tuple[list[float], torch.nn.Module]:
    """The loop's eager path: backward of the window's mean, clip, AdamW, zero."""
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    losses = []
    for i, batch in enumerate(batches()):
        loss = forward(model)(batch)
        (loss / accumulation).backward()
        if (i + 1) % accumulation == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model


def graph_run(accumulation: int, guard, on_step=None) -> tuple[list[float], torch.nn.Module, step_graph.StepGraph]:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True, capturable=True)
    capture.tensor_learning_rate(optimizer, torch.device("cpu"))
    graphs = step_graph.StepGraph(model, optimizer, CLIP, accumulation, guard, torch.device("cpu"))
    losses = []
    for i, batch in enumerate(batches()):
        loss = graphs.step(batch, sync=(i + 1) % accumulation == 0, forward=forward(model))
        losses.append(loss.item())
        if on_step:
            on_step(i, model)
    return losses, model, graphs


@pytest.mark.parametrize("accumulation", [1, 2])
def test_captured_steps_equal_the_eager_loop(accumulation, guard):
    expected, eager = eager_losses(accumulation)
    before = CpuStepGraphs.captures
    losses, model, graphs = graph_run(accumulation, guard)
    torch.testing.assert_close(losses, expected, rtol=1e-6, atol=1e-7)
    for (name, a), b in zip(eager.named_parameters(), model.parameters(), strict=True):
        if not name.endswith("k_lin.bias"):  # its true gradient is 0 (softmax ignores a bias every key shares):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)  # Adam scales rounding noise there
    # one graph per width (with the update inside), or per width plus the optimizer graph under accumulation
    assert graphs.captured == CpuStepGraphs.captures - before == (2 if accumulation == 1 else 3)


def test_a_step_keeps_nothing_new_and_every_width_writes_the_same_gradients(guard):
    grads: dict[int, list[int]] = {}
    live: dict[int, int] = {}

    def watch(i, model):
        grads[i] = [p.grad.data_ptr() for p in model.parameters()]
        if i in (5, len(WIDTHS) - 1):
            gc.collect()
            live[i] = sum(type(o) in (torch.Tensor, torch.nn.Parameter) for o in gc.get_objects())

    graph_run(2, guard, watch)
    assert all(ptrs == grads[0] for ptrs in grads.values())  # shared by both widths, never reallocated or copied
    assert live[5] == live[len(WIDTHS) - 1], live  # both widths and the update captured by step 5: flat from there


def test_the_non_finite_guard_counts_inside_the_replayed_step(guard):
    """The loop does not observe a captured step's loss: the graph does, in place, and the capture's own passes
    leave the counters as they were."""

    def poison(i, model):
        if i == 3:  # after every capture: the weights a replay reads turn NaN, in place
            with torch.no_grad():
                model.classifier.weight.fill_(float("nan"))

    losses, _, _ = graph_run(1, guard, poison)
    nonfinite = sum(not math.isfinite(loss) for loss in losses)
    assert nonfinite == len(WIDTHS) - 4 and int(guard.streak) == int(guard.longest) == nonfinite


def test_a_host_sync_inside_a_step_is_refused_at_capture(guard):
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True, capturable=True)
    graphs = step_graph.StepGraph(model, optimizer, CLIP, 1, guard, torch.device("cpu"))

    def reads_the_device(batch):
        loss = forward(model)(batch)
        return loss * 0 if loss.item() > 1e9 else loss  # .item(): the host waits for the device

    with pytest.raises(SyncDuringCapture):
        graphs.step(batches()[0], sync=True, forward=reads_the_device)


def test_whole_step_is_taken_only_where_a_graph_can_hold_the_step(caplog):
    assert capture.resolve("whole-step", 4, "cuda", 10, mixed_precision="bf16") == capture.WHOLE_STEP
    assert capture.resolve("auto", None, "cuda", 10**6, mixed_precision="bf16") == capture.REDUCE_OVERHEAD
    with caplog.at_level("WARNING"):
        assert capture.resolve("whole-step", 4, "cuda", 10, mixed_precision="fp16") == capture.REDUCE_OVERHEAD
        assert capture.resolve("whole-step", 4, "cuda", 10, processes=2) == capture.REDUCE_OVERHEAD
        assert capture.resolve("whole-step", 4, "cuda", 10, distributed=True) == capture.REDUCE_OVERHEAD
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == (
        "--torch_compile whole-step under fp16 (the GradScaler decides on the host whether to step): "
        "reduce-overhead instead"
    )
    assert "under DDP or FSDP" in messages[1] and "unproven" in messages[2]  # 2 GPUs: the multi-GPU warning too


# ---------------------------------------------------------------------------------------------- real runs

STEPS = 24
RUN = ["--preset", "smoke", "--max_train_steps", str(STEPS), "--logging_steps", "1", "--pad_buckets", "4"]
RUN += ["--attn_implementation", "sdpa", "--mixed_precision", "no", "--gradient_accumulation_steps", "2"]
RUN += ["--max_grad_norm", "0.5", "--checkpointing_steps", "12", "--eval_steps", "12"]


def train(out: Path, *extra: str) -> dict:
    return train_under_graphs(out, [*RUN, *extra])


@pytest.mark.slow
def test_a_whole_step_run_trains_as_eager(smoke_dir, tmp_path):
    """24 steps of 2 micro-batches with clipping: the losses of eager training (dropout 0). A bitwise resume with
    dropout, accumulation and packing: tests/training/speed/test_packing.py."""
    eager = train(tmp_path / "eager", "--dropout", "0")
    graphed = train(tmp_path / "graphed", "--dropout", "0", "--torch_compile", "whole-step")
    losses = [[entry["loss"] for entry in run["train_loss"]] for run in (eager, graphed)]
    assert len(losses[0]) == STEPS
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
    assert graphed["compilation"]["mode"] == "whole-step"
    assert graphed["compilation"]["captured_graphs"] == len(graphed["compilation"]["widths"]) + 1


def test_whole_step_with_an_attention_that_reads_the_device_is_refused(monkeypatch):
    from accelerate import Accelerator

    from training.config import ConfigError
    from training.config_parsing import load_config

    accelerator = Accelerator(cpu=True)
    cfg = load_config(["--preset", "smoke", "--torch_compile", "whole-step", "--attn_implementation", "sdpa"])
    assert capture.for_run(cfg, accelerator, 10) == capture.WHOLE_STEP
    with pytest.raises(ConfigError, match=r"whole-step needs --attn_implementation sdpa \(eager attention asks"):
        capture.for_run(cfg.model_copy(update={"attn_implementation": "eager"}), accelerator, 10)
    monkeypatch.setattr(step_graph, "available", lambda device: device.type == "cuda")  # no stand-in: the CPU
    with pytest.raises(ConfigError, match="whole-step captures CUDA graphs, which a cpu device has not"):
        capture.for_run(cfg, accelerator, 10)
