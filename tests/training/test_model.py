"""Model construction and the optimizer's weight-decay groups."""

from __future__ import annotations

import pytest
import torch

from contract.problem_types import MULTI, REGRESSION, ProblemType
from training.config_parsing import load_config
from training.data.labels import LabelSpace
from training.model import build_model, build_optimizer


def labels(*names: str, problem_type: str = "single_label_classification") -> LabelSpace:
    return LabelSpace(values=list(range(len(names))), names=list(names), source="test", problem_type=problem_type)


def test_tiny_model_from_config_and_no_decay_on_bias_and_layernorm(smoke_dir):
    cfg = load_config(["--preset", "smoke", "--weight_decay", "0.05"])
    model = build_model(cfg, labels("World", "Sports", "Business", "Sci/Tech"))
    assert model.config.num_labels == 4 and model.config.id2label[3] == "Sci/Tech"
    assert ProblemType.of(model.config) == ProblemType.named("single_label_classification", 4)
    optimizer = build_optimizer(model, cfg, learning_rate=1e-3)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    decay_names = {names[id(p)] for p in decay["params"]}

    def is_norm(name: str) -> bool:  # DistilBERT names them embeddings.LayerNorm and *_layer_norm
        return "layernorm" in name.lower().replace("_", "")

    assert all(n.endswith("bias") or is_norm(n) for n in no_decay_names)
    assert "distilbert.embeddings.LayerNorm.weight" in no_decay_names
    assert any(n.endswith("output_layer_norm.weight") for n in no_decay_names)
    assert all(not n.endswith("bias") and not is_norm(n) for n in decay_names)
    assert "distilbert.embeddings.word_embeddings.weight" in decay_names
    assert len(decay_names) + len(no_decay_names) == len(list(model.parameters()))
    assert all(group["lr"] == 1e-3 for group in optimizer.param_groups)
    assert isinstance(optimizer, torch.optim.AdamW)


def test_dropout_override_reaches_every_dropout_of_the_config(smoke_dir):
    model = build_model(load_config(["--preset", "smoke", "--dropout", "0"]), labels("a", "b"))
    config = model.config
    assert config.dropout == config.attention_dropout == config.seq_classif_dropout == 0.0
    default = build_model(load_config(["--preset", "smoke"]), labels("a", "b")).config
    assert default.dropout == 0.1


def test_fast_dropout_keeps_1_minus_p_and_preserves_the_expected_value():
    from training.speed.cpu_speed import FastDropout

    dropout = FastDropout(0.1).train()
    scale = 65536 / (65536 - round(0.1 * 65536))  # 1 / the exact keep probability (16-bit draws)
    torch.manual_seed(0)
    x = torch.ones(2_000_000, requires_grad=True)
    y = dropout(x)
    kept = y.detach() > 0
    assert abs(kept.float().mean().item() - 0.9) < 1e-3  # 2M draws: the standard error is 2e-4
    assert abs(y.mean().item() - 1.0) < 2e-3
    assert torch.allclose(y.detach()[kept], torch.full_like(y.detach()[kept], scale))
    y.sum().backward()
    assert torch.equal(x.grad, kept * scale)  # the gradient flows through kept elements only
    torch.manual_seed(0)
    assert torch.equal(dropout(x).detach(), y.detach())  # seeded: reproducible and resumable
    assert dropout.eval()(x) is x and FastDropout(0.0).train()(x) is x


def test_use_fast_dropout_swaps_every_dropout_module_and_leaves_eval_outputs_unchanged(smoke_dir):
    from training.speed.cpu_speed import FastDropout, use_fast_dropout

    model = build_model(load_config(["--preset", "smoke"]), labels("a", "b", "c", "d")).eval()
    ids = torch.randint(5, 100, (2, 9))
    before = model(input_ids=ids).logits
    count = sum(type(m) is torch.nn.Dropout for m in model.modules())
    assert count > 0 and use_fast_dropout(model) == count
    assert not any(type(m) is torch.nn.Dropout for m in model.modules())
    assert sum(isinstance(m, FastDropout) for m in model.modules()) == count
    assert torch.equal(model(input_ids=ids).logits, before)


