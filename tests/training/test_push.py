"""Publishing: the model card's metadata round-trips through huggingface_hub, and what an upload would send,
checked at the HfApi boundary (no network here): everything but resumable states, from the main process only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from huggingface_hub.utils import filter_repo_objects

from contract import files
from tests.helpers.processes import ROOT, cli_env, describe, launch, run_train
from training import push
from training.output import model_card

FAKE_HUB = ROOT / "tests" / "helpers" / "fake_hub"
LABELS = ["World", "Sports", "Business", "Sci/Tech"]
METRICS = {"accuracy": 0.91, "macro_f1": 0.9, "num_examples": 600, "loss": 0.3}


def summary(**config) -> dict:
    cfg = {
        "model_name_or_path": "distilbert-base-uncased",
        "dataset_name": "ag_news",
        "train_file": None,
        "output_dir": "runs/x",
        "learning_rate": 5e-5,
        "num_train_epochs": 2,
        "per_device_train_batch_size": 32,
        "gradient_accumulation_steps": 1,
        "max_length": 128,
        "warmup_ratio": 0.1,
        "weight_decay": 0.01,
        "seed": 42,
        "lr_scheduler_type": "cosine",
        **config,
    }
    return {
        "config": cfg,
        "label_names": LABELS,
        "validation": METRICS,
        "test": {**METRICS, "accuracy": 0.93},
        "global_step": 100,
        "world_size": 2,
        "effective_batch_size": 64,
        "mixed_precision": "bf16",
        "best_step": 100,
        "metric_for_best_model": "accuracy",
    }


def test_card_metadata_round_trips_with_eval_results(tmp_path):
    model_card.write_model_card(tmp_path, summary(), "acme/agnews")
    card = ModelCard.load(tmp_path / files.MODEL_CARD)
    assert card.data.base_model == "distilbert-base-uncased" and card.data.datasets == ["ag_news"]
    assert card.data.pipeline_tag == "text-classification" and card.data.library_name == "transformers"
    results = {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert results == {
        ("validation", "accuracy"): 0.91,
        ("validation", "macro_f1"): 0.9,
        ("test", "accuracy"): 0.93,
        ("test", "macro_f1"): 0.9,
    }
    assert card.data.model_name == "acme/agnews" and "| schedule | cosine, warmup ratio 0.1 |" in card.text
    assert 'pipeline("text-classification", model="acme/agnews")' in card.text


@pytest.mark.parametrize(
    "config",
    [
        {"model_name_or_path": "{local}"},  # a local folder (training.download, a fine-tune of a fine-tune)
        {"model_name_or_path": "distilbert-base-uncased", "from_scratch": True},  # the smoke preset's kind of run
    ],
)
def test_base_model_is_a_hub_id_or_absent_never_a_local_path(tmp_path, config):
    config = {k: v.format(local=tmp_path) if isinstance(v, str) else v for k, v in config.items()}
    card = model_card.model_card(summary(**config, train_file="a.csv", test_file="b.csv"))
    assert card.data.base_model is None and str(tmp_path) not in card.data.to_yaml()
    assert card.data.datasets is None and "on `a.csv`, test `b.csv`" in card.text


class RecordingApi:
    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, **options):
        self.calls.append(("create_repo", repo_id, options))

    def upload_folder(self, **options):
        self.calls.append(("upload_folder", options["repo_id"], options))
        return type("Commit", (), {"commit_url": f"https://hub.example/{options['repo_id']}/commit/1"})()


def test_push_uploads_the_model_the_card_and_the_reports_but_not_the_states(tmp_path):
    folder = tmp_path / "out"
    for name in (
        files.WEIGHTS,
        files.HF_WEIGHTS,
        files.CONFIG,
        "tokenizer.json",
        f"{files.TOKENIZER_DIR}/vocab.txt",
        files.CURVES_PNG,
        files.EVAL_RESULTS,
        "state/step_84/model.safetensors",
        "state/step_84/progress.json",
        ".distilbert_agnews.pt.abc123",
        ".hf.tmp/config.json",
    ):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("x")
    (folder / files.METRICS).write_text(json.dumps(summary()))
    api = RecordingApi()
    assert push.push(folder, "acme/agnews", private=True, api=api) == "https://hub.example/acme/agnews/commit/1"
    (_, repo, create), (_, repo_again, upload) = api.calls
    assert repo == repo_again == "acme/agnews" and create["private"] is True and create["exist_ok"] is True
    everything = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    sent = set(
        filter_repo_objects(
            everything, allow_patterns=upload.get("allow_patterns"), ignore_patterns=upload["ignore_patterns"]
        )
    )  # what upload_folder itself keeps
    assert sent == {
        files.WEIGHTS,
        files.HF_WEIGHTS,
        files.CONFIG,
        "tokenizer.json",
        "tokenizer/vocab.txt",
        files.CURVES_PNG,
        files.EVAL_RESULTS,
        files.METRICS,
        files.MODEL_CARD,
    }
    assert ModelCard.load(folder / files.MODEL_CARD).data.model_name == "acme/agnews"


def test_push_cli_offline_is_one_line_in_seconds(tmp_path):
    (tmp_path / files.CONFIG).write_text("{}")
    env = cli_env(HF_ENDPOINT="http://127.0.0.1:9")
    env.pop("HF_HUB_OFFLINE")
    command = ["-m", "training.push", "--checkpoint_dir", str(tmp_path), "--hub_model_id", "acme/agnews"]
    result, seconds = launch(command, env=env, timeout=120)
    assert result.returncode == 1 and seconds < 30
    assert "push_to_hub: the Hugging Face Hub (http://127.0.0.1:9) is out of reach" in result.stderr
    assert "push later with this command from a machine that reaches it" in result.stderr  # not "run push"
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_training_refuses_to_start_when_it_could_not_push(smoke_dir, tmp_path):
    out = tmp_path / "out"
    result, seconds = run_train(
        ["--preset", "smoke", "--output_dir", str(out), "--push_to_hub", "--hub_model_id", "acme/agnews"]
    )  # HF_HUB_OFFLINE=1
    assert result.returncode == 1 and seconds < 60, describe(result)
    assert "push_to_hub: the Hugging Face Hub" in result.stderr and "HF_HUB_OFFLINE is set" in result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_two_process_training_pushes_once_from_the_main_process(smoke_dir, tmp_path):
    log = tmp_path / "hub.jsonl"
    env = cli_env(FAKE_HUB_LOG=str(log), HF_TOKEN="hf_test", PYTHONPATH=os.pathsep.join([str(FAKE_HUB), str(ROOT)]))
    env.pop("HF_HUB_OFFLINE")  # the fake Hub answers the probe; data and model are local (smoke preset)
    out = tmp_path / "out"
    result, _ = run_train(
        [
            "--preset",
            "smoke",
            "--output_dir",
            str(out),
            "--num_train_epochs",
            "1",
            "--checkpointing_steps",
            "42",
            "--push_to_hub",
            "--hub_model_id",
            "acme/agnews",
        ],
        processes=2,
        env=env,
    )
    assert result.returncode == 0, describe(result)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(c["call"], c["rank"]) for c in calls] == [("create_repo", "0"), ("upload_folder", "0")]
    sent = calls[1]["files"]
    assert {
        files.WEIGHTS,
        files.HF_WEIGHTS,
        files.CONFIG,
        files.MODEL_CARD,
        files.METRICS,
        files.CURVES_PNG,
        f"{files.TOKENIZER_DIR}/tokenizer.json",
    } <= set(sent)
    assert not [f for f in sent if f.startswith(files.STATE_DIR)] and (out / files.STATE_DIR).is_dir()
    card = ModelCard.load(Path(out) / files.MODEL_CARD)
    assert card.data.base_model is None and card.data.model_name == "acme/agnews"
    assert {r.metric_type for r in card.data.eval_results} == {"accuracy", "macro_f1"}
