"""`agnews distill`: the smoke teacher labels 2,000 unlabelled smoke texts, a 1-layer copy of it learns its scores;
agreement recorded, resume bitwise, and the service's AGREEMENT_WITH guard refusing a bad student at reload."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from contract import agreement, files
from contract.problem_types import ProblemType
from tests.helpers.processes import describe, fault_env, launch
from tests.helpers.service import Server, wait_for
from tests.inference.test_app import make_client
from training.distill.students import chosen_layers

STEPS = ["--max_length", "64", "--learning_rate", "1e-3", "--num_train_epochs", "2", "--per_device_train_batch_size",
         "16", "--checkpointing_steps", "50", "--keep_states"]  # fmt: skip


def distill_args(teacher: Path, lake: Path, out: Path, smoke_dir: Path, *more: str) -> list[str]:
    return ["-m", "training.distill", "--teacher", str(teacher), "--input_file", str(lake / "*.csv"), "--output_dir",
            str(out), "--student_layers", "1", "--test_file", str(smoke_dir / "test.csv"), *STEPS, *more]  # fmt: skip


def distill(teacher: Path, lake: Path, out: Path, smoke_dir: Path, *more: str):
    result, _ = launch(distill_args(teacher, lake, out, smoke_dir, *more))
    assert result.returncode == 0, describe(result)
    return result


@pytest.fixture(scope="module")
def lake(smoke_dir, tmp_path_factory) -> Path:
    """2,000 smoke training texts without their labels, in two shards."""
    folder = tmp_path_factory.mktemp("lake")
    texts = pd.read_csv(smoke_dir / "train.csv")[["text"]]
    texts.iloc[:1000].to_csv(folder / "day0.csv", index=False)
    texts.iloc[1000:2000].to_csv(folder / "day1.csv", index=False)
    return folder


@pytest.fixture(scope="module")
def student(smoke_model, lake, smoke_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("distilled") / "student"
    distill(smoke_model, lake, out, smoke_dir)
    return out


@pytest.mark.slow
def test_a_one_layer_student_keeps_its_teachers_accuracy_and_records_their_agreement(smoke_model, student):
    teacher = json.loads((smoke_model / files.METRICS).read_text())["test"]["accuracy"]
    metrics = json.loads((student / files.METRICS).read_text())
    assert metrics["test"]["accuracy"] >= teacher - 0.05, (metrics["test"]["accuracy"], teacher)
    measured = metrics["agreement_with_teacher"]
    assert measured["agreement"] >= 0.95 and measured["mean_abs_difference"] < 0.1
    config = json.loads((student / files.CONFIG).read_text())
    assert config["n_layers"] == 1 and config[agreement.FIELD]["layers"] == [0]
    record = json.loads((student / agreement.RECORD).read_text())
    held = record["held_out"]["texts"]
    assert record["agreement"] == measured and measured["texts"] == len(held) == len(set(held)) >= 300
    trained_on = pd.read_parquet(student / "distill" / "train.parquet")["text"]
    assert not set(held) & set(trained_on)  # measured on texts it never saw
    assert "## Agreement with its teacher" in (student / files.MODEL_CARD).read_text()


@pytest.mark.slow
def test_the_agreement_recorded_is_the_student_scored_again(student):
    """The record's figure from the saved student and the teacher's recorded scores, by hand."""
    from contract.loading import load_model

    record = json.loads((student / agreement.RECORD).read_text())
    loaded = load_model(str(student), dtype="fp32")
    texts, scores = record["held_out"]["texts"], torch.tensor(record["held_out"]["teacher_scores"])
    mine = loaded.problem.scores(agreement.logits_of(loaded, texts))
    assert (mine - scores).abs().mean().item() == pytest.approx(record["agreement"]["mean_abs_difference"], abs=1e-5)
    assert (mine.argmax(-1) == scores.argmax(-1)).float().mean().item() >= record["agreement"]["agreement"] - 0.01


@pytest.mark.slow
def test_a_resume_mid_distillation_ends_bitwise(smoke_model, lake, student, smoke_dir, tmp_path):
    """Stopped by a fault after step 120 (states every 50), run again with --resume_from_checkpoint latest: the
    teacher's scored shards are kept, and the student ends as the uninterrupted one, bit for bit."""
    out = tmp_path / "student"
    stopped, _ = launch(distill_args(smoke_model, lake, out, smoke_dir), env=fault_env("raise_on_rank:0:120"))
    assert stopped.returncode != 0 and "injected fault" in stopped.stderr, describe(stopped)
    result = distill(smoke_model, lake, out, smoke_dir, "--resume_from_checkpoint", "latest")
    assert f"Resumed from {out / files.STATE_DIR / 'step_100'}" in result.stderr, describe(result)
    assert "Skipped 2 of 2 shards" in result.stdout + result.stderr  # the teacher's scores are kept
    a = torch.load(student / files.WEIGHTS, weights_only=True)
    b = torch.load(out / files.WEIGHTS, weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_running_service_teaches_as_its_folder_does(smoke_model, lake, student, smoke_dir, tmp_path):
    """--teacher http://...: its /info's labels and problem type, its raw scores through /predict (real HTTP): the
    same teacher scores as the folder's `agnews predict` wrote, to 1e-5; --student_layers needs the folder."""
    server = Server(smoke_model, "--reload_interval_s", "0", "--backend", "torch", "--dtype", "float32").wait_ready()
    try:
        out = tmp_path / "from-url"
        args = ["-m", "training.distill", "--teacher", server.url, "--input_file", str(lake / "*.csv"),
                "--output_dir", str(out), "--model_name_or_path", str(student), "--max_train_steps", "5",
                "--checkpointing_steps", "none"]  # fmt: skip
        result, _ = launch(args)
        assert result.returncode == 0, describe(result)
        refused, _ = launch([*args[:-6], "--student_layers", "1"])
    finally:
        server.stop()
    assert refused.returncode == 2 and "--teacher must be its folder" in refused.stderr, describe(refused)
    for shard in ("day0", "day1"):
        by_url = pd.read_json(out / "distill" / "teacher" / f"{shard}.jsonl", lines=True)
        by_folder = pd.read_json(student / "distill" / "teacher" / f"{shard}.jsonl", lines=True)
        scores = [c for c in by_folder.columns if c.startswith("score_")]
        assert (by_url["text"] == by_folder["text"]).all() and len(scores) == 4
        assert (by_url[scores] - by_folder[scores]).abs().to_numpy().max() <= 1e-5
    assert json.loads((out / agreement.RECORD).read_text())["teacher"] == server.url


@pytest.mark.slow
def test_evaluate_reports_the_teacher_beside_the_student(smoke_model, student, smoke_dir):
    """Without --teacher: the one the student's distillation.json names."""
    args = ["-m", "training.evaluate", "--checkpoint_dir", str(student), "--test_file", str(smoke_dir / "test.csv"),
            "--mixed_precision", "fp32"]  # fmt: skip
    result, _ = launch(args)
    assert result.returncode == 0, describe(result)
    evaluated = json.loads((student / files.EVAL_RESULTS).read_text())
    teacher = json.loads((smoke_model / files.METRICS).read_text())["test"]["accuracy"]
    assert evaluated["teacher"]["metrics"]["accuracy"] == pytest.approx(teacher, abs=0.005)
    assert evaluated["teacher"]["agreement"]["texts"] == 600 and evaluated["teacher"]["agreement"]["agreement"] >= 0.95
    assert "Against its teacher" in result.stderr


def mislabelled(source: Path, target: Path) -> Path:
    """The student with its classifier's rows rolled: every answer under another label's name, saved consistently."""
    shutil.copytree(source, target)
    state = torch.load(source / files.WEIGHTS, weights_only=True)
    for name in ("classifier.weight", "classifier.bias"):
        state[name] = state[name].roll(1, 0).clone()
    torch.save(state, target / files.WEIGHTS)
    config = json.loads((source / files.CONFIG).read_text())
    config[files.WEIGHTS_SHA256] = {files.WEIGHTS: files.tensors_sha256(state)}
    (target / files.CONFIG).write_text(json.dumps(config))
    return target


@pytest.mark.slow
def test_the_service_refuses_a_student_that_disagrees_and_keeps_serving(smoke_model, student, tmp_path, capfd):
    served = Path(shutil.copytree(student, tmp_path / "served", ignore=shutil.ignore_patterns("state", "distill")))
    bad = mislabelled(student, tmp_path / "bad")
    settings = {"backend": "torch", "agreement_with": str(smoke_model), "min_agreement": 0.95}
    with pytest.raises(Exception, match="AGREEMENT_WITH: .* keeps .* under MIN_AGREEMENT 95 %"):
        with make_client(bad, **settings):
            pass
    with make_client(served, reload_interval_s=0.05, **settings) as client:
        text = "The striker scored twice as the league leaders won the cup final."
        before = client.post("/predict", json={"inputs": text}).json()
        shown = client.get("/info").json()["distilbert_agnews"]["agreement_with"]
        assert shown["teacher"] == str(smoke_model) and shown["min_agreement"] == 0.95 and shown["agreement"] >= 0.95
        for name in (files.WEIGHTS, files.CONFIG):  # each file whole, by rename
            shutil.copy(bad / name, served / f".{name}.new")
            os.replace(served / f".{name}.new", served / name)
        wait_for(lambda: client.get("/metrics").text, lambda text: 'te_model_reloads{result="failed"} 1.0' in text)
        assert client.post("/predict", json={"inputs": text}).json() == before
        assert client.get("/ready").status_code == 200
    said = capfd.readouterr().err
    assert "Refused the new checkpoint" in said and "under MIN_AGREEMENT 95 %" in said
    held = json.loads((student / agreement.RECORD).read_text())["held_out"]["texts"]
    assert f"{len(held)} held-out texts of distillation.json" in said


def test_student_layers_are_rising_layer_numbers_or_a_count():
    assert (
        chosen_layers("3", 6) == [0, 2, 5] and chosen_layers("0,2,4", 6) == [0, 2, 4] and chosen_layers("1", 2) == [0]
    )
    for spec in ("6", "0,0", "4,2", "0,9", "x"):
        with pytest.raises(Exception, match="student_layers"):
            chosen_layers(spec, 6)


@pytest.mark.parametrize("name", ["single_label_classification", "multi_label_classification", "regression"])
def test_recorded_scores_read_back_as_logits_give_the_same_scores(name):
    problem = ProblemType.named(name, 1 if name == "regression" else 4)
    logits = torch.randn(16, 1 if name == "regression" else 4)
    again = agreement.logits_from_scores(problem, problem.scores(logits))
    assert torch.allclose(problem.scores(again), problem.scores(logits), atol=1e-5)
    assert agreement.measure(problem, logits, again)["agreement"] == 1.0


@pytest.mark.parametrize("family", ["distilbert", "bert", "qwen3"])
def test_a_copy_of_every_layer_is_the_teacher_and_fewer_layers_still_run(family, smoke_dir, tmp_path):
    """smaller_copy keeps the embeddings, the chosen layers (a decoder's attention renumbered) and the head: with
    every layer it answers as the teacher to 1e-5; with one, it loads and answers, its config saying so."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DistilBertConfig

    from tests.helpers.tiny_models import tiny_config
    from training.distill.students import smaller_copy

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(smoke_dir / "model")
    size = len(tokenizer)
    if family == "distilbert":
        config = DistilBertConfig(vocab_size=size, dim=32, n_layers=3, n_heads=2, hidden_dim=64, num_labels=3)
    else:
        config = tiny_config(family, size, num_hidden_layers=3, num_labels=3, pad_token_id=tokenizer.pad_token_id)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "teacher")
    tokenizer.save_pretrained(tmp_path / "teacher")
    ids = torch.randint(5, size, (2, 7))
    teacher = AutoModelForSequenceClassification.from_pretrained(tmp_path / "teacher").eval()
    assert smaller_copy(tmp_path / "teacher", "0,1,2", tmp_path / "all") == [0, 1, 2]
    copy = AutoModelForSequenceClassification.from_pretrained(tmp_path / "all").eval()
    with torch.no_grad():
        assert torch.allclose(copy(input_ids=ids).logits, teacher(input_ids=ids).logits, atol=1e-5)
    smaller_copy(tmp_path / "teacher", "2", tmp_path / "one")  # a count: spread from the first layer to the last
    one = AutoModelForSequenceClassification.from_pretrained(tmp_path / "one").eval()
    assert one.config.num_hidden_layers == 2 and one.config.distilled_from["layers"] == [0, 2]
    with torch.no_grad():
        assert one(input_ids=ids).logits.shape == (2, 3)
    assert (tmp_path / "one" / files.TOKENIZER_DIR / "tokenizer.json").is_file()


@pytest.mark.slow
def test_the_student_trains_on_two_processes_with_a_launch_config(smoke_model, lake, smoke_dir, tmp_path):
    """--config_file: the student's run under accelerate launch (2 gloo processes), every text counted once."""
    from tests.helpers.processes import CPU_2PROC

    out = tmp_path / "ddp"
    result, _ = launch(distill_args(smoke_model, lake, out, smoke_dir, "--config_file", str(CPU_2PROC)))
    assert result.returncode == 0, describe(result)
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["world_size"] == 2 and metrics["test"]["num_examples"] == 600
    assert metrics["agreement_with_teacher"]["agreement"] >= 0.95


@pytest.mark.slow
def test_a_multi_label_teacher_is_distilled_on_its_probabilities(smoke_dir, tmp_path):
    """BCE on the teacher's probability of each label; the label column (lists of names) read back by name in the
    test file, every class kept by id even where the teacher never chose it."""
    teacher, lake, out = tmp_path / "teacher", tmp_path / "lake.jsonl", tmp_path / "student"
    result, _ = launch(["-m", "training.train", "--preset", "smoke-multi-label", "--max_train_steps", "60",
                        "--checkpointing_steps", "none", "--output_dir", str(teacher)])  # fmt: skip
    assert result.returncode == 0, describe(result)
    texts = pd.read_json(smoke_dir / "multi_label_train.jsonl", lines=True)[["text"]]
    texts.head(1000).to_json(lake, orient="records", lines=True)
    args = ["-m", "training.distill", "--teacher", str(teacher), "--input_file", str(lake), "--output_dir", str(out),
            "--student_layers", "1", "--test_file", str(smoke_dir / "multi_label_test.jsonl"), "--label_column",
            "labels", "--max_length", "64", "--learning_rate", "1e-3", "--max_train_steps", "60",
            "--checkpointing_steps", "none"]  # fmt: skip
    result, _ = launch(args)
    assert result.returncode == 0, describe(result)
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["problem_type"] == "multi_label_classification" and metrics["test"]["num_examples"] == 600
    assert metrics["agreement_with_teacher"]["agreement"] >= 0.9
    config = json.loads((out / files.CONFIG).read_text())
    assert list(config["id2label"].values()) == list(
        json.loads((teacher / files.CONFIG).read_text())["id2label"].values()
    )


@pytest.mark.slow
def test_a_reranker_is_distilled_on_query_passage_pairs(smoke_dir, tmp_path):
    """--text_pair_column: pairs scored, trained and measured as pairs; the student ranks each query's passages
    (graded by the deciles of the teacher's scores) and distillation.json keeps the pairs for the service's guard."""
    teacher, lake, out = tmp_path / "teacher", tmp_path / "pairs.csv", tmp_path / "student"
    files_of = {f"--{split}_file": str(smoke_dir / f"reranking_{split}.csv") for split in ("train", "validation")}
    pairs = ["--text_column_names", "query", "--text_pair_column", "passage", "--label_column", "relevance"]
    result, _ = launch(["-m", "training.train", *[x for kv in files_of.items() for x in kv], *pairs, "--problem_type",
                        "reranking", "--model_name_or_path", str(smoke_dir / "model"), "--from_scratch", "true",
                        "--max_length", "64", "--learning_rate", "3e-3", "--max_train_steps", "40",
                        "--checkpointing_steps", "none", "--output_dir", str(teacher)])  # fmt: skip
    assert result.returncode == 0, describe(result)
    pd.read_csv(smoke_dir / "reranking_train.csv")[["query", "passage"]].to_csv(lake, index=False)
    args = ["-m", "training.distill", "--teacher", str(teacher), "--input_file", str(lake), "--text_column", "query",
            "--text_pair_column", "passage", "--label_column", "relevance", "--output_dir", str(out),
            "--student_layers", "1", "--test_file", str(smoke_dir / "reranking_test.csv"), "--max_length", "64",
            "--learning_rate", "1e-3", "--max_train_steps", "20", "--checkpointing_steps", "none"]  # fmt: skip
    result, _ = launch(args)
    assert result.returncode == 0, describe(result)
    metrics = json.loads((out / files.METRICS).read_text())
    assert "ndcg_at_10" in metrics["test"] and "spearman" in metrics["agreement_with_teacher"]
    kept = json.loads((out / agreement.RECORD).read_text())["held_out"]
    assert len(kept["texts"]) == len(kept["text_pairs"]) == metrics["agreement_with_teacher"]["texts"] > 100


@pytest.mark.slow
def test_a_new_run_in_a_students_folder_takes_its_distillation_record_with_it(student, tmp_path):
    """distillation.json is a run's file: a run replacing the student's folder removes it, so no guard reads it."""
    folder = Path(shutil.copytree(student, tmp_path / "student", ignore=shutil.ignore_patterns("state", "distill")))
    flags = ["--overwrite_output_dir", "--max_train_steps", "5", "--checkpointing_steps", "none"]
    result, _ = launch(["-m", "training.train", "--preset", "smoke", "--output_dir", str(folder), *flags])
    assert result.returncode == 0, describe(result)
    assert not (folder / agreement.RECORD).exists()
    assert "agreement_with_teacher" not in json.loads((folder / files.METRICS).read_text())


def test_a_teacher_in_pickle_files_is_refused_before_anything_is_unpickled(smoke_dir, tmp_path, monkeypatch):
    """pytorch_model.bin runs code when unpickled: the copy reads teachers through the service's loader, which
    refuses it (and torch.load is never reached)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DistilBertConfig

    from contract.loading import CheckpointError
    from training.distill.students import smaller_copy

    tokenizer = AutoTokenizer.from_pretrained(smoke_dir / "model")
    config = DistilBertConfig(vocab_size=len(tokenizer), dim=32, n_layers=2, n_heads=2, hidden_dim=64, num_labels=3)
    config.save_pretrained(tmp_path / "teacher")  # transformers 5 writes safetensors only: the pickle by hand
    torch.save(
        AutoModelForSequenceClassification.from_config(config).state_dict(), tmp_path / "teacher" / "pytorch_model.bin"
    )
    tokenizer.save_pretrained(tmp_path / "teacher")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load reached"))
    with pytest.raises(CheckpointError, match="pytorch_model.bin"):
        smaller_copy(tmp_path / "teacher", "1", tmp_path / "student")
    assert not (tmp_path / "student").exists()


@pytest.mark.parametrize(
    "flags, code, says",
    [
        (["--teacher", "no-such-folder"], 1, "teacher: no-such-folder is not a folder"),
        (["--student_layers", "5"], 2, "student_layers: 5 layers; the teacher has 2"),
        (["--teacher", "http://127.0.0.1:9", "--model_name_or_path", "x"], 1, "cannot be reached"),
    ],
    ids=["missing-teacher", "too-many-layers", "unreachable-service"],
)
def test_what_cannot_work_stops_in_one_line_before_anything_is_written(
    smoke_model, smoke_dir, tmp_path, capsys, flags, code, says
):
    from training.distill.__main__ import main

    out = tmp_path / "student"
    base = {"--teacher": str(smoke_model), "--input_file": str(smoke_dir / "test.csv"), "--output_dir": str(out),
            "--student_layers": "1"}  # fmt: skip
    given = dict(zip(flags[::2], flags[1::2]))
    if "--model_name_or_path" in given:
        del base["--student_layers"]
    args = [part for pair in {**base, **given}.items() for part in pair]
    assert main(args) == code
    said = capsys.readouterr().err.strip().splitlines()
    assert said[-1].startswith("agnews distill: ") and says in said[-1] and not out.exists()


def test_distillation_flags_outside_distillation_are_refused():
    from training.config import ConfigError
    from training.config_parsing import load_config

    with pytest.raises(ConfigError, match="distill_alpha: applies to distillation only"):
        load_config(["--preset", "smoke", "--distill_alpha", "0.5"])
