"""LoRA through peft, end to end (issue 40, point 1): a tiny pretrained DistilBERT body (weights saved, no head, as
distilbert-base-uncased comes) fine-tuned with --lora_r; the checkpoint holds the merged weights, adapter/ what
peft's PeftModel.from_pretrained loads, and every consumer reads either one the same way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from fastapi.testclient import TestClient
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from contract import files
from contract.errors import CheckpointError
from contract.loading import load_model
from inference.app import create_app
from inference.settings import Settings
from tests.helpers.processes import cli_env, describe, run_train
from training.checkpoint import load_weights

peft = pytest.importorskip("peft", reason="pip install 'distilbert-agnews[peft]' (dev extra)")

TEXTS = ["Shares fell after the bank cut its forecast.", "The striker scored twice.", "A new chip doubles battery life"]
STEPS, RESUME_FROM = 60, 40
LORA = ["--lora_r", "4", "--lora_alpha", "8", "--learning_rate", "5e-3"]


def write_body(folder: Path, smoke_dir: Path) -> Path:
    """A pretrained encoder body without a classification head (random weights, saved), with its tokenizer."""
    config = AutoConfig.from_pretrained(smoke_dir / "model")
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(smoke_dir / "model").save_pretrained(folder)
    return folder


def lora_args(base: Path, out: Path) -> list[str]:
    return [
        *("--preset", "smoke", "--from_scratch", "false", "--model_name_or_path", str(base)),
        *("--output_dir", str(out), "--max_train_steps", str(STEPS), "--eval_steps", "20"),
        *("--checkpointing_steps", "20", "--logging_steps", "10", *LORA),
    ]


@pytest.fixture(scope="module")
def lora_run(smoke_dir, tmp_path_factory) -> tuple[Path, Path, str]:
    """(body, output folder, the run's stderr)."""
    root = tmp_path_factory.mktemp("lora")
    base = write_body(root / "body", smoke_dir)
    out = root / "out"
    result, _ = run_train(lora_args(base, out), env=cli_env())
    assert result.returncode == 0, describe(result)
    return base, out, result.stderr


def logits_of(model: torch.nn.Module, tokenizer) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits


@pytest.mark.slow
def test_the_log_says_trainable_and_total_parameters(lora_run):
    _, _, stderr = lora_run
    line = next(line for line in stderr.splitlines() if "LoRA r=4" in line)
    assert "on q_lin, v_lin" in line and "head trained whole: pre_classifier, classifier" in line, line
    trainable, total = (
        int(n.replace(",", "")) for n in line.split("trainable parameters ")[1].split(" (")[0].split(" of ")
    )
    assert 0 < trainable < total / 10, line


@pytest.mark.slow
def test_the_checkpoint_holds_the_merged_weights_and_adapter_gives_the_same_logits(lora_run):
    """distilbert_agnews.pt, the Hugging Face export, and the body + adapter/ through peft's own
    PeftModel.from_pretrained: the same logits (1e-5, fp32). The frozen body is unchanged where LoRA did not reach;
    the adapted projections moved (so the merge is tested, not skipped)."""
    base, out, _ = lora_run
    tokenizer = AutoTokenizer.from_pretrained(out / files.TOKENIZER_DIR)
    merged_pt = load_model(str(out), device="cpu", dtype="fp32").model
    exported = AutoModelForSequenceClassification.from_pretrained(out)
    body = AutoModelForSequenceClassification.from_pretrained(base, config=AutoConfig.from_pretrained(out))
    adapted = peft.PeftModel.from_pretrained(body, out / files.ADAPTER_DIR)
    reference = logits_of(merged_pt, tokenizer)
    assert torch.allclose(logits_of(exported, tokenizer), reference, atol=1e-5)
    assert torch.allclose(logits_of(adapted, tokenizer), reference, atol=1e-5)

    weights, original = load_weights(out / files.WEIGHTS), load_file(base / "model.safetensors")
    name = "transformer.layer.0.attention.{}.weight"
    assert torch.equal(weights[f"distilbert.{name.format('k_lin')}"], original[name.format("k_lin")])
    assert not torch.allclose(weights[f"distilbert.{name.format('q_lin')}"], original[name.format("q_lin")])
    adapter = load_file(out / files.ADAPTER_DIR / files.ADAPTER_WEIGHTS)
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in adapter.items())  # B starts at zero: it trained
    assert any(k.endswith("pre_classifier.weight") for k in adapter) and any(
        k.endswith(".classifier.weight") for k in adapter
    )
    assert (out / files.ADAPTER_DIR / files.ADAPTER_WEIGHTS).stat().st_size < (out / files.WEIGHTS).stat().st_size / 4


@pytest.mark.slow
def test_pipeline_and_the_test_split_read_the_merged_model(lora_run):
    """transformers' pipeline needs nothing new; the run's test metrics (the best adapter put back) are those of the
    merged checkpoint scored by python -m training.evaluate's loader."""
    _, out, _ = lora_run
    classify = transformers.pipeline("text-classification", model=str(out), device="cpu", top_k=None)
    served = load_model(str(out), device="cpu", dtype="fp32")
    expected = logits_of(served.model, served.tokenizer).softmax(-1)
    for answers, row in zip(classify(TEXTS), expected):
        assert {a["label"]: a["score"] for a in answers} == pytest.approx(
            dict(zip(served.labels, row.tolist())), abs=1e-5
        )
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["config"]["lora_r"] == 4 and metrics["test"]["num_examples"] == 600
    assert 0 < metrics["parameters"]["trainable"] < metrics["parameters"]["total"] / 10


