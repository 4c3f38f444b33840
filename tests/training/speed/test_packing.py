"""Packed batches: layout, logits, gradients and a real run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import DistilBertConfig, DistilBertForSequenceClassification

from contract import files, shapes
from tests.helpers.processes import train_under_graphs
from training.speed import packing

LENGTHS = (5, 17, 2, 30, 11)


def features() -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(1, 50, (n,), generator=generator).tolist()} for n in LENGTHS]


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=50, dim=32, n_layers=2, n_heads=4, hidden_dim=64, num_labels=3, max_position_embeddings=64
    )
    config.dropout = config.attention_dropout = config.seq_classif_dropout = 0.0
    config._attn_implementation = packing.register()
    model = DistilBertForSequenceClassification(config)
    packing.hand_first_tokens(model)
    return model


def test_a_packed_row_holds_the_texts_end_to_end_with_restarting_positions():
    batch = packing.pack(features(), 0, (32, 64, 96), 1)
    total = sum(LENGTHS)  # 65: the 96 bucket
    assert batch["input_ids"].shape == batch["position_ids"].shape == (1, 96)
    assert batch[packing.STARTS].tolist() == [0, 5, 22, 24, 54, 65] and batch[packing.STARTS].dtype == torch.int32
    assert batch["input_ids"][0, :total].tolist() == [i for f in features() for i in f["input_ids"]]
    assert batch["input_ids"][0, total:].eq(0).all()
    assert batch["position_ids"][0, 22:25].tolist() == [0, 1, 0]  # text 3 (2 tokens) starts at 22, text 4 at 24
    assert batch[packing.TEXT_MASK].shape == (5, 30) and batch[packing.TEXT_MASK].sum(1).tolist() == list(LENGTHS)
    assert packing.real_tokens(batch) == total
    assert packing.pack(features(), 0, (), 8)["input_ids"].shape == (1, 72)  # no buckets: rounded to 8
    assert packing.pack(features(), 0, (96,), 1, longest=64)[packing.TEXT_MASK].shape == (5, 64)  # fixed: one shape


def test_packed_logits_and_gradients_are_those_of_the_padded_batch():
    model = tiny_model()
    padded = shapes.pad(features(), 0, 32)
    logits = model(**padded).logits
    logits.square().sum().backward()
    padded_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    packed_logits = model(**packing.pack(features(), 0, (64, 128), 1)).logits
    packed_logits.square().sum().backward()
    torch.testing.assert_close(packed_logits, logits, rtol=1e-5, atol=1e-5)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, rtol=1e-4, atol=1e-5, msg=name)


def test_the_cuda_kernel_leaves_no_trace_of_the_rows_it_never_writes(monkeypatch):
    """The CUDA path (varlen attention) through a stand-in that leaves the padding's output and gradients NaN, as the
    flash kernel leaves them unwritten: the logits and every gradient are still those of the padded batch."""
    import torch.nn.attention.varlen

    from tests.helpers import varlen

    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", varlen.varlen_attn)
    monkeypatch.setattr(packing, "KERNELS", {"cpu": packing.varlen_attention})  # this CPU as the CUDA device
    test_packed_logits_and_gradients_are_those_of_the_padded_batch()


def test_a_model_with_the_packed_attention_answers_padded_batches_as_sdpa_does():
    """Evaluation and serving see padded batches: the registration answers them as the sync-free SDPA."""
    from contract.attention import sync_free_sdpa

    model = tiny_model().eval()
    padded = shapes.pad(features(), 0, 32)
    packed_attention = model(**padded).logits
    model.set_attn_implementation(sync_free_sdpa())
    torch.testing.assert_close(packed_attention, model(**padded).logits, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- real runs

STEPS = 24
RUN = ["--preset", "smoke", "--max_train_steps", str(STEPS), "--logging_steps", "1", "--attn_implementation", "sdpa"]
RUN += ["--mixed_precision", "no", "--checkpointing_steps", "12", "--eval_steps", "12"]


def train(out: Path, *extra: str) -> dict:
    return train_under_graphs(out, [*RUN, *extra])


@pytest.mark.slow
def test_a_packed_run_trains_as_the_padded_one_and_resumes_bitwise_under_the_whole_step_graph(smoke_dir, tmp_path):
    padded = train(tmp_path / "padded", "--dropout", "0")
    packed = train(tmp_path / "packed", "--dropout", "0", "--packing")
    losses = [[entry["loss"] for entry in run["train_loss"]] for run in (padded, packed)]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
    fractions = [run["throughput"]["padding_fraction"] for run in (padded, packed)]
    print(f"padding: {fractions[0]:.1%} padded, {fractions[1]:.1%} packed")
    assert packed["throughput"]["padding_fraction"] < padded["throughput"]["padding_fraction"]

    # dropout on, 2 micro-batches a step: the warm-up and capture put back what they drew
    graphed = ("--packing", "--torch_compile", "whole-step", "--pad_buckets", "4", "--gradient_accumulation_steps", "2")
    first = train(tmp_path / "graphed", *graphed)
    assert 0 < first["compilation"]["captured_graphs"] <= 8 + 1  # 8 row lengths (at most), the optimizer graph
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "graphed", resumed)  # the folder as a preemption at step 12 would have left it
    shutil.rmtree(resumed / files.STATE_DIR / f"step_{STEPS}")
    again = train(resumed, *graphed, "--resume_from_checkpoint", "latest")
    last = f"{files.STATE_DIR}/step_{STEPS}/model.safetensors"
    a, b = load_file(tmp_path / "graphed" / last), load_file(resumed / last)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert again["train_loss"][-1] == first["train_loss"][-1]


def test_packing_is_refused_with_eager_attention_and_for_heads_it_does_not_know():
    from transformers import BertConfig, BertForSequenceClassification

    from training.config import ConfigError
    from training.config_parsing import load_config

    with pytest.raises(ConfigError, match="packing: needs --attn_implementation sdpa"):
        load_config(["--preset", "smoke", "--packing", "--attn_implementation", "eager"])
    bert = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32))  # fmt: skip
    assert packing.supported(tiny_model()) and not packing.supported(bert)  # BERT's pooler reads the packed row


def test_a_compiled_packed_run_allows_a_graph_for_every_packed_row_length(smoke_dir, tmp_path, monkeypatch):
    """The recompile limit covers every packed row length."""
    from accelerate.state import AcceleratorState

    from training.config_parsing import load_config
    from training.data.batching import train_widths
    from training.set_up import set_up
    from training.train import make_accelerator

    for name in ("recompile_limit", "fail_on_recompile_limit_hit"):  # set_up sets them process-wide: put them back
        monkeypatch.setattr(torch._dynamo.config, name, getattr(torch._dynamo.config, name))
    args = ["--preset", "smoke", "--output_dir", str(tmp_path), "--packing", "--torch_compile", "default"]
    cfg = load_config([*args, "--pad_buckets", "2"])
    try:
        run = set_up(cfg, make_accelerator(cfg), "packed")
        lengths = {batch["input_ids"].shape[1] for batch in run.loaders.train}
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert len(lengths) > 2  # more packed row lengths than pad widths: the case that failed
    assert lengths <= set(train_widths(cfg, "cpu", "default")) == set(shapes.bucket_widths(16 * 64, 4))
    assert torch._dynamo.config.recompile_limit >= len(lengths) and torch._dynamo.config.fail_on_recompile_limit_hit
