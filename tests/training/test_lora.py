"""LoRA through peft end to end."""

from __future__ import annotations

import json
import os
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
from tests.helpers.adapters import write_body
from tests.helpers.processes import cli_env, describe, run_train
from tests.helpers.service import wait_for
from training.output.best_model import load_weights

peft = pytest.importorskip("peft", reason="pip install 'distilbert-agnews[peft]' (dev extra)")

TEXTS = ["Shares fell after the bank cut its forecast.", "The striker scored twice.", "A new chip doubles battery life"]
STEPS, RESUME_FROM = 60, 40
LORA = ["--lora_r", "4", "--lora_alpha", "8", "--learning_rate", "5e-3"]


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
    with pytest.raises(CheckpointError, match="its base model folder .*gone .*is not there") as missing:
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


def adapter_copy(lora_run, tmp_path) -> Path:
    _, out, _ = lora_run
    return Path(shutil.copytree(out / files.ADAPTER_DIR, tmp_path / "adapter"))


def zero_a_block(folder: Path) -> None:
    path = folder / files.ADAPTER_WEIGHTS
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)
    path.write_bytes(bytes(data))


def edit_adapter_config(**fields):
    def edit(folder: Path) -> None:
        path = folder / files.ADAPTER_CONFIG
        path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))

    return edit


def truncate_weights(folder: Path) -> None:
    path = folder / files.ADAPTER_WEIGHTS
    path.write_bytes(path.read_bytes()[:3000])


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit, file",
    [
        (zero_a_block, files.ADAPTER_WEIGHTS),
        (truncate_weights, files.ADAPTER_WEIGHTS),
        (edit_adapter_config(lora_alpha=100000), files.ADAPTER_CONFIG),
        (edit_adapter_config(target_modules=["k_lin"]), files.ADAPTER_CONFIG),  # peft would only warn, base answering
    ],
    ids=["zeroed-block", "truncated", "alpha", "target-modules"],
)
def test_a_damaged_or_edited_adapter_is_refused_naming_the_file(lora_run, tmp_path, edit, file):
    """adapter/config.json records the sha256 of peft's two files: a damaged or edited one is refused in one line
    (before: served silently, with the trained deltas scaled, dropped or garbled)."""
    folder = adapter_copy(lora_run, tmp_path)
    edit(folder)
    with pytest.raises(CheckpointError, match=f"{folder / file}: sha256 .* damaged or edited") as refused:
        load_model(str(folder), device="cpu", dtype="fp32")
    assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_an_adapter_is_served_only_on_the_base_it_was_trained_on(lora_run, smoke_dir, tmp_path):
    """The base's weights are checked against the hash training recorded: another base of the same architecture
    (it loads and answers: before, silently) is refused; the same base at another path is served."""
    base, out, _ = lora_run
    folder = adapter_copy(lora_run, tmp_path)
    torch.manual_seed(1)
    other = tmp_path / "other"
    AutoModel.from_config(AutoConfig.from_pretrained(base)).save_pretrained(other)
    edit_adapter_config(base_model_name_or_path=str(other))(folder)
    with pytest.raises(CheckpointError, match="is not the one the adapter was trained on"):
        load_model(str(folder), device="cpu", dtype="fp32")
    moved = Path(shutil.copytree(base, tmp_path / "moved"))
    edit_adapter_config(base_model_name_or_path=str(moved))(folder)
    served = load_model(str(folder), device="cpu", dtype="fp32")
    merged = load_model(str(out), device="cpu", dtype="fp32")
    assert torch.allclose(
        logits_of(served.model, served.tokenizer), logits_of(merged.model, merged.tokenizer), atol=1e-5
    )
    record = json.loads((folder / files.CONFIG).read_text())[files.ADAPTER_BASE]
    assert record["model"] == str(base) and record["saved"] is None and len(record["sha256"]) == 64


@pytest.mark.slow
def test_an_adapter_from_elsewhere_whose_keys_do_not_fit_is_an_error_not_a_warning(lora_run, tmp_path):
    """Without our record (a peft folder from elsewhere), peft's missing adapter keys are an error; a damaged weights
    file and a base named by a number are one line too."""
    folder = adapter_copy(lora_run, tmp_path)
    (folder / files.CONFIG).unlink()
    edit_adapter_config(target_modules=["k_lin"])(folder)
    with pytest.raises(CheckpointError, match="adapter_model.safetensors: lacks .*k_lin.*missing"):
        load_model(str(folder), device="cpu", dtype="fp32")
    edit_adapter_config(target_modules=["q_lin", "v_lin"], base_model_name_or_path=7)(folder)
    with pytest.raises(CheckpointError, match="base_model_name_or_path must name the base model"):
        load_model(str(folder), device="cpu", dtype="fp32")
    edit_adapter_config(base_model_name_or_path=str(lora_run[0]))(folder)
    truncate_weights(folder)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_model(str(folder), device="cpu", dtype="fp32")


@pytest.mark.slow
def test_an_edited_adapter_at_reload_is_refused_and_the_old_model_keeps_serving(lora_run, tmp_path, capfd):
    """adapter_config.json is in the reload signature: an edit there triggers a reload, which refuses it."""
    folder = adapter_copy(lora_run, tmp_path)
    settings = Settings(model_id=str(folder), dtype="fp32", reload_interval_s=0.05, backend="torch")
    with TestClient(create_app(settings)) as client:
        before = client.post("/predict", json={"inputs": TEXTS[0]}).json()
        staged = folder / ".adapter_config.json.new"
        config = json.loads((folder / files.ADAPTER_CONFIG).read_text())
        staged.write_text(json.dumps({**config, "lora_alpha": 100000}))
        os.replace(staged, folder / files.ADAPTER_CONFIG)
        wait_for(lambda: client.get("/metrics").text, lambda text: 'te_model_reloads{result="failed"} 1.0' in text)
        assert client.post("/predict", json={"inputs": TEXTS[0]}).json() == before
    assert "damaged or edited after training" in capfd.readouterr().err


@pytest.mark.slow
def test_the_adapter_of_a_from_scratch_lora_run_serves_on_its_own(smoke_dir, tmp_path):
    """A from-scratch base exists nowhere else: its weights go to adapter/base/, so adapter/ serves (before: its base
    folder held only config.json) and answers as the merged checkpoint does."""
    out = tmp_path / "out"
    args = ["--preset", "smoke", "--output_dir", str(out), "--max_train_steps", "20", "--eval_steps", "10", *LORA]
    result, _ = run_train(args, env=cli_env())
    assert result.returncode == 0, describe(result)
    assert (out / files.ADAPTER_DIR / files.ADAPTER_BASE_DIR / files.HF_WEIGHTS).is_file()
    answers = {}
    for folder in (out, out / files.ADAPTER_DIR):
        loaded = load_model(str(folder), device="cpu", dtype="fp32")
        answers[folder] = logits_of(loaded.model, loaded.tokenizer)
    assert torch.allclose(answers[out], answers[out / files.ADAPTER_DIR], atol=1e-5)


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
