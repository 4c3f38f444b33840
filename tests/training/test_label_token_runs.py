"""A label-token classifier through the other ways of training and serving: LoRA, FSDP on 2 processes, windowed long
texts in training and in the service, Ray Data batch prediction; a tiny Qwen3 made here (no Hub)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from contract import files
from contract.loading import load_model
from tests.helpers.processes import FSDP, describe, fsdp_env, launch, run_train
from tests.inference.test_app import make_client
from tests.training.test_label_tokens import (
    LABELS,
    TEMPLATE,
    TOPICS,
    classifier_logits,
    config,
    lm_logits,
    write_causal_lm,
)
from training import lora
from training.data.labels import LabelSpace
from training.model import build_model, load_tokenizer

SUFFIX = ". answer :"


@pytest.fixture(scope="module")
def qwen3(smoke_dir, tmp_path_factory) -> Path:
    return write_causal_lm(tmp_path_factory.mktemp("qwen3") / "lm", "qwen3", smoke_dir)


def test_with_lora_step_0_still_reads_the_lms_label_tokens(qwen3, smoke_dir):
    """peft's adapters start at zero and the head is trained whole: the wrapped model scores as the LM at step 0."""
    cfg = config(qwen3, "--label_tokens", TOPICS, "--lora_r", "4")
    tokenizer = load_tokenizer(cfg)
    model = build_model(cfg, LabelSpace(values=[], names=LABELS, source="t"), "eager", tokenizer.pad_token_id)
    wrapped = lora.apply_lora(model, 4, 8.0, 0.0, None, from_scratch=False)
    texts = pd.read_csv(smoke_dir / "test.csv")["text"].head(6).tolist()
    ids = tokenizer.convert_tokens_to_ids(["world", "sports", "business", "science"])
    assert torch.allclose(
        classifier_logits(wrapped, tokenizer, texts), lm_logits(qwen3, tokenizer, texts, ids), atol=1e-5
    )
    trained = {name for name, p in wrapped.named_parameters() if p.requires_grad}
    assert any(".score." in name for name in trained) and any("lora_A" in name for name in trained)


@pytest.mark.slow
def test_a_lora_run_from_label_tokens_keeps_its_template_and_predicts_as_served(qwen3, smoke_dir, tmp_path):
    out = tmp_path / "lora"
    args = ["--preset", "smoke", "--model_name_or_path", str(qwen3), "--from_scratch", "false",
            "--tokenizer_name", str(qwen3 / "tokenizer"), "--label_tokens", TOPICS, "--template", TEMPLATE,
            "--lora_r", "4", "--max_train_steps", "10", "--checkpointing_steps", "none", "--calibration", "none",
            "--output_dir", str(out)]  # fmt: skip
    result, _ = run_train(args)
    assert result.returncode == 0, describe(result)
    assert (out / files.ADAPTER_DIR).is_dir() and "Head started from the LM's label tokens" in result.stderr
    texts = pd.read_csv(smoke_dir / "test.csv")["text"].head(8).tolist()
    source, labelled = tmp_path / "texts.csv", tmp_path / "labelled.csv"
    pd.DataFrame({"text": texts}).to_csv(source, index=False)
    flags = ["--checkpoint_dir", str(out), "--input_file", str(source), "--output_file", str(labelled)]
    result, _ = launch(["-m", "training.predict", *flags, "--mixed_precision", "fp32"])
    assert result.returncode == 0, describe(result)
    with make_client(out, dtype="float32", backend="torch") as client:
        served = client.post("/predict", json={"inputs": [[t] for t in texts]}).json()
    written = pd.read_csv(labelled)
    for i, ranked in enumerate(served):
        scores = {a["label"]: a["score"] for a in ranked}
        assert written.loc[i, [f"score_{name}" for name in LABELS]].tolist() == pytest.approx(
            [scores[name] for name in LABELS], abs=1e-5
        )


@pytest.fixture(scope="module")
def sharded_windows(qwen3, tmp_path_factory) -> Path:
    """The tiny Qwen3 trained from its label tokens under FSDP2 on 2 processes, on smoke-long's stories in 48-token
    windows (a story's windows may sit on both ranks)."""
    out = tmp_path_factory.mktemp("fsdp") / "out"
    args = ["--preset", "smoke-long", "--model_name_or_path", str(qwen3), "--from_scratch", "false",
            "--tokenizer_name", str(qwen3 / "tokenizer"), "--label_tokens", TOPICS, "--template", TEMPLATE,
            "--max_length", "48", "--max_train_steps", "20", "--eval_steps", "10", "--checkpointing_steps", "none",
            "--learning_rate", "3e-3", "--calibration", "none", "--output_dir", str(out)]  # fmt: skip
    result, _ = run_train(args, processes=2, env=fsdp_env(), config=FSDP)
    assert result.returncode == 0, describe(result)
    return out


@pytest.mark.slow
def test_under_fsdp_every_window_of_every_story_is_scored_once(sharded_windows):
    metrics = json.loads((sharded_windows / files.METRICS).read_text())
    assert metrics["test"]["num_examples"] == metrics["num_examples"]["test"]
    assert metrics["test"]["num_windows"] == metrics["num_windows"]["test"] > metrics["num_examples"]["test"]
    saved = json.loads((sharded_windows / files.CONFIG).read_text())
    assert saved["prompt_template"] == TEMPLATE and saved["label_tokens"]["method"] == "tokens"


