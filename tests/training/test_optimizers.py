"""--optim: which optimizer trains and which parameters are never decayed."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
import transformers
from transformers import AutoModelForSequenceClassification

from contract import files
from tests.helpers.processes import cli_env, describe, run_train
from tests.helpers.tiny_models import tiny_config
from training.config import ConfigError
from training.config_parsing import load_config
from training.model import build_optimizer


def tiny_qwen2() -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(tiny_config("qwen2", 64, num_labels=3, pad_token_id=0))


@pytest.mark.parametrize("optim", ["adamw", "adafactor", "sgd"])
def test_a_large_weight_decay_never_reaches_rmsnorm_weights_nor_biases(optim):
    """Zero gradients and a weight decay of 10: whatever the optimizer, decay alone moves the weights it applies to."""
    model = tiny_qwen2()
    cfg = load_config(["--preset", "smoke", "--optim", optim, "--weight_decay", "10"])
    optimizer = build_optimizer(model, cfg, learning_rate=0.01)
    norms = {n: p.detach().clone() for n, p in model.named_parameters() if "norm" in n}
    assert norms and all("RMSNorm" in type(model.get_submodule(n.rsplit(".", 1)[0])).__name__ for n in norms)
    linear = model.model.layers[0].self_attn.q_proj
    before = linear.weight.detach().clone(), linear.bias.detach().clone()
    for _ in range(3):
        for param in model.parameters():
            param.grad = torch.zeros_like(param)
        optimizer.step()
    for name, value in norms.items():
        assert torch.equal(model.get_parameter(name), value), name
    assert torch.equal(linear.bias, before[1])  # a bias: never decayed
    assert not torch.equal(linear.weight, before[0])  # the decay reaches an ordinary weight
    kinds = {"adamw": torch.optim.AdamW, "adafactor": transformers.Adafactor, "sgd": torch.optim.SGD}
    assert isinstance(optimizer, kinds[optim])


def test_the_trainers_names_are_read_and_what_cannot_run_is_one_line():
    assert load_config(["--preset", "smoke", "--optim", "adamw_torch_fused"]).optim == "adamw"
    with pytest.raises(ConfigError, match="optim: adafactor: a compiled or captured step .* runs AdamW only"):
        load_config(["--preset", "smoke", "--optim", "adafactor", "--torch_compile", "whole-step"])
    with pytest.raises(ConfigError, match="optim: .*lion"):
        load_config(["--preset", "smoke", "--optim", "lion"])
    if importlib.util.find_spec("bitsandbytes") is None:
        with pytest.raises(ConfigError, match="adamw_8bit needs bitsandbytes: pip install bitsandbytes"):
            load_config(["--preset", "smoke", "--optim", "adamw_bnb_8bit"])  # the Trainer's name, read as ours
    else:
        assert load_config(["--preset", "smoke", "--optim", "adamw_bnb_8bit"]).optim == "adamw_8bit"


@pytest.mark.slow
def test_adafactor_trains_the_smoke_preset_and_the_run_records_it(smoke_dir, tmp_path):
    out = tmp_path / "run"
    args = ["--preset", "smoke", "--learning_rate", "1e-3", "--max_train_steps", "40", "--output_dir", str(out)]
    result, _ = run_train([*args, "--optim", "adafactor", "--checkpointing_steps", "20"], env=cli_env())
    assert result.returncode == 0, describe(result)
    assert "Adafactor" in result.stderr
    metrics = json.loads((out / files.METRICS).read_text())
    losses = [entry["loss"] for entry in metrics["train_loss"]]
    assert losses[-1] < losses[0], losses  # it learns
    assert metrics["provenance"]["settings"]["optim"] == "adafactor"
    resumed, _ = run_train([*args, "--optim", "sgd", "--resume_from_checkpoint", "latest"], env=cli_env())
    assert resumed.returncode != 0 and "optim adafactor -> sgd" in resumed.stderr, describe(resumed)


def test_auto_compiles_a_long_gpu_run_for_adamw_only():
    """--torch_compile auto on one GPU: reduce-overhead for AdamW, nothing for the optimizers a compiled step does not
    run (their clipping and step stay eager and whole)."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from training.speed import capture

    gpu = SimpleNamespace(
        device=torch.device("cuda"), num_processes=1, distributed_type=DistributedType.NO, mixed_precision="bf16"
    )
    for optim, expected in (("adamw", capture.REDUCE_OVERHEAD), ("adafactor", capture.NONE), ("sgd", capture.NONE)):
        cfg = load_config(["--preset", "smoke", "--optim", optim, "--pad_buckets", "4"])
        assert capture.for_run(cfg, gpu, total_steps=capture.AUTO_MIN_STEPS) == expected, optim