@pytest.mark.slow
def test_the_service_serves_the_adapter_folder_merged_at_load(lora_run):
    """adapter/ alone (adapter_config.json names the body): /predict answers as the merged checkpoint does."""
    _, out, _ = lora_run
    answers = {}
    for folder in (out, out / files.ADAPTER_DIR):
        settings = Settings(model_id=str(folder), dtype="fp32", reload_interval_s=0, backend="torch")
        with TestClient(create_app(settings)) as client:
            response = client.post("/predict", json={"inputs": [[t] for t in TEXTS]})
        assert response.status_code == 200, response.text
        answers[folder] = response.json()
    for merged, adapted in zip(answers[out], answers[out / files.ADAPTER_DIR]):
        assert {a["label"]: a["score"] for a in adapted} == pytest.approx(
            {a["label"]: a["score"] for a in merged}, abs=1e-5
        )


@pytest.mark.slow
def test_an_adapter_whose_body_is_missing_or_another_is_refused_in_one_line(lora_run, smoke_dir, tmp_path):
    _, out, _ = lora_run
    moved = tmp_path / "adapter"
    shutil.copytree(out / files.ADAPTER_DIR, moved)
    config = json.loads((moved / files.ADAPTER_CONFIG).read_text())
    (moved / files.ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": str(tmp_path / "gone")}))
    with pytest.raises(CheckpointError, match="its base model .*gone.* cannot be loaded") as missing:
        load_model(str(moved), device="cpu", dtype="fp32")
    assert "\n" not in str(missing.value)
    other = tmp_path / "wider"  # another body: the adapter's matrices do not fit its projections
    wide = AutoConfig.from_pretrained(smoke_dir / "model", dim=64, hidden_dim=128)
    AutoModel.from_config(wide).save_pretrained(other)
    (moved / files.ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": str(other)}))
    with pytest.raises(CheckpointError, match="does not fit its base model .*: distilbert.embeddings") as body:
        load_model(str(moved), device="cpu", dtype="fp32")  # the run's config.json: the wider body's weights refused
    (moved / files.CONFIG).unlink()  # the body's own config then, as for an adapter from elsewhere: peft refuses
    with pytest.raises(CheckpointError, match="the adapter does not fit its base model") as adapter:
        load_model(str(moved), device="cpu", dtype="fp32")
    assert "\n" not in str(body.value) + str(adapter.value)


@pytest.mark.slow
def test_a_mid_epoch_resume_with_lora_continues_bitwise(lora_run, tmp_path):
    """A copy without the states after step 40 (of 168 per epoch), resumed: the same adapters, head and merged model
    as the uninterrupted run, bit for bit."""
    base, out, _ = lora_run
    resumed = tmp_path / "out"
    shutil.copytree(out, resumed, ignore=lambda folder, names: [n for n in names if n == f"step_{STEPS}"])
    result, _ = run_train([*lora_args(base, resumed), "--resume_from_checkpoint", "latest"], env=cli_env())
    assert result.returncode == 0, describe(result)
    assert f"Resumed from {resumed / files.STATE_DIR / f'step_{RESUME_FROM}'}" in result.stderr, describe(result)
    last = f"{files.STATE_DIR}/step_{STEPS}/model.safetensors"
    a, b = load_file(out / last), load_file(resumed / last)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    best, again = load_weights(out / files.WEIGHTS), load_weights(resumed / files.WEIGHTS)
    assert all(torch.equal(best[k], again[k]) for k in best)
    adapter = f"{files.ADAPTER_DIR}/{files.ADAPTER_WEIGHTS}"
    a, b = load_file(out / adapter), load_file(resumed / adapter)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "code", "says"),
    [
        (["--lora_target_modules", "nothing_here"], 2, "lora_target_modules: nothing_here match no module"),
        (["--lora_r", "0", "--lora_alpha", "4"], 2, "lora_r: must be set (e.g. 8) for --lora_alpha to apply"),
    ],
)
def test_lora_settings_that_cannot_apply_stop_in_one_line_writing_nothing(smoke_dir, tmp_path, flags, code, says):
    base = write_body(tmp_path / "body", smoke_dir)
    out = tmp_path / "out"
    result, _ = run_train([*lora_args(base, out), *flags], env=cli_env())
    assert result.returncode == code, describe(result)
    assert "Traceback" not in result.stderr and says in result.stderr.strip().splitlines()[-1], describe(result)
    assert not (out / files.WEIGHTS).exists() and not (out / files.ADAPTER_DIR).exists()


def test_lora_without_peft_installed_is_a_usage_error(smoke_dir, tmp_path):
    """peft hidden (a module of that name that fails to import comes first on the path): exit 2, one line naming
    the extra to install, before any data or model is read."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "peft.py").write_text("raise ImportError('No module named peft')\n")
    out = tmp_path / "out"
    result, _ = run_train(
        ["--preset", "smoke", "--lora_r", "8", "--output_dir", str(out)], env=cli_env(PYTHONPATH=str(hidden))
    )
    assert result.returncode == 2, describe(result)
    assert "lora_r: needs peft: pip install 'distilbert-agnews[peft]'" in result.stderr, describe(result)
    assert not out.exists()


def test_lora_has_its_own_default_learning_rate_unless_one_is_given():
    from training.config import LORA_LEARNING_RATE, TrainConfig

    assert TrainConfig(lora_r=8).learning_rate == LORA_LEARNING_RATE
    assert TrainConfig(lora_r=8, learning_rate=1e-4).learning_rate == 1e-4
    assert TrainConfig().learning_rate == 5e-5