@torch.no_grad()
def windows_by_hand(folder: Path, story: str) -> tuple[list[list[int]], list[float]]:
    """The story's windows as the checkpoint's tokenizer cuts them, and their logits averaged, softmaxed."""
    loaded = load_model(str(folder), device="cpu", dtype="fp32")
    encoded = loaded.long_text.encode(loaded.tokenizer, [story], None, loaded.long_text.window)
    windows = [f["input_ids"] for f in encoded.features]
    logits = torch.cat([loaded.model(input_ids=torch.tensor([w])).logits for w in windows]).mean(0)
    return windows, logits.softmax(-1).tolist()


@pytest.mark.slow
def test_the_service_pools_windows_that_each_end_with_the_templates_suffix(sharded_windows, smoke_dir):
    """LONG_TEXT=chunk (the run's own setting): every window of a long story ends with the suffix where the label
    token is read, and /predict answers the windows' mean to 1e-5."""
    stories = pd.read_csv(smoke_dir / "long_test.csv")["text"].head(4).tolist()
    suffix = load_model(str(sharded_windows), device="cpu", dtype="fp32").tokenizer.encode(
        SUFFIX, add_special_tokens=False
    )
    with make_client(sharded_windows, dtype="float32", backend="torch") as client:
        assert client.get("/info").json()["distilbert_agnews"]["long_text"]["long_text"] == "chunk"
        answers = client.post("/predict", json={"inputs": [[s] for s in stories]}).json()
    for story, answer in zip(stories, answers):
        windows, expected = windows_by_hand(sharded_windows, story)
        assert len(windows) > 1 and all(w[-len(suffix) :] == suffix for w in windows)
        got = {a["label"]: a["score"] for a in answer}
        assert [got[name] for name in LABELS] == pytest.approx(expected, abs=1e-5)


@pytest.mark.slow
def test_ray_data_labels_long_stories_as_the_service_does(sharded_windows, smoke_dir, tmp_path):
    pytest.importorskip("ray", reason="pip install 'distilbert-agnews[ray]' (in the dev extra)")
    lake = tmp_path / "lake"
    lake.mkdir()
    stories = pd.read_csv(smoke_dir / "long_test.csv")["text"].head(12)
    for i in range(2):
        pd.DataFrame({"text": stories[i * 6 : (i + 1) * 6]}).to_csv(lake / f"day{i}.csv", index=False)
    flags = ["--checkpoint_dir", str(sharded_windows), "--input_file", str(lake / "day*.csv"), "--output_dir",
             str(tmp_path / "ray"), "--mixed_precision", "fp32", "--ray", "--num_replicas", "1"]  # fmt: skip
    result, _ = launch(["-m", "training.predict", *flags])
    assert result.returncode == 0, describe(result)
    with make_client(sharded_windows, dtype="float32", backend="torch") as client:
        served = client.post("/predict", json={"inputs": [[s] for s in stories]}).json()
    written = pd.concat([pd.read_csv(tmp_path / "ray" / f"day{i}.csv") for i in range(2)], ignore_index=True)
    assert written["text"].tolist() == stories.tolist()
    for i, answer in enumerate(served):
        scores = {a["label"]: a["score"] for a in answer}
        assert written.loc[i, [f"score_{name}" for name in LABELS]].tolist() == pytest.approx(
            [scores[name] for name in LABELS], abs=1e-5
        )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_the_optimized_runtimes_read_the_template_as_torch_does(qwen3, tmp_path, backend):
    """A downloaded label-token classifier converted (no cache output: a decoder's) and served in fp32: its answers
    equal PyTorch's to 1e-5, a text far past the window included."""
    pytest.importorskip(backend, reason=f"pip install 'distilbert-agnews[{backend}]' (in the dev extra)")
    folder = Path(shutil.copytree(qwen3, tmp_path / "lm"))
    spec = {"classifier_from_token": ["world", "sports", "business", "science"], "method": "no_post_processing",
            "labels": LABELS, "template": TEMPLATE}  # fmt: skip
    (folder / "label_tokens.json").write_text(json.dumps(spec))
    texts = [[t] for t in ("the striker scored twice in the final", "shares fell sharply " * 200)]
    answers = {}
    for runtime in ("torch", backend):
        with make_client(folder, dtype="float32", backend=runtime) as client:
            assert client.get("/info").json()["distilbert_agnews"]["runtime"]["name"] == runtime
            answers[runtime] = client.post("/predict", json={"inputs": texts, "truncate": True}).json()
    for got, want in zip(answers[backend], answers["torch"]):
        assert {a["label"]: a["score"] for a in got} == pytest.approx({a["label"]: a["score"] for a in want}, abs=1e-5)


@pytest.mark.slow
def test_a_copy_of_its_layers_reads_stories_as_the_label_token_teacher_did(sharded_windows, smoke_dir, tmp_path):
    """`agnews distill --student_layers 1` from the windowed label-token Qwen3: the student keeps its template, its
    48-token windows and their pooling, and its agreement on held-out stories is recorded."""
    lake = tmp_path / "stories.csv"
    pd.read_csv(smoke_dir / "long_train.csv")[["text"]].head(300).to_csv(lake, index=False)
    out = tmp_path / "student"
    args = ["-m", "training.distill", "--teacher", str(sharded_windows), "--input_file", str(lake), "--output_dir",
            str(out), "--student_layers", "1", "--max_train_steps", "10", "--checkpointing_steps", "none"]  # fmt: skip
    result, _ = launch(args)
    assert result.returncode == 0, describe(result)
    teacher, student = (json.loads((folder / files.CONFIG).read_text()) for folder in (sharded_windows, out))
    for field in ("prompt_template", "long_text", "chunk_stride", "chunk_pooling", "chunk_max_length", "label_tokens"):
        assert student[field] == teacher[field], field
    assert student["num_hidden_layers"] == 1 and student["distilled_from"]["layers"] == [0]
    assert json.loads((out / files.METRICS).read_text())["agreement_with_teacher"]["texts"] == 60
