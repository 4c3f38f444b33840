"""training.download, then an offline run that never opens a connection."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from contract import files
from tests.helpers.processes import ROOT, cli_env, describe, launch, run_train

pytestmark = pytest.mark.slow

NO_NETWORK = ROOT / "tests" / "helpers" / "no_network"


def guarded_env(log) -> dict:
    return cli_env(NO_NETWORK_LOG=str(log), PYTHONPATH=os.pathsep.join([str(NO_NETWORK), str(ROOT)]))


def test_the_network_guard_refuses_and_records(tmp_path):
    log = tmp_path / "network.log"
    code = (
        "import socket\ntry:\n    socket.create_connection(('huggingface.co', 443), timeout=2)\n"
        "except OSError as e:\n    print(e)"
    )
    result = subprocess.run([sys.executable, "-c", code], env=guarded_env(log), capture_output=True, text=True)
    assert "refused by the test" in result.stdout, describe(result)
    assert "huggingface.co" in log.read_text()


@pytest.fixture(scope="module")
def hub_like_sources(smoke_dir, tmp_path_factory):
    """A pretrained-style model folder (weights, config, tokenizer) and a dataset folder with train/test files
    whose label column is a ClassLabel, as the Hub's ag_news has."""
    import datasets
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    root = tmp_path_factory.mktemp("sources")
    model_dir, data_dir = root / "tiny-distilbert", root / "news"
    AutoModel.from_config(AutoConfig.from_pretrained(smoke_dir / "model")).save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(smoke_dir / "model").save_pretrained(model_dir)
    data_dir.mkdir()
    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["World", "Sports", "Business", "Sci/Tech"]),
        }
    )
    for split in ("train", "test"):
        rows = datasets.load_dataset("csv", data_files=str(smoke_dir / f"{split}.csv"), split="train")
        rows.cast(features).to_parquet(str(data_dir / f"{split}.parquet"))
    return model_dir, data_dir


def test_download_then_train_offline_without_touching_the_network(hub_like_sources, tmp_path):
    model_dir, data_dir = hub_like_sources
    prepared, log = tmp_path / "prepared", tmp_path / "network.log"
    result, _ = launch(
        [
            "-m",
            "training.download",
            "--output_dir",
            str(prepared),
            "--model_name_or_path",
            str(model_dir),
            "--dataset_name",
            str(data_dir),
        ]
    )
    assert result.returncode == 0, describe(result)
    config = yaml.safe_load((prepared / "train_config.yaml").read_text())
    assert config["model_name_or_path"] == str((prepared / "model").resolve())
    assert config["label_names"] == ["World", "Sports", "Business", "Sci/Tech"]
    assert (prepared / "model" / "model.safetensors").is_file() and (prepared / "data" / "test.parquet").is_file()

    shutil.rmtree(model_dir.parent)  # nothing outside the prepared folder is left to read
    out = tmp_path / "out"
    result, _ = run_train(
        [
            "--config",
            str(prepared / "train_config.yaml"),
            "--output_dir",
            str(out),
            "--num_train_epochs",
            "1",
            "--max_length",
            "64",
            "--per_device_train_batch_size",
            "16",
            "--learning_rate",
            "1e-3",
            "--mixed_precision",
            "no",
            "--checkpointing_steps",
            "none",
        ],
        processes=2,
        env=guarded_env(log),
    )
    assert result.returncode == 0, describe(result)
    assert not log.exists(), f"network access attempted:\n{log.read_text()}"
    assert "newly initialized" in result.stderr + result.stdout  # the classifier head only: the encoder was loaded
    assert (out / files.WEIGHTS).is_file()


def test_download_without_the_hub_fails_at_once_with_the_reason(tmp_path):
    result, seconds = launch(
        ["-m", "training.download", "--output_dir", str(tmp_path / "p")], env=cli_env(HF_HUB_OFFLINE="1")
    )
    assert result.returncode == 1, describe(result)
    assert "Cannot download distilbert-base-uncased, ag_news" in result.stdout and "login node" in result.stdout
    assert seconds < 30 and not (tmp_path / "p").exists()