def test_cpu_training_attention_equals_eager_without_dropout_and_is_the_cpu_default(smoke_dir):
    from contract.attention import SYNC_FREE_SDPA
    from training.speed.cpu_speed import CPU_TRAINING_ATTENTION, attention_for

    cfg = load_config(["--preset", "smoke"])
    assert attention_for(None, True, torch.device("cpu")) == CPU_TRAINING_ATTENTION
    assert attention_for(None, False, torch.device("cpu")) == "eager"
    assert attention_for(None, True, torch.device("cuda")) == SYNC_FREE_SDPA  # SDPA, its mask always built
    assert attention_for("sdpa", True, torch.device("cpu")) == SYNC_FREE_SDPA
    torch.manual_seed(0)
    eager = build_model(cfg, labels("a", "b", "c", "d"), "eager").eval()
    ours = build_model(cfg, labels("a", "b", "c", "d"), CPU_TRAINING_ATTENTION).eval()
    ours.load_state_dict(eager.state_dict())
    ids = torch.randint(5, 100, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # padding goes through the eager mask path
    assert torch.equal(
        ours(input_ids=ids, attention_mask=mask).logits, eager(input_ids=ids, attention_mask=mask).logits
    )


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_cpu_training_attention_handles_grouped_query_attention_as_eager_does(architecture):
    """Decoder classifiers share each key/value head among several query heads (4 query, 2 key/value heads here):
    the CPU attention gives eager's logits, with left padding too (issue 40: a shape error before)."""
    from transformers import AutoModelForSequenceClassification

    from tests.helpers.tiny_models import tiny_config
    from training.speed.cpu_speed import register_attention

    config = tiny_config(architecture, 100, num_labels=3, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="eager").eval()
    ids = torch.randint(1, 100, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding: the last token is real, as decoder classifiers pool it
    ids[1, :4] = 0
    eager = model(input_ids=ids, attention_mask=mask).logits
    model.set_attn_implementation(register_attention())
    ours = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(ours, eager, atol=1e-6), (ours - eager).abs().max()


def test_fast_dropout_is_switched_on_only_on_cpu_and_only_when_asked(smoke_dir):
    from training.speed.cpu_speed import FastDropout, enable

    def fresh():
        return build_model(load_config(["--preset", "smoke"]), labels("a", "b"))

    assert enable(fresh(), fast_dropout_on=True, device=torch.device("cuda")) == 0
    assert enable(fresh(), fast_dropout_on=False, device=torch.device("cpu")) == 0
    model = fresh()
    assert enable(model, fast_dropout_on=True, device=torch.device("cpu")) > 0
    assert any(isinstance(m, FastDropout) for m in model.modules())


def test_the_task_is_written_into_the_model_config(smoke_dir):
    cfg = load_config(["--preset", "smoke"])
    tags = build_model(cfg, labels("a", "b", "c", problem_type=MULTI)).config
    assert tags.problem_type == MULTI and ProblemType.of(tags).thresholds == (0.5, 0.5, 0.5)
    score = build_model(cfg, LabelSpace(values=[], names=["rating"], source="t", problem_type=REGRESSION)).config
    assert score.num_labels == 1 and score.id2label == {0: "rating"} and ProblemType.of(score).function == "none"


def test_sync_free_sdpa_gives_the_logits_of_sdpa_with_and_without_padding(smoke_dir):
    from contract.attention import sync_free_sdpa

    cfg = load_config(["--preset", "smoke"])
    torch.manual_seed(0)
    plain = build_model(cfg, labels("a", "b", "c", "d"), "sdpa").eval()
    ours = build_model(cfg, labels("a", "b", "c", "d"), sync_free_sdpa()).eval()
    ours.load_state_dict(plain.state_dict())
    ids = torch.randint(5, 100, (3, 9))
    padded = torch.ones_like(ids)
    padded[1, 6:] = 0
    for mask in (torch.ones_like(ids), padded):  # no padding: sdpa skips the mask, ours builds an all-true one
        assert torch.allclose(
            ours(input_ids=ids, attention_mask=mask).logits, plain(input_ids=ids, attention_mask=mask).logits, atol=1e-6
        )
